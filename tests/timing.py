"""Wall-clock bounds that hold on a loaded machine: a run measured beside a reference run."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def side_by_side(*runs: Callable[[], T]) -> list[tuple[T, float]]:
    """Run each at the same time; return each one's result and how long it took. A loaded
    machine stretches them alike, so a bound on the difference holds where one on a single
    wall time does not."""

    def timed(run: Callable[[], T]) -> tuple[T, float]:
        started = time.monotonic()
        value = run()
        return value, time.monotonic() - started

    with ThreadPoolExecutor(len(runs)) as pool:
        return [future.result() for future in [pool.submit(timed, run) for run in runs]]
