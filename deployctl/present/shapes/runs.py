"""The typed documents of status (and top, restart's nothing restarted), stop and launch.

No `from __future__ import annotations` (see the package's docstring).
"""

from typing import Annotated, Literal, NotRequired, Required, TypedDict

from deployctl.choices import PdRole
from deployctl.ops.runs import RunState, UnitState
from deployctl.present.shapes.common import Entry, HostEntry, Job, Registration
from deployctl.present.shapes.fleet import Flags
from deployctl.remote.measures import CrashRecord


class Histogram(TypedDict):
    p50: float | None
    p99: float | None
    count: int


class Metrics(TypedDict, total=False):
    # SGLang's metrics: their keys come from deployctl/metrics.py, so tools/contract.py
    # declares their schema (a name the type refers to, not a shape it declares).
    pass


class ListedWorker(TypedDict):
    url: str
    healthy: bool | None
    load: int | None
    deployment: Annotated[str | None, "Which worker of ours it is; null: none."]
    role: Annotated[
        Literal[PdRole.PREFILL, PdRole.DECODE, "regular"] | None,
        "As the router lists it: a prefill or decode of a router in PD mode, `regular` for a whole-request worker; null: the router does not say (legacy API).",
    ]
    bootstrap_port: Annotated[int | None, "A prefill's bootstrap port as the router lists it."]


class RouterState(TypedDict):
    """A live router's worker list, and its drift from the inventory: `unregistered` (worker → URL) serve but are not listed; `stray` URLs are listed where a worker of ours is known not to serve; `miscast` are listed in another role than they serve. Not drift, and removed by `router sync` only with --force: `unknown` (URL → worker) are listed where a worker of ours may serve but its host cannot be read (`unread`: worker → why); `not_ours` URLs are listed where no worker of the inventory is."""

    router: str
    api: Annotated[
        Literal["workers", "legacy"] | None,
        "`workers` (0.3 and later), `legacy` (up to 0.2.1), null: no router answered.",
    ]
    error: str
    workers: list[ListedWorker]
    unregistered: dict[str, str]
    stray: list[str]
    unknown: dict[str, str]
    unread: dict[str, str]
    not_ours: list[str]
    miscast: Annotated[
        dict[str, str],
        "URL → the worker of ours serving there as another role (or bootstrap port) than the router lists: drift, which `router sync` mends.",
    ]
    drift: bool
    pd: Annotated[bool, "The router routes prefill/decode pairs (`pd: true`)."]
    missing_roles: Annotated[
        list[PdRole],
        "A router in PD mode serves only with a healthy prefill and a healthy decode listed: the roles it has none of.",
    ]


class StatusFields(TypedDict):
    # What one look at a run says, in `status`'s entries and in a multi-node server's nodes.
    run: str | None
    pid: int | None
    state: Annotated[
        RunState | None,
        "The run's state as this look saw it (ready, starting, crashed, stopped, …); null without a run.",
    ]
    alive: bool
    ready: bool
    crashed: bool
    status: Annotated[str | None, "The run record's status (running, stopped, …)."]
    uptime_s: int | None
    log: str | None
    gpus: list[int] | None
    mem_fraction_static: Annotated[
        float | None,
        "The share of each of its GPUs' memory the server takes (--mem-fraction-static); null when its command sets none.",
    ]
    last_line: str
    crash: str | None
    warning: str | None
    gpu_memory_used_mib: int | None
    metrics: NotRequired[Metrics | None]
    metrics_note: NotRequired[Annotated[str, "Why there are no metrics; empty when there are."]]
    router: NotRequired[RouterState]
    job: NotRequired[Job]


class NodeStatus(TypedDict):
    host: str
    node_rank: int
    ok: bool
    error: str | None


class MultiNodeUnit(TypedDict):
    """A multi-node server as a whole, its nodes in rank order."""

    state: Annotated[
        UnitState,
        "The server as a whole: ready, starting, stopped, degraded (a node other than rank 0 down) or crashed (rank 0 down).",
    ]
    ok: bool
    nnodes: Annotated[int, {"minimum": 2}]
    nodes: list[Annotated[NodeStatus, {"allOf": [{"$ref": "#/$defs/runStatus"}]}]]
    down: Annotated[
        list[str], "The nodes that crashed, died or could not be read while meant to run."
    ]


class Status(TypedDict):
    """Each deployment's current run."""

    hosts: dict[str, HostEntry[StatusFields]]
    deployments: NotRequired[
        Annotated[dict[str, MultiNodeUnit], "Multi-node servers as a whole, by deployment."]
    ]


class NothingRestarted(TypedDict):
    """No run needed a restart."""

    restarted: list[str]
    hosts: dict[str, HostEntry[StatusFields]]


class StopFields(TypedDict):
    run: str | None
    ended: list[int]
    killed: list[int]
    gpus_clean: bool | None
    note: str
    shutdown: Annotated[
        Literal["drained", "cut"] | None,
        "How the run ended: drained (by itself within the timeout after SIGTERM to its main process, or, a node > 0 of a multi-node server, to its rank 0's: what it ran finished), cut (still running at the timeout: its whole group was signalled, what it ran was cut); null: nothing of it was running.",
    ]
    shutdown_s: Annotated[
        float | None,
        "Seconds from the first signal until nothing of the run was left; null: nothing of it was running.",
    ]
    router: NotRequired[Annotated[Registration, "Its removal from its router before the stop."]]
    job: NotRequired[Job]


class Stop(TypedDict):
    hosts: dict[str, HostEntry[StopFields]]


class Preflight(TypedDict):
    """The host's answer to 'may we start here?'."""

    ready: bool
    problems: list[str]
    hints: list[str]
    warnings: list[str]
    flags: Flags | None
    command: str
    env: dict[str, str]
    log: str


class LaunchRun(TypedDict, total=False):
    # How a started run came up: every key once it has a `state` (the contract's
    # dependentRequired), its `job` only where it is one.
    run: str
    log: str
    pid: int
    state: Annotated[RunState, "ready, crashed, died, timeout, started or aborted."]
    ready: bool
    elapsed_s: float
    crashes: list[CrashRecord]
    warnings: list[CrashRecord]
    command: str
    env: dict[str, str]
    note: str
    connection_losses: list[str]
    job: Job


class LaunchFields(LaunchRun, total=False):
    preflight: Required[Preflight]
    stopped: Annotated[
        Entry[StopFields],
        "launch --replace: its live run, stopped first; a stop that failed kept it from starting (then no preflight).",
    ]


class Launch(TypedDict):
    """A launch: every host's preflight and, once started, how its run came up."""

    started: bool
    dry_run: bool
    hosts: dict[str, HostEntry[LaunchFields]]
    group_failed_ended: NotRequired[
        Annotated[
            dict[str, list[int]], "Nodes of a failed multi-node server whose runs were ended: PIDs."
        ]
    ]
    registrations: NotRequired[
        Annotated[
            list[Registration],
            "Ready workers added to their routers, and workers added to routers that came up.",
        ]
    ]


class SyncFields(TypedDict):
    # A sync judges itself: not ok when a change failed or a URL was kept unknown.
    ok: bool
    error: NotRequired[str]
    code: NotRequired[str]
    dry_run: bool
    force: Annotated[
        bool,
        "--force: URLs whose owner cannot be read, and URLs no worker of the inventory has, are removed too.",
    ]
    before: RouterState
    changes: list[Registration]
    kept: Annotated[
        list[str],
        "Listed URLs left in the router, unknown or not ours (see `before`); --force removes them.",
    ]


class Sync(TypedDict):
    hosts: dict[str, HostEntry[SyncFields]]
