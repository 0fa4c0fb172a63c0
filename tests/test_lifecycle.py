"""launch / status / stop / restart / watch over real sshd hosts with the stand-in server."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import CLI
from tests.sshd_hosts import SSHLab, TestHost, alive, copy_standin, free_port, sh
from tests.streamed import Streamed, stream_tokens


def prepare(host: TestHost, tp: int = 2, **knobs: object) -> dict[str, object]:
    """Give a host the stand-in (importable from its home) and a model folder."""
    copy_standin(host.home)
    model = host.home / "model"
    model.mkdir(exist_ok=True)
    (model / "standin.json").write_text(json.dumps({"startup_s": 0.3, **knobs}))
    sh("chown", "-R", f"{host.user}:{host.user}", host.home)
    host.set_gpus("clean", max(tp, 1))
    return {
        "launch_module": "sglang_standin",
        "template": "eagle3",
        "model_path": str(model),
        "draft_model_path": str(model),
        "tp": tp,
        "bind_host": host.address,
        "port": free_port(host.address),
        "log_dir": "~/logs",
    }


def inventory(lab: SSHLab, tmp_path: Path, names: list[str], **knobs: object) -> Path:
    host_vars = {n: prepare(lab.hosts[n], **knobs) for n in names}
    return lab.inventory(tmp_path / "inv.yml", names, host_vars)


def rank_pids(host: TestHost) -> list[int]:
    out = sh("pgrep", "-u", host.user, "-f", "sglang::scheduler", check=False).stdout
    return [int(p) for p in out.split()]


def launch_json(cli: CLI, inv: Path, *extra: str) -> tuple[int, dict, str]:
    result = cli("launch", "-i", str(inv), "--json", "--timeout", "60", *extra)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


@pytest.mark.fresh_cli  # a user's own processes, start to end
def test_launch_reaches_ready_then_stop_ends_every_rank(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    alpha = hosts.hosts["alpha"]
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    entry = doc["hosts"]["alpha"]
    assert entry["state"] == "ready" and entry["run"] == "baseline_v1"
    assert entry["log"] == str(alpha.home / "logs" / "baseline_v1.log")
    assert "The server is fired up and ready to roll!" in Path(entry["log"]).read_text()
    assert len(rank_pids(alpha)) == 2
    # Detached: its own session and process group.
    pid = entry["pid"]
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid

    status = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"]["alpha"]
    assert status["alive"] and status["ready"] and not status["crashed"]
    assert status["run"] == "baseline_v1" and status["pid"] == pid

    stopped = cli("stop", "-i", str(inv), "--json")
    assert stopped.returncode == 0, stopped.stderr
    result = json.loads(stopped.stdout)["hosts"]["alpha"]
    assert pid in result["ended"] and result["gpus_clean"] is True
    assert rank_pids(alpha) == []
    status = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"]["alpha"]
    assert status["alive"] is False and status["status"] == "stopped" and status["crashed"] is False


def test_log_versions_increment_and_old_logs_are_kept(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    logs = hosts.hosts["alpha"].home / "logs"
    logs.mkdir()
    (logs / "eagle3_v4.log").write_text("an older run\n")
    sh("chown", "-R", f"{hosts.hosts['alpha'].user}:{hosts.hosts['alpha'].user}", logs)
    code, doc, err = launch_json(cli, inv)
    assert code == 0, (err, doc)
    assert doc["hosts"]["alpha"]["run"] == "eagle3_v5"
    assert cli("stop", "-i", str(inv)).returncode == 0
    first = (logs / "eagle3_v5.log").read_text()
    code, doc, err = launch_json(cli, inv)
    assert code == 0, (err, doc)
    assert doc["hosts"]["alpha"]["run"] == "eagle3_v6"
    assert (logs / "eagle3_v4.log").read_text() == "an older run\n"
    assert (logs / "eagle3_v5.log").read_text().startswith(first)
    cli("stop", "-i", str(inv))


def test_dirty_gpus_refuse_naming_pids_and_nothing_starts(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha", "bravo", "charlie"])
    hosts.hosts["bravo"].set_gpus("busy", 2)
    code, doc, _err = launch_json(cli, inv)
    assert code == 1
    assert doc["started"] is False
    assert "PIDs 419 hold GPU memory" in " ".join(doc["hosts"]["bravo"]["preflight"]["problems"])
    assert doc["hosts"]["alpha"]["preflight"]["ready"] is True
    for name in ("alpha", "bravo", "charlie"):
        host = hosts.hosts[name]
        assert rank_pids(host) == []
        assert not (host.home / "logs").exists() or not list((host.home / "logs").iterdir())
        assert not (host.home / ".deployctl" / "lock").exists()  # locks released
    human = cli("launch", "-i", str(inv), "--timeout", "60")
    assert "bravo: error: GPUs are not clean: dirty: PIDs 419 hold GPU memory" in human.stderr
    assert "nothing was started on any host" in human.stderr


def test_port_in_use_is_refused(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    import yaml

    port = yaml.safe_load(inv.read_text())["all"]["hosts"]["alpha"]["port"]
    with socket.socket() as sock:
        sock.bind((hosts.hosts["alpha"].address, port))
        sock.listen()
        code, doc, _ = launch_json(cli, inv)
    assert code == 1
    assert f"port {port} is in use" in " ".join(doc["hosts"]["alpha"]["preflight"]["problems"])


def test_crash_during_start_fails_fast_with_the_report(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"], crash="startup")
    start = time.monotonic()
    code, doc, _ = launch_json(cli, inv)
    assert code == 1
    entry = doc["hosts"]["alpha"]
    assert entry["state"] in ("crashed", "died")
    # The host failed, and says why: the crash, with the code scripts branch on.
    assert entry["ok"] is False and entry["code"] == "server"
    assert entry["error"].startswith("the server crashed: ") and "RuntimeError" in entry["error"]
    crash = entry["crashes"][0]
    assert crash["signature"] == "tensor-shape-mismatch"
    assert crash["exception"] == "RuntimeError"
    assert set(crash["ranks"]) <= {"TP0", "TP1"} and crash["ranks"]
    took = time.monotonic() - start
    assert took < 30, f"took {took:.2f}s, bound 30s"
    human = cli("status", "-i", str(inv))
    assert human.returncode == 1 and "crashed" in human.stdout


def test_restart_crashed_brings_the_run_back(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    # The crash waits long enough after ready that a launch polling on a loaded machine
    # sees the run ready first (0.5 s was seen lost between two polls in CI).
    inv = inventory(hosts, tmp_path, ["alpha", "bravo"], crash="after_ready", crash_after_s=3.0)
    model = hosts.hosts["bravo"].home / "model" / "standin.json"
    model.write_text(json.dumps({"startup_s": 0.3}))  # bravo stays healthy
    code, doc, err = launch_json(cli, inv)
    assert code == 0, (err, doc)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"]
        if status["alpha"]["crashed"]:
            break
        time.sleep(0.5)
    assert status["alpha"]["crashed"] and "tensor" in status["alpha"]["crash"].lower()
    assert not status["bravo"]["crashed"]
    (hosts.hosts["alpha"].home / "model" / "standin.json").write_text(
        json.dumps({"startup_s": 0.3})
    )
    result = cli("restart", "--crashed", "-i", str(inv), "--json", "--timeout", "60")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["hosts"]["alpha"]["run"] == "eagle3_v2" and doc["hosts"]["alpha"]["state"] == "ready"
    assert "bravo" not in doc["hosts"]  # healthy runs are left alone
    logs = hosts.hosts["alpha"].home / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["eagle3_v1.log", "eagle3_v2.log"]
    cli("stop", "-i", str(inv))


def watch_until(cli: CLI, inv: Path, needle: str) -> tuple[str, str]:
    """Run `watch` until a line holds `needle` (or it ends, or 90 s pass), then Ctrl-C it:
    (stdout, stderr)."""
    watch = Streamed(cli.popen("watch", "-i", str(inv), "--interval", "0.5", "--timeout", "30"))
    try:
        watch.until(lambda line: needle in line, 90)
    finally:
        _, err = watch.interrupt()
    return "".join(f"{line}\n" for line in watch.seen), err


def test_watch_restarts_once_then_stops_at_a_crash_loop(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"], crash="after_ready", crash_after_s=3.0)
    code, _, err = launch_json(cli, inv)
    assert code == 0, err
    text, err = watch_until(cli, inv, "crash loop")
    assert "restarting (attempt 1)" in text, text + err
    assert "restarted as eagle3_v2" in text
    assert "crash loop" in text and "tensor-shape-mismatch" in text
    assert "Traceback" not in err
    logs = sorted(p.name for p in (hosts.hosts["alpha"].home / "logs").iterdir())
    assert logs == ["eagle3_v1.log", "eagle3_v2.log"]


def test_two_launches_at_once_one_is_refused(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"], startup_s=1.0)
    procs = [cli.popen("launch", "-i", str(inv), "--timeout", "60") for _ in range(2)]
    results = [(*p.communicate(timeout=120), p.returncode) for p in procs]
    codes = sorted(r[2] for r in results)
    assert codes == [0, 1], results
    loser = next(r for r in results if r[2] == 1)
    assert "in progress" in loser[1] or "is in use" in loser[1] or "not clean" in loser[1]
    assert len(list((hosts.hosts["alpha"].home / "logs").iterdir())) == 1
    cli("stop", "-i", str(inv))


def test_stale_lock_of_a_dead_launcher_is_cleared(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = hosts.hosts["alpha"].home / ".deployctl"
    state.mkdir()
    lock = {
        "host": socket.gethostname(),
        "pid": dead.pid,
        "op": "launch",
        "token": "t",
        "since": time.time(),
        "expires": time.time() + 3600,  # not expired: only the dead owner makes it stale
    }
    (state / "lock").write_text(json.dumps(lock))
    sh("chown", "-R", f"{hosts.hosts['alpha'].user}:{hosts.hosts['alpha'].user}", state)
    code, doc, err = launch_json(cli, inv)
    assert code == 0, err
    assert doc["hosts"]["alpha"]["state"] == "ready"
    # Broken, then ours taken and given back at the end of the launch.
    assert not (state / "lock").exists()
    cli("stop", "-i", str(inv))


def test_dry_run_shows_commands_and_starts_nothing(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    result = cli("launch", "--dry-run", "-i", str(inv))
    assert result.returncode == 0, result.stderr
    assert "-m sglang_standin" in result.stdout and "eagle3_v1.log" in result.stdout
    assert rank_pids(hosts.hosts["alpha"]) == []
    assert not (hosts.hosts["alpha"].home / ".deployctl" / "lock").exists()


@pytest.mark.parametrize("value", ["/models/a b;touch /tmp/pwned-$(id -u)", "-rf `id`\n'x\"y"])
def test_hostile_model_path_reaches_the_server_exactly(
    hosts: SSHLab, cli: CLI, tmp_path: Path, value: str
) -> None:
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=1)
    model = alpha.home / "m" / value.replace("/", "_")
    model.mkdir(parents=True)
    (model / "standin.json").write_text(json.dumps({"startup_s": 0.2}))
    sh("chown", "-R", f"{alpha.user}:{alpha.user}", alpha.home)
    host_vars.update(model_path=str(model), draft_model_path=str(model))
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars})
    code, _doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    record = json.loads((model / "standin-argv.jsonl").read_text().splitlines()[0])
    assert f"--model-path={model}" in record["argv"]
    assert not list(Path("/tmp").glob("pwned-*"))
    cli("stop", "-i", str(inv))


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({"host": socket.gethostname(), "op": "launch", "token": "t"}),  # no pid
        json.dumps({"host": socket.gethostname(), "pid": 0, "expires": time.time() + 3600}),
        "{cut short",
        "",
    ],
    ids=["no-pid-no-expiry", "pid-0", "not-json", "empty"],
)
def test_a_lock_no_deployctl_could_have_written_does_not_block_forever(
    hosts: SSHLab, cli: CLI, tmp_path: Path, content: str
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    state = hosts.hosts["alpha"].home / ".deployctl"
    state.mkdir()
    (state / "lock").write_text(content)
    sh("chown", "-R", f"{hosts.hosts['alpha'].user}:{hosts.hosts['alpha'].user}", state)
    code, doc, err = launch_json(cli, inv)
    assert code == 0, err
    assert doc["hosts"]["alpha"]["state"] == "ready"
    cli("stop", "-i", str(inv))


def test_a_live_launchers_lock_is_respected(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    state = hosts.hosts["alpha"].home / ".deployctl"
    state.mkdir()
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),  # alive: this test
        "op": "launch",
        "token": "live",
        "expires": time.time() + 3600,
    }
    (state / "lock").write_text(json.dumps(holder))
    sh("chown", "-R", f"{hosts.hosts['alpha'].user}:{hosts.hosts['alpha'].user}", state)
    code, doc, err = launch_json(cli, inv)
    assert code == 1 and doc["started"] is False, err
    problems = doc["hosts"]["alpha"]["preflight"]["problems"]
    assert any("another deployctl launch is in progress" in p for p in problems), problems
    assert json.loads((state / "lock").read_text())["token"] == "live"


def test_dry_run_with_a_failing_preflight_exits_1_and_starts_nothing(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    hosts.hosts["alpha"].set_gpus("busy", 2)
    human = cli("launch", "--dry-run", "-i", str(inv))
    assert human.returncode == 1, human.stderr
    assert "-m sglang_standin" in human.stdout  # the command is still shown
    assert "alpha: error: GPUs are not clean" in human.stderr
    assert "nothing was started on any host" in human.stderr
    code, doc, _ = launch_json(cli, inv, "--dry-run")
    assert code == 1
    assert (doc["dry_run"], doc["started"], doc["hosts"]["alpha"]["ok"]) == (True, False, False)
    assert rank_pids(hosts.hosts["alpha"]) == []
    assert not (hosts.hosts["alpha"].home / ".deployctl" / "lock").exists()


ENV_VALUES = {
    "NCCL_P2P_DISABLE": "1",
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "true",
    "ODD_VALUE": "two words 'single' \"double\" $HOME `id` \\ back\nsecond line é",
    "HF_TOKEN": "hf_env_secret_0123456789",
}


def test_env_reaches_the_server_byte_exact_masked_everywhere_and_kept_by_restart(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    host_vars = prepare(alpha, tp=1)
    host_vars["env"] = ENV_VALUES
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": host_vars})
    secret = ENV_VALUES["HF_TOKEN"]

    shown = cli("render", "-i", str(inv))
    assert shown.returncode == 0, shown.stderr
    assert "NCCL_P2P_DISABLE=1\n" in shown.stdout and "HF_TOKEN='********'" in shown.stdout
    dry = cli("launch", "--dry-run", "-i", str(inv), "--template", "baseline")
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=true" in dry.stdout
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    assert doc["hosts"]["alpha"]["env"]["HF_TOKEN"] == "********"
    restarted = json.loads(cli("restart", "-i", str(inv), "--json", "--timeout", "60").stdout)
    assert restarted["hosts"]["alpha"]["state"] == "ready"
    status = cli("status", "-i", str(inv), "--json")
    cli("stop", "-i", str(inv))

    starts = [
        json.loads(line)
        for line in (alpha.home / "model" / "standin-argv.jsonl").read_text().splitlines()
    ]
    assert len(starts) == 2  # the launch and the restart
    for start in starts:
        assert {k: start["env"].get(k) for k in ENV_VALUES} == ENV_VALUES
        assert start["env"]["HOME"] == str(alpha.home)  # the login environment is the base
    runs = alpha.home / ".deployctl" / "runs"
    for path in runs.iterdir():
        if path.suffix == ".env":
            assert json.loads(path.read_text()) == ENV_VALUES
            assert path.stat().st_mode & 0o777 == 0o600
        else:  # an env secret reaches no other file, the real command (.cmd) included
            assert secret not in path.read_text(), path
            if path.suffix == ".cmd":
                assert path.stat().st_mode & 0o777 == 0o600
    for text in (shown.stdout, dry.stdout, json.dumps(doc), json.dumps(restarted), status.stdout):
        assert secret not in text


def test_the_dry_run_announces_the_log_the_launch_uses_after_a_log_was_deleted(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0 and doc["hosts"]["alpha"]["run"] == "baseline_v1", err
    cli("stop", "-i", str(inv))
    Path(doc["hosts"]["alpha"]["log"]).unlink()  # deleted to save space; its record stays
    dry = cli("launch", "--dry-run", "-i", str(inv), "--template", "baseline", "--json")
    announced = json.loads(dry.stdout)["hosts"]["alpha"]["preflight"]["log"]
    assert announced.endswith("/baseline_v2.log")
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    assert doc["hosts"]["alpha"]["log"] == announced
    cli("stop", "-i", str(inv))


def streaming(
    host: TestHost, inv: Path, log: Path, count: int, tokens: int
) -> tuple[list[threading.Thread], list[tuple[int, bool]]]:
    """`count` streamed requests of `tokens` tokens each to the host's server (at its port in
    `inv`), in flight once this returns."""
    port = yaml.safe_load(inv.read_text())["all"]["hosts"][host.name]["port"]
    answers: list[tuple[int, bool]] = []
    before = log.read_text().count("POST /v1/completions")
    threads = [
        threading.Thread(target=stream_tokens, args=(host.address, port, tokens, answers))
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    # The access line is written with the answer's headers: the request is in flight.
    while log.read_text().count("POST /v1/completions") < before + count:
        assert time.monotonic() < deadline, "the requests never reached the server"
        time.sleep(0.05)
    return threads, answers


def slow_alpha(hosts: SSHLab, cli: CLI, tmp_path: Path) -> tuple[Path, TestHost, Path]:
    """alpha serving the baseline at 20 ms a decode step, its drain looking every 0.5 s: its
    inventory, the host and the run's log."""
    inv = inventory(hosts, tmp_path, ["alpha"], drain_s=0.5, step_ms=20.0)
    code, doc, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    return inv, hosts.hosts["alpha"], Path(doc["hosts"]["alpha"]["log"])


