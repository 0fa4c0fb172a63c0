"""The statistics of `deployctl canary`: is the candidate worse than its control at matched load?

Pure (standard library only). Samples of each side go into load buckets (a replica running more
requests is slower per token without being worse), and only buckets both sides have are compared.

The test is an always-valid confidence sequence (a normal-mixture boundary, Robbins' mixture
SPRT written as an interval) on the log of the worse-ratio, so `verdict()` may be asked after
every sample: the chance that any of the intervals is ever wrong is at most `1 - confidence`
(exactly so for a known noise; with the noise estimated, as here, checked by seeded simulation in
tests/test_canary_stats.py and benchmarks/canary_stats.py).

- Each sample becomes its log value, signed so that larger is worse (throughput negated); within
  a bucket and side it is clipped to 3 robust scales (MAD) of its median, so a stalled interval
  cannot carry the verdict.
- A bucket's difference is the candidate's mean minus the control's; buckets pool with
  inverse-variance weights (n_c n_k / (n_c + n_k)), with one noise variance for all, inflated
  by the lag-1 autocorrelation of successive intervals of a replica ((1 + phi) / (1 - phi)).
- Pooling every bucket would drown a regression confined to high load, so the verdict is taken
  over a fixed family of load ranges: every bucket, and each range below or from a power of two
  (< 16, >= 16, ...). The family is fixed before any data, so a Bonferroni split of the error
  rate over it keeps the guarantee; a range is judged once it holds `MIN_SHARE` of the matched
  samples (load decides that, not the values).
- "regression": some range's interval lies wholly above `1 + max_regression` (worse by at least
  the MDE, with that confidence), so an effect below the MDE is called a regression with
  probability at most `1 - confidence` however often one looks. "no_regression": every judged
  range's interval lies wholly below it. A true effect of exactly the MDE stays undecided.
- A candidate so slow that its load buckets and the control's no longer meet (every request
  stays longer, so it holds more of them) leaves nothing to match. Given the same arrivals, a
  replica that holds more running requests at no more completions keeps each request longer
  (Little's law: time in system = running / completion rate): when the candidate's median
  running requests reach `SEPARATION` times the control's and its lower quartile lies above
  the control's upper one, over `min_samples` intervals of each side, at no more than
  `SEPARATION_RATE` times the control's completions, the verdict is "regression" by load
  separation. Equal replicas do not drift apart like that by chance
  (their quartiles cross), however often one looks; a router that sends the candidate more
  requests raises its completions too, and keeps this rule out.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deployctl.choices import CanaryMetric
from deployctl.errors import UsageError

if TYPE_CHECKING:
    from deployctl.metrics import Interval

# itl/ttft: seconds, lower is better; throughput: output tokens/s per running request, higher is better.
METRICS = tuple(str(m) for m in CanaryMetric)
SIDES = ("control", "candidate")

# SGLang's decode CUDA-graph batch sizes (1..8, 10..32 by 2, 40..64 by 4, 72..256 by 8; by 16 after).
CUDA_GRAPH_SIZES: tuple[int, ...] = (
    *range(1, 9),
    *range(10, 33, 2),
    *range(40, 65, 4),
    *range(72, 257, 8),
)
BEYOND_STEP = 16

# The load ranges judged: each split s gives "buckets < s" and "buckets >= s", plus all buckets.
SPLITS: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 256, 512)
# A range is judged once it holds this share of the matched samples: a narrow tail with a handful
# of samples would otherwise hold up every promotion.
MIN_SHARE = 0.2
# Clip a sample's residual to this many robust scales; no scale before this many residuals.
CLIP_SCALES = 3.0
MIN_RESIDUALS = 10
# No verdict before the pooled variance has this many degrees of freedom: the mixture boundary
# takes the estimated noise as known, which a handful of samples cannot support.
MIN_DF = 30
# The noise floor (log units, 0.5 %): identical values would otherwise give an interval of width 0.
SIGMA_FLOOR = 0.005
# The largest serial correlation believed; past it the inflation would explode on a short series.
MAX_PHI = 0.8
MAD_TO_SIGMA = 1.4826
# Load separation: the candidate's median running requests against the control's, at no more
# completions than this times the control's.
SEPARATION = 1.5
SEPARATION_RATE = 1.1
LOAD_SEPARATION = "load separation"


# Samples each side needs in a bucket before tune --live compares it there: a bucket one
# replica passed through once or twice would be judged on a noisy sample or two.
MIN_CELL = 5

# The load adjustment needs some spread of the load within the buckets to fit a slope to.
LOAD_SPREAD_FLOOR = 1e-9

# The buckets `bucket_sequences` splits its error rate over: every CUDA-graph size of the
# judge's, then this many 16-wide buckets past the largest (to 512 past SGLang's 256: 67).
BUCKETS_BEYOND = 16


def bucket_index(bucket: int, sizes: Sequence[int] = CUDA_GRAPH_SIZES) -> int:
    """A bucket's place among the buckets of `sizes` (sorted): 0 for the smallest, one step
    per CUDA-graph size, then per 16."""
    if bucket <= sizes[-1]:
        return bisect.bisect_left(sizes, bucket)
    return len(sizes) - 1 + math.ceil((bucket - sizes[-1]) / BEYOND_STEP)


def bucket_of(running: float, sizes: Sequence[int] = CUDA_GRAPH_SIZES) -> int:
    """The load bucket of a sample by its mean running requests: the smallest CUDA-graph batch
    size >= running (past the largest size, on by 16); 0 for an idle sample."""
    if not math.isfinite(running) or running <= 0:
        return 0
    ordered = sizes if sizes is CUDA_GRAPH_SIZES else sorted(sizes)
    at = bisect.bisect_left(ordered, running)
    if at < len(ordered):
        return ordered[at]
    top = ordered[-1]
    return top + BEYOND_STEP * math.ceil((running - top) / BEYOND_STEP)


@dataclass(frozen=True)
class Sample:
    running: float  # the replica's mean running requests over the interval
    value: float  # the metric over the interval (ITL p50 from the histogram delta, tokens/s per running request)
    requests: (
        int  # requests finished in the interval (0: the sample carries no information, ignored)
    )
    source: str = ""  # the replica it came from: serial correlation is measured per replica


def interval_sample(part: Interval | None, metric: str, source: str) -> Sample | None:
    """A replica's interval (or span) as a sample of `metric`; None when it has none (no
    request finished in it, or the metric is not defined there)."""
    if part is None or part.requests == 0:
        return None
    value = part.value(metric)
    return None if value is None else Sample(part.running, value, part.requests, source)


@dataclass(frozen=True)
class BucketStat:
    bucket: int
    control_n: int
    candidate_n: int
    control: (
        float | None
    )  # the side's central value (geometric mean of clipped samples), metric units
    candidate: float | None
    ratio: float | None  # candidate / control, oriented so that > 1 is worse for every metric


@dataclass(frozen=True)
class BucketInterval:
    """One matched bucket's worse-ratio (candidate ÷ control, > 1 worse) and its interval."""

    bucket: int
    samples: int
    ratio: float
    low: float | None  # None: unbounded, before the noise can be estimated
    high: float | None


