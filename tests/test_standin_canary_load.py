"""tests/canary_load.py's PoissonLoad against the stand-in (and a server that fails on purpose):
the arrivals keep their rate whatever the server does, the in-flight bound holds, failures are
counted, and nothing but loopback is loaded."""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.canary_load import PoissonLoad, loopback_target
from tests.test_router_standins import (  # noqa: F401 (the fixture)
    Process,
    Start,
    answers,
    call,
    registered,
    start,
    start_router,
)
from tests.test_standin import (  # noqa: F401 (the fixture)
    READY,
    STANDIN,
    Launch,
    Server,
    free_port,
    standin,
    wait_for,
)
from tests.test_standin_metrics import running, scrape, value


def slow_server(standin: Launch, step_ms: float) -> Server:  # noqa: F811 (the fixture)
    server = standin(None, "--enable-metrics", tp=1, knobs={"startup_s": 0.2, "step_ms": step_ms})
    server.wait_log(READY)
    return server


def test_arrivals_keep_their_poisson_rate_while_the_server_is_slow(
    standin: Launch,  # noqa: F811 (the fixture)
) -> None:
    # Each request takes about a second (5 steps of 200 ms and more): a closed loop would send
    # a handful in 2.5 s; an open one sends rate * 2.5.
    server = slow_server(standin, 200.0)
    rate, seconds = 40.0, 2.5
    with PoissonLoad(f"http://127.0.0.1:{server.port}", rate, 400, 5, seed=7) as load:
        time.sleep(seconds)
        during = load.report()
    report = load.report()

    expected = rate * seconds  # Poisson: the count's sd is its mean's square root
    assert abs(report.arrivals - expected) < 4 * expected**0.5, (
        f"{report.arrivals} arrivals in {seconds}s, expected {expected} ± {4 * expected**0.5:.1f}"
    )
    # Many at once: no arrival waited for another to end.
    assert during.in_flight >= 10, f"{during.in_flight} in flight, bound 10"
    # Each left when it was due: a busy machine delays a few, which bunches the gaps measured
    # (their spread then says how busy the machine was); the schedule's gaps are the process.
    late = statistics.median(r.arrived_s - r.due_s for r in load.results())
    assert late < 0.2, f"arrivals left {late:.3f}s after they were due (median), bound 0.2s"
    due = [r.due_s for r in load.results()]
    gaps = [b - a for a, b in itertools.pairwise([0.0, *due])]
    mean = statistics.fmean(gaps)
    # Exponential gaps: mean 1 / rate, and as spread as their mean (a fixed pace's sd is 0).
    bound = 4 / rate / len(gaps) ** 0.5
    assert abs(mean - 1 / rate) < bound, f"mean gap {mean:.4f}s, expected {1 / rate} ± {bound:.4f}"
    spread = statistics.pstdev(gaps) / mean
    assert 0.7 < spread < 1.3, f"the gaps' sd is {spread:.2f} of their mean, bounds 0.7 to 1.3"
    # All of them came back whole, and the server counted each one.
    assert (report.done, report.failed, report.dropped, report.in_flight) == (
        report.arrivals,
        0,
        0,
        0,
    ), report.errors[:3]
    assert len(report.latencies_s) == len(report.ttft_s) == report.done
    assert value(scrape(server.port), "num_requests_total", "true") == report.done


def test_arrivals_beyond_max_in_flight_are_dropped_not_queued(
    standin: Launch,  # noqa: F811 (the fixture)
) -> None:
    server = slow_server(standin, 100.0)  # 20 tokens: ~2 s a request
    batches: list[float] = []
    with PoissonLoad(f"http://127.0.0.1:{server.port}", 50.0, 4, 20, seed=3) as load:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            batches.append(running(server))
            time.sleep(0.05)
        load.stop()
        stopped = load.report()
    report = load.report()

    assert max(batches) == 4  # the server never saw more than the bound
    assert report.peak_in_flight == 4
    assert report.arrivals == stopped.arrivals, (report.arrivals, stopped.arrivals)
    assert report.arrivals > 20, f"{report.arrivals} arrivals in 1.5 s at 50/s, bound 20"
    # The first 4 ran (the gaps are far shorter than a request); every later arrival dropped.
    assert (report.done, report.failed, report.dropped) == (4, 0, report.arrivals - 4)
    assert len(load.results()) == 4


def metrics_worker(start: Start, tmp_path: Path, name: str) -> Process:  # noqa: F811
    """A stand-in worker (one rank) with /metrics, ready."""
    model = tmp_path / name
    model.mkdir()
    (model / "standin.json").write_text(json.dumps({"startup_s": 0.2}))
    port = free_port()
    worker = start(name, sys.executable, STANDIN, "--model-path", model, "--tp", 1,
                   "--port", port, "--enable-metrics", port=port)  # fmt: skip
    wait_for(lambda: answers(port), 10, f"{name} ready")
    return worker


