"""The stand-in's live /metrics (what `deployctl canary` judges from) and its `slowdown` knob.

The series are 0.5.23's TokenizerMetricsCollector's (srt/observability/metrics_collector.py in
the wheel tests/sglang_wheel.py gives): checked here against that file's own declarations, then
moved by real requests against a running stand-in.
"""

from __future__ import annotations

import ast
import http.client
import json
import socket
import statistics
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sglang_wheel import SGLANG_VERSION, sglang_wheel
from tests.standin.sglang_standin.knobs import load_knobs
from tests.standin.sglang_standin.request_metrics import REQUEST_METRICS
from tests.test_standin import READY, Launch, Server, standin, wait_for  # noqa: F401 (fixture)

Sample = tuple[str, str | None, str | None]  # sample name, is_streaming, le


def scrape(port: int) -> dict[Sample, float]:
    """The series of the /metrics of the server on a loopback port, by name, is_streaming, le."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    found: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("is_streaming"), sample.labels.get("le"))
            found[key] = sample.value
    return found


def value(page: dict[Sample, float], name: str, streaming: str | None = None) -> float:
    return page.get((f"sglang:{name}", streaming, None), 0.0)


def running(server: Server) -> float:
    return value(scrape(server.port), "num_running_reqs")


def post(server: Server, path: str, body: dict[str, object]) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200
        return reply.read()
    finally:
        conn.close()


@contextmanager
def streams(server: Server) -> Iterator[list[socket.socket]]:
    """Sockets for `open_streams`; closing them at the end is their clients going away."""
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def open_streams(server: Server, held: list[socket.socket], batch: int) -> None:
    """Hold `batch` streamed requests of 2,000 tokens (minutes) running."""
    body = json.dumps({"prompt": "a b", "max_tokens": 2000, "stream": True}).encode()
    while len(held) < batch:
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        held.append(sock)
    wait_for(lambda: running(server) == batch, 5, f"{batch} running")


def itl_ms(server: Server, windows: int = 3, seconds: float = 0.6) -> float:
    """The mean ITL of each window from the histogram's deltas (what a canary reads), in ms;
    the median window, so one stalled by another test's CPU does not decide."""
    means = []
    for _ in range(windows):
        before = scrape(server.port)
        time.sleep(seconds)
        after = scrape(server.port)
        total = value(after, "inter_token_latency_seconds_sum") - value(
            before, "inter_token_latency_seconds_sum"
        )
        count = value(after, "inter_token_latency_seconds_count") - value(
            before, "inter_token_latency_seconds_count"
        )
        assert count > 0
        means.append(total / count * 1000)
    return statistics.median(means)


# ---- the series, as the wheel declares them ----------------------------------------------


def wheel_collector() -> dict[str, tuple[str, str, list[float] | None, bool]]:
    """TokenizerMetricsCollector's metrics in the real 0.5.23 wheel: name -> (kind,
    documentation, default buckets, labelled is_streaming)."""
    with zipfile.ZipFile(sglang_wheel(SGLANG_VERSION)) as wheel:
        source = wheel.read("sglang/srt/observability/metrics_collector.py").decode()
    (cls,) = (
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.ClassDef) and n.name == "TokenizerMetricsCollector"
    )
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    defaults: dict[str, list[float]] = {}  # `if bucket_x is None: bucket_x = [...]`
    declared: dict[str, tuple[str, str, str | None, bool]] = {}
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.startswith("bucket_"):
                defaults[target.id] = [ast.literal_eval(e) for e in node.value.elts]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            kw = {k.arg: k.value for k in node.keywords}
            if node.func.id in ("Counter", "Histogram") and "name" in kw:
                name = ast.literal_eval(kw["name"]).removeprefix("sglang:")
                buckets = kw.get("buckets")
                bucket_var = buckets.id if isinstance(buckets, ast.Name) else None
                streamed = "is_streaming" in ast.unparse(kw["labelnames"])
                doc = ast.literal_eval(kw["documentation"])
                declared[name] = (node.func.id, doc, bucket_var, streamed)
    return {
        name: (kind, doc, defaults.get(var or ""), streamed)
        for name, (kind, doc, var, streamed) in declared.items()
    }


def test_the_live_series_are_the_wheels_names_labels_and_buckets() -> None:
    real = wheel_collector()
    for name, doc, bounds, streamed in REQUEST_METRICS:
        kind, real_doc, real_bounds, real_streamed = real[name]
        assert (doc, streamed) == (real_doc, real_streamed), name
        if bounds is None:
            assert kind == "Counter", name
        else:
            assert kind == "Histogram" and real_bounds is not None, name
            assert [float(b) for b in bounds] == real_bounds, name


# ---- live against requests --------------------------------------------------------------


