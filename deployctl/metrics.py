"""SGLang's Prometheus metrics (`--enable-metrics`, GET /metrics): a pure parser.

The text is parsed with prometheus_client's own parser. Scheduler metrics come from TP rank
0 (SGLang labels them `tp_rank`); histograms are summed over their label sets and read as
Prometheus' `histogram_quantile` reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from deployctl.errors import MetricsError

PREFIX = "sglang:"
GAUGES = (
    "num_running_reqs",
    "num_queue_reqs",
    "gen_throughput",
    "token_usage",
    "cache_hit_rate",
    "spec_accept_length",
    # A decode's requests waiting for their KV from a prefill (disaggregation).
    "num_decode_transfer_queue_reqs",
)
# Counters, summed over their label sets: tokens generated since the server started.
COUNTERS = ("generation_tokens_total",)
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds")
# What the agent brings back at most: SGLang's page is tens of KiB.
METRICS_LIMIT_BYTES = 1 << 20


def parse_metrics(text: str) -> dict[str, Any]:
    """The metrics deployctl shows, keyed by SGLang's names without `sglang:`.

    Gauges are numbers (None when the server does not export one, e.g. no speculation);
    histograms are {"p50": seconds, "p99": seconds, "count": n}, with None quantiles while
    no request has been seen.
    """
    page = read_counts(text)
    gauges, counters, buckets = page.gauges, page.counters, page.histograms
    found: dict[str, Any] = {name: _finite(gauges.get(name)) for name in GAUGES}
    found.update({name: _finite(counters.get(name)) for name in COUNTERS})
    if found["spec_accept_length"] == 0:
        # Real SGLang (0.5.17) exports it on a server that does not speculate too, as 0.0; a
        # speculating one reports at least 1 (the verified token counts).
        found["spec_accept_length"] = None
    for name in HISTOGRAMS:
        counts = buckets.get(name, {})
        total = counts.get(math.inf, 0.0)
        found[name] = {
            "p50": quantile(0.5, counts),
            "p99": quantile(0.99, counts),
            "count": int(total),
        }
    return found


def quantile(q: float, counts: dict[float, float]) -> float | None:
    """`histogram_quantile(q, …)` over cumulative bucket counts {upper bound: count}."""
    bounds = sorted(counts)
    if not bounds or bounds[-1] != math.inf or counts[math.inf] <= 0:
        return None
    rank = q * counts[math.inf]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = counts[bound]
        if count >= rank:
            if bound == math.inf:  # beyond the last finite bucket: its bound is the answer
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return None


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


# ---- intervals: what a server did between two reads of its /metrics (canary) ------------


@dataclass(frozen=True)
class Counts:
    """One read of a server's /metrics, by SGLang's names without `sglang:`: its gauges (TP
    rank 0's), counters and cumulative histogram buckets {upper bound: count}, each summed
    over its label sets."""

    gauges: dict[str, float]
    counters: dict[str, float]
    histograms: dict[str, dict[float, float]]

    @property
    def running(self) -> float:
        return self.gauges.get("num_running_reqs", 0.0)


@dataclass(frozen=True)
class Interval:
    """What a server did between two reads: its mean batch, the requests it finished and
    aborted, its ITL and TTFT medians over the interval, and tokens/s per running request."""

    seconds: float
    running: float
    requests: int
    aborted: int
    itl: float | None
    ttft: float | None
    throughput: float | None  # output tokens per second per running request

    def value(self, metric: str) -> float | None:
        return {"itl": self.itl, "ttft": self.ttft, "throughput": self.throughput}[metric]


def read_counts(text: str) -> Counts:
    """Every `sglang:` gauge, counter and histogram of a /metrics page (pure); the one parse
    of the page, for what status shows and for a canary's intervals."""
    from prometheus_client.parser import text_string_to_metric_families

    gauges: dict[str, float] = {}
    ranks: dict[str, str] = {}
    counters: dict[str, float] = {}
    histograms: dict[str, dict[float, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            name = family.name.removeprefix(PREFIX)
            if not family.name.startswith(PREFIX):
                continue
            for sample in family.samples:
                if family.type == "counter" and sample.name == family.name + "_total":
                    # (a counter family's name lacks the `_total` its samples have)
                    key = name + "_total"
                    counters[key] = counters.get(key, 0.0) + sample.value
                elif family.type == "histogram" and sample.name == family.name + "_bucket":
                    counts = histograms.setdefault(name, {})
                    bound = float(sample.labels["le"])
                    counts[bound] = counts.get(bound, 0.0) + sample.value
                elif sample.name == family.name and family.type not in ("counter", "histogram"):
                    rank = sample.labels.get("tp_rank", "0")
                    if name not in gauges or (rank == "0" and ranks[name] != "0"):
                        gauges[name], ranks[name] = sample.value, rank
    except (ValueError, KeyError, TypeError) as exc:
        raise MetricsError(f"the server's /metrics is not Prometheus text: {exc}") from None
    return Counts(gauges, counters, histograms)


def counter_delta(before: Counts, after: Counts, name: str) -> float:
    """How much counter `name` grew between two reads; one that went back (the server
    restarted) counts from zero."""
    now, then = after.counters.get(name, 0.0), before.counters.get(name, 0.0)
    return now - then if now >= then else now


def interval(
    before: Counts, after: Counts, seconds: float, running: float | None = None
) -> Interval:
    """The interval between two reads (a counter that went back: the server restarted, and
    the interval counts from zero). Its load is `running` (the mean of more reads than two)
    or the mean of the two reads' running requests."""

    def median(name: str) -> float | None:
        now, then = after.histograms.get(name, {}), before.histograms.get(name, {})
        restarted = now.get(math.inf, 0.0) < then.get(math.inf, 0.0)
        counts = {b: c - (0.0 if restarted else then.get(b, 0.0)) for b, c in now.items()}
        return quantile(0.5, counts)

    if running is None:
        running = (before.running + after.running) / 2
    tokens = counter_delta(before, after, "generation_tokens_total")
    per_request = tokens / seconds / running if seconds > 0 and running > 0 else None
    return Interval(
        seconds,
        running,
        int(counter_delta(before, after, "num_requests_total")),
        int(counter_delta(before, after, "num_aborted_requests_total")),
        median("inter_token_latency_seconds"),
        median("time_to_first_token_seconds"),
        per_request,
    )


# A span closes once this many requests have finished in it: a rate from one finish over a
# span rounded to whole reads is off by up to a read either way, and the judge averages the
# logs of the rates; three finishes keep that within about 15 % at any finish rate (simulated
# with random finishes; the old rule, dropping intervals without one, read 3.7 times the rate
# at 0.3 finishes a read).
SPAN_FINISHES = 3


@dataclass
class _Span:
    start_at: float
    start: Counts
    load: float = 0.0  # running requests x seconds since start (trapezoids between reads)


def _went_back(before: Counts, after: Counts) -> bool:
    """A counter smaller than at the read before: the server restarted in between."""
    return any(after.counters.get(name, 0.0) < v for name, v in before.counters.items())


class Spans:
    """Throughput samples that lose no time. SGLang counts a request's output tokens when it
    finishes, so an interval in which none finished shows no tokens although its requests
    ran. Dropping such intervals keeps the time of the ones that did finish but not of the
    ones that did not: it overstates the rate of a server whose requests finish seldom
    against one whose requests finish often (in the lab, read every 0.25 s, a speculative
    replica that gains 47 % at a batch of 4 read as a 35 % loss). A span instead runs from a
    read at which a request had finished to the first read by which SPAN_FINISHES more had,
    through the reads without one; its load is the time-weighted mean of the reads' running
    requests. A server's first span starts at its first read with a finish, and again after
    a restart (its counters went back)."""

    def __init__(self, finishes: int = SPAN_FINISHES) -> None:
        self.finishes = finishes
        self._open: dict[str, _Span] = {}
        self._last: dict[str, tuple[float, Counts]] = {}  # each server's read before

    def add(self, name: str, at: float, counts: Counts) -> Interval | None:
        """Server `name` read at `at`: the span it ends, else None."""
        last = self._last.get(name)
        self._last[name] = (at, counts)
        span = self._open.get(name)
        if last is None or _went_back(last[1], counts):
            self._open.pop(name, None)  # no finish seen yet (since the restart)
            return None
        last_at, before = last
        if span is None:
            if counter_delta(before, counts, "num_requests_total") > 0:  # the first span
                self._open[name] = _Span(at, counts)
            return None
        span.load += (before.running + counts.running) / 2 * (at - last_at)
        seconds = at - span.start_at
        if seconds <= 0:
            return None
        part = interval(span.start, counts, seconds, span.load / seconds)
        if part.requests < self.finishes:
            return None  # too few finished yet: the span goes on
        self._open[name] = _Span(at, counts)
        return part
