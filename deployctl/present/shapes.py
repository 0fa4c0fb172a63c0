"""The typed `--json` documents: one TypedDict per document and per shared shape.

documents.py builds them (mypy checks every key and value), and `python -m tools.contract
--write` generates their schemas from these declarations (tools/typed_schema.py): a key's
description is its `Annotated[..., "…"]` string, a mapping there adds keywords (`minimum`…),
an object's description is its docstring, an enum's values come from the enum.

Not every document is typed yet (issue 53, item 1): tools/contract.py still declares the
others by hand. No `from __future__ import annotations` here: Python 3.11 reads a
`NotRequired` key of a string annotation as required.
"""

from typing import Annotated, Literal, NotRequired, TypedDict

from deployctl.ops.patch import FileState, PatchState
from deployctl.ops.rollout import UnitOutcome
from deployctl.ops.runs import DrainSignal
from deployctl.remote.measures import CrashRecord

# ---- shared shapes -------------------------------------------------------------------------


class Failure(TypedDict):
    """The command failed as a whole (a bad inventory, pattern or option): nothing was done on any host."""

    ok: Literal[False]
    error: str
    code: str
    hint: str | None


class Registration(TypedDict):
    """A worker added to its router or removed from it; `error` says why not."""

    worker: str
    router: str
    url: str
    action: Literal["add", "remove"]
    ok: bool
    error: str


class Job(TypedDict):
    """The Slurm job this run is (launcher: slurm), as last seen: squeue, else sacct, else its record."""

    id: str
    state: Annotated[
        str,
        "Slurm's job state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, …; UNKNOWN when Slurm no longer knows it",
    ]
    reason: Annotated[
        str, "Why a pending job waits (Resources, Priority, BeginTime, …); empty otherwise"
    ]
    nodes: Annotated[list[str], "Its nodes, the head first"]
    head: Annotated[str, "The head node's address (NodeAddr): where the server answers"]
    time_left_s: Annotated[
        float | None, "Seconds to its time limit; null without one or when not running"
    ]
    exit_code: Annotated[str, "code:signal once it ended; empty before"]


# ---- bench --suggest-threshold ---------------------------------------------------------------


class SuggestionLevel(TypedDict):
    concurrency: int
    baseline_tokens_per_s: float
    speculative_tokens_per_s: float
    wins: Annotated[
        bool | None,
        "Whether speculation beats the baseline here (a tie is no win); null: above the speculative run's own threshold, so not measured for speculation.",
    ]


class Suggestion(TypedDict):
    """deployctl bench --suggest-threshold BASELINE SPEC --json"""

    baseline: str
    speculative: str
    threshold: Annotated[
        int | None,
        "The largest level where speculation wins at it and every level below; null: speculation never wins.",
    ]
    between: Annotated[
        list[int | None],
        "[last win, first loss]: the crossover lies between them. Last win null: speculation never wins; first loss null: it wins at every level measured.",
        {"minItems": 2, "maxItems": 2},
    ]
    crossover_unresolved: Annotated[
        bool,
        "Levels between the last win and the first loss were not measured (deployctl tune narrows it down).",
    ]
    wins_after_loss: Annotated[
        list[int],
        "Levels past the first loss where speculation wins again: a threshold cannot use them.",
    ]
    speculative_threshold: Annotated[
        int | None,
        "The speculative run's own --threshold: above it its curve is the baseline's, so those levels are not measured and the suggestion cannot exceed it.",
    ]
    baseline_speculates: Annotated[bool, "The baseline run's command has --speculative-algorithm."]
    levels: list[SuggestionLevel]


# ---- patch list, patch audit ---------------------------------------------------------------


class PatchSetEntry(TypedDict):
    name: str
    version: str
    hash: str
    sglang_versions: list[str]
    description: str
    requires: list[str]
    flags: list[str]


class PatchList(TypedDict):
    patches: list[PatchSetEntry]


class SetState(TypedDict):
    state: Annotated[
        PatchState,
        "What the installation's files are, told by each file's shipped hashes, else hunk by hunk; the record of this state_dir second. applied: every hunk is in the files (detail `no record here` when this state_dir has no record of it); partly applied: some are (detail names the files that lack it); missing: none is; outdated: recorded here as an older version (or other content), the files as that apply left them; drifted: a file has, for some hunk, neither its lines nor those it expects (detail names it), or SGLang was reinstalled since apply; unsupported: no variant for this SGLang.",
    ]
    version: Annotated[
        str | None, "The version the files carry (applied), else the one recorded here."
    ]
    expected_version: str
    detail: str
    recorded: Annotated[bool, "This state_dir has a record of the set on this installation."]
    files: Annotated[
        dict[str, FileState],
        "Each file of the set's variant for this SGLang: applied, partly applied (some hunks), missing, or differs (a hunk whose lines are neither the set's nor the release's).",
    ]


# ---- rollout (also canary's and tune --live's units, patch apply --rolling, restart) ---------


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
