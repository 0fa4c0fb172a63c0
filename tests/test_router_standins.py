"""The routers the router tests deploy, run here as local processes on loopback ports.

The real sglang-router 0.3.2 (tests/router_venv.py::router_venv) and the stand-in of the
legacy ≤ 0.2.1 API (tests/standin/legacy_router.py) in front of SGLang stand-in workers.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.router_venv import legacy_router_python, router_venv
from tests.test_standin import STANDIN, free_port, wait_for

# Every test here starts routers and stand-in workers (services; the real router's venv
# comes from PyPI): lab tests, outside the fast tier.
pytestmark = pytest.mark.lab


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")


Start = Callable[..., Process]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start processes in their own sessions, logging to files; kill their groups after."""
    started: list[subprocess.Popen[bytes]] = []

    def _start(name: str, *argv: object, port: int, env: dict[str, str] | None = None) -> Process:
        log = tmp_path / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(a) for a in argv],
                env=None if env is None else {**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(proc)
        return Process(proc, port, log)

    yield _start
    for proc in started:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def call(port: int, method: str, path: str, doc: Any = None) -> tuple[int, bytes]:
    """One request to a loopback port: its status and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        body = None if doc is None else json.dumps(doc)
        conn.request(method, path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def answers(port: int, path: str = "/health") -> bool:
    try:
        return call(port, "GET", path)[0] == 200
    except OSError:
        return False


def start_worker(start: Start, tmp_path: Path, name: str, step_ms: float = 10.0) -> Process:
    """An SGLang stand-in (one rank), ready."""
    model = tmp_path / name
    model.mkdir()
    (model / "standin.json").write_text(json.dumps({"startup_s": 0.2, "step_ms": step_ms}))
    port = free_port()
    worker = start(name, sys.executable, STANDIN, "--model-path", model, "--tp", 1, "--port", port,
                   port=port)  # fmt: skip
    wait_for(lambda: answers(port), 10, f"{name} ready")
    return worker


def start_router(start: Start, kind: str) -> Process:
    """The real router (kind "real") or the legacy stand-in, listening with no workers."""
    python = router_venv() / "bin" / "python" if kind == "real" else legacy_router_python()
    port = free_port()
    # The real router also binds a Prometheus port (0.0.0.0:29000 unless told).
    router = start(f"router-{kind}", python, "-m", "sglang_router.launch_router",
                   "--host", "127.0.0.1", "--port", port, "--policy", "round_robin",
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", free_port(),
                   port=port)  # fmt: skip
    wait_for(lambda: answers(port), 15, f"the {kind} router's /health")
    return router


def stream(port: int, max_tokens: int) -> list[tuple[float, bytes]]:
    """Stream one completion; return each SSE `data:` line with the time it arrived."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    request = {"model": "m", "prompt": "w1 w2", "max_tokens": max_tokens, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(request),
                 {"Content-Type": "application/json"})  # fmt: skip
    response = conn.getresponse()
    assert response.status == 200, response.read()
    lines = []
    while line := response.readline():
        if line.startswith(b"data:"):
            lines.append((time.monotonic(), line.strip()))
    conn.close()
    return lines


def registered(router: Process) -> list[dict[str, Any]]:
    status, body = call(router.port, "GET", "/workers")
    assert status == 200, body
    workers: list[dict[str, Any]] = json.loads(body)["workers"]
    return workers


