"""The /metrics parser: SGLang's Prometheus text into the numbers deployctl shows."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deployctl.errors import MetricsError
from deployctl.metrics import PREFIX, Counts, parse_metrics, quantile, read_counts

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


# ---- read_counts against prometheus_client's own parser ---------------------------------


def prometheus_counts(text: str) -> Counts:
    """What deployctl read from a page through prometheus_client's text parser (its parser
    before it had its own, its values as floats): the oracle `read_counts` must agree with."""
    gauges: dict[str, float] = {}
    ranks: dict[str, str] = {}
    counters: dict[str, float] = {}
    histograms: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        name = family.name.removeprefix(PREFIX)
        for sample in family.samples:
            if family.type == "counter" and sample.name == family.name + "_total":
                counters[name + "_total"] = counters.get(name + "_total", 0.0) + float(sample.value)
            elif family.type == "histogram" and sample.name == family.name + "_bucket":
                counts = histograms.setdefault(name, {})
                bound = float(sample.labels["le"])
                counts[bound] = counts.get(bound, 0.0) + float(sample.value)
            elif sample.name == family.name and family.type not in ("counter", "histogram"):
                rank = sample.labels.get("tp_rank", "0")
                if name not in gauges or (rank == "0" and ranks[name] != "0"):
                    gauges[name], ranks[name] = float(sample.value), rank
    return Counts(gauges, counters, histograms)


def same_counts(text: str) -> Counts:
    """`read_counts(text)`, asserted equal to the oracle's (NaN equal to NaN)."""
    ours, theirs = read_counts(text), prometheus_counts(text)
    assert repr(ours) == repr(theirs)
    return ours


REAL_PAGES = sorted((Path(__file__).parent / "data" / "real-sglang-0.5.17").glob("metrics*.txt"))
LABELS = 'model_name="m",tp_rank="0"'
# Pages prometheus_client reads, each with a turn of the format a parser can get wrong.
EDGE_PAGES = {
    "escapes in label values, le among them": (
        "# TYPE sglang:ttft_seconds histogram\n"
        'sglang:ttft_seconds_bucket{model_name="a\\"b,le=\\"9\\"\\\\",le="0.5"} 2\n'
        'sglang:ttft_seconds_bucket{model_name="x,le=",le="+Inf",tp_rank="0"} 3\n'
        'sglang:ttft_seconds_bucket{le="+Inf",path="c:\\\\d\\n"} 4\n'
    ),
    "space around labels, a trailing comma, tabs, CRLF": (
        "# TYPE sglang:token_usage gauge\r\n"
        'sglang:token_usage { tp_rank = "1" , } 0.25\r\n'
        'sglang:token_usage{\ttp_rank="0",}\t0.5\t1700000000000\r\n'
        'sglang:cache_hit_rate{,tp_rank="1"} 0.75\r\n'
    ),
    "values as Go writes them": (
        "# TYPE sglang:a gauge\nsglang:a NaN\n# TYPE sglang:b gauge\nsglang:b +Inf\n"
        "# TYPE sglang:c gauge\nsglang:c -1.5e-3\n# TYPE sglang:d gauge\nsglang:d 7\n"
    ),
    "counters named with and without _total, and their _created": (
        "# TYPE sglang:generation_tokens_total counter\n"
        f"sglang:generation_tokens_total{{{LABELS}}} 10.0\n"
        f'sglang:generation_tokens_total{{model_name="m",tp_rank="1"}} 5.0\n'
        f"sglang:generation_tokens_created{{{LABELS}}} 1.7e9\n"
        "# HELP sglang:num_requests Requests.\n# TYPE sglang:num_requests counter\n"
        "sglang:num_requests 4\n"
    ),
    "a stray sample inside a histogram ends it": (
        "# TYPE sglang:itl_seconds histogram\n"
        'sglang:itl_seconds_bucket{le="0.1"} 1\nsglang:itl_seconds_sum 0.05\n'
        "sglang:other 9\n"
        'sglang:itl_seconds_bucket{le="+Inf"} 1\n'
    ),
    "HELP alone, no TYPE at all, summary, gauges by rank": (
        "sglang:untyped_first 1\n# HELP sglang:helped Only help.\nsglang:helped 2\n"
        "# TYPE sglang:latency summary\n"
        'sglang:latency_count 9\nsglang:latency_sum 3\nsglang:latency{quantile="0.5"} 0.2\n'
        "# TYPE sglang:h histogram\n# HELP sglang:h Help after its type.\n"
        'sglang:h_bucket{le="+Inf"} 1\n'
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{tp_rank="2"} 2\nsglang:num_running_reqs{tp_rank="1"} 1\n'
        'sglang:num_running_reqs{tp_rank="0"} 0\nsglang:num_running_reqs{tp_rank="0"} 5\n'
        "# a comment\n\n# TYPE other_total counter\nother_total 1\n"
    ),
    "a family's last TYPE decides, a bare HELP ends a family": (
        "# TYPE sglang:a gauge\nsglang:a 1\n# TYPE sglang:a counter\nsglang:a 2\n"
        "# TYPE sglang:b bogus\n# TYPE sglang:b gauge\nsglang:b 3\n"
        '# TYPE sglang:h histogram\n# HELP\nsglang:h_bucket{le="+Inf"} 1\n'
    ),
    "headers split on ASCII blanks only": (
        "#\x1cTYPE sglang:c\x1csummary\nsglang:c_sum 1\n#\xa0TYPE\tcounter\n"
        "#\tTYPE\x0bsglang:d\x0cgauge\nsglang:d 4\n"
    ),
}


