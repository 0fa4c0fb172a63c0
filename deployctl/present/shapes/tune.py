"""The typed documents of `deployctl tune --json`: a tune record with its phases, a
`--dry-run` plan and a kept lookup; and of `tune --live`: a live window, the policies raced,
and a kept window as `--report` judges it again.

No `from __future__ import annotations` (see the package's docstring).
"""

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from deployctl.choices import SpeculationPolicy, ThresholdMode
from deployctl.ops.tune.live import LiveDecision, Speculation, ThresholdVerdict
from deployctl.ops.tune.search import LevelVerdict
from deployctl.ops.tune.tuner import Outcome as TuneOutcome
from deployctl.present.shapes.rollout import RolloutUnit
from deployctl.remote.measures import BenchLevel

BucketVerdict = Literal["win", "loss", "undecided"]


class LivePrecision(TypedDict):
    buckets: Annotated[
        int,
        "--precision: the crossover's bracket, in CUDA-graph buckets, that ends the window (0: it runs whole).",
    ]
    reached: Annotated[
        bool,
        "The window ended early, its bracket that narrow; its intervals are then the always-valid ones it stopped on.",
    ]


class LiveSamples(TypedDict):
    """Intervals read from each replica that carried a sample."""

    speculative: int
    plain: int


class KeptSamples(LiveSamples):
    """Samples kept of each replica (the record holds them; the report counts them)."""


class LiveBucket(TypedDict):
    bucket: Annotated[int, "A CUDA-graph batch size: the samples' running requests up to it."]
    samples: int
    gain: Annotated[float, "Speculative ÷ plain output tok/s per running request in the bucket."]
    low: Annotated[float | None, "The gain's interval; null: unbounded."]
    high: float | None
    detectable: Annotated[
        float | None,
        "The interval's half-width as a fraction: the smallest gain the bucket's samples could tell from none; null: unbounded.",
    ]
    verdict: BucketVerdict


class LiveCrossover(TypedDict):
    last_win: Annotated[
        int | None,
        "The largest bucket where speculation is better beyond its interval, below the first loss.",
    ]
    first_loss: Annotated[int | None, "The smallest bucket where it is worse beyond its interval."]
    threshold: Annotated[int | None, "T: last_win when both exist; null otherwise."]
    speculation: Speculation
    reached: Annotated[int, "The largest bucket both replicas served at: nothing is said above it."]
    sizes: Annotated[
        list[int],
        "The buckets there are: the replicas' decode CUDA-graph batch sizes (past the largest, 16 wide).",
    ]


class RaceBucket(TypedDict):
    bucket: Annotated[int, "A CUDA-graph batch size."]
    samples: Annotated[dict[str, int], "Policy -> its samples in the bucket."]
    values: Annotated[
        dict[str, float], "Policy -> output tok/s per running request (geometric mean)."
    ]
    winner: Annotated[str | None, "null: a policy has too few samples here to compare (under 5)."]
    decided: Annotated[bool, "The winner is better than every other policy beyond their interval."]


class RaceGain(TypedDict):
    gain: float
    low: float | None
    high: float | None


class PolicyRace(TypedDict):
    """tune --live --policies: the policies raced on one replica each."""

    policies: Annotated[list[SpeculationPolicy], "In race order, one replica each."]
    replicas: Annotated[list[str], "The replica each policy served on, in that order."]
    buckets: Annotated[list[RaceBucket], "Each load bucket a policy served at, ascending."]
    winner: Annotated[str | None, "The best policy weighted by the traffic's share of each bucket."]
    decided: Annotated[bool, "Its lead over every other policy is beyond the interval."]
    versus: Annotated[
        dict[str, RaceGain],
        "Each other policy -> the winner's traffic-weighted gain over it and its interval.",
    ]
    shares: Annotated[
        dict[str, float],
        "Bucket -> its share of the traffic (the buckets every policy served at).",
    ]


