"""The typed documents of rollout (also canary's and tune --live's units, patch apply --rolling, restart --rolling).

No `from __future__ import annotations` (see the package's docstring).
"""

from typing import Annotated, NotRequired, TypedDict

from deployctl.ops.rollout import UnitOutcome
from deployctl.ops.runs import DrainSignal
from deployctl.present.shapes.common import Job
from deployctl.remote.measures import CrashRecord


class PatchDone(TypedDict):
    set: str
    version: str
    action: str


class UnitPlanFields(TypedDict):
    """A unit's plan: whether and why it changes (what --dry-run says)."""

    unit: str
    changes: bool
    reasons: list[str]
    command_diff: Annotated[
        list[str], "`- word`/`+ word`: the command's words that change (secrets masked)."
    ]
    env_diff: list[str]
    patches: dict[str, list[str]]
    router: str | None
    blocked: Annotated[
        str,
        "Why the unit cannot be replaced (its router is not in the inventory, its run could not be read); empty when it can.",
    ]


class UnitResultFields(TypedDict, total=False):
    """What the rollout did with a unit: every key, unless --dry-run (`outcome` requires the
    others)."""

    outcome: UnitOutcome
    ok: bool
    old_run: str | None
    new_run: str | None
    state: str | None
    error: str
    crash: CrashRecord | None
    warnings: list[str]
    drained: bool | None
    drain_signal: Annotated[
        DrainSignal | None,
        "What the drain watched to know the worker was idle: its own num_running_reqs (metrics), the router's load for it (router load), or neither, so the whole --drain-timeout was waited (timeout); null: not drained (no router, or not serving).",
    ]
    timings_s: Annotated[
        dict[str, float],
        "Seconds per step: remove, drain, stop, patches, launch, server_start (the server's own wait), total.",
    ]
    overhead_s: Annotated[
        float | None, "deployctl's own time: total less the drain and the server's start."
    ]
    patches_done: list[PatchDone]
    gpus_clean: Annotated[
        bool | None,
        "The unit's GPUs were clean after its stop, before its start (null: not checked, e.g. a router).",
    ]


class RolloutUnit(UnitPlanFields, UnitResultFields):
    """One unit: a deployment, or a multi-node server as `NAME (node, node…)`. Outcome keys (those `outcome` requires) are present unless --dry-run."""

    job: NotRequired[Job]


class Rollout(TypedDict):
    ok: bool
    dry_run: bool
    interrupted: Annotated[
        bool, "Ctrl-C: the units in hand finished (or went back), no other was started."
    ]
    units: list[RolloutUnit]
