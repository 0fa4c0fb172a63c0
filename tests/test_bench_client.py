"""The builtin bench client: its streams spread over processes that share one list of
requests, so that a fast server is measured, not the client's own limit."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from deployctl.remote.bench import bench_prompt, client_processes, run_streams
from deployctl.remote.measures import BenchArgs


class _Streaming(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Chunks)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.prompts: list[str] = []


class _Chunks(BaseHTTPRequestHandler):
    """A /v1/completions that streams one token a chunk, a few ms apart, as SGLang does."""

    server: _Streaming

    def log_message(self, *_: object) -> None:
        pass

    def do_POST(self) -> None:
        import time

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
            self.server.prompts.append(body["prompt"])
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for _ in range(body["max_tokens"]):
                time.sleep(0.002)
                chunk = {"choices": [{"text": " K"}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
            self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        finally:
            with self.server.lock:
                self.server.in_flight -= 1


@pytest.fixture
def server() -> Iterator[_Streaming]:
    server = _Streaming()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _args(port: int, concurrency: int, processes: int = 0) -> BenchArgs:
    return {
        "bind_host": "127.0.0.1",
        "port": port,
        "concurrency": concurrency,
        "prompts": 0,
        "input_len": 4,
        "output_len": 5,
        "flush": False,
        "timeout": 30.0,
        "tool": "builtin",
        "env": {},
        "warmup": False,
        "client_processes": processes,
    }


@pytest.mark.lab  # it starts a server
@pytest.mark.parametrize("processes", [1, 3])
def test_streams_over_processes_send_every_request_once_at_the_levels_concurrency(
    server: _Streaming, processes: int
) -> None:
    requests = [(i, 3 + i % 4) for i in range(40)]
    streamed = run_streams(_args(server.server_address[1], 6, processes), requests)

    assert streamed["processes"] == processes
    assert sorted(server.prompts) == sorted(bench_prompt(i, 4) for i, _ in requests)
    assert server.most_in_flight == 6, server.most_in_flight
    timings = streamed["timings"]
    assert [t["error"] for t in timings] == [""] * 40
    assert sorted(t["tokens"] for t in timings) == sorted(n for _, n in requests)
    ended = [t["ended"] for t in timings]
    assert ended == sorted(ended), "timings are in the order their requests ended"
    # the level's seconds run from the first stream's start to the last one's end
    first_start = min(t["ended"] - t["e2e"] for t in timings)
    assert max(t["e2e"] for t in timings) <= streamed["seconds"]
    assert streamed["seconds"] <= ended[-1] - first_start + 0.5, streamed["seconds"]
    assert 0.0 <= streamed["busy"] <= 1.5


def test_a_level_gets_a_process_per_sixteen_streams_within_half_the_cpus() -> None:
    assert client_processes(1, cpus=16) == 1
    assert client_processes(16, cpus=16) == 1
    assert client_processes(17, cpus=16) == 2
    assert client_processes(128, cpus=16) == 8
    assert client_processes(256, cpus=16) == 8  # at most 8
    assert client_processes(256, cpus=6) == 3  # half the CPUs: the server needs the rest
    assert client_processes(256, cpus=1) == 1


def test_a_level_whose_client_was_busy_warns_that_it_may_measure_the_client(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployctl.fanout import FleetResult, HostResult
    from deployctl.inventory import Host
    from deployctl.ops.bench import BenchResult
    from deployctl.present.views import BENCH, render_result

    def level(concurrency: int, busy: float) -> dict[str, object]:
        spread = {"p50": 10.0, "p99": 20.0}
        return {
            "concurrency": concurrency, "prompts": 8, "completed": 8, "failed": 0, "errors": [],
            "duration_s": 1.0, "output_tokens": 80, "output_tokens_per_s": 80.0,
            "requests_per_s": 8.0, "ttft_ms": spread, "itl_ms": spread, "e2e_ms": spread,
            "client_processes": 2, "client_busy": busy,
        }  # fmt: skip

    params = {"tool": "builtin", "input_len": 16, "output_len": 30}
    levels = [level(1, 0.2), level(64, 0.9), level(128, 0.97)]
    doc: dict[str, Any] = {"run": "baseline_v1", "params": params, "levels": levels}
    fleet: FleetResult[BenchResult | None] = FleetResult(
        [HostResult(Host("alpha"), BenchResult(doc, "k"))]
    )
    render_result(BENCH, fleet, False)
    err = capsys.readouterr().err
    assert (
        "alpha: warning: concurrency 64, 128: the bench client was busy 97 % of the level (at "
        "128, over 2 process(es)): these figures may be the client's limit, not the server's"
    ) in err
    doc["levels"] = [level(1, 0.2), level(64, 0.89)]
    render_result(BENCH, fleet, False)
    assert "bench client was busy" not in capsys.readouterr().err
