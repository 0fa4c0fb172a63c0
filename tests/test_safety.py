"""Safety over real sshd hosts: never act on the wrong process or host, no lock left behind,
no traceback for a host that cannot do what was asked."""

from __future__ import annotations

import json
import pwd
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.sshd_hosts import SSHLab, TestHost, free_port, sh
from tests.test_lifecycle import launch_json, prepare, rank_pids


def wait_for(condition: Callable[[], bool], limit: float = 20) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"not within {limit}s"
        time.sleep(0.05)


def one_host(hosts: SSHLab, tmp_path: Path, tp: int = 1, **knobs: object) -> tuple[TestHost, Path]:
    """alpha, prepared for the stand-in, and an inventory of it alone."""
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=tp, **knobs)
    return alpha, hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars})


def running(pid: int) -> bool:
    """The process exists and is not a zombie (nobody here may reap orphans at once)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_start_that_fails_gives_the_lock_back_and_says_why_in_one_line(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=1)
    # Everything the preflight checks lives outside the home folder, which then goes away:
    # the preflight passes, and the start fails (the server would run from the home folder).
    elsewhere = alpha.root / "elsewhere"
    elsewhere.mkdir()
    shutil.copytree(alpha.home / "model", elsewhere / "model")
    sh("chown", "-R", f"{alpha.user}:{alpha.user}", elsewhere)
    host_vars.update(
        launch_module="json.tool",  # found without the home folder; never gets to run
        model_path=str(elsewhere / "model"),
        draft_model_path=str(elsewhere / "model"),
        state_dir=str(elsewhere / "state"),
        log_dir=str(elsewhere / "logs"),
    )
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars})
    away = alpha.root / "home-away"
    alpha.home.rename(away)
    try:
        code, doc, err = launch_json(cli, inv, "--template", "baseline")
    finally:
        shutil.rmtree(elsewhere / "agent", ignore_errors=True)
        away.rename(alpha.home)
    entry = doc["hosts"]["alpha"]
    assert code == 1 and not entry["ok"], err
    assert entry["code"] == "host"
    assert entry["error"].startswith("start failed on the host: No such file or directory")
    assert "Traceback" not in err and "Traceback" not in entry["error"]
    assert not (elsewhere / "state" / "lock").exists()


def test_a_state_dir_that_is_a_file_is_one_line_naming_it(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=1)
    (alpha.home / "state-file").write_text("not a folder\n")
    sh("chown", "-R", f"{alpha.user}:{alpha.user}", alpha.home)
    host_vars["state_dir"] = "~/state-file"
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars})
    for command in (["status"], ["stop"], ["launch", "--timeout", "30"]):
        result = cli(*command, "-i", str(inv))
        assert result.returncode == 1, (command, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        lines = result.stderr.splitlines()
        assert lines[0].startswith("alpha: error: "), result.stderr
        assert "state-file" in lines[0], lines[0]
    assert (alpha.home / "state-file").read_text() == "not a folder\n"


def test_a_trace_in_a_healthy_server_is_a_warning_not_a_crash(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    _, inv = one_host(hosts, tmp_path, request_error=True, crash_after_s=0.1)
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0 and doc["hosts"]["alpha"]["state"] == "ready", err
    log = Path(doc["hosts"]["alpha"]["log"])
    wait_for(lambda: "Exception in ASGI application" in log.read_text())

    status = cli("status", "-i", str(inv), "--json")
    entry = json.loads(status.stdout)["hosts"]["alpha"]
    assert status.returncode == 0, status.stderr
    assert (entry["alive"], entry["ready"], entry["crashed"]) == (True, True, False)
    assert entry["crash"] is None and "ValueError" in entry["warning"]
    human = cli("status", "-i", str(inv))
    assert "warning: " in human.stdout and "crashed" not in human.stdout

    restarted = cli("restart", "--crashed", "-i", str(inv))
    assert restarted.returncode == 0, restarted.stderr
    assert "nothing to restart" in restarted.stdout
    assert (
        json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"]["alpha"]["run"]
        == doc["hosts"]["alpha"]["run"]
    )
    cli("stop", "-i", str(inv))


def test_a_trace_in_a_server_that_fails_its_health_check_is_a_crash(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # The shipped behaviour stays: a scheduler trace while starting ends the launch at once.
    _, inv = one_host(hosts, tmp_path, tp=2, crash="startup", startup_s=30)
    code, doc, _ = launch_json(cli, inv, "--template", "baseline")
    assert code == 1 and doc["hosts"]["alpha"]["state"] in ("crashed", "died")
    assert doc["hosts"]["alpha"]["crashes"]


def test_a_recorded_pid_that_now_names_another_process_is_never_signalled(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha, inv = one_host(hosts, tmp_path)
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    run_id = doc["hosts"]["alpha"]["run"]
    record_path = alpha.home / ".deployctl" / "runs" / f"{run_id}.json"
    assert stat.S_IMODE(record_path.stat().st_mode) == 0o600
    cli("stop", "-i", str(inv))
    # The server is gone; its PID (and so its group and session id) now names an unrelated
    # session leader of the same user, as after PID reuse.
    user = pwd.getpwnam(alpha.user)
    stranger = subprocess.Popen(
        ["sleep", "300"], start_new_session=True, user=user.pw_uid, group=user.pw_gid
    )
    try:
        record = json.loads(record_path.read_text())
        assert isinstance(record["starttime"], int)
        pid = stranger.pid
        record.update(pid=pid, pgid=pid, sid=pid, status="running")
        for key in ("stop_requested_at", "stop_budget_s", "stopped_at"):  # as a run never stopped
            del record[key]
        record_path.write_text(json.dumps(record))
        status = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"]["alpha"]
        assert status["alive"] is False and status["crashed"] is True
        stopped = cli("stop", "-i", str(inv), "--json")
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout)["hosts"]["alpha"]["ended"] == []
        assert stranger.poll() is None, "deployctl signalled a process that is not its run"
    finally:
        stranger.kill()
        stranger.wait()


def test_launch_refuses_while_the_current_run_lives_and_replace_stops_it_first(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    _, inv = one_host(hosts, tmp_path)
    code, first, err = launch_json(cli, inv, "--template", "baseline", "--no-wait")
    assert code == 0, err
    code, second, err = launch_json(cli, inv, "--template", "baseline", "--no-wait")
    assert code == 1 and second["started"] is False
    problems = second["hosts"]["alpha"]["preflight"]["problems"]
    assert (
        f"run {first['hosts']['alpha']['run']} (pid {first['hosts']['alpha']['pid']})"
        in problems[0]
    )
    assert running(first["hosts"]["alpha"]["pid"])

    code, third, err = launch_json(cli, inv, "--template", "baseline", "--replace")
    assert code == 0, err
    assert third["hosts"]["alpha"]["state"] == "ready"
    assert not running(first["hosts"]["alpha"]["pid"])
    status = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"]["alpha"]
    assert status["run"] == third["hosts"]["alpha"]["run"] and status["alive"]
    cli("stop", "-i", str(inv))


def test_a_host_where_the_agent_cannot_be_kept_can_still_be_stopped(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha, inv = one_host(hosts, tmp_path)
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    # As after an upgrade on a full disk: the new agent's copy cannot be written.
    agent_dir = alpha.home / ".deployctl" / "agent"
    shutil.rmtree(agent_dir)
    agent_dir.mkdir(mode=0o555)  # root's, not writable by the login user
    try:
        status = cli("status", "-i", str(inv), "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["hosts"]["alpha"]["alive"] is True
        stopped = cli("stop", "-i", str(inv), "--json")
        assert stopped.returncode == 0, stopped.stderr
        assert doc["hosts"]["alpha"]["pid"] in json.loads(stopped.stdout)["hosts"]["alpha"]["ended"]
    finally:
        agent_dir.rmdir()
    assert not running(doc["hosts"]["alpha"]["pid"])


@contextmanager
def noisy_login(host: TestHost) -> Iterator[None]:
    """The host's login prints a banner on stdout and a complaint on stderr, as a motd or an
    rc file would, before every command."""
    shell = host.root / "noisy-shell"
    shell.write_text(
        "#!/bin/sh\n"
        'echo "Welcome to the GPU farm! Be nice."\n'
        'echo \'{"motd": "a line of JSON that is not an answer"}\'\n'
        'echo "Could not chdir to home directory /gone: No such file or directory" >&2\n'
        'exec /bin/sh "$@"\n'
    )
    shell.chmod(0o755)
    sh("usermod", "--shell", str(shell), host.user)
    try:
        yield
    finally:
        sh("usermod", "--shell", "/bin/sh", host.user)


def test_login_noise_and_tool_warnings_never_reach_a_parser(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=1)
    alpha.set_gpus("clean", 1, warn=True)
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars})
    with noisy_login(alpha):
        assert "Welcome" in alpha_says(alpha)
        gpus = cli("gpus", "-i", str(inv), "--json")
        assert gpus.returncode == 0, gpus.stderr
        assert json.loads(gpus.stdout)["hosts"]["alpha"]["clean"] is True
        code, doc, err = launch_json(cli, inv, "--template", "baseline")
        assert code == 0 and doc["hosts"]["alpha"]["state"] == "ready", err
        log = doc["hosts"]["alpha"]["log"]
        tail = cli("logs", "-i", str(inv), "-n", "1")
        assert tail.returncode == 0, tail.stderr
        assert tail.stdout.splitlines() == [Path(log).read_text().splitlines()[-1]]
        crash = cli("crash", "-i", str(inv), "--json")
        assert crash.returncode == 0, crash.stderr
        assert json.loads(crash.stdout)["hosts"]["alpha"]["crashes"] == []
        status = cli("status", "-i", str(inv), "--json")
        assert json.loads(status.stdout)["hosts"]["alpha"]["ready"] is True, status.stderr
        stopped = cli("stop", "-i", str(inv), "--json")
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout)["hosts"]["alpha"]["gpus_clean"] is True


def alpha_says(host: TestHost) -> str:
    """What a command over the host's login prints besides its own output."""
    return sh("su", "-s", str(host.root / "noisy-shell"), host.user, "-c", "true").stdout