@pytest.mark.parametrize("page", REAL_PAGES, ids=lambda path: path.name)
def test_real_pages_read_as_prometheus_client_reads_them(page: Path) -> None:
    counts = same_counts(page.read_text(encoding="utf-8"))
    assert counts.gauges["num_running_reqs"] > 0  # read under load
    assert counts.histograms["inter_token_latency_seconds"][INF] > 0


@pytest.mark.parametrize("text", EDGE_PAGES.values(), ids=EDGE_PAGES.keys())
def test_edge_pages_read_as_prometheus_client_reads_them(text: str) -> None:
    same_counts(text)


def test_a_familys_last_type_counts_for_the_samples_before_it() -> None:
    counts = same_counts(EDGE_PAGES["a family's last TYPE decides, a bare HELP ends a family"])
    assert counts.counters == {"a_total": 3.0} and "a" not in counts.gauges
    assert counts.gauges["b"] == 3.0 and counts.histograms == {}


def test_escaped_values_never_hide_or_fake_a_bucket_bound() -> None:
    counts = same_counts(EDGE_PAGES["escapes in label values, le among them"])
    assert counts.histograms["ttft_seconds"] == {0.5: 2.0, INF: 7.0}


def test_a_gauge_is_rank_0s_wherever_the_page_lists_it() -> None:
    counts = same_counts(EDGE_PAGES["HELP alone, no TYPE at all, summary, gauges by rank"])
    assert counts.gauges["num_running_reqs"] == 0  # rank 0's first value, not rank 2's
    assert counts.gauges["latency"] == 0.2 and "latency_sum" not in counts.gauges
    assert counts.histograms["h"] == {INF: 1.0}  # a HELP after its TYPE keeps the type


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ('sglang:a{tp_rank="0"} 1_0\n', "line 1: not a number: '1_0'"),
        ("# TYPE sglang:a\nsglang:a 1\n", "line 1: no metric type"),
        ("# TYPE sglang:a bogus\n", "line 1: no type 'bogus'"),
        ("# TYPE _total counter\n_total 1\n", "line 1: a counter without a name"),
        (
            "\n# TYPE sglang:h histogram\nsglang:h_bucket 1\n",
            "line 3: a bucket without its le label",
        ),
        ('# TYPE sglang:h histogram\nsglang:h_bucket{le="x"} 1\n', "line 2: not a number: 'x'"),
        ('sglang:a{tp_rank="0",tp_rank="1"} 1\n', "line 1: a label named twice"),
        ('sglang:a{x="1} 1\n', "line 1: not a sample"),
        ("sglang:a\n", "line 1: not a sample"),
        ("sglang:a 1 soon\n", "line 1: not a number: 'soon'"),
        ("# TYPE 9a gauge\n", "line 1: not a metric name: '9a'"),
    ],
)
def test_what_prometheus_client_refuses_is_refused_with_its_line(text: str, detail: str) -> None:
    with pytest.raises((ValueError, KeyError)):
        prometheus_counts(text)
    with pytest.raises(MetricsError, match="not Prometheus text") as refused:
        read_counts(text)
    assert detail in str(refused.value)


