"""A run as a process group on this host: its members, found through /proc."""

from __future__ import annotations

import os

from .protocol import PollArgs, RunRecord


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
