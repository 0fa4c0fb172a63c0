"""An open-loop Poisson load for lab tests (`deployctl canary`'s): stdlib only.

Requests arrive at exponential gaps (seeded) whatever the server does, as real users do: a
slow server does not slow the arrivals down (a closed loop would, and hide the slowness). Each
is a streamed POST /v1/completions in its own thread; at most ``max_in_flight`` run at once,
and an arrival beyond that is counted as dropped, never queued (an unbounded queue would grow
without end once the server falls behind). Loopback only: it refuses any other address, so a
test can never load a real service by mistake.

    with PoissonLoad("http://127.0.0.1:30000", rate_per_s=20, max_in_flight=32,
                     max_tokens=64, seed=1) as load:
        time.sleep(10)
    report = load.report()  # after the with: arrivals stopped, requests in flight finished
    assert report.failed == 0 and report.dropped == 0
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import random
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import urlsplit


@dataclass
class RequestResult:
    """One request: when it was due and when it arrived (seconds from the load's start; a
    busy machine makes it late), its time to the first chunk and to the end, and why it failed
    (None: it ended with [DONE], no error event)."""

    due_s: float
    arrived_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str | None = None


@dataclass
class LoadReport:
    arrivals: int  # every arrival, dropped ones included
    done: int
    failed: int
    dropped: int
    in_flight: int  # still running when the report was taken
    peak_in_flight: int
    latencies_s: list[float] = field(default_factory=list)  # end to end, done requests
    ttft_s: list[float] = field(default_factory=list)  # done requests
    errors: list[str] = field(default_factory=list)  # one per failed request


def loopback_target(url: str) -> tuple[str, int, str]:
    """(host, port, path of /v1/completions) of an http:// URL on a loopback address; else
    ValueError."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme != "http" or not host:
        raise ValueError(f"PoissonLoad: {url!r} is not an http:// URL")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it could be anywhere
        loopback = False
    if not loopback:
        raise ValueError(f"PoissonLoad: {url!r} is not a loopback address; it loads only those")
    return host, parts.port or 80, parts.path.rstrip("/") + "/v1/completions"


def stream_completion(
    host: str, port: int, path: str, body: bytes, timeout_s: float, result: RequestResult
) -> None:
    """POST one streamed completion and read it to its end: `result` gets its time to the
    first chunk, and why it failed (an HTTP status, a chunk that is no JSON, an error event,
    no [DONE], a broken connection); its error stays None for a whole stream."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    finished = False
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        if reply.status != 200:
            result.error = f"HTTP {reply.status}: {reply.read(200)!r}"
            return
        while line := reply.readline():
            if not line.startswith(b"data:"):
                continue
            data = line.removeprefix(b"data:").strip()
            if data == b"[DONE]":
                finished = True
                break
            if result.ttft_s is None:
                result.ttft_s = time.monotonic() - started
            try:
                chunk = json.loads(data)
            except ValueError:
                chunk = None
            if not isinstance(chunk, dict):
                result.error = f"not a JSON chunk: {data[:200]!r}"
            elif "error" in chunk:
                result.error = f"error event: {json.dumps(chunk['error'])[:200]}"
        if result.error is None and not finished:
            result.error = "the stream ended without [DONE]"
    except (OSError, http.client.HTTPException) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


class PoissonLoad:
    """Streamed completions arriving as a Poisson process of ``rate_per_s``; see the module."""

    def __init__(
        self,
        url: str,
        rate_per_s: float,
        max_in_flight: int,
        max_tokens: int,
        seed: int,
        *,
        timeout_s: float = 60.0,
        model: str = "default",
    ) -> None:
        if not rate_per_s > 0 or max_in_flight < 1 or max_tokens < 1:
            raise ValueError("PoissonLoad: rate_per_s > 0, max_in_flight >= 1, max_tokens >= 1")
        self.host, self.port, self.path = loopback_target(url)
        self.rate_per_s = rate_per_s
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        # The real router (0.3.2) refuses a completion without `model` (422).
        body = {"model": model, "prompt": "canary load", "max_tokens": max_tokens, "stream": True}
        self.body = json.dumps(body).encode()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._results: list[RequestResult] = []
        self._threads: list[threading.Thread] = []
        self._arrivals = 0
        self._dropped = 0
        self._in_flight = 0
        self._peak = 0
        self._dispatcher: threading.Thread | None = None
        self._t0 = 0.0

    def __enter__(self) -> PoissonLoad:
        self._t0 = time.monotonic()
        self._dispatcher = threading.Thread(target=self._arrive, daemon=True)
        self._dispatcher.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self.wait(self.timeout_s)

    def stop(self) -> None:
        """No more arrivals (those in flight go on)."""
        self._stop.set()
        if self._dispatcher is not None:
            self._dispatcher.join()

    def wait(self, timeout_s: float) -> None:
        """Wait for the requests in flight, at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _arrive(self) -> None:
        # Arrivals keep to their own clock: a late start (a busy machine) shortens the next
        # gap rather than lowering the rate.
        due = self._t0
        while True:
            due += self._rng.expovariate(self.rate_per_s)
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            with self._lock:
                self._arrivals += 1
                if self._in_flight >= self.max_in_flight:
                    self._dropped += 1
                    continue
                self._in_flight += 1
                self._peak = max(self._peak, self._in_flight)
                result = RequestResult(due - self._t0, time.monotonic() - self._t0)
                self._results.append(result)
                thread = threading.Thread(target=self._request, args=(result,), daemon=True)
                self._threads.append(thread)
            thread.start()

    def _request(self, result: RequestResult) -> None:
        started = time.monotonic()
        try:
            stream_completion(self.host, self.port, self.path, self.body, self.timeout_s, result)
        finally:
            with self._lock:  # ended and out of flight at once, for report()
                result.e2e_s = time.monotonic() - started
                self._in_flight -= 1

    def report(self) -> LoadReport:
        """The counts and latencies so far (a request counts once it has ended)."""
        with self._lock:
            report = LoadReport(
                arrivals=self._arrivals,
                done=0,
                failed=0,
                dropped=self._dropped,
                in_flight=self._in_flight,
                peak_in_flight=self._peak,
            )
            ended = [r for r in self._results if r.e2e_s is not None]
        for result in ended:
            assert result.e2e_s is not None
            if result.error is None:
                report.done += 1
                report.latencies_s.append(result.e2e_s)
                if result.ttft_s is not None:
                    report.ttft_s.append(result.ttft_s)
            else:
                report.failed += 1
                report.errors.append(result.error)
        return report

    def results(self) -> list[RequestResult]:
        """Every request that was sent (not the dropped arrivals), in arrival order."""
        with self._lock:
            return list(self._results)
