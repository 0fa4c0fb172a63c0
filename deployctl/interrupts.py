"""Ctrl-C ends a command within `GRACE_S`, whatever its worker threads are doing.

The first Ctrl-C raises KeyboardInterrupt in the main thread, as Python's own handler does,
and starts a timer: a command still running when it fires (a clean-up that waits on a host, a
thread that holds what the main thread needs) ends there with status 130 and says so. What
was already started on hosts keeps running, as after any Ctrl-C. A command that takes charge
of the interrupt (it stops its jobs at a safe point and puts back what it changed: see
`ops/driver.py`) stops the timer; its next Ctrl-C starts it again.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterable
from concurrent.futures import Future, wait
from types import FrameType
from typing import Any

GRACE_S = 2.0
# How long a thread waiting on workers sleeps at most before it looks again. The kernel may
# hand a process's SIGINT to any of its threads; Python then runs the handler in the main
# thread only once that thread runs again, which a wait without a timeout never does.
POLL_S = 0.25
EXIT_CODE = 130
MESSAGE = (
    "interrupted: what was already started on hosts keeps running (deployctl status shows it)\n"
)

_timer: list[threading.Timer] = []
_said = threading.Event()


def wait_all(futures: Iterable[Future[Any]]) -> None:
    """Wait until every future is done, waking every POLL_S so Ctrl-C gets through."""
    pending = list(futures)
    while pending:
        pending = list(wait(pending, timeout=POLL_S).not_done)


def install() -> None:
    """Handle Ctrl-C as above in this process (call from the main thread)."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a background job's stays ignored
        signal.signal(signal.SIGINT, _on_interrupt)


def take_charge() -> None:
    """The command handles this Ctrl-C itself and ends when it is safe: no forced end."""
    while _timer:
        _timer.pop().cancel()


def say_interrupted() -> int:
    """Tell the user (once) that the command was interrupted; return its exit status."""
    if not _said.is_set():
        _said.set()
        sys.stderr.write(MESSAGE)
    return EXIT_CODE


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    if not _timer:
        timer = threading.Timer(GRACE_S, _end_now)
        timer.daemon = True
        _timer.append(timer)
        timer.start()
    raise KeyboardInterrupt


def _end_now() -> None:
    try:
        say_interrupted()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(EXIT_CODE)
