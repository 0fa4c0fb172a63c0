"""The kept agent: front ends that poll (top, watch, the dashboard) keep one agent process
per host over their connection, and it never outlives them.

Real sshd hosts on loopback (tests/sshd_hosts.py). A host's `python` can be a wrapper that
logs each start of the host's Python, which is what a round costs on the host.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deployctl import agent
from deployctl.connection import Connection, ConnectOptions
from deployctl.crash.catalog import default_catalog
from deployctl.deployments import deployment_targets
from deployctl.errors import CommandTimeoutError
from deployctl.fanout import Fleet
from deployctl.inventory import Host, load_inventory
from deployctl.ops.rounds import metrics_round
from deployctl.ops.router import router_silence
from deployctl.ops.runs import run_status
from deployctl.remote import protocol as proto
from deployctl.remote import wire
from tests.conftest import CLI
from tests.sshd_hosts import HOST_PYTHON, SSHLab, TestHost, free_port, sh
from tests.test_deployments import run_json, two_replicas

pytestmark = pytest.mark.lab


def counting_python(host: TestHost) -> str:
    """A `python` for the host that logs each start to ~/python-starts, then runs Python."""
    wrapper = host.home / "counting-python"
    wrapper.write_text(f'#!/bin/sh\necho "$$" >>"$HOME/python-starts"\nexec {HOST_PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    sh("chown", f"{host.user}:{host.user}", wrapper)
    return str(wrapper)


def python_starts(host: TestHost) -> int:
    path = host.home / "python-starts"
    return len(path.read_text().split()) if path.exists() else 0


def kept_agents(host: TestHost) -> list[int]:
    """The host user's kept agent processes (the agent started with --session)."""
    found = sh("pgrep", "-u", host.user, "-f", f" {wire.SESSION} ", check=False).stdout
    return [int(pid) for pid in found.split()]


def kept_of(conn: Connection) -> object:
    """The connection's kept agent, None when it keeps none (these hosts run one python)."""
    assert len(conn.kept) <= 1, conn.kept
    return next(iter(conn.kept.values()), None)


