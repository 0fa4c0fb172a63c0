"""A run's life cycle through the library (ops/runs.py) over real sshd hosts: the one replace
step that restart and watch share."""

from __future__ import annotations

import ast
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from deployctl.connection import ConnectOptions
from deployctl.crash import load_catalog
from deployctl.errors import ConnectError
from deployctl.events import Collect, WaitEnded
from deployctl.fanout import Fleet
from deployctl.inventory import Host, load_inventory
from deployctl.ops import runs
from deployctl.ops.runs import RunState, replace, run_status
from deployctl.ops.serving import recorded_plan
from deployctl.patchset import load_patch_sets
from deployctl.project import SHIPPED_DATA
from tests.conftest import CLI
from tests.sshd_hosts import SSHLab, TestHost
from tests.test_layers import PACKAGE
from tests.test_lifecycle import inventory, launch_json, rank_pids
from tests.test_safety import running, wait_for


def test_a_stop_that_fails_on_one_host_keeps_only_that_host_from_relaunching(
    hosts: SSHLab, cli: CLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha", "bravo"])
    code, _, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    catalog, patch_sets = load_catalog(), load_patch_sets([SHIPPED_DATA / "patches"])
    selected = load_inventory(inv).select(None)
    with Fleet(selected, ConnectOptions()) as fleet:
        statuses = {r.name: r.value for r in fleet.run(lambda h, c: run_status(h, c, catalog))}
    assert all(s is not None and s.ready for s in statuses.values()), statuses
    # Both pass the check made before any stop; then bravo's stop fails (its host goes away
    # at that moment): alpha's must not suffer for it.
    real_stop = runs.stop_serving

    def stop_failing_on_bravo(fleet: Fleet, host: Host, *args: Any, **kwargs: Any) -> Any:
        if host.name == "bravo":
            raise ConnectError("bravo: the SSH connection was lost")
        return real_stop(fleet, host, *args, **kwargs)

    monkeypatch.setattr(runs, "stop_serving", stop_failing_on_bravo)
    broken = selected
    plans = []
    for host in broken:
        status = statuses[host.name]
        assert status is not None
        plans.append(recorded_plan(host, status, patch_sets))
    old = {name: s.run["id"] for name, s in statuses.items() if s is not None and s.run}
    seen = Collect()
    with Fleet(broken, ConnectOptions()) as fleet:
        replaced = replace(
            fleet, plans, catalog, restart_of=old, stop_timeout=5, timeout=60, events=seen
        )
    assert list(replaced.stops.failed) == ["bravo"]
    assert replaced.launch is not None
    [outcome] = replaced.launch.outcomes
    assert outcome.name == "alpha" and outcome.value is not None
    assert outcome.value.state is RunState.READY and outcome.value.run["id"] == "baseline_v2"
    assert outcome.value.run["restart_of"] == "baseline_v1"
    ended = [e for e in seen.events if isinstance(e, WaitEnded)]
    assert [(e.target, e.run, e.state) for e in ended] == [("alpha", "baseline_v2", "ready")]
    cli("stop", "-i", str(inv))


def test_restart_and_watch_replace_runs_only_through_replace() -> None:
    def functions(module: str) -> dict[str, ast.FunctionDef]:
        tree = ast.parse((PACKAGE / "ops" / module).read_text(encoding="utf-8"))
        return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}

    def called(function: ast.FunctionDef) -> set[str]:
        return {
            n.func.id
            for n in ast.walk(function)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }

    restart, watch = functions("restart.py"), functions("watch.py")
    assert "replace" in called(restart["relaunch_recorded"])
    for user in (restart["restart"], watch["watch"]):  # both through restart's relaunch
        assert "relaunch_recorded" in called(user), user.name
    for user in (restart["relaunch_recorded"], restart["restart"], watch["watch"]):
        assert not called(user) & {"stop_run", "launch", "end_run"}, user.name


