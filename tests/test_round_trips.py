"""Round trips as a tested property: how many remote commands each read costs per host.

Over real sshd hosts, through the library layer (Fleet + ops), counting with
Connection.round_trips: gpus, status and patch audit cost one remote command per host, whatever
the host answers; a launch preflight costs one, two only when a stale lock must be broken. The
host agent is sent to a host once (per deployctl version): the first agent call there costs
three round trips (the miss, the copy, the call), every later one a single round trip.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from deployctl.agent import install_agent
from deployctl.connection import ConnectOptions
from deployctl.crash import load_catalog
from deployctl.fanout import Fleet
from deployctl.inventory import Host, load_inventory
from deployctl.ops.gpus import check_gpus
from deployctl.ops.patch import audit_host
from deployctl.ops.plan import plan_launch
from deployctl.ops.preflight import release_lock, run_preflight
from deployctl.ops.runs import run_status
from deployctl.patchset import load_patch_sets
from deployctl.project import SHIPPED_DATA, Project
from tests.sglang_wheel import SGLANG_VERSION, install_on
from tests.sshd_hosts import SSHLab, sh
from tests.test_lifecycle import prepare

NAMES = ["alpha", "bravo", "charlie"]


def fleet_hosts(lab: SSHLab, tmp_path: Path, host_vars: dict[str, dict[str, object]]) -> list[Host]:
    inventory = lab.inventory(tmp_path / "inv.yml", list(host_vars), host_vars)
    return load_inventory(inventory).select(None)


def test_gpus_status_and_audit_cost_one_round_trip_per_host(
    hosts: SSHLab, sglang_template: Path, tmp_path: Path
) -> None:
    # alpha and bravo have SGLang, charlie has none: an error answer must not cost more.
    hosts.hosts["bravo"].set_gpus("busy", 2)
    host_vars: dict[str, dict[str, object]] = {
        "alpha": {"python": install_on(hosts.hosts["alpha"], sglang_template)},
        "bravo": {"python": install_on(hosts.hosts["bravo"], sglang_template)},
        "charlie": {"patches": ["spec-disable"]},
    }
    selected = fleet_hosts(hosts, tmp_path, host_vars)
    sets = load_patch_sets([SHIPPED_DATA / "patches"])
    catalog = load_catalog()
    one_each = dict.fromkeys(NAMES, 1)

    with Fleet(selected, ConnectOptions(), forks=3) as fleet:
        gpus = {r.name: r for r in fleet.run(check_gpus)}
        assert fleet.round_trips() == one_each
    assert gpus["alpha"].value is not None and gpus["alpha"].value.clean
    assert gpus["bravo"].value is not None and gpus["bravo"].value.pids == [419]

    with Fleet(selected, ConnectOptions(), forks=3) as fleet:
        first = fleet.run(lambda host, conn: run_status(host, conn, catalog))
        assert fleet.round_trips() == dict.fromkeys(NAMES, 3)
    assert first.ok and not first.failed

    with Fleet(selected, ConnectOptions(), forks=3) as fleet:
        status = fleet.run(lambda host, conn: run_status(host, conn, catalog))
        assert fleet.round_trips() == one_each
    for result in status:
        assert result.value is not None and result.value.run is None, result.error
        assert result.value.gpus is not None

    with Fleet(selected, ConnectOptions(), forks=3) as fleet:
        audit = {
            r.name: r
            for r in fleet.run(lambda host, conn: audit_host(host, conn, sets, ["spec-disable"]))
        }
        assert fleet.round_trips() == one_each
    for name in ("alpha", "bravo"):
        report = audit[name].value
        assert report is not None and report.sglang_version == SGLANG_VERSION, audit[name].error
        assert report.states["spec-disable"].state == "missing"
    assert audit["charlie"].value is None
    assert "SGLang is not installed" in (audit["charlie"].error or "")


def write_stale_lock(lab: SSHLab, name: str) -> None:
    """A lock left six hours ago by a deployctl that is gone."""
    host = lab.hosts[name]
    lock = host.home / ".deployctl" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = {"host": socket.gethostname(), "pid": 1 << 22, "user": "root", "op": "launch"}
    lock.write_text(json.dumps(dict(holder, token="stale-token", since=time.time() - 7 * 3600)))
    sh("chown", "-R", f"{host.user}:{host.user}", lock.parent)


def test_launch_preflight_costs_one_round_trip_two_to_break_a_stale_lock(
    hosts: SSHLab, tmp_path: Path
) -> None:
    host_vars = {name: prepare(hosts.hosts[name]) for name in NAMES}
    write_stale_lock(hosts, "charlie")
    selected = fleet_hosts(hosts, tmp_path, host_vars)
    sets = load_patch_sets([SHIPPED_DATA / "patches"])
    plans = {p.host.name: p for p in plan_launch(Project(None), selected, None, None, [], sets)}
    with Fleet(selected, ConnectOptions(), forks=3) as fleet:
        assert not fleet.run(install_agent).failed

    with Fleet(selected, ConnectOptions(), forks=3) as fleet:
        preflights = fleet.run(lambda host, conn: run_preflight(plans[host.name], conn, 16))
        assert fleet.round_trips() == {"alpha": 1, "bravo": 1, "charlie": 2}
        tokens = {}
        for result in preflights:
            assert result.value is not None and result.value.ok, (
                result.error,
                result.value.problems if result.value else None,
            )
            assert result.value.lock_token
            tokens[result.name] = result.value.lock_token
        fleet.run(lambda host, conn: release_lock(plans[host.name], conn, tokens[host.name]))
    assert all(not (hosts.hosts[n].home / ".deployctl" / "lock").exists() for n in NAMES)


def test_a_lock_this_process_lost_track_of_is_broken_one_it_holds_is_respected(
    hosts: SSHLab, tmp_path: Path
) -> None:
    """A launch cut off by a lost connection leaves a lock of this very process that it
    never learnt of (the answer naming it was lost) or could not give back: its next launch
    there breaks it (tune's put-back was refused by one). A lock it holds for a launch under
    way is respected."""
    import os

    alpha = hosts.hosts["alpha"]
    selected = fleet_hosts(hosts, tmp_path, {"alpha": prepare(alpha)})
    sets = load_patch_sets([SHIPPED_DATA / "patches"])
    [plan] = plan_launch(Project(None), selected, None, None, [], sets)
    lock = alpha.home / ".deployctl" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    ours = {"host": socket.gethostname(), "pid": os.getpid(), "user": "root", "op": "launch",
            "expires": time.time() + 3600, "token": "lost-token", "since": time.time()}  # fmt: skip
    lock.write_text(json.dumps(ours))
    sh("chown", "-R", f"{alpha.user}:{alpha.user}", lock.parent)
    with Fleet(selected, ConnectOptions()) as fleet:
        conn = fleet.connection(selected[0])
        taken = run_preflight(plan, conn, 16)
        assert taken.ok and taken.lock_token, taken.problems
        held = run_preflight(plan, conn, 16)  # a second launch meanwhile, as from another thread
        assert not held.ok and held.lock_token is None
        assert (
            f"another deployctl launch is in progress on alpha (pid {os.getpid()}"
            in (held.problems[0])
        )
        release_lock(plan, conn, taken.lock_token)
    assert not lock.exists()


def test_a_poll_tries_an_unreachable_host_again_only_after_a_backoff(
    hosts: SSHLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """top and watch poll every round; a host that cannot be reached is tried again after
    1, 2, 4 … s (its last failure standing meanwhile), not at every round."""

    from deployctl.connection import SSHConnection

    # Each command sent to a host, whether on its kept connection or a new one: right after
    # sshd is killed, the kept one may not have seen its end yet, and the first try fails on
    # it without connecting again.
    attempts: list[str] = []
    real_exec = SSHConnection._exec

    def counting_exec(
        self: SSHConnection, command: str, stdin: bytes | None, timeout: float, shown: str
    ) -> tuple[int, bytes, bytes]:
        attempts.append(self.name)
        return real_exec(self, command, stdin, timeout, shown)

    monkeypatch.setattr(SSHConnection, "_exec", counting_exec)
    bravo = hosts.hosts["bravo"]
    selected = fleet_hosts(hosts, tmp_path, {"alpha": {}, "bravo": {}})
    now = [0.0]
    try:
        with Fleet(selected, ConnectOptions(), forks=2) as fleet:
            first = fleet.poll(lambda host, conn: conn.run("echo up").stdout, lambda: now[0])
            assert [r.value for r in first] == ["up\n", "up\n"]
            bravo.go_away()  # sshd and our session with it
            tried = []
            for at in (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 8.0):
                now[0] = at
                before = attempts.count("bravo")
                result = {
                    r.name: r
                    for r in fleet.poll(lambda h, c: c.run("echo up").stdout, lambda: now[0])
                }
                tried.append(attempts.count("bravo") > before)
                assert result["alpha"].value == "up\n" and result["bravo"].failed
            # down at 1.0: again at 2.0 (+1), 4.0 (+2), 8.0 (+4)
            assert tried == [True, False, True, False, True, False, True]
            bravo.start()
            now[0] = 16.0
            back = {
                r.name: r for r in fleet.poll(lambda h, c: c.run("echo up").stdout, lambda: now[0])
            }
            assert back["bravo"].value == "up\n"
    finally:
        bravo.ensure_running()
