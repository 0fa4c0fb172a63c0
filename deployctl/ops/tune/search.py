"""Tune's pure search: what is compared at one level (`judge`), where a threshold can switch
(`Levels`), and which levels each phase's server must measure next (`Search`). No I/O: the
tuner (tuner.py) launches and measures what it decides."""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, cast

from deployctl.ops.bench import per_token_ms, round_figures, spread_of

if TYPE_CHECKING:
    from deployctl.remote.measures import BenchLevel, LevelFigures, ObjectiveShown


class Phase(StrEnum):
    BASELINE = "baseline"
    SPECULATIVE = "speculative"
    TUNED = "tuned"


class LevelVerdict(StrEnum):
    """Speculation against the baseline at one level; a tie is not a win."""

    WIN = "win"
    LOSS = "loss"
    TIE = "tie"


# ---- what is compared ---------------------------------------------------------------------


@dataclass(frozen=True)
class Objective:
    """What "better" means: output throughput, or throughput within a latency bound."""

    kind: str = "throughput"  # or max_itl_ms, max_ttft_ms
    bound: float | None = None

    def latency(self, level: BenchLevel) -> float | None:
        """The level's latency this objective bounds, in ms: TTFT, or the time per output
        token (not the builtin's ITL, which is per streamed chunk)."""
        if self.kind == "max_ttft_ms":
            return level["ttft_ms"]["p50"]
        return per_token_ms(level)

    def median_latency(self, samples: Sequence[BenchLevel]) -> float | None:
        seen = [v for v in (self.latency(s) for s in samples) if v is not None]
        return statistics.median(seen) if seen else None

    def meets(self, samples: Sequence[BenchLevel]) -> bool:
        """Whether the level's median latency is within the bound (always, for throughput)."""
        if self.bound is None:
            return True
        latency = self.median_latency(samples)
        return latency is not None and latency <= self.bound

    def near_bound(self, samples: Sequence[BenchLevel], noise: float) -> bool:
        """Whether the median latency is too close to the bound to judge from one sample."""
        if self.bound is None:
            return False
        latency = self.median_latency(samples)
        return latency is None or abs(latency - self.bound) < noise * self.bound

    def describe(self) -> ObjectiveShown:
        return {"kind": self.kind, "bound": self.bound}


def tps(level: BenchLevel) -> float:
    return float(level["output_tokens_per_s"])


def median_tps(samples: Sequence[BenchLevel]) -> float:
    return statistics.median(tps(s) for s in samples)


def by_concurrency(levels: Sequence[BenchLevel]) -> dict[int, list[BenchLevel]]:
    """The samples of each concurrency, in the order measured, lowest concurrency first."""
    found: dict[int, list[BenchLevel]] = {}
    for level in levels:
        found.setdefault(level["concurrency"], []).append(level)
    return dict(sorted(found.items()))


