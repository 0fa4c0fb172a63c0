"""What operations report while they work: typed events, and the sink they go to.

An operation never prints and builds no sentences: it emits events (a wait's progress, a
crash, a restart, a log line, a finished bench level) to the sink its caller gave it. Every
output is just a sink: the terminal's progress line, the log printer, `watch`'s event lines,
JSON lines, and next the dashboard. Each event is plain data; a sink decides how it looks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from deployctl.crash.model import CrashReport


@dataclass(frozen=True, kw_only=True)
class Event:
    """Something that happened to one target (a host, a deployment or a multi-node server)."""

    kind: ClassVar[str] = "event"
    target: str
    at: float = field(default_factory=time.time)


# ---- waiting for a run -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Waiting(Event):
    """A started run is not ready yet; `last_line` is the newest line of its log."""

    kind: ClassVar[str] = "waiting"
    elapsed: float
    last_line: str


@dataclass(frozen=True, kw_only=True)
class ConnectionLost(Event):
    """The connection to a host dropped while it was waited for or followed; retrying."""

    kind: ClassVar[str] = "connection_lost"
    elapsed: float
    error: str


@dataclass(frozen=True, kw_only=True)
class Reconnected(Event):
    """A lost connection is back."""

    kind: ClassVar[str] = "reconnected"
    elapsed: float


@dataclass(frozen=True, kw_only=True)
class WaitEnded(Event):
    """A wait for a run settled: `state` is a RunState value (ready, crashed, timeout…)."""

    kind: ClassVar[str] = "wait_ended"
    run: str
    state: str
    elapsed: float


# ---- supervising runs (watch) ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class HostFailed(Event):
    """A host could not be read or followed; `exception` keeps a bug's traceback."""

    kind: ClassVar[str] = "host_failed"
    exception: BaseException


@dataclass(frozen=True, kw_only=True)
class Restarting(Event):
    """A run crashed (on `down`, for a multi-node server) and is being replaced."""

    kind: ClassVar[str] = "restarting"
    run: str
    signature: str
    attempt: int
    down: list[str]


@dataclass(frozen=True, kw_only=True)
class CrashLoop(Event):
    """A run crashed too often (or the same way twice): it is left down."""

    kind: ClassVar[str] = "crash_loop"
    run: str
    signature: str
    repeated: bool  # the same crash twice in a row, else too many within the window
    crashes: int
    window_s: float


@dataclass(frozen=True, kw_only=True)
class DecodeHeld(Event):
    """A decode fails its health check but is not restarted: a prefill of its router was down
    within the window, and a decode's health fails while its prefill is gone (sglang#12779)."""

    kind: ClassVar[str] = "decode_held"
    run: str
    prefill: str  # the prefill seen down
    down_s: float  # how long ago it was seen down
    window_s: float  # past this after the prefill is back, a decode still failing is restarted


@dataclass(frozen=True, kw_only=True)
class StuckTransfer(Event):
    """A decode has requests waiting for their KV and has sent no token for `stuck_s`."""

    kind: ClassVar[str] = "stuck_transfer"
    run: str
    waiting: int
    stuck_s: float


@dataclass(frozen=True, kw_only=True)
class CanaryProgress(Event):
    """A canary's judge after a round of samples: matched samples, per load bucket the
    control's and the candidate's, and the estimate (candidate / control, > 1 worse)."""

    kind: ClassVar[str] = "canary_progress"
    samples: int
    buckets: dict[str, list[int]]  # bucket -> [control samples, candidate samples]
    estimate: float | None
    low: float | None
    high: float | None
    elapsed_s: float


@dataclass(frozen=True, kw_only=True)
class RaceProgress(Event):
    """Policies raced on live traffic after a round of samples: per load bucket, each
    policy's samples (policies in the race's order)."""

    kind: ClassVar[str] = "race_progress"
    policies: tuple[str, ...]
    buckets: dict[str, list[int]]  # bucket -> samples of each policy
    elapsed_s: float


