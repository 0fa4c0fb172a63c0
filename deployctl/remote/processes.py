"""The process launcher's host side: a run is a process group started here (its own
session), found through /proc, ended by signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import cast

from .files import state_path, write_json
from .protocol import (
    JobInfo,
    JobRef,
    LeaderIdentity,
    LiveRunOrigin,
    PollArgs,
    RunRecord,
    StartArgs,
    StopReply,
)


def stat_fields(pid: int | str) -> list[bytes] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, session, …]; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def process_starttime(pid: int) -> int | None:
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])


def process_group(pgid: int, sid: int) -> list[int]:
    """PIDs whose process group and session are the run's (never anyone else's)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields and int(fields[2]) == pgid and int(fields[3]) == sid and fields[0] != b"Z":
            members.append(int(entry))
    return sorted(members)


def run_members(run: PollArgs | RunRecord) -> list[int]:
    """The run's live processes; none when its leader's PID now names another process.

    While any process of the run is left, Linux does not give its group id (the leader's
    PID) to a new process; so a process with that PID and another start time means the
    whole run is gone, and what shares that group now belongs to someone else.
    """
    recorded = run.get("starttime")
    if recorded is not None:
        now = process_starttime(run["pgid"])
        if now is not None and now != recorded:
            return []
    return process_group(run["pgid"], run["sid"])


class ProcessWatch:
    """One poll's look at a process run: its group's members, at its `bind_host`."""

    def __init__(self, args: PollArgs) -> None:
        self.args = args
        self.job: JobInfo | None = None

    def look(self) -> tuple[list[int], bool, str, bool]:
        """Its members, whether it lives, where it answers, whether it may serve now."""
        members = run_members(self.args)
        return members, bool(members), self.args["bind_host"], bool(members)

    def end(self) -> None:
        """Nothing to keep: the processes are the record."""


class ProcessLauncher:
    """Servers as process groups on this host (`launcher: ssh`): registered last, it owns
    every run, start and poll no other launcher claims."""

    def owns_run(self, run: RunRecord) -> bool:
        return True

    def job_ref(self, state_dir: str, run: RunRecord) -> JobRef | None:
        return None

    def owns_start(self, args: StartArgs) -> bool:
        return True

    def owns_poll(self, args: PollArgs) -> bool:
        return True

    def facts(self) -> dict[str, object]:
        return {}

    def start(self, args: StartArgs, run_id: str, log_path: str, log_fd: int) -> RunRecord:
        """Start the command detached in its own session, logging to `log_fd`."""
        proc = subprocess.Popen(
            ["/bin/sh", "-c", "exec " + args["command"]],
            stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, cwd=os.path.expanduser("~"),
            env={**os.environ, **args["env"]},
        )  # fmt: skip
        os.close(log_fd)
        identity: LeaderIdentity = {}
        starttime = process_starttime(proc.pid)
        if starttime is not None:
            identity["starttime"] = starttime
        return cast(RunRecord, {
            **args["run"],
            **identity,
            "id": run_id,
            "log": log_path,
            "pid": proc.pid,
            "pgid": proc.pid,
            "sid": proc.pid,
            "started_at": time.time(),
            "status": "running",
        })  # fmt: skip

    def watch(self, args: PollArgs) -> ProcessWatch:
        return ProcessWatch(args)

    def liveness(self, run: RunRecord) -> tuple[list[int], bool, LiveRunOrigin]:
        """Its members, whether it lives, and what a live run says besides (nothing)."""
        members = run_members(run)
        return members, bool(members), {}

    def stop(self, state_dir: str, run: RunRecord, timeout: float) -> StopReply:
        """SIGTERM the run's process group, SIGKILL what is left after the timeout."""
        members = run_members(run)
        killed: list[int] = []
        record = state_path(state_dir, "runs", run["id"] + ".json")
        if members and run["status"] == "running":
            run = cast(RunRecord, dict(run, stop_requested_at=time.time()))
            write_json(record, run)
        if members:
            os.killpg(run["pgid"], signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while run_members(run) and time.monotonic() < deadline:
                time.sleep(0.05)
            killed = run_members(run)
            if killed:
                os.killpg(run["pgid"], signal.SIGKILL)
                while run_members(run) and time.monotonic() < deadline + 10:
                    time.sleep(0.05)
        if run["status"] == "running":
            run = cast(RunRecord, dict(run, status="stopped", stopped_at=time.time()))
            write_json(record, run)
        left = run_members(run)
        return {"run": run, "ended": members, "killed": killed, "left": left, "job": None}
