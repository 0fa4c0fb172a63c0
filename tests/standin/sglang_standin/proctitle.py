"""Process titles, the way setproctitle does it: rewrite the argv area that
/proc/<pid>/cmdline shows, and set comm (15 characters) with prctl."""

from __future__ import annotations

import contextlib
import ctypes

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1


def prctl(option: int, arg: int | bytes) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def set_process_title(title: str) -> None:
    """Make ``ps -o args`` show exactly ``title`` and ``ps -o comm`` its first 15 bytes."""
    prctl(PR_SET_NAME, title.encode()[:15])
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Fields after "(comm)": index 0 is field 3; arg_start/arg_end are 48/49.
        fields = stat[stat.rindex(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])
    except (OSError, ValueError, IndexError):
        return
    size = end - start
    if start == 0 or size <= 1:
        return
    raw = title.encode()[: size - 1]
    ctypes.memmove(start, raw + b"\0" * (size - len(raw)), size)