def median_sample(samples: Sequence[BenchLevel]) -> BenchLevel:
    """The measured level whose throughput is the median (the lower one of an even count)."""
    ordered = sorted(samples, key=tps)
    return ordered[(len(ordered) - 1) // 2]


def spread(samples: Sequence[BenchLevel]) -> float:
    """The samples' range as a fraction of their median (0 for one sample)."""
    values = [tps(s) for s in samples]
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


def pooled_rounds(samples: Sequence[BenchLevel]) -> list[float]:
    """Every round of the level's samples, in the order measured."""
    return [r for s in samples for r in s.get("rounds_tokens_per_s", [])]


def level_figures(samples: Sequence[BenchLevel]) -> LevelFigures:
    """How warm and how steady one server's samples of a level were: the warm-ups' time, the
    first warm-up's sample against the level's median, and the spread and drift of all their
    rounds together."""
    warmups = [w for s in samples if (w := s.get("warmup_s")) is not None]
    first = next(
        (f for s in samples if (f := s.get("first_sample_tokens_per_s")) is not None), None
    )
    found = pooled_rounds(samples)
    figures = round_figures(found, first, median_tps(samples))
    return cast(
        "LevelFigures",
        {"warmup_s": sum(warmups) if warmups else None, **figures, "rounds": len(found)},
    )


@dataclass(frozen=True)
class Judged:
    """Speculation against the baseline at one concurrency."""

    concurrency: int
    verdict: LevelVerdict
    baseline: float  # median output tok/s
    speculative: float
    settled: bool  # False: inside the noise or the spread, not yet measured `repeats` times
    spread: dict[str, float]
    samples: dict[str, int]
    level_spread: dict[str, float | None] = field(default_factory=dict)  # phase → its rounds'
    within_spread: bool = False  # the rounds' spreads exceed the difference to decide


def judge(
    concurrency: int,
    base: Sequence[BenchLevel],
    spec: Sequence[BenchLevel],
    objective: Objective,
    noise: float,
    repeats: int,
) -> Judged:
    """Compare the two at one level.

    Throughputs further apart than `noise` (a fraction) and than their rounds' spreads
    together decide at once. Closer ones are measured `repeats` times each; then
    speculation wins or loses only when every sample of one beats every sample of the other
    (one further apart than the noise, by its median), else it is a tie. Under a latency
    bound, the one that meets it wins; when neither does, neither is better (a tie).
    """
    enough = len(base) >= repeats and len(spec) >= repeats
    mb, ms = median_tps(base), median_tps(spec)
    spreads = {
        p: spread_of(pooled_rounds(s))
        for p, s in ((Phase.BASELINE, base), (Phase.SPECULATIVE, spec))
    }
    within = _within_spread(mb, ms, *spreads.values())
    verdict, settled = _by_throughput(base, spec, mb, ms, noise, enough, within)
    if objective.bound is not None:
        near = objective.near_bound(base, noise) or objective.near_bound(spec, noise)
        meets_b, meets_s = objective.meets(base), objective.meets(spec)
        if meets_b != meets_s or not meets_b:
            verdict = (
                LevelVerdict.WIN
                if meets_s and not meets_b
                else LevelVerdict.LOSS
                if meets_b
                else LevelVerdict.TIE
            )
            settled = enough or not near
        else:
            settled = settled and (enough or not near)
    return Judged(
        concurrency,
        verdict,
        mb,
        ms,
        settled,
        {Phase.BASELINE: spread(base), Phase.SPECULATIVE: spread(spec)},
        {Phase.BASELINE: len(base), Phase.SPECULATIVE: len(spec)},
        {str(p): v for p, v in spreads.items()},
        within,
    )


def _within_spread(mb: float, ms: float, sb: float | None, ss: float | None) -> bool:
    """Whether the two servers' rounds spread wider than the ratio's distance from 1 (their
    relative half-widths added in quadrature, as a ratio's are); unknown spreads: no."""
    if sb is None or ss is None or mb <= 0:
        return False
    return math.hypot(sb, ss) > abs(ms / mb - 1)


def _by_throughput(
    base: Sequence[BenchLevel],
    spec: Sequence[BenchLevel],
    mb: float,
    ms: float,
    noise: float,
    enough: bool,
    within: bool,
) -> tuple[LevelVerdict, bool]:
    """`within`: the rounds spread wider than the difference, which then only `repeats`
    samples decide."""
    by_sign = LevelVerdict.WIN if ms > mb else LevelVerdict.LOSS
    apart = mb <= 0 or abs(ms - mb) / mb >= noise
    if apart and (enough or not within):
        return (by_sign if ms != mb else LevelVerdict.TIE), True
    if not enough:
        return (by_sign if apart else LevelVerdict.TIE), False
    separated = min(map(tps, spec)) > max(map(tps, base)) or min(map(tps, base)) > max(
        map(tps, spec)
    )
    return (by_sign if separated else LevelVerdict.TIE), True


# ---- which levels are worth measuring -----------------------------------------------------


# The largest decode CUDA graph when the command does not say (SGLang sizes it from the GPU's
# memory; past it every batch size is its own).
DEFAULT_MAX_GRAPH_BS = 256


def speculative_graph_sizes(max_bs: int) -> list[int]:
    """The decode batch sizes SGLang 0.5.23 captures CUDA graphs for on a speculative server
    (`generate_decode_cuda_graph_batch_sizes`); it pads a batch up to the next one."""
    sizes = [
        *range(1, 9),
        *range(10, 33, 2),
        *range(40, 65, 4),
        *range(72, 257, 8),
        *range(272, max_bs + 1, 16),
    ]
    sizes = [s for s in sizes if s <= max_bs]
    return sizes if max_bs in sizes else [*sizes, max_bs]


@dataclass(frozen=True)
class Levels:
    """Where a threshold can switch: any batch size (patch mode), or in adaptive mode only at
    CUDA-graph sizes, since SGLang pads a batch before it picks the draft steps."""

    graph_sizes: tuple[int, ...] = ()  # empty: every integer

    def between(self, low: int, high: int) -> list[int]:
        if not self.graph_sizes:
            return list(range(low + 1, high))
        inside = [s for s in self.graph_sizes if low < s < high]
        # Past the largest graph there is no padding: every batch size is its own.
        top = self.graph_sizes[-1]
        return inside + list(range(max(low, top) + 1, high))

    def snap(self, level: int) -> int:
        """The largest switch point at or below `level`."""
        if not self.graph_sizes or level > self.graph_sizes[-1]:
            return level
        return self.graph_sizes[max(0, bisect.bisect_right(self.graph_sizes, level) - 1)]


def spaced(candidates: Sequence[int], points: int) -> list[int]:
    """`points` candidates that split the range into equal parts (all when there are few)."""
    if len(candidates) <= points:
        return list(candidates)
    picked = [
        candidates[(i * (len(candidates) + 1)) // (points + 1) - 1] for i in range(1, points + 1)
    ]
    return sorted(set(picked))


def rounds(width: int, points: int) -> int:
    """Splits of `points` new levels it takes to narrow `width` candidates to none."""
    return math.ceil(math.log(width + 1, points + 1)) if width > 0 else 0


@dataclass
class Search:
    """Where speculation stops winning, narrowed down between the two servers' visits.

    Each visit of a server measures what it owes: the levels the other server measured and
    it has not, levels whose comparison is inside the noise (up to `repeats` samples each),
    and a level where speculation wins again after a loss, with the loss before it (so
    neither is averaged away). Once nothing is owed, `points` new levels split the bracket
    between the last win and the first non-win; they are measured on the server that is up
    and then on the other. The search ends when the bracket's ends are adjacent.
    """

    coarse: list[int]
    levels: Levels = field(default_factory=Levels)
    objective: Objective = field(default_factory=Objective)
    noise: float = 0.03
    repeats: int = 3
    points: int = 3
    samples: dict[Phase, dict[int, list[BenchLevel]]] = field(
        default_factory=lambda: {Phase.BASELINE: {}, Phase.SPECULATIVE: {}}
    )
    planned: list[int] = field(default_factory=list)
    refined: list[int] = field(default_factory=list)
    suspects: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.planned = sorted(set(self.coarse))

    def add(self, phase: Phase, measured: Sequence[BenchLevel]) -> None:
        for concurrency, found in by_concurrency(measured).items():
            self.samples[phase].setdefault(concurrency, []).extend(found)

    def judged(self) -> dict[int, Judged]:
        """Every level both servers measured."""
        base, spec = self.samples[Phase.BASELINE], self.samples[Phase.SPECULATIVE]
        return {
            c: judge(c, base[c], spec[c], self.objective, self.noise, self.repeats)
            for c in self.planned
            if c in base and c in spec
        }

    def owed(self, phase: Phase, last_visit: bool = False) -> list[int]:
        """The levels `phase`'s server should measure now (empty: nothing more from it).
        `last_visit`: the other server is not launched again, so only levels it measured are
        owed (a level one server alone measured is never compared)."""
        self._advance()
        owed = [c for c in self.planned if self._short(phase, c)]
        if last_visit:
            other = Phase.SPECULATIVE if phase is Phase.BASELINE else Phase.BASELINE
            owed = [c for c in owed if c in self.samples[other]]
        return owed

    def stop(self) -> None:
        """The search ends before it is narrowed down (no launch is left): levels planned
        that no server measured are dropped, so the tuned run does not measure them and the
        record does not call them measured."""
        measured = {c for found in self.samples.values() for c in found}
        self.planned = [c for c in self.planned if c in measured]
        self.refined = [c for c in self.refined if c in measured]

    def bracket(self) -> tuple[int, int | None]:
        """The last level where speculation wins before its first non-win (0: none), and
        that first non-win (None: it wins at every level measured)."""
        judged = self.judged()
        last_win = 0
        for c in sorted(judged):
            if judged[c].verdict is not LevelVerdict.WIN:
                return last_win, c
            last_win = c
        return last_win, None

    @property
    def narrowed(self) -> bool:
        """The bracket's ends are adjacent (or speculation wins everywhere)."""
        last_win, first_loss = self.bracket()
        return first_loss is None or not self.levels.between(last_win, first_loss)

    def wins_again(self) -> list[int]:
        """Levels above the first non-win where speculation wins again: the threshold cannot
        use them (it only turns speculation off above T)."""
        _, first_loss = self.bracket()
        judged = self.judged()
        return [
            c
            for c in sorted(judged)
            if first_loss is not None and c > first_loss and judged[c].verdict is LevelVerdict.WIN
        ]

    @property
    def threshold(self) -> int | None:
        """T: speculation on while the batch is at most T; None when it never wins or wins at
        every level measured (see `speculation`)."""
        last_win, first_loss = self.bracket()
        if first_loss is None or last_win == 0:
            return None
        return self.levels.snap(last_win)

    @property
    def speculation(self) -> str:
        """never, always (at every level measured) or up_to (T)."""
        if self.bracket()[1] is None:
            return "always"
        return "never" if self.threshold is None else "up_to"

    def short(self, phase: Phase) -> int:
        """How many samples `phase` still owes, as planned now (nothing is planned anew)."""
        return sum(self._short(phase, c) for c in self.planned)

    def _needed(self, level: int) -> int:
        return self.repeats if level in self.suspects else 1

    def _short(self, phase: Phase, level: int) -> bool:
        return len(self.samples[phase].get(level, [])) < self._needed(level)

    def _advance(self) -> None:
        judged = self.judged()
        self.suspects.update(c for c, j in judged.items() if not j.settled)
        _, first_loss = self.bracket()
        again = self.wins_again()
        if again and first_loss is not None:
            self.suspects.update([first_loss, *again])
        if any(
            self._short(p, c) for p in (Phase.BASELINE, Phase.SPECULATIVE) for c in self.planned
        ):
            return  # finish what is started before narrowing further
        last_win, first_loss = self.bracket()
        if first_loss is None:
            return
        candidates = spaced(self.levels.between(last_win, first_loss), self.points)
        new = [c for c in candidates if c not in self.planned]
        self.planned = sorted({*self.planned, *new})
        self.refined = sorted({*self.refined, *new})

    def launches_left(self) -> int:
        """A guess at the visits still to come: one per split of the bracket."""
        last_win, first_loss = self.bracket()
        if first_loss is None:
            return 0
        return rounds(len(self.levels.between(last_win, first_loss)), self.points)