class TuneLive(TypedDict):
    """tune --live: the window's per-bucket comparison, the live crossover, the policies raced and what followed."""

    ok: Annotated[
        bool,
        "The window ended with the threshold rolled out (promoted) or reported, and every action after it worked; false when it failed (a replica that did not serve, a router that stopped answering) or on Ctrl-C.",
    ]
    interrupted: Annotated[bool, "Ctrl-C: both replicas were put back."]
    router: str
    speculative: Annotated[
        str | None,
        "The replica relaunched with speculation always on; null: --race-threshold (no crossover window).",
    ]
    plain: Annotated[str | None, "The replica relaunched without speculation."]
    others: Annotated[list[str], "The router's other selected replicas: left serving."]
    decision: LiveDecision
    reason: str
    elapsed_s: Annotated[float, "The windows' lengths, summed."]
    precision: LivePrecision
    samples: LiveSamples
    buckets: Annotated[
        list[LiveBucket],
        "Each load bucket both replicas served at (5 samples each, at least), ascending.",
    ]
    crossover: LiveCrossover | None
    threshold: Annotated[int | None, "T: the crossover's, or --race-threshold; null: none decided."]
    inventory_threshold: Annotated[
        int | None,
        "The replicas' `threshold` in the inventory (what tune wrote from a synthetic bench); null: none set.",
    ]
    inventory_verdict: Annotated[
        ThresholdVerdict | None,
        "That threshold on this traffic: too high (it speculates at a bucket speculation lost), too low (it stops below a bucket speculation won); null: none set, or nothing decided.",
    ]
    race: PolicyRace | None
    kept: Annotated[
        SpeculationPolicy | None,
        "The policy that serves after (promoted), or would (reported); null: the replicas are back as they were.",
    ]
    units: Annotated[list[RolloutUnit], "The two replicas' relaunch for the window."]
    actions: Annotated[
        Sequence[Mapping[str, Any]],
        "After the windows: the kept policy's rollout, or every replica touched put back.",
    ]
    window: Annotated[
        int | None,
        "The crossover window's number on the router's host (tune --live --report N, --resume N); null: not kept.",
    ]
    keep_error: Annotated[str | None, "Why the window's record could not be kept."]


class KeptEndLook(TypedDict):
    """How a window that ended judged its buckets (absent while running, and in records kept before windows said it)."""

    always_valid: Annotated[
        bool,
        "Its end took the always-valid intervals (a window that looked every round, or a resumed one).",
    ]
    error_share: Annotated[float, "The share of the error rate its end look spent."]


class LiveRecord(TypedDict):
    """One live window of one router, as kept on the router's host and judged again."""

    window: Annotated[int | None, "Its number on the router's host (tune-live/N.json)."]
    router: str
    state: Literal["running", "done"]
    started_at: float
    updated_at: float
    speculative: str
    plain: str
    confidence: float
    resumed: Annotated[list[int], "The windows whose samples it started from, oldest first."]
    sizes: NotRequired[
        Annotated[
            list[int],
            "The decode CUDA-graph batch sizes its samples are bucketed by (the speculative replica's; absent in a record kept before windows said theirs).",
        ]
    ]
    samples: KeptSamples
    decision: Annotated[str | None, "null while running."]
    threshold: Annotated[int | None, "The crossover's T when the window ended."]
    elapsed_s: Annotated[float, "Its sampling, and the resumed windows'."]
    end_look: NotRequired[KeptEndLook]
    buckets: Annotated[
        Sequence[Mapping[str, Any]],
        "Each bucket judged from the samples, as tune --live's buckets: for a window that ended, as its end look judged them (the same look again); for a running one, with always-valid intervals (a report is one look more).",
    ]
    crossover: Annotated[Mapping[str, Any], "As tune --live's crossover."]


# ---- tune: a record (as kept on the host), a plan (--dry-run), a kept record (--report) ----
# A record's keys are the protocol's (remote/measures.py's TuneRecord, PhaseRecord,
# Verdict, LevelFigures: tools/contract.py checks they name the same ones); these declare
# their JSON shape, descriptions and words.