def test_a_launch_whose_server_is_stopped_meanwhile_says_stopped_not_died(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"], startup_s=30)
    launch = cli.popen("launch", "-i", str(inv), "--json", "--timeout", "60")
    log_dir = hosts.hosts["alpha"].home / "logs"
    deadline = time.monotonic() + 30
    while not (log_dir.exists() and any(log_dir.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # the wait is polling
    stopped = cli("stop", "-i", str(inv))
    out, err = launch.communicate(timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    entry = json.loads(out)["hosts"]["alpha"]
    assert entry["state"] == "stopped" and entry["ok"] is False, (entry, err)
    assert launch.returncode == 1


def test_stop_returns_only_once_a_group_killed_with_sigkill_is_gone(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # Ranks that ignore SIGTERM and hold host memory: after SIGKILL they take a while to die.
    inv = inventory(hosts, tmp_path, ["alpha"], ignore_sigterm=True, host_mib=768, drain_s=0.2)
    code, _, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    ranks = rank_pids(hosts.hosts["alpha"])
    assert len(ranks) == 2
    stopped = cli("stop", "-i", str(inv), "--timeout", "0.5", "--json")
    assert rank_pids(hosts.hosts["alpha"]) == []  # gone when stop returns, not a moment later
    entry = json.loads(stopped.stdout)["hosts"]["alpha"]
    assert stopped.returncode == 0, stopped.stderr
    assert set(ranks) <= set(entry["killed"]), entry


def test_a_main_process_that_dies_of_sigterm_alone_gets_its_group_cut_soon(tmp_path: Path) -> None:
    # A wrapper (not exec'd) dies of the SIGTERM meant for the server and never ends what
    # it started: the group is cut a few seconds later, not at the end of the timeout.
    import os
    import subprocess

    from deployctl.remote.processes import (
        LEADER_GONE_GRACE,
        ProcessLauncher,
        process_group,
        process_starttime,
    )

    (tmp_path / "runs").mkdir()
    wrapper = subprocess.Popen(["/bin/sh", "-c", "sleep 120; true"], start_new_session=True)
    pid = wrapper.pid
    # The shell and its sleep: on a busy machine the sleep can start well after 0.2 s.
    wait_for(lambda: len(process_group(pid, pid)) == 2, 10)
    run: Any = {"id": "w_v1", "pid": pid, "pgid": pid, "sid": pid, "status": "running",
                "starttime": process_starttime(pid)}  # fmt: skip
    try:
        reply = ProcessLauncher().stop(str(tmp_path), run, 30, "leader")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, 9)
        wrapper.wait()
    assert reply["shutdown"] == "cut" and len(reply["ended"]) == 2, reply
    assert reply["shutdown_s"] is not None
    assert LEADER_GONE_GRACE <= reply["shutdown_s"] < LEADER_GONE_GRACE + 5, reply
    assert reply["left"] == [] and reply["killed"] == [], reply  # the sleep took the SIGTERM


# ---- launch --replace: the same replace step -------------------------------------------------


def run_record(host: TestHost, run_id: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(
        (host.home / ".deployctl" / "runs" / f"{run_id}.json").read_text()
    )
    return record


def serving(cli: CLI, inv: Path, name: str) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"][
        name
    ]
    return entry


def alpha_serving(hosts: SSHLab, cli: CLI, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """An inventory of alpha and bravo, alpha serving (its launch entry), bravo nothing."""
    inv = inventory(hosts, tmp_path, ["alpha", "bravo"])
    code, first, err = launch_json(cli, inv, "--template", "baseline", "-H", "alpha")
    assert code == 0, err
    return inv, first["hosts"]["alpha"]


def test_launch_replace_refused_by_preflight_stops_nothing(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, old = alpha_serving(hosts, cli, tmp_path)
    # A plan the host refuses whatever runs there: its model folder does not exist.
    code, doc, err = launch_json(
        cli, inv, "--template", "baseline", "-H", "alpha", "--replace",
        "--set", "model_path=/no/such/model",
    )  # fmt: skip
    assert code == 1 and doc["started"] is False and doc["dry_run"] is False, err
    entry = doc["hosts"]["alpha"]
    assert entry["ok"] is False and entry["code"] == "preflight"
    assert "/no/such/model does not exist on alpha" in entry["preflight"]["problems"]
    assert "stopped" not in entry
    assert running(old["pid"])
    # A host with nothing alive is checked in full: bravo's GPUs are taken, so alpha's live
    # run is not stopped for a launch that could not start on bravo.
    hosts.hosts["bravo"].set_gpus("busy", 2)
    code, doc, err = launch_json(cli, inv, "--template", "baseline", "--replace")
    assert code == 1 and doc["started"] is False, err
    assert "not clean" in doc["hosts"]["bravo"]["error"]
    assert doc["hosts"]["alpha"]["preflight"]["ready"] is True
    assert running(old["pid"])
    status = serving(cli, inv, "alpha")
    assert status["run"] == old["run"] and status["ready"] is True
    cli("stop", "-i", str(inv))


def test_launch_replace_replaces_a_live_run_and_starts_where_none_lives(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, old = alpha_serving(hosts, cli, tmp_path)
    # A dry run is the check --replace makes first: alpha's live run is no refusal; it stops
    # nothing.
    code, doc, err = launch_json(cli, inv, "--template", "baseline", "--replace", "--dry-run")
    assert code == 0 and doc["dry_run"] is True and doc["started"] is False, err
    assert "stopped" not in doc["hosts"]["alpha"] and running(old["pid"])
    code, doc, err = launch_json(cli, inv, "--template", "baseline", "--replace")
    assert code == 0, err
    alpha, bravo = doc["hosts"]["alpha"], doc["hosts"]["bravo"]
    assert alpha["state"] == "ready" and alpha["run"] == "baseline_v2"
    assert alpha["stopped"]["run"] == old["run"] and old["pid"] in alpha["stopped"]["ended"]
    assert not running(old["pid"])
    assert bravo["state"] == "ready" and bravo["run"] == "baseline_v1"
    assert "stopped" not in bravo  # nothing lived there: nothing was stopped
    # The new run says which run it replaced; a first run replaced none.
    assert run_record(hosts.hosts["alpha"], "baseline_v2")["restart_of"] == old["run"]
    assert run_record(hosts.hosts["bravo"], "baseline_v1")["restart_of"] is None
    # For people: the stop, then the run that took its place.
    human = cli("launch", "-i", str(inv), "--template", "baseline", "--replace", "-H", "bravo")
    assert human.returncode == 0, human.stderr
    assert "bravo: stopped baseline_v1" in human.stdout
    assert "bravo: baseline_v2" in human.stdout and "ready in" in human.stdout
    cli("stop", "-i", str(inv))


def test_launch_replace_one_host_failing_its_stop_keeps_only_it_from_relaunching(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha", "bravo"])
    code, first, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    # bravo's run records cannot be written: its stop fails before it signals anything (the
    # check made before any stop only reads them).
    runs_dir = hosts.hosts["bravo"].home / ".deployctl" / "runs"
    runs_dir.chmod(0o555)
    try:
        code, doc, err = launch_json(cli, inv, "--template", "baseline", "--replace")
    finally:
        runs_dir.chmod(0o700)
    assert code == 1 and doc["started"] is True, err
    alpha, bravo = doc["hosts"]["alpha"], doc["hosts"]["bravo"]
    assert alpha["ok"] is True and alpha["state"] == "ready" and alpha["run"] == "baseline_v2"
    assert not running(first["hosts"]["alpha"]["pid"])
    assert bravo["ok"] is False and bravo["stopped"]["ok"] is False
    assert bravo["error"].startswith("could not stop its run"), bravo
    assert "run" not in bravo  # not started
    assert running(first["hosts"]["bravo"]["pid"])  # what it served still serves
    assert serving(cli, inv, "bravo")["run"] == "baseline_v1"
    cli("stop", "-i", str(inv))