@dataclass(frozen=True, kw_only=True)
class StopFailed(Event):
    """A run to be replaced could not be stopped; it is not relaunched."""

    kind: ClassVar[str] = "stop_failed"
    exception: BaseException


@dataclass(frozen=True, kw_only=True)
class Replaced(Event):
    """A run was replaced by `new_run` (None: its launch was refused), now in `state`."""

    kind: ClassVar[str] = "replaced"
    old_run: str
    new_run: str | None
    state: str


@dataclass(frozen=True, kw_only=True)
class TimeLimitNear(Event):
    """A Slurm job has `time_left_s` to its time limit: `renewing` its successor now (it has
    a router), or not (no router: it will be down from its end until its successor serves)."""

    kind: ClassVar[str] = "time_limit_near"
    run: str
    job: str
    time_left_s: float
    renewing: bool


@dataclass(frozen=True, kw_only=True)
class Renewed(Event):
    """A Slurm job's successor `new_run` (None: refused) is in `state`; with `error` empty it
    serves in the router, and the old job was taken out and cancelled."""

    kind: ClassVar[str] = "renewed"
    old_run: str
    new_run: str | None
    state: str
    error: str


@dataclass(frozen=True, kw_only=True)
class Watching(Event):
    """Supervision began: its first look found `deployments` on `hosts` hosts, of which
    `unreadable` could not be read; it looks again every `interval_s` seconds."""

    kind: ClassVar[str] = "watching"
    deployments: int
    hosts: int
    unreadable: int
    interval_s: float


@dataclass(frozen=True, kw_only=True)
class WatchStopped(Event):
    """Supervision ended: told to (Ctrl-C; the servers keep running), or because it gave up
    on every deployment it watches."""

    kind: ClassVar[str] = "watch_stopped"
    gave_up: bool = False


# ---- a router's worker list ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RouterChanged(Event):
    """A worker was added to its router (or removed), or `error` says why not."""

    kind: ClassVar[str] = "router_changed"
    router: str
    url: str
    added: bool
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class RolloutStep(Event):
    """A rollout unit's next step (`step`: "draining (3 running)", "starting", …); an empty
    target: Ctrl-C, the rollout stops after the units in hand."""

    kind: ClassVar[str] = "rollout_step"
    step: str
    elapsed: float


# ---- logs ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LogLine(Event):
    """One whole line of a log; `crash`: it belongs to a crash trace."""

    kind: ClassVar[str] = "log_line"
    line: str
    crash: bool = False


@dataclass(frozen=True, kw_only=True)
class LogCrash(Event):
    """A crash completed by the log lines just sent."""

    kind: ClassVar[str] = "crash"
    report: CrashReport


# ---- bench ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BenchLevelStarted(Event):
    """A load level of a sweep began."""

    kind: ClassVar[str] = "bench_level_started"
    elapsed: float
    concurrency: int


@dataclass(frozen=True, kw_only=True)
class BenchLevelDone(Event):
    """A load level of a sweep finished."""

    kind: ClassVar[str] = "bench_level_done"
    elapsed: float
    concurrency: int
    output_tokens_per_s: float
    failed: int


# ---- tune ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TuneStep(Event):
    """Tune moved on: `step` is launching, measuring, restoring or keeping a phase's server
    (baseline, speculative, tuned); `eta` is the seconds it expects to have left."""

    kind: ClassVar[str] = "tune_step"
    phase: str
    step: str
    elapsed: float
    levels: list[int] = field(default_factory=list)
    eta: float | None = None


# ---- sinks ---------------------------------------------------------------------------------


class EventSink(Protocol):
    """Where an operation sends its events (possibly from many threads at once)."""

    @property
    def closed(self) -> bool:
        """The reader has gone (a closed pipe): a stream of events may stop."""
        ...

    def emit(self, event: Event) -> None:
        """Take one event."""


class Discard:
    """A sink for callers that want only the result."""

    closed = False

    def emit(self, event: Event) -> None:
        pass


class Collect:
    """A sink that keeps every event, in order (tests, and callers that summarise)."""

    closed = False

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)


DISCARD = Discard()