@pytest.mark.lab  # it starts the real router
def test_a_load_through_the_real_router_loses_nothing(
    start: Start,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    workers = [metrics_worker(start, tmp_path, f"w{i}") for i in range(2)]
    router = start_router(start, "real")
    for worker in workers:
        assert call(router.port, "POST", "/workers", {"url": worker.url})[0] == 202
    wait_for(lambda: sum(w["is_healthy"] for w in registered(router)) == 2, 10, "2 workers")
    with PoissonLoad(router.url, 20.0, 16, 10, seed=5) as load:
        time.sleep(1.5)
    report = load.report()
    assert report.arrivals > 10 and report.dropped == 0
    assert (report.done, report.failed) == (report.arrivals, 0), report.errors[:3]
    served = [value(scrape(w.port), "num_requests_total", "true") for w in workers]
    assert sum(served) == report.done and min(served) > 0, served  # both, round robin


class _Failing(BaseHTTPRequestHandler):
    """Answers /v1/completions in turn: whole, an error event, cut short, 500."""

    protocol_version = "HTTP/1.1"
    turns = itertools.count()
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            turn = next(self.turns) % 4
        if turn == 3:
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk = b'{"choices": [{"index": 0, "text": " tok", "finish_reason": null}]}'
        self.wfile.write(b"data: " + chunk + b"\n\n")
        if turn == 1:
            self.wfile.write(b'data: {"error": {"message": "boom", "code": 500}}\n\n')
        if turn != 2:
            self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def failing_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.lab  # it starts a server
def test_failed_requests_are_those_without_done_or_with_an_error(failing_server: int) -> None:
    with PoissonLoad(f"http://127.0.0.1:{failing_server}", 100.0, 1, 1, seed=1) as load:
        while load.report().done + load.report().failed < 8:
            time.sleep(0.02)
    report = load.report()
    sent = report.done + report.failed
    assert report.done == len(range(0, sent, 4))  # the whole answers: turns 0, 4, 8, …
    kinds = {e.split(":")[0] for e in report.errors}
    assert kinds == {"error event", "the stream ended without [DONE]", "HTTP 500"}, kinds


SWEEP_LOAD = Path(__file__).resolve().parent.parent / "scripts" / "sweep_load.py"


def sweep(url: str, tmp_path: Path, levels: str, seconds: float) -> dict[str, Any]:
    """scripts/sweep_load.py (the H200's live-window load) run for `seconds`, its summary."""
    stop, out = tmp_path / "stop", tmp_path / "load.json"
    args = ["--levels", levels, "--step-s", "0.5", "--max-tokens", "4"]
    with subprocess.Popen(
        [sys.executable, str(SWEEP_LOAD), "--url", url, *args, "--stop-file", str(stop),
         "--out", str(out)], stdout=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        proc.stdout.readline()  # its first level is on: the load runs from here
        time.sleep(seconds)
        stop.touch()
        said, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, said
    summary: dict[str, Any] = json.loads(out.read_text())
    return summary


def test_the_sweep_load_holds_each_level_and_counts_every_request(
    standin: Launch,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    server = slow_server(standin, 10.0)
    summary = sweep(f"http://127.0.0.1:{server.port}", tmp_path, "1,3", 2.5)
    assert summary["levels"] == [1, 3]  # up, then down: no end repeated
    assert set(summary["by_level"]) == {"1", "3"}, summary
    assert all(v["done"] > 0 and v["failed"] == 0 for v in summary["by_level"].values()), summary


@pytest.mark.lab  # it starts a server
def test_the_sweep_load_counts_what_the_lab_load_calls_failed(
    failing_server: int, tmp_path: Path
) -> None:
    summary = sweep(f"http://127.0.0.1:{failing_server}", tmp_path, "1", 1.0)
    row = summary["by_level"]["1"]
    assert row["done"] >= 1 and row["failed"] >= 3, summary
    kinds = {e.split(":")[0] for e in summary["errors"]}
    assert kinds == {"error event", "the stream ended without [DONE]", "HTTP 500"}, kinds


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.1:30000", "http://example.com:80", "https://127.0.0.1:443",
     "http://0.0.0.0:30000", "127.0.0.1:30000"],
)  # fmt: skip
def test_only_loopback_is_loaded(url: str) -> None:
    with pytest.raises(ValueError, match="PoissonLoad"):
        PoissonLoad(url, 1.0, 1, 1, seed=0)


def test_loopback_addresses_are_accepted() -> None:
    assert loopback_target("http://127.0.0.2:30000") == ("127.0.0.2", 30000, "/v1/completions")
    assert loopback_target("http://localhost:8/") == ("localhost", 8, "/v1/completions")
    assert loopback_target("http://[::1]:8") == ("::1", 8, "/v1/completions")
