"""A third launcher, as a test double: its servers are plain subprocesses of this process,
each known by a handle `unit-N` (a systemd unit's name, say), never by a pid. It is added
through the seam alone — `register` on the client side (deployctl/launchers/) and on the host
side (deployctl/remote/launchers.py) — and the agent's calls are answered in this process
(`answer_in_process`), where the host side's registry is this process's."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from deployctl import agent
from deployctl import launchers as client_launchers
from deployctl.choices import LAUNCH_KINDS
from deployctl.facts import ProbeOutput, run_probes
from deployctl.launchers.base import Launcher
from deployctl.remote import launchers as host_launchers
from deployctl.remote.files import read_json, state_path, write_json
from deployctl.remote.handlers import handle
from deployctl.remote.protocol import (
    LiveRunOrigin,
    Placement,
    PlacementRef,
    PollArgs,
    RunRecord,
    StartArgs,
    StopReply,
)
from deployctl.remote.wire import placement_ref

KIND = "unit"
REPO = Path(__file__).resolve().parent.parent


class UnitLauncher(Launcher):
    """The client side: a server on the host, placed as a unit; every other verb the base's."""

    kind = KIND
    placements_title = "units"
    placement_word = "unit"

    def words(self, placed: Placement | None) -> str:
        return "" if placed is None else f"unit {placed['id']} {placed['state']}"


def unit(name: str, state: str, head: str, exit_code: str = "") -> Placement:
    return {"id": name, "state": state, "reason": "", "nodes": [], "head": head,
            "time_left": None, "exit_code": exit_code}  # fmt: skip


class UnitWatch:
    def __init__(self, units: UnitHostLauncher, args: PollArgs) -> None:
        self.units, self.args = units, args
        self.placement: Placement | None = None

    def look(self) -> tuple[list[int], bool, str, bool]:
        self.placement = self.units.state(self.args["placement"]["id"])
        alive = self.placement["state"] == "active"
        return [], alive, self.args["bind_host"], alive

    def end(self) -> None:
        """Nothing kept: the units are the record."""


class UnitHostLauncher:
    """The host side: each unit a subprocess in a session of its own, by its name."""

    kind = KIND

    def __init__(self) -> None:
        self.units: dict[str, subprocess.Popen[bytes]] = {}
        self.heads: dict[str, str] = {}  # where each unit's server answers: its bind_host
        self.numbers = itertools.count(1)

    def state(self, name: str) -> Placement:
        proc, head = self.units.get(name), self.heads.get(name, "")
        if proc is None:
            return unit(name, "unknown", head)
        code = proc.poll()
        return (
            unit(name, "active", head)
            if code is None
            else unit(name, "inactive", head, f"{code}:0")
        )

    def placement_ref(self, state_dir: str, run: RunRecord) -> PlacementRef | None:
        return placement_ref(self.kind, state_dir, run, run["job"])

    def facts(self) -> dict[str, str | None]:
        return {}

    def start(self, args: StartArgs, run_id: str, log_path: str, log_fd: int) -> RunRecord:
        name = f"unit-{next(self.numbers)}"
        env = {**os.environ, **args["env"], "PYTHONPATH": str(REPO)}
        self.units[name] = subprocess.Popen(
            ["/bin/sh", "-c", "exec " + args["command"]], stdin=subprocess.DEVNULL,
            stdout=log_fd, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO, env=env,
        )  # fmt: skip
        os.close(log_fd)
        self.heads[name] = args["run"]["bind_host"]
        return cast(RunRecord, {
            **args["run"], "id": run_id, "log": log_path, "pid": 0, "pgid": 0, "sid": 0,
            "started_at": time.time(), "status": "running", "job": self.state(name),
        })  # fmt: skip

    def watch(self, args: PollArgs) -> UnitWatch:
        return UnitWatch(self, args)

    def liveness(self, run: RunRecord) -> tuple[list[int], bool, LiveRunOrigin]:
        placed = self.state(run["job"]["id"])
        return [], placed["state"] == "active", {"placement": placed["id"]}

    def stop(self, state_dir: str, run: RunRecord, timeout: float, first_signal: str) -> StopReply:
        proc = self.units[run["job"]["id"]]
        ran = proc.poll() is None
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        path = state_path(state_dir, "runs", run["id"] + ".json")
        placed = self.state(run["job"]["id"])
        run = cast(RunRecord, dict(read_json(path) or run, status="stopped", job=placed))
        write_json(path, run, mode=0o600)
        return {"run": run, "ended": [], "killed": [], "left": [], "placement": placed,
                "shutdown": "drained" if ran else None, "shutdown_s": 0.0}  # fmt: skip

    def end_all(self) -> None:
        for proc in self.units.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


def answer_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's calls answered by its handlers in this process (JSON both ways, the reply
    checked against its type as a host's is), so a launcher registered here is the host's."""

    def answer(host: Any, spec: Any, args: Mapping[str, Any], stdin: bytes | None) -> Any:
        reply = handle(spec.name, json.loads(json.dumps(args)), stdin)
        return agent.check_reply(host, spec.name, json.loads(json.dumps(reply)), "", spec.reply)

    def call(host: Any, conn: Any, spec: Any, args: Any, stdin: bytes | None = None,
             timeout: float | None = None) -> Any:  # fmt: skip
        return answer(host, spec, args, stdin)

    def call_beside(
        host: Any, conn: Any, probes: Mapping[str, str], spec: Any, args: Any
    ) -> tuple[dict[str, ProbeOutput], Any]:
        return run_probes(conn, probes, purpose=spec.purpose), answer(host, spec, args, None)

    monkeypatch.setattr(agent, "call", call)
    monkeypatch.setattr(agent, "call_beside", call_beside)


@contextlib.contextmanager
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[UnitHostLauncher]:
    """The unit launcher registered on both sides for the test's time; its units ended after."""
    monkeypatch.setattr(client_launchers, "LAUNCHERS", dict(client_launchers.LAUNCHERS))
    monkeypatch.setattr(host_launchers, "LAUNCHERS", dict(host_launchers.LAUNCHERS))
    kinds = list(LAUNCH_KINDS)
    host = UnitHostLauncher()
    client_launchers.register(UnitLauncher())
    host_launchers.register(host)
    try:
        yield host
    finally:
        host.end_all()
        LAUNCH_KINDS[:] = kinds