def assert_no_crash(cli: CLI, inv: Path) -> None:
    crash = cli("crash", "-i", str(inv), "--json")
    assert crash.returncode == 0 and json.loads(crash.stdout)["hosts"]["alpha"]["crashes"] == []


def test_stop_lets_every_streamed_request_finish_and_the_server_end_its_ranks(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # Ranks outlive their parent (no PR_SET_PDEATHSIG): the server's own drain ends them.
    inv, alpha, log = slow_alpha(hosts, cli, tmp_path)
    ranks = rank_pids(alpha)
    assert len(ranks) == 2
    # Four streams of 300 tokens: about 7 s each, all in flight when the stop begins.
    threads, answers = streaming(alpha, inv, log, 4, 300)
    stopped = cli("stop", "-i", str(inv), "--timeout", "60", "--json")
    for thread in threads:
        thread.join(timeout=60)
    assert answers == [(300, True)] * 4, answers  # every token of every request, then [DONE]
    assert stopped.returncode == 0, stopped.stderr
    result = json.loads(stopped.stdout)["hosts"]["alpha"]
    assert result["shutdown"] == "drained" and result["killed"] == [], result
    assert 0 < result["shutdown_s"] < 60
    assert set(ranks) <= set(result["ended"]) and result["gpus_clean"] is True
    assert rank_pids(alpha) == [] and not [p for p in result["ended"] if alive(p)]
    text = log.read_text()
    assert "SIGTERM received. signum=None frame=None. Draining requests" in text
    looks = re.findall(r"Gracefully exiting\.\.\. Remaining number of requests (\d+)\.", text)
    assert looks[-1] == "0" and int(looks[0]) > 0, looks  # it waited for the requests
    assert "crashed with exit code" not in text  # no child died under the server
    assert_no_crash(cli, inv)
    status = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"]["alpha"]
    assert status["state"] == "stopped" and status["crashed"] is False
    human = cli("stop", "-i", str(inv))  # nothing left: said so
    assert human.returncode == 0 and "was not running" in human.stdout


def test_a_request_longer_than_the_timeout_is_cut_at_it_and_stop_says_so(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, alpha, log = slow_alpha(hosts, cli, tmp_path)
    # 3000 tokens: over 60 s, far past a 3 s timeout.
    threads, answers = streaming(alpha, inv, log, 1, 3000)
    started = time.monotonic()
    stopped = cli("stop", "-i", str(inv), "--timeout", "3", "--json")
    took = time.monotonic() - started
    for thread in threads:
        thread.join(timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    result = json.loads(stopped.stdout)["hosts"]["alpha"]
    assert result["shutdown"] == "cut", result
    assert 3 <= result["shutdown_s"] < 3 + 10 + 10  # the timeout, then the group's grace
    assert took < 40, f"stop took {took:.1f}s"
    ((got, done),) = answers
    assert not done and got < 3000, answers  # cut, not finished
    assert rank_pids(alpha) == [] and result["gpus_clean"] is True
    # The ranks died of the group's SIGTERM ("crashed with exit code -15"): the stop's doing.
    assert "crashed with exit code -15" in log.read_text()
    assert_no_crash(cli, inv)


def test_stop_escalates_to_sigkill_for_ranks_that_ignore_sigterm(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"], ignore_sigterm=True, drain_s=0.2)
    code, _, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    ranks = rank_pids(hosts.hosts["alpha"])
    stopped = cli("stop", "-i", str(inv), "--timeout", "1", "--json")
    assert stopped.returncode == 0, stopped.stderr
    entry = json.loads(stopped.stdout)["hosts"]["alpha"]
    assert set(ranks) <= set(entry["killed"]), entry  # SIGKILL was needed, and sent
    assert entry["gpus_clean"] is True
    assert rank_pids(hosts.hosts["alpha"]) == []
