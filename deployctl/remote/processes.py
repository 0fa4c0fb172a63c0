"""The process launcher's host side: a run is a process group started here (its own
session), found through /proc, ended by signals."""

from __future__ import annotations

import os
import time

from .files import marked_stopping, state_path, write_json
from .lean import SIGKILL, SIGTERM
from .wire import FIRST_SIGNAL_GROUP, FIRST_SIGNAL_LEADER, SHUTDOWN_CUT, SHUTDOWN_DRAINED

TYPE_CHECKING = False  # the types for the checker only (files.py says why)
if TYPE_CHECKING:
    from collections.abc import Callable

    from .protocol import (
        LeaderIdentity,
        LiveRunOrigin,
        Placement,
        PlacementRef,
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


def in_group(pid: int | str, pgid: int, sid: int) -> bool:
    """Is PID a process of the group and session (a zombie is gone, whatever its parent does)?

    Its group is asked of the kernel first (getpgid: one system call); only a process of the
    group has its /proc/PID/stat read (and formatted by the kernel) for its session and state,
    and its group again (the PID may have been reused in between). A host runs hundreds to
    thousands of processes, and a status, a poll and a stop's waits each look at all of them."""
    try:
        if os.getpgid(int(pid)) != pgid:
            return False
    except OSError:  # gone
        return False
    fields = stat_fields(pid)
    return (
        fields is not None and fields[0] != b"Z" and (int(fields[2]), int(fields[3])) == (pgid, sid)
    )


def process_group(pgid: int, sid: int) -> list[int]:
    """PIDs whose process group and session are the run's (never anyone else's)."""
    return sorted(
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and in_group(entry, pgid, sid)
    )


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


def members_left(run: RunRecord, known: list[int]) -> list[int]:
    """The run's members now, for a wait that looks every 50 ms: those of `known` still in
    its group, each read alone; all of /proc only when none of them is left (one may have
    started another process meanwhile). A host runs thousands of processes: a stop's drain
    no longer reads each one's /proc entry twenty times a second."""
    left = [pid for pid in known if in_group(pid, run["pgid"], run["sid"])]
    return left or run_members(run)


class ProcessWatch:
    """One poll's look at a process run: its group's members, at its `bind_host`."""

    def __init__(self, args: PollArgs) -> None:
        self.args = args
        self.placement: Placement | None = None

    def look(self) -> tuple[list[int], bool, str, bool]:
        """Its members, whether it lives, where it answers, whether it may serve now."""
        members = run_members(self.args)
        return members, bool(members), self.args["bind_host"], bool(members)

    def end(self) -> None:
        """Nothing to keep: the processes are the record."""


class ProcessLauncher:
    """Servers as process groups on this host (`launcher: ssh`): the default launcher, of
    every record that names no other and every poll that names no placement."""

    kind = "ssh"

    def placement_ref(self, state_dir: str, run: RunRecord) -> PlacementRef | None:
        return None

    def facts(self) -> dict[str, str | None]:
        return {}

    def start(self, args: StartArgs, run_id: str, log_path: str, log_fd: int) -> RunRecord:
        """Start the command detached in its own session, logging to `log_fd`."""
        import subprocess  # only a start needs it: ~12 ms of a call's start

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
        # No stop marks, no placement: a new process run's record has none of them.
        record: RunRecord = {
            **args["run"],
            **identity,  # type: ignore[typeddict-item]
            "id": run_id,
            "log": log_path,
            "pid": proc.pid,
            "pgid": proc.pid,
            "sid": proc.pid,
            "started_at": time.time(),
            "status": "running",
        }  # fmt: skip
        return record

    def watch(self, args: PollArgs) -> ProcessWatch:
        return ProcessWatch(args)

    def liveness(self, run: RunRecord) -> tuple[list[int], bool, LiveRunOrigin]:
        """Its members, whether it lives, and what a live run says besides (nothing)."""
        members = run_members(run)
        return members, bool(members), {}

    def stop(self, state_dir: str, run: RunRecord, timeout: float, first_signal: str) -> StopReply:
        """SIGTERM the run's main process (or, `first_signal` none, nothing) and wait up to
        `timeout` for the group to end by itself; then SIGTERM the group, and SIGKILL what
        is left a little later."""
        members = run_members(run)
        killed: list[int] = []
        shutdown, shutdown_s = None, None
        record = state_path(state_dir, "runs", run["id"] + ".json")
        if members and run["status"] == "running":
            run = marked_stopping(run, timeout)
            write_json(record, run)
        if members:
            began = time.monotonic()
            drained = first_signal != FIRST_SIGNAL_GROUP and drain_group(
                run, timeout, first_signal == FIRST_SIGNAL_LEADER
            )
            shutdown = SHUTDOWN_DRAINED if drained else SHUTDOWN_CUT
            if not drained:
                killed = cut_group(run, min(CUT_GRACE, timeout))
            shutdown_s = round(time.monotonic() - began, 3)
        if run["status"] == "running":
            run = {**run, "status": "stopped", "stopped_at": time.time()}
            write_json(record, run)
        left = run_members(run)
        return {
            "run": run, "ended": members, "killed": killed, "left": left, "placement": None,
            "shutdown": shutdown, "shutdown_s": shutdown_s,
        }  # fmt: skip


# After the drain's timeout the group gets SIGTERM, and SIGKILL this much later at most (a
# server that died of its schedulers' deaths ends its tree itself: SGLang within ~5 s).
CUT_GRACE = 10.0
# A group whose main process is gone gets this long to follow it before it is cut: SGLang
# SIGKILLs its children just before itself; a wrapper that died of the SIGTERM never ends
# the server under it.
LEADER_GONE_GRACE = 5.0
# /proc/PID/stat's flags: the process is exiting (a SIGKILLed process tearing down its
# memory, which a big one takes a while to do).
PF_EXITING = 0x4


def exiting(pid: int) -> bool:
    """The process is on its way out (dying of a signal already): no signal is needed."""
    fields = stat_fields(pid)
    return fields is None or bool(int(fields[6]) & PF_EXITING)


def signal_if_there(send: Callable[[int, int], None], target: int, signal: int) -> None:
    """`send(target, signal)` (os.kill, os.killpg) unless the target is gone already."""
    try:  # noqa: SIM105 - contextlib's import would cost every status call ~3 ms
        send(target, signal)
    except ProcessLookupError:
        pass


def drain_group(run: RunRecord, timeout: float, signal_leader: bool) -> bool:
    """SIGTERM the run's main process (when asked) and wait up to `timeout` for the whole
    group to end by itself: True when it did."""
    leader = run["pid"]
    if signal_leader and leader in run_members(run):
        signal_if_there(os.kill, leader, SIGTERM)
    deadline = time.monotonic() + timeout
    leader_gone_at: float | None = None
    members = run_members(run)
    while True:
        members = members_left(run, members)
        if not members:
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if leader not in members:
            leader_gone_at = now if leader_gone_at is None else leader_gone_at
            dying = all(exiting(pid) for pid in members)
            if not dying and now >= leader_gone_at + LEADER_GONE_GRACE:
                return False
        time.sleep(0.05)


def cut_group(run: RunRecord, grace: float) -> list[int]:
    """SIGTERM the whole group, SIGKILL what is left after `grace`; the PIDs SIGKILLed."""
    signal_if_there(os.killpg, run["pgid"], SIGTERM)
    deadline = time.monotonic() + grace
    members = run_members(run)
    while members and time.monotonic() < deadline:
        time.sleep(0.05)
        members = members_left(run, members)
    killed = run_members(run)
    if killed:
        signal_if_there(os.killpg, run["pgid"], SIGKILL)
        left = killed
        while left and time.monotonic() < deadline + 10:
            time.sleep(0.05)
            left = members_left(run, left)
    return killed