class LevelFiguresShape(TypedDict):
    warmup_s: Annotated[
        float | None, "The warm-ups at this level on the phase's servers, in seconds; null: none."
    ]
    first_sample_bias: Annotated[
        float | None, "The first warm-up's sample ÷ the level's median - 1; null: no warm-up."
    ]
    spread: Annotated[
        float | None, "Of all the rounds of the level's samples, as in a level's spread."
    ]
    drift: Annotated[float | None, "Of all those rounds, as in a level's drift."]
    drifting: Annotated[bool, "|drift| > spread."]
    rounds: int


class PhaseShape(TypedDict):
    run: str | None
    template: str
    threshold: int | None
    state: str
    levels: Annotated[
        list[BenchLevel],
        "One per concurrency, as bench --json has them: the median sample of a level measured more than once.",
    ]
    samples: Annotated[
        dict[str, list[float]], "Concurrency → every output tok/s measured there, in order."
    ]
    sweeps: Annotated[list[str], "The kept bench files of this phase on the host."]
    runs: Annotated[
        list[str],
        "The phase's runs, one per visit of its server (the search comes back to it).",
    ]
    per_level: NotRequired[
        Annotated[
            dict[str, LevelFiguresShape],
            "Concurrency → how warm and how steady this phase measured it.",
        ]
    ]


class TunePhases(TypedDict, total=False):
    baseline: PhaseShape
    speculative: PhaseShape
    tuned: PhaseShape


class CrossoverShape(TypedDict):
    last_win: int | None
    first_loss: int | None


class VerdictShape(TypedDict):
    verdict: LevelVerdict
    baseline: float
    speculative: float
    spread: dict[str, float]
    samples: dict[str, int]
    level_spread: NotRequired[
        Annotated[
            dict[str, float | None],
            "Phase → the spread of all its rounds at this level (per_level's).",
        ]
    ]
    within_spread: NotRequired[
        Annotated[
            bool,
            "The two phases' spreads together (in quadrature) exceed |speculative ÷ baseline - 1|: the samples do not decide this level (measured up to --repeats times, then judged by the medians).",
        ]
    ]


class TuneRecordShape(TypedDict):
    host: str
    deployment: str | None
    tune: int | None
    outcome: TuneOutcome
    outcome_note: str
    threshold: Annotated[
        int | None,
        "T: speculation on while the batch is at most T; null when it never wins or wins at every level (see speculation).",
    ]
    threshold_mode: ThresholdMode
    speculation: NotRequired[Literal["never", "always", "up_to", ""]]
    crossover: NotRequired[CrossoverShape | None]
    phases: Annotated[TunePhases, {"additionalProperties": False}]
    refined_levels: list[int]
    wins_again: NotRequired[list[int]]
    verdicts: NotRequired[dict[str, VerdictShape]]
    envelope_ratio: Annotated[
        dict[str, float], "Concurrency → tuned tok/s ÷ the better of baseline and speculative."
    ]
    min_ratio: float
    held: bool
    capacity: NotRequired[int | None]
    serving: str | None
    serving_known: NotRequired[
        Annotated[
            bool,
            "false: the host did not answer when tune last asked, so `serving` is not known (records before this key: true).",
        ]
    ]
    previous: NotRequired[str | None]
    crash: NotRequired[dict[str, Any] | None]
    patches: NotRequired[list[str]]
    params: NotRequired[dict[str, Any]]
    started_at: NotRequired[float]
    wall_s: NotRequired[float]
    launches: int
    levels_measured: int
    narrowed: NotRequired[
        Annotated[
            bool | None,
            "The crossover's bracket ends are adjacent levels (false: --max-launches stopped the search first).",
        ]
    ]


class PlannedPhase(TypedDict):
    template: str
    command: str


class TunePlanShape(TypedDict):
    deployment: NotRequired[str | None]
    phases: dict[str, PlannedPhase]
    params: NotRequired[dict[str, Any]]
    launches: int
    levels: int
    estimated_s: float
    assumed: NotRequired[dict[str, Any]]


class KeptTune(TypedDict):
    record: TuneRecordShape | None
    numbers: list[int]
    unreadable: list[str]