def test_ctrl_c_ends_a_multi_host_launch_at_once_and_leaves_the_servers(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    names = ["alpha", "bravo"]
    host_vars = {n: prepare(hosts.hosts[n], tp=1, startup_s=60) for n in names}
    inv = hosts.inventory(tmp_path / "inv.yml", names, host_vars)
    # A launch that does not end is made to show where each of its threads waits.
    proc = cli.popen("launch", "-i", str(inv), "--template", "baseline", "--timeout", "120",
                     env={"PYTHONFAULTHANDLER": "1"})  # fmt: skip
    try:
        wait_for(lambda: all(rank_pids(hosts.hosts[n]) for n in names), 90)  # set-up, not the proof
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            _out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            ended = proc.poll()  # not None: it ended, and something else holds its pipes
            proc.send_signal(signal.SIGABRT)
            try:
                err = proc.communicate(timeout=10)[1]
            except subprocess.TimeoutExpired:
                err = "(its pipes stay open)"
            pytest.fail(f"Ctrl-C did not end the launch in 30 s (exit status {ended}): {err}")
        took = time.monotonic() - started
    finally:
        proc.kill()
    assert proc.returncode == 130, (err, _out)
    assert took < 3, f"Ctrl-C took {took:.1f}s"
    assert "interrupted: what was already started on hosts keeps running" in err
    assert "Traceback" not in err
    assert all(rank_pids(hosts.hosts[n]) for n in names)  # left running, as said
    assert cli("stop", "-i", str(inv)).returncode == 0


def test_set_reaches_every_variable_and_refuses_connection_ones(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha, inv = one_host(hosts, tmp_path)
    dry = cli("launch", "--dry-run", "-i", str(inv), "--set", "log_dir=~/elsewhere",
              "--set", "template=baseline")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert f"→ {alpha.home}/elsewhere/baseline_v1.log" in dry.stdout
    assert "--speculative" not in dry.stdout  # the baseline template, as --set asked
    refused = cli("render", "-i", str(inv), "--set", "ansible_host=10.9.9.9")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: --set cannot change how hosts are reached")


def test_preflight_checks_the_path_the_server_will_get(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # `--model-path=~/model` reaches the server with a literal `~`: no shell expands it there.
    _, inv = one_host(hosts, tmp_path)
    result = cli("launch", "--dry-run", "-i", str(inv), "--set", "model_path=~/model")
    assert result.returncode == 1
    assert "alpha: error: ~/model does not exist on alpha" in result.stderr


def test_an_ipv6_bind_host_is_checked_and_served(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=1)
    host_vars.update(bind_host="::1", port=free_port("::1"))
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars})
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0 and doc["hosts"]["alpha"]["state"] == "ready", err
    status = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"]["alpha"]
    assert status["ready"] is True
    cli("stop", "-i", str(inv))


def test_status_of_a_run_that_does_not_exist_is_an_error(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    result = cli("status", "-i", str(inv), "--run", "nosuch_v1")
    assert result.returncode == 1
    assert result.stderr.startswith("alpha: error: no run nosuch_v1 recorded on alpha")


def test_gpus_with_no_gpu_listed_is_not_clean(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    alpha = hosts.hosts["alpha"]
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    smi = alpha.bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$1\" in --query-gpu=*) echo 'index, uuid' ;; esac\n")
    try:
        result = cli("gpus", "-i", str(inv))
    finally:
        smi.unlink()  # the next reset puts the fake back
    assert result.returncode == 1
    assert "nvidia-smi listed no GPU" in result.stdout + result.stderr