@pytest.mark.parametrize(
    "line",
    [
        'sglang:a{x="1"} 1 2 3',  # tokens after the timestamp
        'sglang:a{x="1"} 1 # {trace_id="7"} 1',  # an exemplar (OpenMetrics)
        "sglang:a{x=} 1",  # a label without its value
        '{__name__="sglang:a"} 1',  # the name among the labels
        'sglang:a{"x y"="1"} 1',  # a quoted label name
        "sglang:a\xa0{} 1",  # a name outside the format's grammar
    ],
)
def test_what_the_text_format_does_not_allow_is_refused_where_prometheus_client_reads_it(
    line: str,
) -> None:
    prometheus_counts(line)
    with pytest.raises(MetricsError, match="line 1: not a sample"):
        read_counts(line)


@pytest.mark.parametrize(
    "line",
    [
        "sglang:a{" + " " * 32_000 + "x",
        "sglang:a{," + "\t" * 32_000 + "x",
        "sglang:a{" + 'a="",' * 6_000,
        "sglang:a{" + 'a="" , ' * 5_000 + "!",
        'sglang:a{a="' + "\\" * 32_000,
        "sglang:a" + " " * 32_000 + "x y z",
    ],
    ids=["blanks", "comma-tabs", "labels", "spaced-labels", "backslashes", "tokens"],
)
def test_a_hostile_line_costs_time_linear_in_its_length(line: str) -> None:
    """A page is up to 1 MiB: a pattern that backtracks over runs of blanks took 5.5 s of CPU
    for 16,000 of them (hours for a megabyte). Linear, 32 KB cost ~5 ms."""
    start = time.process_time()
    with pytest.raises(MetricsError):
        read_counts(line)
    assert time.process_time() - start < 2.0


def test_mutated_real_lines_are_read_or_refused_as_prometheus_client_does() -> None:
    """Real lines with a character dropped, doubled or replaced (a fixed seed): both parsers
    refuse the page or both read the same counts, but where the line leaves the text format's
    grammar in a way prometheus_client forgives (`sglang:a b{…}`: it reads any UTF-8 name)."""
    lines = REAL_PAGES[0].read_text(encoding="utf-8").splitlines()
    rng = random.Random(5)
    outcomes: Counter[str] = Counter()
    for _ in range(1500):
        at = rng.randrange(len(lines))
        line = lines[at]
        cut = rng.randrange(len(line) + 1)
        change = rng.choice(['"', "\\", ",", "=", "{", "}", " ", "", line[cut : cut + 1] * 2])
        mutated = line[:cut] + change + line[cut + 1 :]
        page = "\n".join([*lines[max(0, at - 3) : at], mutated])
        try:
            theirs: Counts | None = prometheus_counts(page)
        except Exception:  # (ValueError mostly; IndexError, OverflowError on some lines)
            theirs = None
        try:
            ours: Counts | None = read_counts(page)
        except MetricsError as refused:
            ours, why = None, str(refused)
        if ours is None and theirs is not None:
            # (a name with a blank reads to us as a name and a value that is not a number)
            assert not mutated.startswith("#"), mutated
            assert ": not a sample: " in why or ": not a number: " in why, why
            outcomes["grammar refused"] += 1
        else:
            assert repr(ours) == repr(theirs), mutated
            outcomes["refused" if ours is None else "read"] += 1
    assert len(outcomes) == 3 and min(outcomes.values()) > 50, outcomes  # each outcome seen
