"""The typed documents of the JSON lines `logs --json` and `watch --json` print: one object per
event, its kind (`event`), its target and when (`at`), then its fields (`EVENT_SHAPES` pairs
each event with its type; documents.event_json builds them from the event's fields).

No `from __future__ import annotations` (see the package's docstring).
"""

from typing import Annotated, Literal, TypedDict

from deployctl import events
from deployctl.remote.measures import CrashRecord


class EventLogLine(TypedDict):
    """One whole line of a log; `crash`: it belongs to a crash trace."""

    event: Literal["log_line"]
    target: str
    at: float
    line: str
    crash: bool


class EventCrash(TypedDict):
    """A crash completed by the log lines just sent."""

    event: Literal["crash"]
    target: str
    at: float
    report: CrashRecord


class EventHostFailed(TypedDict):
    """A host could not be read or followed; `exception` keeps a bug's traceback."""

    event: Literal["host_failed"]
    target: str
    at: float
    error: str
    code: str
    hint: str | None


class EventConnectionLost(TypedDict):
    """The connection to a host dropped while it was waited for or followed; retrying."""

    event: Literal["connection_lost"]
    target: str
    at: float
    elapsed: float
    error: str


class EventReconnected(TypedDict):
    """A lost connection is back."""

    event: Literal["reconnected"]
    target: str
    at: float
    elapsed: float


class EventRestarting(TypedDict):
    """A run crashed (on `down`, for a multi-node server) and is being replaced."""

    event: Literal["restarting"]
    target: str
    at: float
    run: str
    signature: str
    attempt: int
    down: list[str]


class EventCrashLoop(TypedDict):
    """A run crashed too often (or the same way twice): it is left down."""

    event: Literal["crash_loop"]
    target: str
    at: float
    run: str
    signature: str
    repeated: bool
    crashes: int
    window_s: float


class EventDecodeHeld(TypedDict):
    """A decode fails its health check but is not restarted: a prefill of its router was down within the window (a decode's health fails while its prefill is gone, sglang#12779)."""

    event: Literal["decode_held"]
    target: str
    at: float
    run: str
    prefill: Annotated[str, "The prefill of its router seen down."]
    down_s: Annotated[float, "How long ago it was seen down."]
    window_s: float


class EventStuckTransfer(TypedDict):
    """A decode has requests waiting for their KV and has sent no token for `stuck_s` seconds."""

    event: Literal["stuck_transfer"]
    target: str
    at: float
    run: str
    waiting: int
    stuck_s: float


class EventStopFailed(TypedDict):
    """A run to be replaced could not be stopped; it is not relaunched."""

    event: Literal["stop_failed"]
    target: str
    at: float
    error: str
    code: str
    hint: str | None


class EventReplaced(TypedDict):
    """A run was replaced by `new_run` (None: its launch was refused), now in `state`."""

    event: Literal["replaced"]
    target: str
    at: float
    old_run: str
    new_run: str | None
    state: str


class EventWatching(TypedDict):
    """Supervision began: its first look is done. Once, before that look's own events."""

    event: Literal["watching"]
    target: str
    at: float
    deployments: Annotated[int, "Deployments (a multi-node group counts once) found."]
    hosts: int
    unreadable: Annotated[int, "Hosts that could not be read (each also has its own event)."]
    interval_s: float


class EventWatchStopped(TypedDict):
    """Supervision ended: told to (Ctrl-C; the servers keep running), or because it gave up"""

    event: Literal["watch_stopped"]
    target: str
    at: float
    gave_up: bool


class EventRouterChanged(TypedDict):
    """A worker was added to its router (`added`) or removed from it; `error` says why not (empty when done)."""

    event: Literal["router_changed"]
    target: str
    at: float
    router: str
    url: str
    added: bool
    error: str


class EventTimeLimitNear(TypedDict):
    """A Slurm job is within --renew-before of its time limit: `renewing` its successor now (it has a router), or not (no router: down from the limit until its successor serves)."""

    event: Literal["time_limit_near"]
    target: str
    at: float
    run: str
    job: str
    time_left_s: float
    renewing: bool


class EventRenewed(TypedDict):
    """A Slurm job's successor `new_run` (null: refused) is in `state`; with `error` empty it serves in the router, and the old job was taken out and cancelled."""

    event: Literal["renewed"]
    target: str
    at: float
    old_run: str
    new_run: str | None
    state: str
    error: str


# Each event a JSON-lines command prints, and its document's type (an event's exception is
# its error, code and hint there).
EVENT_SHAPES: dict[type[events.Event], type] = {
    events.LogLine: EventLogLine,
    events.LogCrash: EventCrash,
    events.HostFailed: EventHostFailed,
    events.ConnectionLost: EventConnectionLost,
    events.Reconnected: EventReconnected,
    events.Restarting: EventRestarting,
    events.CrashLoop: EventCrashLoop,
    events.DecodeHeld: EventDecodeHeld,
    events.StuckTransfer: EventStuckTransfer,
    events.StopFailed: EventStopFailed,
    events.Replaced: EventReplaced,
    events.Watching: EventWatching,
    events.WatchStopped: EventWatchStopped,
    events.RouterChanged: EventRouterChanged,
    events.TimeLimitNear: EventTimeLimitNear,
    events.Renewed: EventRenewed,
}
