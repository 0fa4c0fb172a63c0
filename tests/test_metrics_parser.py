"""The /metrics parser: SGLang's Prometheus text into the numbers deployctl shows."""

from __future__ import annotations

import pytest

from deployctl.errors import MetricsError
from deployctl.metrics import parse_metrics, quantile

INF = float("inf")


def test_quantiles_are_read_as_prometheus_histogram_quantile_reads_them() -> None:
    counts = {0.1: 0.0, 0.2: 4.0, 0.4: 10.0, INF: 10.0}
    assert quantile(0.5, counts) == pytest.approx(0.2 + 0.2 * (5 - 4) / 6)
    assert quantile(0.2, counts) == pytest.approx(0.1 + 0.1 * 2 / 4)
    assert quantile(0.5, {0.1: 0.0, INF: 0.0}) is None  # no request seen yet
    assert quantile(0.99, {0.1: 0.0, 0.2: 1.0, INF: 3.0}) == 0.2  # beyond the last bucket


def sglang_page(rank1_running: float = 7.0) -> str:
    """A /metrics page shaped like SGLang 0.5.23's: two TP ranks' gauges, a histogram per
    streaming flag, and metrics deployctl does not show."""
    labels = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0"'
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f'sglang:num_running_reqs{{{labels},tp_rank="1"}} {rank1_running}',
        f'sglang:num_running_reqs{{{labels},tp_rank="0"}} 3.0',
        "# TYPE sglang:gen_throughput gauge",
        f'sglang:gen_throughput{{{labels},tp_rank="0"}} 812.5',
        "# TYPE sglang:decode_sum_seq_lens gauge",
        f'sglang:decode_sum_seq_lens{{{labels},tp_rank="0"}} 4096.0',
        "# TYPE sglang:time_to_first_token_seconds histogram",
    ]
    for flag, counts in (("true", (1, 3, 4)), ("false", (0, 1, 2))):
        for bound, count in zip(("0.1", "0.2", "+Inf"), counts, strict=True):
            lines.append(
                f'sglang:time_to_first_token_seconds_bucket{{{labels},tp_rank="0",'
                f'is_streaming="{flag}",le="{bound}"}} {count}'
            )
        lines.append(
            f'sglang:time_to_first_token_seconds_count{{{labels},tp_rank="0",'
            f'is_streaming="{flag}"}} {counts[-1]}'
        )
    lines.append("# TYPE process_cpu_seconds_total counter")
    lines.append("process_cpu_seconds_total 12.0")
    return "\n".join(lines) + "\n"


def test_gauges_come_from_tp_rank_0_and_histograms_sum_their_label_sets() -> None:
    metrics = parse_metrics(sglang_page())
    assert metrics["num_running_reqs"] == 3.0  # rank 0's, listed after rank 1's
    assert metrics["gen_throughput"] == 812.5
    assert metrics["spec_accept_length"] is None  # not exported without speculation
    assert metrics["num_queue_reqs"] is None
    ttft = metrics["time_to_first_token_seconds"]
    assert ttft["count"] == 6  # 4 streaming + 2 not
    assert ttft["p50"] == pytest.approx(0.1 + 0.1 * (3 - 1) / 3)  # cumulative 1, 4, 6
    assert metrics["inter_token_latency_seconds"] == {"p50": None, "p99": None, "count": 0}


@pytest.mark.parametrize(
    "text",
    [
        "<html>Not Found</html>",
        "sglang:gen_throughput{ 5\n",
        'sglang:gen_throughput{tp_rank="0" 5\n',
    ],
)
def test_a_page_that_is_not_prometheus_text_is_an_error(text: str) -> None:
    with pytest.raises(MetricsError, match="not Prometheus text"):
        parse_metrics(text)


def test_other_families_first_nan_gauges_and_exact_quantiles() -> None:
    page = (
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.0\n"
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{tp_rank="0"} NaN\n'
        "# TYPE sglang:cache_hit_rate gauge\n"
        'sglang:cache_hit_rate{tp_rank="0"} 0.5\n'
        "# TYPE sglang:inter_token_latency_seconds histogram\n"
        'sglang:inter_token_latency_seconds_bucket{tp_rank="0",le="0.1"} 1.0\n'
        'sglang:inter_token_latency_seconds_bucket{tp_rank="0",le="+Inf"} 1.0\n'
    )
    metrics = parse_metrics(page)
    assert metrics["cache_hit_rate"] == 0.5  # read after a family deployctl skips
    assert metrics["token_usage"] is None  # NaN: nothing to show
    # One observation, in the first bucket: from 0 up to its bound, as Prometheus reads it.
    assert metrics["inter_token_latency_seconds"] == {"p50": 0.05, "p99": 0.099, "count": 1}


def test_the_first_bucket_starts_at_zero() -> None:
    assert quantile(0.5, {0.1: 4.0, INF: 4.0}) == pytest.approx(0.05)
    assert quantile(0.25, {0.2: 4.0, 0.4: 8.0, INF: 8.0}) == pytest.approx(0.1)


def test_the_stand_ins_buckets_are_sglangs_own() -> None:
    """The stand-in's /metrics buckets, read against the real 0.5.23 wheel's declarations."""
    import ast
    import zipfile

    from tests.sglang_wheel import ensure_wheels
    from tests.standin.sglang_standin.request_metrics import ITL_BUCKETS, TTFT_BUCKETS

    with zipfile.ZipFile(ensure_wheels()[0]) as wheel:
        source = wheel.read("sglang/srt/observability/metrics_collector.py").decode()
    declared = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.startswith("bucket_"):
                    declared.setdefault(target.id, ast.literal_eval(node.value))
    assert declared["bucket_time_to_first_token"] == list(TTFT_BUCKETS)
    assert declared["bucket_inter_token_latency"] == list(ITL_BUCKETS)