@dataclass(frozen=True)
class RangeStat:
    """A judged load range: its pooled worse-ratio and interval (Bonferroni-corrected)."""

    name: str  # "all", "< 16", ">= 16"
    samples: int
    estimate: float
    low: float | None  # None: unbounded, before the noise can be estimated
    high: float | None


@dataclass(frozen=True)
class Verdict:
    state: str  # "regression" | "no_regression" | "undecided"
    estimate: float | None  # pooled worse-ratio over matched buckets (1.0 = same; 1.08 = 8 % worse)
    low: float | None  # its interval at the configured confidence
    high: float | None
    buckets: list[BucketStat]
    samples: int  # matched samples used (both sides of a bucket present)
    ranges: tuple[RangeStat, ...] = ()  # the judged ranges, each at the corrected confidence
    decided_by: str | None = None  # the range that showed the regression, LOAD_SEPARATION, None
    note: str = ""  # how the load separated, in words


@dataclass
class _Cell:
    """One side of one bucket: raw log values sorted (for the median); the clipped values'
    count, mean and sum of squared deviations (Welford's, free of cancellation); and the
    samples' log running requests: their mean, squared deviations and co-deviations with
    the values (for the load adjustment)."""

    raw: list[float]
    n: int = 0
    mean: float = 0.0
    squares: float = 0.0
    load_mean: float = 0.0
    load_squares: float = 0.0
    co_squares: float = 0.0

    def median(self) -> float:
        return _median(self.raw)

    def push(self, value: float, load: float) -> None:
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self.squares += delta * (value - self.mean)
        load_delta = load - self.load_mean
        self.load_mean += load_delta / self.n
        self.load_squares += load_delta * (load - self.load_mean)
        self.co_squares += load_delta * (value - self.mean)


