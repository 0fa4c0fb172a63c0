"""A polling round (Fleet.poll with answer_within): a slow host never holds the others back,
its late answer is not lost, and the first round waits for everyone. Local hosts, no SSH:
the operation itself is slow or quick."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from deployctl.connection import Connection, ConnectOptions
from deployctl.deployments import deployment_targets
from deployctl.errors import CommandTimeoutError
from deployctl.fanout import Fleet
from deployctl.inventory import Host, load_inventory


def local_hosts(tmp_path: Path, names: list[str]) -> list[Host]:
    lines = ["all:", "  hosts:"] + [f"    {n}: {{ansible_connection: local}}" for n in names]
    path = tmp_path / "inv.yml"
    path.write_text("\n".join(lines) + "\n")
    return load_inventory(path).select(None)


def test_a_slow_host_is_shown_waiting_the_others_on_time_and_its_late_answer_stands(
    tmp_path: Path,
) -> None:
    release = threading.Event()
    calls: dict[str, int] = {"fast": 0, "slow": 0}

    def read(host: Host, conn: Connection) -> str:
        calls[host.name] += 1
        if host.name == "slow" and calls["slow"] == 2:  # hangs in its second round
            release.wait(10)
            return "late"
        return f"{host.name} {calls[host.name]}"

    with Fleet(local_hosts(tmp_path, ["fast", "slow"]), ConnectOptions(), forks=4) as fleet:
        first = fleet.poll(read, answer_within=0.2)
        assert [r.value for r in first] == ["fast 1", "slow 1"]
        began = time.monotonic()
        second = {r.name: r for r in fleet.poll(read, answer_within=0.2)}
        took = time.monotonic() - began
        assert took < 2, f"took {took:.2f}s, bound 2s (not the 10 s the slow host takes)"
        assert second["fast"].value == "fast 2"
        assert isinstance(second["slow"].exception, CommandTimeoutError)
        assert "still running" in str(second["slow"].exception)
        third = {r.name: r for r in fleet.poll(read, answer_within=0.2)}
        assert third["fast"].value == "fast 3" and third["slow"].failed  # not asked again
        assert calls["slow"] == 2
        release.set()
        time.sleep(0.2)
        fourth = {r.name: r for r in fleet.poll(read, answer_within=0.2)}
        assert fourth["slow"].value == "late"  # its late answer, not lost
        fifth = {r.name: r for r in fleet.poll(read, answer_within=0.2)}
        assert fifth["slow"].value == "slow 3" and fifth["fast"].value == "fast 5"


def test_the_first_round_waits_for_every_host(tmp_path: Path) -> None:
    def read(host: Host, conn: Connection) -> str:
        time.sleep(0.5 if host.name == "slow" else 0)  # connecting, starting its agent
        return host.name

    with Fleet(local_hosts(tmp_path, ["fast", "slow"]), ConnectOptions(), forks=4) as fleet:
        first = fleet.poll(read, answer_within=0.1)
        assert [r.value for r in first] == ["fast", "slow"]
        later = {r.name: r for r in fleet.poll(read, answer_within=0.1)}
        assert later["fast"].value == "fast" and later["slow"].failed


def test_deployments_of_one_machine_answer_in_turn_without_being_shown_late(
    tmp_path: Path,
) -> None:
    """A PD pair and its router on one machine: its kept agent answers one call at a time, so
    the third deployment's call starts after the other two (seen on the H200: a real
    prefill's /health runs a 1-token prefill, and the decode was shown not answering every
    round). The round waits a window for each call queued on one machine."""
    path = tmp_path / "inv.yml"
    path.write_text(
        "all:\n  hosts:\n    box:\n      ansible_connection: local\n      deployments:\n"
        "        router: {port: 1}\n        prefill: {port: 2}\n        decode: {port: 3}\n"
    )
    hosts = deployment_targets(load_inventory(path).select(None))
    assert {h.name for h in hosts} == {"box"} and len(hosts) == 3

    def read(host: Host, conn: Connection) -> str:
        with conn.kept_lock:  # one call at a time on the machine, as its kept agent answers
            time.sleep(0.3)
        return host.label

    with Fleet(hosts, ConnectOptions(), forks=4) as fleet:
        fleet.poll(read, answer_within=0.5)
        later = list(fleet.poll(read, answer_within=0.5))
    late = [r.name for r in later if r.failed]
    assert late == [], f"shown not answering: {late} (each call 0.3 s, in turn; window 0.5 s)"
