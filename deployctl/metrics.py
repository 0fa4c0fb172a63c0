"""SGLang's Prometheus metrics (`--enable-metrics`, GET /metrics): a pure parser.

The text is read as prometheus_client's parser reads it (`read_counts`). Scheduler metrics
come from TP rank 0 (SGLang labels them `tp_rank`); histograms are summed over their label
sets and read as Prometheus' `histogram_quantile` reads them.
"""

from __future__ import annotations

import math
import re
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
    of the page, for what status shows and for a canary's intervals.

    A page of the text format (0.0.4, what SGLang writes) gives the counts prometheus_client's
    parser gives (tests/test_metrics_parser.py compares the two): samples join families as it
    joins them, and a family's last TYPE decides what its samples are. Labels are decoded only
    where they are read (`le`, `tp_rank`): a real 600-line page costs ~2.3 ms of CPU, not
    prometheus_client's ~12. Refused where prometheus_client reads: what the format does not
    allow (a name outside its grammar, a quoted name, an empty label value, an exemplar,
    tokens after the timestamp). Read where prometheus_client refuses: a label named twice or
    a reserved `__` label on a line whose labels are not read."""
    page = _Page()
    family = _Family("")
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line:
            continue
        try:
            if line[0] == "#":
                parts = _HEADER_SPLIT.split(line, maxsplit=3)
                if len(parts) < 2 or parts[1] not in ("HELP", "TYPE"):
                    continue  # a comment
                name = _metric_name(parts[2]) if len(parts) > 2 else ""
                if parts[1] == "TYPE" and len(parts) < 4:
                    raise ValueError(f"no metric type in {line!r}")
                if name != family.name:
                    page.add(family)
                    family = _Family(name)
                if parts[1] == "TYPE":
                    family.typed(parts[3], number)
                continue
            sample = _SAMPLE.fullmatch(line)
            if sample is None:
                raise ValueError(f"not a sample: {line!r}")
            name, value = sample["name"], _value(sample["value"])
            if sample["timestamp"] is not None:
                _value(sample["timestamp"])
            held = (number, name, sample["labels"] or "", value)
            if name in family.holds:
                family.samples.append(held)
            else:  # a family of its own, untyped; the one before has ended
                page.add(family)
                family = _Family("")
                page.add(_Family(name, [held]))
        except ValueError as exc:
            raise _not_prometheus(number, exc) from None
    page.add(family)
    return Counts(page.gauges, page.counters, page.histograms)


# The text exposition format (0.0.4), as SGLang's prometheus_client writes it. A quoted value
# is "unrolled" (runs of plain characters between escapes), and no two runs of blanks meet:
# a line is matched in time linear in its length, whatever it holds.
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_QUOTED = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL = rf"{_LABEL_NAME}[ \t]*=[ \t]*{_QUOTED}[ \t]*"
_SAMPLE = re.compile(
    rf"(?P<name>{_NAME})"
    rf"(?:[ \t]*\{{[ \t]*(?:,[ \t]*)?(?P<labels>(?:{_LABEL}(?:,[ \t]*|(?=\}})))*)\}}[ \t]*|[ \t]+)"
    r"(?P<value>[^ \t]+)(?:[ \t]+(?P<timestamp>[^ \t]+))?"
)
_METRIC_NAME = re.compile(_NAME)
_LABEL_PAIR = re.compile(rf"({_LABEL_NAME})[ \t]*=[ \t]*({_QUOTED})")
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_ESCAPE = re.compile(r'\\[\\n"]')
# A header's words are split on ASCII blanks only, as prometheus_client splits them.
_HEADER_SPLIT = re.compile(r"[ \t\n\r\x0b\x0c]+")
_TYPES = frozenset(
    ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "untyped", "info",
     "stateset")
)  # fmt: skip
# The sample names a family of each type holds, after its name (any other: just the name).
_SAMPLES_OF = {"summary": ("_count", "_sum", ""), "histogram": ("_count", "_sum", "_bucket")}
# (line number, sample name, labels as written, value)
_Held = tuple[int, str, str, float]


class _Family:
    """A family as the page builds it: its name ("": none yet), its type and the line that
    said it, the samples it holds so far."""

    def __init__(self, name: str, samples: list[_Held] | None = None) -> None:
        self.name, self.kind, self.kind_line = name, "untyped", 0
        self.samples = samples or []
        self.holds: frozenset[str] = frozenset((name,) if name else ())

    def typed(self, kind: str, number: int) -> None:
        self.kind, self.kind_line = kind, number
        self.holds = frozenset(self.name + end for end in _SAMPLES_OF.get(kind, ("",)))


class _Page:
    """What a page's families add up to: TP rank 0's gauges (else the first rank's listed),
    counters and cumulative histogram buckets summed over their label sets."""

    def __init__(self) -> None:
        self.gauges: dict[str, float] = {}
        self.ranks: dict[str, str] = {}
        self.counters: dict[str, float] = {}
        self.histograms: dict[str, dict[float, float]] = {}

    def add(self, family: _Family) -> None:
        if not family.name:
            return
        if family.kind not in _TYPES:
            raise _not_prometheus(family.kind_line, ValueError(f"no type {family.kind!r}"))
        # prometheus_client names a counter's family without its `_total`
        name = family.name.removesuffix("_total") if family.kind == "counter" else family.name
        if not name:
            raise _not_prometheus(family.kind_line, ValueError("a counter without a name"))
        if not name.startswith(PREFIX):
            return
        short, bucket = name.removeprefix(PREFIX), family.name + "_bucket"
        for number, sample, labels, value in family.samples:
            try:
                if family.kind == "counter":
                    key = short + "_total"
                    self.counters[key] = self.counters.get(key, 0.0) + value
                elif family.kind == "histogram":
                    if sample == bucket:
                        self._bucket(short, labels, value)
                elif sample == family.name:
                    self._gauge(short, labels, value)
            except ValueError as exc:
                raise _not_prometheus(number, exc) from None

    def _bucket(self, name: str, labels: str, value: float) -> None:
        bound = _labels(labels).get("le")
        if bound is None:
            raise ValueError("a bucket without its le label")
        counts = self.histograms.setdefault(name, {})
        upper = _value(bound)
        counts[upper] = counts.get(upper, 0.0) + value

    def _gauge(self, name: str, labels: str, value: float) -> None:
        if name in self.gauges and self.ranks[name] == "0":
            return
        rank = _labels(labels).get("tp_rank", "0") if "tp_rank" in labels else "0"
        if name not in self.gauges or rank == "0":
            self.gauges[name], self.ranks[name] = value, rank


def _not_prometheus(number: int, exc: ValueError) -> MetricsError:
    return MetricsError(f"the server's /metrics is not Prometheus text: line {number}: {exc}")


def _metric_name(text: str) -> str:
    if _METRIC_NAME.fullmatch(text) is None:
        raise ValueError(f"not a metric name: {text!r}")
    return text


def _value(text: str) -> float:
    """A sample's value as Python reads a float (`NaN`, `+Inf`), but never `1_0`."""
    if "_" in text:
        raise ValueError(f"not a number: {text!r}")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None


def _labels(text: str) -> dict[str, str]:
    """A sample's labels, decoded (the text matched `_SAMPLE`'s label list). Without a
    backslash no value holds a quote, so the quotes split names from values."""
    if "\\" in text:
        pairs = [
            (name, _ESCAPE.sub(_unescape, quoted[1:-1]))
            for name, quoted in _LABEL_PAIR.findall(text)
        ]
    else:
        parts = text.split('"')
        pairs = list(zip((part.strip(", \t=") for part in parts[:-1:2]), parts[1::2], strict=True))
    labels = dict(pairs)
    if len(labels) != len(pairs):
        raise ValueError(f"a label named twice in {{{text}}}")
    return labels


def _unescape(escape: re.Match[str]) -> str:
    return _UNESCAPED[escape[0]]


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
