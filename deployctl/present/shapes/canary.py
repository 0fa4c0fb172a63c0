"""The typed documents of `deployctl canary --json`: the canary's record (as the router's host
keeps it: remote/measures.py's `CanaryRecord` names the same keys) and what was done with it.

No `from __future__ import annotations` (see the package's docstring).
"""

from typing import Annotated, Literal, TypedDict

from deployctl.choices import CanaryMetric
from deployctl.ops.canary import Decision
from deployctl.present.shapes.rollout import RolloutUnit

CanaryState = Literal["planned", "running", "done"]
CanaryVerdict = Literal["regression", "no_regression", "undecided"]
CanaryStepKind = Literal["split", "rollback", "promotion"]


class CanaryBucketRow(TypedDict):
    bucket: Annotated[int, "Running requests, rounded up to a CUDA-graph batch size."]
    control_n: int
    candidate_n: int
    control: float | None
    candidate: float | None
    ratio: float | None


class CanaryStepRow(TypedDict):
    step: CanaryStepKind
    unit: str
    outcome: str
    old_run: str | None
    new_run: str | None
    error: str | None


class CanaryFields(TypedDict):
    # A canary's record (the host keeps it; `canary --json` is it and more).
    canary: Annotated[int | None, "Its number on the router's host; null when not kept."]
    router: str
    state: Annotated[
        CanaryState, "running: still judged (or its deployctl was killed; see updated_at)."
    ]
    started_at: Annotated[float, "Seconds since the epoch."]
    updated_at: Annotated[float, "When the record was last written (each 5 s while running)."]
    candidates: Annotated[list[str], "The replicas that tried the inventory's configuration."]
    controls: Annotated[list[str], "The replicas left on their run, compared against."]
    metric: CanaryMetric
    max_regression: Annotated[float, "The minimum detectable effect, as a fraction (0.05: 5 %)."]
    confidence: Annotated[float, "1 - the false-alarm rate."]
    verdict: CanaryVerdict | None
    estimate: Annotated[
        float | None,
        "Candidate over control at matched load, oriented so that above 1 is worse (throughput inverted).",
    ]
    low: float | None
    high: float | None
    samples: Annotated[int, "Matched samples (both sides of a load bucket present)."]
    buckets: list[CanaryBucketRow]
    reason: Annotated[str, "Why it ended as it did."]
    decision: Annotated[
        Decision | None,
        "failed: not carried through (the canaries' configuration did not serve, the router stopped answering, or the canaries gave nothing to compare), the canaries put back.",
    ]
    elapsed_s: Annotated[float, "Seconds spent judging."]
    interrupted: Annotated[bool, "Ctrl-C: the canaries were put back."]
    steps: Annotated[
        list[CanaryStepRow],
        "Every replacement made, in order: the split, then the rollback or the promotion.",
    ]


class CanaryRecord(CanaryFields):
    """One canary of one router, as kept on the router's host (canaries/N.json)."""


class Canary(CanaryFields):
    ok: Annotated[
        bool,
        "A clear verdict acted on: promoted, or kept (no regression with --no-promote, or inconclusive); false for a rollback, a failed canary (a split that did not serve, a router that stopped answering, nothing to compare) or Ctrl-C.",
    ]
    dry_run: bool
    already_current: Annotated[
        list[str],
        "Replicas that already run the inventory's configuration: neither canary nor control.",
    ]
    not_judged: Annotated[
        dict[str, str],
        "Replicas that differ but that a canary cannot judge (a prefill records no time to first token or inter-token latency; a replica whose role changes has no like to compare with) -> why: neither canary nor control, and left as they run by a promotion.",
    ]
    units: Annotated[
        list[RolloutUnit],
        "The canaries' and the control's plans, and what was last done with each (split, then the promotion or rollback; `steps` keeps every one).",
    ]
    keep_error: Annotated[
        str | None, "Why the record could not be kept on the router's host (null: kept)."
    ]