def test_the_real_router_adds_lists_and_removes_workers_through_its_workers_api(
    start: Start, tmp_path: Path
) -> None:
    worker = start_worker(start, tmp_path, "worker")
    router = start_router(start, "real")
    assert call(router.port, "GET", "/health") == (200, b"OK")
    assert call(router.port, "GET", "/readiness")[0] == 503  # no healthy worker yet
    assert call(router.port, "POST", f"/add_worker?url={worker.url}")[0] == 404
    assert registered(router) == []

    status, body = call(router.port, "POST", "/workers", {"url": worker.url})
    assert status == 202, body
    accepted = json.loads(body)
    assert accepted["status"] == "accepted"
    wait_for(lambda: [w["url"] for w in registered(router)] == [worker.url], 10, "the worker")
    [listed] = registered(router)
    assert listed["is_healthy"] is True
    assert listed["id"] == accepted["worker_id"]
    wait_for(lambda: answers(router.port, "/readiness"), 10, "/readiness 200")

    status, body = call(router.port, "DELETE", f"/workers/{listed['id']}")
    assert status == 202, body
    wait_for(lambda: registered(router) == [], 10, "the worker's removal")
    assert call(router.port, "GET", "/readiness")[0] == 503


def test_the_legacy_stand_in_has_the_old_api_and_proxies_round_robin(
    start: Start, tmp_path: Path
) -> None:
    first, second = (start_worker(start, tmp_path, name) for name in ("first", "second"))
    router = start_router(start, "legacy")
    assert call(router.port, "GET", "/health")[0] == 200
    assert call(router.port, "GET", "/workers")[0] == 404
    assert call(router.port, "GET", "/list_workers") == (200, b'{"urls": []}')
    assert call(router.port, "POST", "/v1/completions", {"prompt": "w1"}) == (
        503,
        b"No available workers",
    )

    # It checks the worker's /health before adding it.
    nobody = f"http://127.0.0.1:{free_port()}"
    status, body = call(router.port, "POST", f"/add_worker?url={nobody}")
    assert status == 400 and nobody in body.decode(), body
    for worker in (first, second):
        added = call(router.port, "POST", f"/add_worker?url={worker.url}")
        assert added == (200, f"Successfully added worker: {worker.url}".encode())
    assert call(router.port, "POST", f"/add_worker?url={first.url}")[0] == 400  # already there
    urls = json.loads(call(router.port, "GET", "/list_workers")[1])["urls"]
    assert urls == [first.url, second.url]

    for _ in range(2):
        assert stream(router.port, 3)[-1][1] == b"data: [DONE]"
    for worker in (first, second):
        assert worker.text().count('"POST /v1/completions HTTP/1.1" 200') == 1

    removed = call(router.port, "POST", f"/remove_worker?url={first.url}")
    assert removed == (200, f"Successfully removed worker: {first.url}".encode())
    urls = json.loads(call(router.port, "GET", "/list_workers")[1])["urls"]
    assert urls == [second.url]

    router.proc.send_signal(signal.SIGTERM)
    assert router.proc.wait(timeout=5) == 0
    log = router.text()
    assert log.count('"POST /add_worker?url=') == 4 and log.count('"GET /list_workers') == 3


@pytest.mark.parametrize("kind", ["real", "legacy"])
def test_a_streamed_completion_through_the_router_arrives_token_by_token(
    start: Start, tmp_path: Path, kind: str
) -> None:
    worker = start_worker(start, tmp_path, "slow", step_ms=150.0)  # one token per 150 ms
    router = start_router(start, kind)
    if kind == "real":
        assert call(router.port, "POST", "/workers", {"url": worker.url})[0] == 202
        wait_for(lambda: any(w["is_healthy"] for w in registered(router)), 10, "the worker")
    else:
        assert call(router.port, "POST", f"/add_worker?url={worker.url}")[0] == 200

    lines = stream(router.port, 6)
    assert lines[-1][1] == b"data: [DONE]"
    tokens = [json.loads(line[len(b"data: ") :]) for _, line in lines[:-1]]
    assert "".join(t["choices"][0]["text"] for t in tokens) == " tok" * 6
    # Buffered, every line would arrive at the end; streamed, they span the decode.
    took = lines[-1][0] - lines[0][0]
    assert took > 0.5, f"the tokens came over {took:.2f}s, bound 0.5s"
    assert '"POST /v1/completions HTTP/1.1" 200' in worker.text()