def wait_until(check: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def counted_inventory(hosts: SSHLab, tmp_path: Path, names: list[str], **common: Any) -> Path:
    host_vars = {name: {"python": counting_python(hosts.hosts[name])} for name in names}
    return hosts.inventory(tmp_path / "inv.yml", names, host_vars, **common)


@pytest.fixture
def fleet_of(tmp_path: Path) -> Iterator[Callable[[Path], Fleet]]:
    opened: list[Fleet] = []

    def open_fleet(inv: Path) -> Fleet:
        fleet = Fleet(load_inventory(inv).select(None), ConnectOptions(), forks=4)
        opened.append(fleet)
        return fleet

    yield open_fleet
    for fleet in opened:
        fleet.close()


def top_rounds(cli: CLI, inv: Path, rounds: int) -> subprocess.Popen[str]:
    """`top --json` started, after `rounds` of its documents were read."""
    proc = cli.popen("top", "--json", "-i", str(inv), "--interval", "0.2")
    assert proc.stdout is not None
    for _ in range(rounds):
        doc = json.loads(proc.stdout.readline())
        assert all(entry["ok"] for entry in doc["hosts"].values()), doc
    return proc


def test_top_keeps_one_agent_per_host_and_none_outlives_a_sigkilled_client(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    names = ["alpha", "bravo"]
    inv = counted_inventory(hosts, tmp_path, names)
    proc = top_rounds(cli, inv, 20)
    try:
        for name in names:
            host = hosts.hosts[name]
            # One Python per host for 20 rounds, besides the first start's miss and the
            # unpacking of the agent: one process per call would be 20 or more.
            assert python_starts(host) <= 3, (name, python_starts(host))
            assert len(kept_agents(host)) == 1, name
    finally:
        proc.kill()  # SIGKILL: no clean-up of ours runs
        proc.communicate(timeout=10)
    for host in (hosts.hosts[name] for name in names):
        assert wait_until(lambda host=host: not kept_agents(host)), host.name


@pytest.mark.parametrize("front_end", ["watch", "dashboard"])
def test_watch_and_the_dashboard_keep_one_agent_per_host_and_none_outlives_them(
    hosts: SSHLab, cli: CLI, tmp_path: Path, front_end: str
) -> None:
    names = ["alpha", "bravo"]
    inv = counted_inventory(hosts, tmp_path, names)
    interval = 0.5 if front_end == "dashboard" else 0.2  # the least each allows
    extra = ["--port", str(free_port("127.0.0.1"))] if front_end == "dashboard" else []
    proc = cli.popen(front_end, "-i", str(inv), "--interval", str(interval), *extra)
    try:
        # 20 rounds at least, once both hosts answer through kept agents.
        assert wait_until(lambda: all(kept_agents(hosts.hosts[n]) for n in names), timeout=30)
        time.sleep(20 * interval)
        for name in names:
            host = hosts.hosts[name]
            assert python_starts(host) <= 3, (front_end, name, python_starts(host))
            assert len(kept_agents(host)) == 1, name
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    for host in (hosts.hosts[name] for name in names):
        assert wait_until(lambda host=host: not kept_agents(host)), host.name


def test_a_kept_agent_ends_when_its_sshd_is_killed(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inv = counted_inventory(hosts, tmp_path, ["alpha"])
    alpha = hosts.hosts["alpha"]
    proc = top_rounds(cli, inv, 3)
    try:
        [kept] = kept_agents(alpha)
        # The sshd of our session only (the listener stays): the connection is cut.
        session_sshd = int(sh("ps", "-o", "ppid=", "-p", str(kept)).stdout.strip() or 0)
        while session_sshd and b"sshd" not in Path(f"/proc/{session_sshd}/cmdline").read_bytes():
            session_sshd = int(sh("ps", "-o", "ppid=", "-p", str(session_sshd)).stdout.strip())
        os.kill(session_sshd, signal.SIGKILL)
        assert wait_until(lambda: kept not in kept_agents(alpha))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert wait_until(lambda: not kept_agents(alpha))


def test_two_deployments_of_one_host_each_get_their_own_reply_through_its_kept_agent(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, ports = two_replicas(hosts, tmp_path)
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    alpha = hosts.hosts["alpha"]
    inventory = load_inventory(inv)
    targets = deployment_targets(inventory.select(None), None, inventory.select)
    assert [t.label for t in targets] == ["alpha/r1", "alpha/r2"]
    rounds = 40
    try:
        # As top and watch poll: both deployments' calls at once, over one connection to
        # the host and its one kept agent. Each must read its own reply, never the other's.
        with Fleet(targets, ConnectOptions(), forks=4, select=inventory.select) as fleet:
            fleet.keep_agents()
            for number in range(rounds):
                result = fleet.poll(lambda host, conn: run_status(host, conn, default_catalog()))
                for entry in result:
                    deployment = entry.host.deployment
                    assert entry.value is not None and entry.value.run, (number, entry.error)
                    run = entry.value.run
                    assert (run["port"], Path(run["log"]).name) == (
                        ports[deployment],
                        f"{deployment}_baseline_v1.log",
                    ), (number, entry.name)
            kept = kept_of(fleet.connection(targets[0]))
            assert isinstance(kept, agent.KeptAgent) and kept.answered == 2 * rounds
            assert kept_agents(alpha) == [kept.pid]
    finally:
        cli("stop", "-i", str(inv))


def test_a_routers_worker_list_is_read_through_the_kept_agent(
    hosts: SSHLab, fleet_of: Callable[[Path], Fleet], tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    # Nothing listens on the router's port: each read says so, on the host.
    inv = counted_inventory(hosts, tmp_path, ["alpha"], port=free_port(alpha.address))
    fleet = fleet_of(inv)
    fleet.keep_agents()
    router = fleet.hosts[0]
    conn = fleet.connection(router)
    for _ in range(5):  # as a canary checks its router every round
        assert router_silence(router, conn)
    kept = kept_of(conn)
    assert isinstance(kept, agent.KeptAgent) and kept.answered == 5
    assert python_starts(alpha) <= 3, python_starts(alpha)


def test_deployments_of_one_host_on_two_pythons_read_through_a_kept_agent_each(
    hosts: SSHLab, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    other = alpha.home / "router-python"  # as a router's own venv: another python
    other.symlink_to(HOST_PYTHON)
    sh("chown", "-h", f"{alpha.user}:{alpha.user}", other)
    table = {"router": {"python": str(other)}, "w1": {}}
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": {"deployments": table}})
    inventory = load_inventory(inv)
    targets = deployment_targets(inventory.select(None), None, inventory.select)
    with Fleet(targets, ConnectOptions(), forks=4, select=inventory.select) as fleet:
        fleet.keep_agents()
        for _ in range(2):  # the router's first: its python must not answer w1's calls
            for target in targets:
                args: proto.ProbeArgs = {
                    "state_dir": target.settings.state_dir,
                    "paths": [],
                    "hunks": {},
                }
                reply = agent.call(target, fleet.connection(target), agent.PROBE, args)
                # Which SGLang a call finds is its python's (none here, in either).
                error = reply["sglang"].get("error", "")
                assert error.endswith(f" for {target.settings.python}"), (target.label, error)
        kept = fleet.connection(targets[0]).kept
        assert sorted(kept) == sorted([HOST_PYTHON, str(other)])
        assert all(isinstance(k, agent.KeptAgent) and k.answered == 2 for k in kept.values())


def test_rounds_go_on_while_a_host_hangs_and_its_agent_is_restarted(
    hosts: SSHLab, tmp_path: Path, fleet_of: Callable[[Path], Fleet]
) -> None:
    # alpha answers within 3 s even on a busy machine (1 s was seen missed), and the round
    # ends then, well before bravo's call times out (command_timeout 8 s).
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"], command_timeout=8)
    fleet = fleet_of(inv)
    fleet.keep_agents()
    catalog = default_catalog()
    first = metrics_round(fleet, catalog, within=2)
    assert first.ok, [r.error for r in first]
    bravo = hosts.hosts["bravo"]
    old = kept_of(fleet.connection(host_named(fleet, "bravo")))
    assert isinstance(old, agent.KeptAgent)
    # A hung read on bravo (an NFS state_dir): its runs/current is a FIFO nobody writes.
    runs = bravo.home / ".deployctl" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    os.mkfifo(runs / "current")
    sh("chown", "-R", f"{bravo.user}:{bravo.user}", bravo.home / ".deployctl")
    started = time.monotonic()
    hung = metrics_round(fleet, catalog, within=3)
    took = time.monotonic() - started
    by_name = {r.name: r for r in hung}
    assert by_name["alpha"].ok, by_name["alpha"].exception
    # alpha's round did not wait for bravo (command_timeout 8 s).
    assert took < 5, f"the round took {took:.2f}s, bound 5s (answer within 3 s)"
    assert isinstance(by_name["bravo"].exception, CommandTimeoutError)
    # bravo's call times out (command_timeout 8 s): its agent is closed and ends on the host,
    # though its call still hangs there.
    assert wait_until(lambda: old.pid not in kept_agents(bravo), timeout=15)
    (runs / "current").unlink()
    late = {r.name: r for r in metrics_round(fleet, catalog, within=5)}
    assert isinstance(late["bravo"].exception, CommandTimeoutError)  # its call's own end
    assert "within 8s" in str(late["bravo"].exception)
    fleet._waiting.clear()  # no backoff wait in a test
    again = metrics_round(fleet, catalog, within=5)
    assert again.ok, [r.error for r in again]
    new = kept_of(fleet.connection(host_named(fleet, "bravo")))
    assert isinstance(new, agent.KeptAgent) and new.pid != old.pid
    assert kept_agents(bravo) == [new.pid]


def test_a_wedged_probe_is_killed_on_the_host_and_the_agent_goes_on(
    hosts: SSHLab, tmp_path: Path, fleet_of: Callable[[Path], Fleet]
) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["bravo"], command_timeout=2)
    bravo = hosts.hosts["bravo"]
    smi = bravo.bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\nsleep 600\n")
    fleet = fleet_of(inv)
    fleet.keep_agents()
    host = host_named(fleet, "bravo")
    status = run_status(host, fleet.connection(host), default_catalog())
    assert status.gpus is None  # the GPU query was killed after 1 s (half the timeout)
    kept = kept_of(fleet.connection(host))
    assert isinstance(kept, agent.KeptAgent) and kept.answered == 1
    assert wait_until(lambda: "sleep 600" not in sh("ps", "-u", bravo.user, "-o", "args").stdout)
    assert kept_agents(bravo) == [kept.pid]


def test_a_new_agent_version_starts_a_new_kept_agent(
    hosts: SSHLab, tmp_path: Path, fleet_of: Callable[[Path], Fleet], monkeypatch: Any
) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    alpha = hosts.hosts["alpha"]
    fleet = fleet_of(inv)
    fleet.keep_agents()
    host = host_named(fleet, "alpha")
    conn = fleet.connection(host)
    run_status(host, conn, default_catalog())
    old = kept_of(conn)
    assert isinstance(old, agent.KeptAgent)
    # An upgrade of deployctl: the bundle (so its hash) changes under a running front end.
    extra = tmp_path / "zz_upgrade.py"
    extra.write_text("# a newer agent\n")
    files = agent.bundle_files()
    monkeypatch.setattr(agent, "bundle_files", lambda: [*files, extra])
    agent.agent_bundle.cache_clear()
    agent.agent_hash.cache_clear()
    try:
        run_status(host, conn, default_catalog())
        new = kept_of(conn)
        assert isinstance(new, agent.KeptAgent) and new.pid != old.pid
        assert new.bundle == agent.agent_hash() != old.bundle
        assert wait_until(lambda: kept_agents(alpha) == [new.pid])
    finally:
        monkeypatch.undo()
        agent.agent_bundle.cache_clear()
        agent.agent_hash.cache_clear()


# A python that gets no input: a kept agent ends at once, a one-shot call needs none. The
# second keeps python's exit status but gives it 2 s after its output ended (as a busy host
# does): the status, not the output's end, tells a kept agent that ended from a lost one.
NO_INPUT_PYTHONS = {
    "at-once": f'#!/bin/sh\nexec {HOST_PYTHON} "$@" </dev/null\n',
    "late-status": (
        f'#!/bin/bash\n{HOST_PYTHON} "$@" </dev/null\nstatus=$?\n'
        "exec >&- 2>&-\nsleep 2\nexit $status\n"
    ),
}


@pytest.mark.parametrize("script", list(NO_INPUT_PYTHONS))
def test_a_python_that_cannot_keep_an_agent_answers_one_process_per_call_with_a_note(
    hosts: SSHLab,
    tmp_path: Path,
    fleet_of: Callable[[Path], Fleet],
    monkeypatch: Any,
    script: str,
) -> None:
    bravo = hosts.hosts["bravo"]
    wrapper = bravo.home / "no-input-python"
    wrapper.write_text(NO_INPUT_PYTHONS[script])
    wrapper.chmod(0o755)
    sh("chown", f"{bravo.user}:{bravo.user}", wrapper)
    inv = hosts.inventory(tmp_path / "inv.yml", ["bravo"], {"bravo": {"python": str(wrapper)}})
    notes: list[str] = []
    monkeypatch.setattr(agent, "note", notes.append)
    # Nothing known of this host yet, and what this test learns of it (no kept agent, the
    # bundle sent in argv: its python cannot read the bundle on stdin) stays in this test.
    monkeypatch.setattr(agent, "_NO_KEPT_AGENT", {})
    monkeypatch.setattr(agent, "_BUNDLE_IN_MEMORY", set())
    fleet = fleet_of(inv)
    fleet.keep_agents()
    for _ in range(3):
        result = metrics_round(fleet, default_catalog(), within=10)
        assert result.ok, [r.error for r in result]
    assert len(notes) == 1 and "one process per call" in notes[0], notes
    assert kept_of(fleet.connection(host_named(fleet, "bravo"))) is None


# Something on the host that answers in the kept agent's place (damaged files, a hostile
# host): its ready line is right, its replies are not. NO_RUN: a good status reply (no run).
NO_RUN = {"alive": False, "members": [], "health": None, "size": 0, "data": "",
          "placement": None, "run": None, "command": None, "env": None, "metrics": None}  # fmt: skip
GPUS_ANSWER = {"exit_code": 0, "output": "", "stderr": ""}
WRONG_REPLIES: dict[str, tuple[str, str]] = {
    # (the reply line after the mark, what the error says)
    "an error": (
        json.dumps({"reply": {"error": "status failed on the host: KeyError: 'pid'",
                              "code": "agent"}, "probes": None}),
        "status failed on the host: KeyError: 'pid'",
    ),
    "keys missing": (
        json.dumps({"reply": {"alive": True}, "probes": {"gpus": GPUS_ANSWER}}),
        "bravo: the host agent's status reply is malformed: ",
    ),
    "no JSON object": (
        json.dumps({"reply": ["run"], "probes": {"gpus": GPUS_ANSWER}}), "no JSON object"
    ),
    "no reply": (json.dumps({"probes": {}}), "the kept agent's status reply is malformed"),
    "not JSON": ("{not json", "the kept agent's status reply is malformed"),
    "a probe's output not text": (
        json.dumps({"reply": NO_RUN, "probes": {"gpus": {**GPUS_ANSWER, "output": 5}}}),
        "the kept agent's status reply is malformed",
    ),
}  # fmt: skip
FAKE_SESSION = """import os, sys
mark, ready, reply = sys.argv[1:4]
print(mark + ready.replace("PID", str(os.getpid())), flush=True)
for line in sys.stdin:
    print(mark + reply, flush=True)
"""


@pytest.mark.parametrize("wrong", list(WRONG_REPLIES))
def test_a_wrong_reply_from_a_kept_agent_is_an_agent_error_of_its_host(
    hosts: SSHLab, tmp_path: Path, fleet_of: Callable[[Path], Fleet], wrong: str
) -> None:
    bravo = hosts.hosts["bravo"]
    reply, said = WRONG_REPLIES[wrong]
    (bravo.home / "fake-session.py").write_text(FAKE_SESSION)
    ready = json.dumps({"session": agent.agent_hash(), "pid": "PID"}).replace('"PID"', "PID")
    fake = [HOST_PYTHON, str(bravo.home / "fake-session.py"), wire.REPLY_MARK, ready, reply]
    wrapper, session = bravo.home / "faking-python", shlex.quote(wire.SESSION)
    wrapper.write_text(
        "#!/bin/sh\n"
        f'for arg in "$@"; do [ "$arg" = {session} ] && exec {shlex.join(fake)}; done\n'
        f'exec {HOST_PYTHON} "$@"\n'
    )
    wrapper.chmod(0o755)
    sh("chown", f"{bravo.user}:{bravo.user}", wrapper, bravo.home / "fake-session.py")
    inv = hosts.inventory(tmp_path / "inv.yml", ["bravo"], {"bravo": {"python": str(wrapper)}})
    fleet = fleet_of(inv)
    fleet.keep_agents()
    for _ in range(2):  # the agent that answered wrong answers the next round too
        [result] = metrics_round(fleet, default_catalog(), within=10)
        assert result.name == "bravo" and result.code == "agent", (wrong, result.exception)
        assert result.error is not None and said in result.error, (wrong, result.error)
    kept = kept_of(fleet.connection(host_named(fleet, "bravo")))
    assert isinstance(kept, agent.KeptAgent) and kept.answered == 2 and not kept.ended


def host_named(fleet: Fleet, name: str) -> Host:
    return next(h for h in fleet.hosts if h.name == name)
