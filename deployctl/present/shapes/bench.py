"""The typed documents of `deployctl bench --json`: a sweep, `--compare` and
`--suggest-threshold`.

No `from __future__ import annotations` (see the package's docstring).
"""

from typing import Annotated, Required, TypedDict

from deployctl.present.shapes.common import HostEntry
from deployctl.remote.measures import BenchLevel


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


# ---- bench, bench --compare ------------------------------------------------------------------


class BenchFields(TypedDict):
    deployment: str | None
    run: str
    levels: list[BenchLevel]
    saved: str


class Sweep(TypedDict):
    """deployctl bench --json"""

    hosts: dict[str, HostEntry[BenchFields]]


class SweepParams(TypedDict, total=False):
    tool: str
    input_len: int
    output_len: int
    concurrency: list[int]
    prompts: list[int]
    warmup: Annotated[bool, "Each level was warmed up first (--warmup)."]


class KeptSweep(TypedDict, total=False):
    """A sweep as kept on its host (older ones may lack keys)."""

    run: str
    deployment: str | None
    template: str
    threshold: int | None
    patches: dict[str, str]
    env: dict[str, str]
    command: str
    deployctl_version: str
    by: str
    at: float
    params: SweepParams
    levels: Required[list[BenchLevel]]


class Comparison(TypedDict):
    """deployctl bench --compare RUNS --json"""

    runs: dict[str, KeptSweep]
    missing: list[str]
    errors: Annotated[dict[str, str], "Host → why its kept sweeps could not be read."]
    unreadable: Annotated[
        dict[str, list[str]],
        "Host → its kept bench files that are not JSON or not a sweep, skipped.",
    ]