# Steps of tens of ms: the decode loop keeps to a clock, so a step that starts late (a busy
# machine; other tests run beside this one) takes that from the next, as long as it is less
# than a step late.
@pytest.mark.parametrize(
    ("flags", "knobs", "below", "at"),
    [
        # Plain steps: 30 + 2 * b ms, one token each; 1.5 times that from batch 8.
        ([], {"step_ms": 30, "per_req_ms": 2, "slowdown": {"factor": 1.5, "min_batch": 8}},
         (7, 44.0), (8, 46.0 * 1.5)),
        # Speculative steps: 30 + 4 * b ms for 3 tokens each, the gap / 3 observed 3 times.
        (["--speculative-algorithm", "EAGLE3"],
         {"spec_step_ms": 30, "spec_per_req_ms": 4, "accept_len": 3,
          "slowdown": {"factor": 1.5, "min_batch": 4}},
         (3, 42.0 / 3), (4, 46.0 * 1.5 / 3)),
    ],
    ids=["plain", "speculative"],
)  # fmt: skip
def test_live_itl_is_the_step_time_slowed_only_from_min_batch(
    standin: Launch,  # noqa: F811 (the fixture)
    flags: list[str],
    knobs: dict[str, object],
    below: tuple[int, float],
    at: tuple[int, float],
) -> None:
    server = standin(None, "--enable-metrics", *flags, tp=1, knobs={"startup_s": 0.2, **knobs})
    server.wait_log(READY)
    with streams(server) as held:
        for batch, step_ms in (below, at):
            open_streams(server, held, batch)
            itl = itl_ms(server)
            assert itl == pytest.approx(step_ms, rel=0.08), (
                f"ITL {itl:.2f} ms at batch {batch}: {itl / step_ms:.3f} of the model's "
                f"{step_ms:.2f}, bound ±0.08"
            )


def test_counters_move_as_requests_finish_and_aborts_count(
    standin: Launch,  # noqa: F811 (the fixture)
) -> None:
    server = standin(None, "--enable-metrics", tp=1, knobs={"startup_s": 0.2})
    server.wait_log(READY)
    start = scrape(server.port)
    # Before any request: the streamed series at 0, the others not yet there (as
    # prometheus_client shows a labelled child only once used; so does the real page).
    assert value(start, "num_requests_total", "true") == 0.0
    assert ("sglang:num_requests_total", "false", None) not in start
    assert ("sglang:num_aborted_requests_total", None, None) not in start

    for tokens in (5, 7, 9):
        post(server, "/v1/completions", {"prompt": "a", "max_tokens": tokens, "stream": True})
    post(server, "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 4}})
    page = scrape(server.port)
    assert value(page, "num_requests_total", "true") == 3
    assert value(page, "generation_tokens_total", "true") == 5 + 7 + 9
    assert value(page, "num_requests_total", "false") == 1
    assert value(page, "generation_tokens_total", "false") == 4
    assert value(page, "time_to_first_token_seconds_count", "true") == 3
    assert value(page, "e2e_request_latency_seconds_count", "true") == 3
    # One gap per token after the first: 4 + 6 + 8, each about one step (10.5 ms alone).
    assert value(page, "inter_token_latency_seconds_count") == 4 + 6 + 8
    itl_sum = value(page, "inter_token_latency_seconds_sum")
    assert 0.0105 * 18 * 0.8 < itl_sum < 0.0105 * 18 * 3, (
        f"ITL sum {itl_sum:.4f}s: {itl_sum / (0.0105 * 18):.2f} of 18 steps, bounds 0.8 to 3"
    )
    # The non-streamed request's one output is its first: TTFT is its whole time.
    assert value(page, "time_to_first_token_seconds_sum", "false") == pytest.approx(
        value(page, "e2e_request_latency_seconds_sum", "false")
    )
    assert ("sglang:num_aborted_requests_total", None, None) not in page

    # Clients that go away: aborted at once (2,000 tokens would take 20 s), counted as
    # aborted and, as 0.5.23's scheduler finishes them with FINISH_ABORT, as requests too.
    with streams(server) as held:
        open_streams(server, held, 2)
    wait_for(lambda: running(server) == 0, 3, "the aborted requests to leave the batch")
    page = scrape(server.port)
    assert value(page, "num_aborted_requests_total") == 2
    assert value(page, "num_requests_total", "true") == 3 + 2
    assert value(page, "e2e_request_latency_seconds_count", "true") == 3 + 2
    assert value(page, "generation_tokens_total", "true") > 5 + 7 + 9


def test_the_observations_knob_still_stands_for_its_histogram(
    standin: Launch,  # noqa: F811 (the fixture)
) -> None:
    knobs = {"startup_s": 0.2, "observations": {"inter_token_latency_seconds": [0.012] * 40}}
    server = standin(None, "--enable-metrics", tp=1, knobs=knobs)
    server.wait_log(READY)
    post(server, "/v1/completions", {"prompt": "a", "max_tokens": 5, "stream": True})
    page = scrape(server.port)
    assert value(page, "inter_token_latency_seconds_count") == 40  # the knob's, not live
    assert page[("sglang:inter_token_latency_seconds_bucket", None, "0.01")] == 0
    assert page[("sglang:inter_token_latency_seconds_bucket", None, "0.015")] == 40
    assert value(page, "e2e_request_latency_seconds_count", "true") == 1  # live


@pytest.mark.parametrize(
    "slowdown",
    [{"factor": 1.08, "min_batch": 16, "from": 3}, {"factor": 0}, {"min_batch": 4}, [1.08],
     {"factor": 1.08, "min_batch": 0}, {"factor": True}],
)  # fmt: skip
def test_a_bad_slowdown_knob_is_an_error(tmp_path: Path, slowdown: object) -> None:
    (tmp_path / "standin.json").write_text(json.dumps({"slowdown": slowdown}))
    with pytest.raises(ValueError, match="slowdown must be"):
        load_knobs(str(tmp_path))


def test_the_slowdown_knob_defaults_min_batch_to_1(tmp_path: Path) -> None:
    (tmp_path / "standin.json").write_text(json.dumps({"slowdown": {"factor": 2}}))
    assert load_knobs(str(tmp_path))["slowdown"] == {"factor": 2.0, "min_batch": 1}
