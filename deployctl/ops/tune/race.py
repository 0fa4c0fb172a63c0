"""Speculation policies raced on live traffic (`tune --live --policies`): pure.

Each policy serves on its own replica behind one router; every interval each replica's
output tokens per second per running request is a sample of its policy. Each pair of
policies has a `Judge` (deployctl.canary_stats) at a confidence split over the pairs
(Bonferroni), so every bucket's and the overall comparison hold together.

- A bucket's winner is the policy with the best central value there (once each policy has
  `MIN_CELL` samples in it); it is decided when its interval against every other policy
  lies wholly above even.
- The overall winner weighs the buckets by the traffic's share of them (where the fleet's
  load is, not where samples are cheapest): the policy with the best weighted log value,
  decided when its weighted interval against every other lies wholly above even.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from deployctl.canary_stats import (
    CUDA_GRAPH_SIZES,
    MIN_CELL,
    BucketInterval,
    Judge,
    Sample,
    bucket_of,
)

# The judges' regression margin: unused here (intervals decide), as in the live window.
RACE_MARGIN = 0.03


@dataclass(frozen=True)
class Gain:
    """One policy's throughput over another's (> 1: better), with its interval."""

    ratio: float
    low: float | None  # None: unbounded
    high: float | None

    @property
    def better(self) -> bool:
        return self.low is not None and self.low > 1


@dataclass(frozen=True)
class RaceBucket:
    bucket: int
    samples: dict[str, int]  # policy -> samples in the bucket
    values: dict[str, float]  # policy -> output tok/s per running request (geometric mean)
    winner: str | None  # None: a policy has fewer than MIN_CELL samples here
    decided: bool  # the winner better than each other policy beyond their interval


@dataclass(frozen=True)
class RaceOverall:
    winner: str | None  # None: no bucket every policy served at
    decided: bool
    versus: dict[str, Gain]  # each other policy -> the winner's gain over it, traffic-weighted
    shares: dict[int, float]  # bucket -> its share of the traffic, over the common buckets


@dataclass(frozen=True)
class RaceResult:
    policies: tuple[str, ...]
    buckets: tuple[RaceBucket, ...]
    overall: RaceOverall


def _flipped(interval: BucketInterval) -> Gain:
    """A worse-ratio interval (> 1 worse) as the other side's gain."""
    return Gain(
        1 / interval.ratio,
        None if interval.high is None else 1 / interval.high,
        None if interval.low is None else 1 / interval.low,
    )


class PolicyRace:
    """Feed each policy's samples with `add`; read `result()` once, at the window's end."""

    def __init__(
        self,
        policies: Sequence[str],
        confidence: float,
        min_samples: int,
        sizes: Sequence[int] = CUDA_GRAPH_SIZES,
    ) -> None:
        if len(set(policies)) != len(policies) or len(policies) < 2:
            raise ValueError(f"a race needs two or more distinct policies, not {policies!r}")
        self.policies = tuple(policies)
        self.sizes = tuple(sorted(sizes))  # the buckets: the replicas' CUDA-graph sizes
        pairs = list(itertools.combinations(self.policies, 2))
        pair_confidence = 1 - (1 - confidence) / len(pairs)
        # (a, b): a is the judge's candidate, b its control.
        self._judges = {
            pair: Judge(
                "throughput",
                RACE_MARGIN,
                pair_confidence,
                min_samples,
                adjust_load=True,
                sizes=self.sizes,
            )
            for pair in pairs
        }
        self._logs: dict[tuple[str, int], list[float]] = {}
        self._traffic: Counter[int] = Counter()

    def add(self, policy: str, sample: Sample) -> None:
        for (candidate, control), judge in self._judges.items():
            if policy == candidate:
                judge.add("candidate", sample)
            elif policy == control:
                judge.add("control", sample)
        bucket = bucket_of(sample.running, self.sizes)
        if sample.requests > 0 and bucket and math.isfinite(sample.value) and sample.value > 0:
            self._logs.setdefault((policy, bucket), []).append(math.log(sample.value))
            self._traffic[bucket] += 1

    @property
    def samples(self) -> int:
        return sum(self._traffic.values())

    def gain(self, winner: str, other: str, bucket: int) -> Gain | None:
        """`winner`'s gain over `other` in one bucket (its Bonferroni-split interval)."""
        judge, flip = self._pair(winner, other)
        found = next((i for i in judge.bucket_intervals() if i.bucket == bucket), None)
        if found is None:
            return None
        return _flipped(found) if not flip else Gain(found.ratio, found.low, found.high)

    def _pair(self, a: str, b: str) -> tuple[Judge, bool]:
        """The judge of a pair, and whether `a` is its control (its ratio is then a's gain)."""
        if (a, b) in self._judges:
            return self._judges[a, b], False
        return self._judges[b, a], True

    def result(self) -> RaceResult:
        buckets = sorted({b for _, b in self._logs})
        rows = []
        common: list[int] = []
        for bucket in buckets:
            logs = {p: self._logs.get((p, bucket), []) for p in self.policies}
            values = {p: math.exp(sum(v) / len(v)) for p, v in logs.items() if v}
            winner, decided = None, False
            if all(len(v) >= MIN_CELL for v in logs.values()):
                common.append(bucket)
                winner = max(values, key=values.__getitem__)
                gains = [self.gain(winner, p, bucket) for p in self.policies if p != winner]
                decided = all(g is not None and g.better for g in gains)
            samples = {p: len(v) for p, v in logs.items()}
            rows.append(RaceBucket(bucket, samples, values, winner, decided))
        return RaceResult(self.policies, tuple(rows), self._overall(rows, common))

    def _overall(self, rows: Sequence[RaceBucket], common: Sequence[int]) -> RaceOverall:
        total = sum(self._traffic[b] for b in common)
        if not total:
            return RaceOverall(None, False, {}, {})
        shares = {b: self._traffic[b] / total for b in common}
        by_bucket = {r.bucket: r for r in rows}

        def score(policy: str) -> float:
            return sum(s * math.log(by_bucket[b].values[policy]) for b, s in shares.items())

        winner = max(self.policies, key=score)
        versus: dict[str, Gain] = {}
        for other in self.policies:
            if other == winner:
                continue
            judge, flip = self._pair(winner, other)
            weighted = judge.weighted_interval(shares)
            if weighted is not None:
                versus[other] = (
                    Gain(weighted.ratio, weighted.low, weighted.high)
                    if flip
                    else _flipped(weighted)
                )
        decided = len(versus) == len(self.policies) - 1 and all(g.better for g in versus.values())
        return RaceOverall(winner, decided, versus, shares)
