"""Work that Ctrl-C can stop: jobs run in worker threads while the caller's thread waits in
short steps (so Ctrl-C reaches it). The first Ctrl-C sets `cancel` (each job stops at its
next safe point and puts back what it changed) and waits for the jobs; a second Ctrl-C
leaves at once, leaving the hosts as they are. Rollout and tune drive their units with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

from deployctl import interrupts

T = TypeVar("T")


@dataclass
class Driven(Generic[T]):
    """Each job's future, in the order given; `interrupted`: Ctrl-C set `cancel`."""

    futures: list[Future[T]]
    interrupted: bool


def drive(
    jobs: Sequence[Callable[[], T]],
    workers: int,
    cancel: threading.Event,
    on_interrupt: Callable[[], None] = lambda: None,
) -> Driven[T]:
    """Run `jobs`, `workers` at a time, until all are done or Ctrl-C is pressed twice.

    The threads are daemons, not an executor's: nothing joins them when a second Ctrl-C
    ends the program (an executor's workers are joined at exit, which waits for a start).
    """
    futures: list[Future[T]] = [Future() for _ in jobs]
    slots = threading.Semaphore(max(1, workers))

    def run(job: Callable[[], T], future: Future[T]) -> None:
        with slots:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(job())
            except BaseException as exc:  # the caller reads it from the future
                future.set_exception(exc)

    threads = [
        threading.Thread(target=run, args=(job, future), daemon=True)
        for job, future in zip(jobs, futures, strict=True)
    ]
    interrupted = False
    try:
        for thread in threads:
            thread.start()
        interrupts.wait_all(futures)
    except KeyboardInterrupt:
        interrupted = True
        interrupts.take_charge()  # the jobs put back what they changed: no forced end
        cancel.set()
        # A Ctrl-C while the jobs were being started: the rest start too, and see `cancel`.
        for thread in threads:
            if thread.ident is None:
                thread.start()
        on_interrupt()
        interrupts.wait_all(futures)  # a second Ctrl-C leaves from here
    return Driven(futures, interrupted)
