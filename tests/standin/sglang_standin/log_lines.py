"""Output: log lines in SGLang's wording.

SGLang logs through `logging` to stderr and uvicorn's access log goes to stdout; each
record is one os.write so lines from the parent and the ranks (sharing one file
description) never tear.
"""

from __future__ import annotations

import contextlib
import os
import time


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


def write(fd: int, text: str) -> None:
    data = text.encode("utf-8", "backslashreplace")
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data) :]


def log(msg: str, prefix: str = "") -> None:
    """Write one SGLang logger record: ``[YYYY-MM-DD HH:MM:SS{ prefix}] msg``."""
    write(2, f"[{_stamp()}{prefix}] {msg}\n")


def uvicorn_log(level: str, msg: str, fd: int = 2) -> None:
    """Write one uvicorn record in the format SGLang configures for it."""
    write(fd, f"[{_stamp()}] {(level + ':').ljust(9)} {msg}\n")


# The shutdown lines (TokenizerManager's SignalHandler and sigterm_watchdog, http_server's
# health_generate, SubprocessWatchdog, utils' kill_process_tree; the same in 0.5.17 and
# 0.5.23).  The SIGTERM and SIGQUIT handlers are added through the event loop, which calls
# them without arguments: SGLang prints signum and frame as None.
SIGTERM_LINE = "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
SIGQUIT_LINE = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
SHUTDOWN_HEALTH_LINE = "Health check request received during shutdown. Returning 503."


def drain_line(rids: list[str]) -> str:
    """sigterm_watchdog's look at the requests left."""
    return (
        f"Gracefully exiting... Remaining number of requests {len(rids)}. "
        f"Remaining requests remaining_rids={rids!r}."
    )


def child_crashed_line(name: str, pid: int, code: int) -> str:
    """SubprocessWatchdog's line for a child that exited non-zero."""
    return (
        f"Subprocess {name} (pid={pid}) crashed with exit code {code}. "
        "Triggering SIGQUIT for cleanup..."
    )


def scheduler_exit_line(pid: int, code: int) -> str:
    """A node > 0's block_until_scheduler_exits, for each scheduler that ended."""
    return f"Scheduler or DataParallelController {pid} terminated with {code}"


def reconnect_line(addr: str) -> str:
    """A decode's heartbeat that found its prefill's bootstrap server gone."""
    return f"Attempting to reconnect to {addr}..."


def lost_prefill_line(addr: str, affected: int) -> str:
    """_handle_node_failure: the decode forgets the prefill after the heartbeat's failures."""
    return (
        f"Lost connection with prefill instance (bootstrap_addr: {addr}), "
        f"{affected} requests affected"
    )


def kill_tree_line(pid: int, include_parent: bool) -> str:
    return f"kill_process_tree called: parent_pid={pid}, include_parent={include_parent}, pid={pid}"