def _median(ordered: list[float]) -> float:
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of a sorted, non-empty list (the nearest rank at or above it)."""
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if q > 0 else ordered[0]


def _ratio(log_ratio: float) -> float | None:
    """A log ratio back to a ratio; None for an unbounded end (no noise estimate yet)."""
    return math.exp(log_ratio) if abs(log_ratio) < 700 else None  # past 700 exp overflows


def _ranges() -> tuple[tuple[str, int, float], ...]:
    found: list[tuple[str, int, float]] = [("all", 1, math.inf)]
    for split in SPLITS:
        found += [(f"< {split}", 1, split - 1), (f">= {split}", split, math.inf)]
    return tuple(found)


RANGES = _ranges()


class Judge:
    """Feed samples of both sides with `add`; ask `verdict()` whenever (it stays valid)."""

    def __init__(
        self,
        metric: str,
        max_regression: float = 0.05,
        confidence: float = 0.95,
        min_samples: int = 20,
        *,
        adjust_load: bool = False,
        sizes: Sequence[int] = CUDA_GRAPH_SIZES,
    ) -> None:
        if metric not in METRICS:
            raise UsageError(
                f"unknown canary metric {metric!r}", hint=f"one of: {', '.join(METRICS)}"
            )
        if not 0 < max_regression < 10:
            raise UsageError(f"--max-regression must be above 0 (got {max_regression!r})")
        if not 0 < confidence < 1:
            raise UsageError(f"--confidence must be between 0 and 1 (got {confidence!r})")
        if min_samples < 0:
            raise UsageError(f"--min-samples must be 0 or more (got {min_samples!r})")
        self.metric = metric
        self.max_regression = max_regression
        self.confidence = confidence
        self.min_samples = min_samples
        # The batch sizes a sample's running requests are bucketed by: the server's decode
        # CUDA-graph sizes, as it pads a batch to the next one and steps it at that size.
        self.sizes = tuple(sorted(sizes))
        # Regress each value on its log running requests within its bucket (one slope for
        # all cells): a replica running more requests within a bucket is slower per token
        # without being worse, and what the load explains is noise no longer.
        self.adjust_load = adjust_load
        self._sign = -1.0 if metric == "throughput" else 1.0
        self._threshold = math.log1p(max_regression)
        # The mixture's scale: tightest where the interval's half-width is the MDE / sqrt(2)
        # (simulated: a promotion and an 8 % regression decide soonest near there).
        self._rho = 2 / self._threshold**2
        self._cells: dict[tuple[str, int], _Cell] = {}
        self._abs_residuals: list[float] = []  # sorted, for the robust scale
        self._previous: dict[tuple[str, str], float] = {}  # last residual per side and replica
        self._lagged = 0.0
        self._lag_squares = 0.0
        self._squares = 0.0  # the cells' squared deviations and degrees of freedom, summed
        self._df = 0
        self._load_squares = 0.0  # and their load's, and the co-deviations
        self._co_squares = 0.0
        # Each bucket's stats and matched entry, dropped when a sample lands in it: verdict()
        # is asked after every sample, and one sample changes one bucket.
        self._stats: dict[int, tuple[BucketStat, tuple[int, float, float, int] | None]] = {}
        # Each side's running requests and completions per interval: the load-separation rule.
        self._load: dict[str, tuple[list[float], list[int]]] = {side: ([], []) for side in SIDES}

    def add(self, side: str, sample: Sample) -> None:
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}")
        bucket = bucket_of(sample.running, self.sizes)
        if sample.requests <= 0 or bucket == 0:
            return
        if not (math.isfinite(sample.value) and sample.value > 0):
            return  # no observation in the interval (an empty histogram delta)
        running, finished = self._load[side]
        bisect.insort(running, sample.running)
        finished.append(sample.requests)
        value = self._sign * math.log(sample.value)
        cell = self._cells.setdefault((side, bucket), _Cell(raw=[]))
        if len(cell.raw) >= 2:
            residual = value - cell.median()
            if len(self._abs_residuals) >= MIN_RESIDUALS:
                limit = CLIP_SCALES * self._scale()
                residual = max(-limit, min(limit, residual))
                value = cell.median() + residual
            bisect.insort(self._abs_residuals, abs(residual))
            key = (side, sample.source)
            if key in self._previous:
                self._lagged += residual * self._previous[key]
                self._lag_squares += residual * residual
            self._previous[key] = residual
        bisect.insort(cell.raw, self._sign * math.log(sample.value))
        self._squares -= cell.squares
        self._load_squares -= cell.load_squares
        self._co_squares -= cell.co_squares
        cell.push(value, math.log(sample.running))
        self._squares += cell.squares
        self._load_squares += cell.load_squares
        self._co_squares += cell.co_squares
        if cell.n > 1:
            self._df += 1
        if self.adjust_load:
            self._stats.clear()  # the slope moved: every bucket's difference with it
        else:
            self._stats.pop(bucket, None)

    def _slope(self) -> float:
        """The within-bucket slope of the log value on the log load (0 without adjustment)."""
        if not self.adjust_load or self._load_squares <= LOAD_SPREAD_FLOOR:
            return 0.0
        return self._co_squares / self._load_squares

    def _scale(self) -> float:
        return max(MAD_TO_SIGMA * _median(self._abs_residuals), SIGMA_FLOOR)

    def _noise(self) -> tuple[float, int]:
        """The variance of one sample (log units, inflated for serial correlation) and its df."""
        df = self._df
        squares = self._squares
        if self._slope():  # what the load explains is not noise; the slope costs one df
            squares, df = squares - self._slope() * self._co_squares, df - 1
        if df <= 0:
            return math.inf, 0
        variance = max(squares / df, SIGMA_FLOOR**2)
        phi = self._lagged / self._lag_squares if self._lag_squares > 0 else 0.0
        phi = min(max(phi, 0.0), MAX_PHI)
        return variance * (1 + phi) / (1 - phi), df

    def _half_width(self, information: float, alpha: float) -> float:
        """The normal-mixture boundary on the estimate: valid at every sample count at once."""
        if information <= 0:
            return math.inf
        rho = self._rho
        return (
            math.sqrt(
                (information + rho)
                * (math.log((information + rho) / rho) + 2 * math.log(1 / alpha))
            )
            / information
        )

    def _bucket(self, bucket: int) -> tuple[BucketStat, tuple[int, float, float, int] | None]:
        """A bucket's stats and, when both sides have it, its log worse-ratio, its weight
        (1 / (1/n_c + 1/n_k): the inverse of its variance in units of one sample's) and samples."""
        control = self._cells.get(("control", bucket))
        candidate = self._cells.get(("candidate", bucket))
        entry = None
        if control and candidate:
            weight = control.n * candidate.n / (control.n + candidate.n)
            difference = candidate.mean - control.mean
            if slope := self._slope():
                # Compared at one load: each side's mean moved along the slope to the
                # other's mean load; the slope's own uncertainty widens it a little.
                apart = candidate.load_mean - control.load_mean
                difference -= slope * apart
                weight = 1 / (1 / weight + apart * apart / self._load_squares)
            entry = (bucket, difference, weight, control.n + candidate.n)
        stat = BucketStat(
            bucket=bucket,
            control_n=control.n if control else 0,
            candidate_n=candidate.n if candidate else 0,
            control=math.exp(self._sign * control.mean) if control else None,
            candidate=math.exp(self._sign * candidate.mean) if candidate else None,
            ratio=math.exp(entry[1]) if entry else None,
        )
        return stat, entry

    def _matched(self) -> tuple[list[BucketStat], list[tuple[int, float, float, int]]]:
        """Every bucket's stats, and the matched buckets' entries, ascending."""
        stats: list[BucketStat] = []
        matched: list[tuple[int, float, float, int]] = []
        for bucket in sorted({bucket for _, bucket in self._cells}):
            if bucket not in self._stats:
                self._stats[bucket] = self._bucket(bucket)
            stat, entry = self._stats[bucket]
            stats.append(stat)
            if entry:
                matched.append(entry)
        return stats, matched

    def _separated(self) -> tuple[float, str] | None:
        """The candidate's time in system over the control's (Little's law) and why, when its
        load has separated from the control's; else None."""
        (k_running, k_done), (c_running, c_done) = self._load["candidate"], self._load["control"]
        enough = max(self.min_samples, 2)
        if len(k_running) < enough or len(c_running) < enough:
            return None
        k_median, c_median = _median(k_running), _median(c_running)
        k_rate, c_rate = sum(k_done) / len(k_done), sum(c_done) / len(c_done)
        if not (
            k_median >= SEPARATION * c_median
            and _quantile(k_running, 0.25) > _quantile(c_running, 0.75)
            and k_rate <= SEPARATION_RATE * c_rate
        ):
            return None
        k_mean, c_mean = sum(k_running) / len(k_running), sum(c_running) / len(c_running)
        ratio = (k_mean / k_rate) / (c_mean / c_rate)
        note = (
            f"the candidate holds {k_median:.0f} running requests against the control's "
            f"{c_median:.0f} at {k_rate / c_rate:.2f} times its completions: each request "
            f"stays about {ratio:.1f} times as long"
        )
        return ratio, note

    def _compared(self, min_cell: int) -> list[tuple[int, float, float, int]]:
        """The matched buckets' entries where each side has at least `min_cell` samples."""
        _, matched = self._matched()
        return [
            entry
            for entry in matched
            if min(self._cells[side, entry[0]].n for side in SIDES) >= min_cell
        ]

    def bucket_intervals(self, share: float = 1.0, min_cell: int = 1) -> list[BucketInterval]:
        """Each matched bucket's worse-ratio with its own interval, for one look at the end
        of a window of fixed length: Student-free normal intervals (the noise has at least
        MIN_DF degrees of freedom, else every interval is unbounded) at the configured
        confidence (or `share` of its error rate), Bonferroni-split over the matched buckets.
        Unlike `verdict`, this is not valid when asked again and again while samples come in.
        Buckets where a side has fewer than `min_cell` samples are left out."""
        matched = self._compared(min_cell)
        if not matched:
            return []
        alpha = share * (1 - self.confidence) / len(matched)
        z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
        return self._intervals(min_cell, lambda information: z / math.sqrt(information))

    def bucket_sequences(self, share: float = 1.0, min_cell: int = 1) -> list[BucketInterval]:
        """Each matched bucket's worse-ratio with an always-valid interval (the normal-mixture
        boundary of `verdict`): it may be asked after every sample. The error rate (`share`
        of the configured one) is split over the judge's sizes and BUCKETS_BEYOND more, a
        family fixed before any data, so the intervals hold together however often and at
        whichever buckets they are read. Wider than `bucket_intervals` at the same samples:
        the price of looking.
        Buckets where a side has fewer than `min_cell` samples are left out."""
        alpha = share * (1 - self.confidence) / (len(self.sizes) + BUCKETS_BEYOND)
        return self._intervals(min_cell, lambda information: self._half_width(information, alpha))

    def _intervals(
        self, min_cell: int, half_width: Callable[[float], float]
    ) -> list[BucketInterval]:
        """The compared buckets' worse-ratios, each with `half_width(its information)` on
        the log scale (unbounded before the noise has MIN_DF degrees of freedom)."""
        variance, df = self._noise()
        found = []
        for bucket, difference, weight, count in self._compared(min_cell):
            width = half_width(weight / variance) if df >= MIN_DF else math.inf
            found.append(
                BucketInterval(
                    bucket, count, math.exp(difference),
                    _ratio(difference - width), _ratio(difference + width),
                )
            )  # fmt: skip
        return found

    def weighted_interval(self, shares: Mapping[int, float]) -> BucketInterval | None:
        """The worse-ratio over the matched buckets `shares` names, each weighted by its
        share (of the traffic, not of the information), with its normal interval at the
        configured confidence: one look at the end of a window, as `bucket_intervals`. Its
        `bucket` is 0; None when no bucket of `shares` is matched."""
        _, matched = self._matched()
        used = [(b, d, w, n) for b, d, w, n in matched if shares.get(b, 0) > 0]
        if not used:
            return None
        total = sum(shares[b] for b, *_ in used)
        estimate = sum(shares[b] / total * d for b, d, _, _ in used)
        variance, df = self._noise()
        spread = math.sqrt(variance * sum((shares[b] / total) ** 2 / w for b, _, w, _ in used))
        z = statistics.NormalDist().inv_cdf(1 - (1 - self.confidence) / 2)
        width = z * spread if df >= MIN_DF else math.inf
        return BucketInterval(
            0, sum(n for *_, n in used), math.exp(estimate),
            _ratio(estimate - width), _ratio(estimate + width),
        )  # fmt: skip

    def verdict(self) -> Verdict:
        buckets, matched = self._matched()
        separated = self._separated()
        if separated is not None:
            ratio, note = separated
            samples = sum(entry[3] for entry in matched)
            return Verdict(
                "regression", ratio, None, None, buckets, samples, (), LOAD_SEPARATION, note
            )
        if not matched:
            return Verdict("undecided", None, None, None, buckets, 0)
        # Prefix sums over the ascending matched buckets: a range is a slice of them.
        keys = [m[0] for m in matched]
        weights, weighted, counts = [0.0], [0.0], [0]
        for _, difference, weight, count in matched:
            weights.append(weights[-1] + weight)
            weighted.append(weighted[-1] + weight * difference)
            counts.append(counts[-1] + count)
        samples = counts[-1]
        variance, df = self._noise()
        family_alpha = (1 - self.confidence) / len(RANGES)
        judged: dict[tuple[int, int], tuple[RangeStat, float, float]] = {}
        for name, low, high in RANGES:
            first = bisect.bisect_left(keys, low)
            last = bisect.bisect_right(keys, high)
            count = counts[last] - counts[first]
            # An empty range, or one already judged under another name, adds nothing.
            if (first, last) in judged or count == 0 or count < MIN_SHARE * samples:
                continue
            weight = weights[last] - weights[first]
            estimate = (weighted[last] - weighted[first]) / weight
            width = self._half_width(weight / variance, family_alpha)
            stat = RangeStat(
                name, count, math.exp(estimate), _ratio(estimate - width), _ratio(estimate + width)
            )
            judged[first, last] = (stat, estimate - width, estimate + width)
        estimate = weighted[-1] / weights[-1]
        width = self._half_width(weights[-1] / variance, 1 - self.confidence)
        state = "undecided"
        decided_by = None
        if samples >= self.min_samples and df >= MIN_DF:
            worst = max(judged.values(), key=lambda j: j[1])
            if worst[1] > self._threshold:
                state = "regression"
                decided_by = worst[0].name
            elif all(upper < self._threshold for _, _, upper in judged.values()):
                state = "no_regression"
        return Verdict(
            state,
            math.exp(estimate),
            _ratio(estimate - width),
            _ratio(estimate + width),
            buckets,
            samples,
            tuple(stat for stat, _, _ in judged.values()),
            decided_by,
        )
