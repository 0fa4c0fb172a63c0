"""The tokenizer manager's per-request metrics (latency histograms and counters)."""

from __future__ import annotations

import bisect

# SGLang 0.5.23's buckets (srt/observability/metrics_collector.py, TokenizerMetricsCollector's
# defaults: bucket_time_to_first_token, bucket_inter_token_latency, bucket_e2e_request_latency).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
    0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
# TokenizerMetricsCollector's per-request metrics (0.5.23, srt/observability/metrics_collector.py):
# name without "sglang:", its documentation, its buckets (None: a counter), and whether it is
# labelled is_streaming (beside model_name and engine_type, which every one carries).
REQUEST_METRICS: tuple[tuple[str, str, tuple[float, ...] | None, bool], ...] = (
    ("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     TTFT_BUCKETS, True),
    ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     ITL_BUCKETS, False),
    ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
     E2E_BUCKETS, True),
    ("generation_tokens_total", "Number of generation tokens processed.", None, True),
    ("num_requests_total", "Number of requests processed.", None, True),
    ("num_aborted_requests_total", "Number of requests aborted.", None, False),
)  # fmt: skip
_BOUNDS = {name: bounds for name, _, bounds, _ in REQUEST_METRICS if bounds is not None}


class RequestMetrics:
    """The tokenizer manager's request metrics, kept live as 0.5.23 keeps them.

    Series are keyed (name, is_streaming value, "" where the metric has no such label). As
    prometheus_client shows a labelled child only once it is used, the non-streamed series and
    num_aborted_requests_total appear with their first observation; the streamed ones (and
    the ITL histogram) are there from the start, at 0. Callers hold the decoder's lock.
    """

    def __init__(self) -> None:
        self.histograms: dict[tuple[str, str], list[float]] = {}  # bucket counts, then sum
        self.counters: dict[tuple[str, str], float] = {}
        for name, _, _, by_stream in REQUEST_METRICS:
            if name != "num_aborted_requests_total":
                self._row(name, "true" if by_stream else "")

    def _row(self, name: str, streaming: str) -> list[float]:
        if name not in _BOUNDS:
            self.counters.setdefault((name, streaming), 0.0)
            return []
        row = self.histograms.get((name, streaming))
        if row is None:
            row = self.histograms[(name, streaming)] = [0.0] * (len(_BOUNDS[name]) + 2)
        return row

    def observe(self, name: str, streaming: str, value: float, n: int = 1) -> None:
        """``n`` observations of ``value / n`` adding ``value`` to the sum, as 0.5.23's
        observe_inter_token_latency counts a gap that brought n tokens."""
        row = self._row(name, streaming)
        row[bisect.bisect_left(_BOUNDS[name], value / n)] += n  # le: the first bound >= it
        row[-1] += value

    def count(self, name: str, streaming: str, n: float = 1.0) -> None:
        self._row(name, streaming)
        self.counters[(name, streaming)] += n
