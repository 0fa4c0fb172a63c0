"""Live output as JSON lines: `watch --json` and `logs --follow --json` print one JSON object
per event per line, over real sshd hosts and the stand-in server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import CLI
from tests.sshd_hosts import SSHLab
from tests.test_lifecycle import inventory, launch_json
from tests.test_logs import REMOTE_LOG, SCHEDULER_CRASH, Follow, append, write_log


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of `text` as one JSON object (a line that is not one fails the test)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_watch_json_prints_one_event_per_line_through_a_crash_loop(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # Seconds after ready: the launch sees it ready even on a loaded machine.
    inv = inventory(hosts, tmp_path, ["alpha"], crash="after_ready", crash_after_s=3.0)
    code, _, err = launch_json(cli, inv)
    assert code == 0, err
    proc = cli.popen("watch", "-i", str(inv), "--interval", "0.5", "--timeout", "30", "--json")
    try:
        out, err = proc.communicate(timeout=90)  # it ends by itself at the crash loop
    finally:
        proc.kill()
    events = json_lines(out)
    kinds = [e["event"] for e in events]
    assert kinds == ["watching", "restarting", "replaced", "crash_loop", "watch_stopped"], (
        kinds,
        err,
    )
    watching, restarting, replaced, loop, stopped = events
    assert (watching["deployments"], watching["hosts"], watching["unreadable"]) == (1, 1, 0)
    assert watching["interval_s"] == 0.5 and watching["target"] == ""
    assert restarting["target"] == "alpha" and restarting["attempt"] == 1
    assert restarting["run"] == "eagle3_v1" and restarting["signature"] == "tensor-shape-mismatch"
    assert (replaced["old_run"], replaced["new_run"], replaced["state"]) == (
        "eagle3_v1",
        "eagle3_v2",
        "ready",
    )
    assert loop["repeated"] is True and loop["run"] == "eagle3_v2"
    assert stopped["gave_up"] is True and proc.returncode == 1, err
    assert all(isinstance(e["at"], float) for e in events)
    assert "Traceback" not in err


def test_logs_follow_json_streams_lines_and_the_crash_as_objects(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    log = write_log(hosts.hosts["alpha"], "old 1\nold 2\n")
    follow = Follow(cli, "-i", str(inv), "--path", REMOTE_LOG, "-n", "1", "--json")
    try:
        follow.expect('"old 2"')
        append(log, SCHEDULER_CRASH)
        follow.expect('"event": "crash"')
    finally:
        code, err = follow.interrupt()
    events = [json.loads(line) for line in follow.seen]
    assert events[0] == {**events[0], "event": "log_line", "target": "alpha", "line": "old 2"}
    assert events[0]["crash"] is False
    traced = [e for e in events if e["event"] == "log_line" and e["crash"]]
    assert any(e["line"].startswith("RuntimeError: The size of tensor a (160)") for e in traced)
    crash = events[-1]
    assert crash["event"] == "crash" and crash["report"]["signature"] == "tensor-shape-mismatch"
    assert code == 0, err


def test_logs_json_names_a_host_that_cannot_be_read_in_its_own_object(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    write_log(hosts.hosts["alpha"], "only alpha\n")
    result = cli("logs", "-i", str(inv), "--path", REMOTE_LOG, "--json")
    events = json_lines(result.stdout)
    assert {"event": "log_line", "target": "alpha", "line": "only alpha"}.items() <= events[
        0
    ].items()
    [failed] = [e for e in events if e["event"] == "host_failed"]
    assert failed["target"] == "bravo" and failed["code"] == "missing_log", failed
    assert result.returncode == 1 and result.stderr == "", result.stderr
