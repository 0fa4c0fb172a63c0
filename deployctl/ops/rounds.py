"""The one status-rounds loop, of `top`, `watch`, the dashboard's collector and canary, and
`top`'s metric rounds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from deployctl.crash import Catalog
from deployctl.fanout import Fleet, FleetResult
from deployctl.ops.runs import RunStatus, run_status

T = TypeVar("T")

TOP_TAIL_BYTES = 16 * 1024


# A round of a front end that polls waits this long at least for a host's answer (else its
# interval): a host still at work then is shown as not answering, and the others go on.
ROUND_ANSWER_MIN = 2.0


def answer_within(interval: float) -> float:
    """How long a polling round waits for its slowest host (Fleet.poll's `answer_within`)."""
    return max(interval, ROUND_ANSWER_MIN)


def metrics_round(
    fleet: Fleet,
    catalog: Catalog,
    tail_bytes: int = TOP_TAIL_BYTES,
    within: float | None = None,
) -> FleetResult[RunStatus]:
    """Every deployment's status with metrics, over the fleet's open connections (a host
    that dropped its connection keeps its error and is reconnected with backoff; one still
    at work after `within` seconds is shown as not answering: Fleet.poll)."""
    return fleet.poll(
        lambda host, conn: run_status(host, conn, catalog, metrics=True, tail_bytes=tail_bytes),
        answer_within=within,
    )


def status_rounds(
    step: Callable[[], T],
    interval: float,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    stop: threading.Event | None = None,
    pace: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[T]:
    """`step`'s result every `interval` seconds (less the round's own time when `pace`),
    `rounds` times (None: until stopped). The one status-rounds loop: `top`, `watch`, the
    dashboard's collector, canary and `tune --live`. `stop` ends the rounds, also in the
    middle of a wait."""
    done = 0
    while (rounds is None or done < rounds) and not (stop is not None and stop.is_set()):
        started = clock()
        result = step()
        done += 1
        yield result
        if rounds is None or done < rounds:
            left = max(0.0, interval - (clock() - started)) if pace else interval
            if stop is not None:
                stop.wait(left)
            else:
                sleep(left)


def metrics_rounds(
    fleet: Fleet,
    catalog: Catalog,
    interval: float,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[FleetResult[RunStatus]]:
    """`top`'s rounds: a metrics round every `interval` seconds; over more than one round,
    through one kept agent per host (agent.KeptAgent)."""
    if rounds != 1:
        fleet.keep_agents()
    within = answer_within(interval)
    return status_rounds(
        lambda: metrics_round(fleet, catalog, within=within), interval, rounds, sleep
    )


@dataclass
class WatchEnded:
    """How a streaming command (`watch`, `top`, the dashboard) ended; its events were shown
    as they came. Not ok when watch gave up on every deployment it watched."""

    ok: bool = True
