"""Benchmarks against a server on this host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, TypedDict

from .files import fail, read_bytes
from .measures import BenchArgs, BenchLevel, Spread
from .patches import sglang_install
from .runs import http_get, server_address


class Timing(TypedDict):
    error: str
    ttft: float
    itl: list[float]
    e2e: float
    tokens: int
    ended: float  # perf_counter when the request ended


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread_ms(values: list[float]) -> Spread:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return {
        "p50": None if p50 is None else p50 * 1000,
        "p99": None if p99 is None else p99 * 1000,
    }


def bench_prompt(index: int, words: int) -> str:
    """Random words, about one token each; `index` seeds them, so no two prompts share a
    prefix the server's cache could reuse."""
    import random

    rng = random.Random(index)
    return " ".join(f"w{rng.randrange(100000)}" for _ in range(words))


def stream_completion(args: BenchArgs, prompt: str, output_len: int | None = None) -> Timing:
    """One streamed /v1/completions request (EOS ignored; `output_len` tokens, else the
    level's), timed from the request."""
    import http.client

    body = json.dumps(
        {
            "model": "default",
            "prompt": prompt,
            "max_tokens": output_len or args["output_len"],
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    address = server_address(args["bind_host"])
    timing: Timing = {"error": "", "ttft": 0.0, "itl": [], "e2e": 0.0, "tokens": 0, "ended": 0.0}
    start = time.perf_counter()
    last: float | None = None
    try:
        conn = http.client.HTTPConnection(address, args["port"], timeout=args["timeout"])
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            timing["error"] = f"HTTP {response.status} from /v1/completions"
            timing["ended"] = time.perf_counter()
            return timing
        finished = False
        for raw in response:
            finished = finished or raw.startswith(b"data: [DONE]")
            if not raw.startswith(b"data: {"):
                continue
            now = time.perf_counter()
            chunk = json.loads(raw[6:])
            if chunk.get("usage"):
                timing["tokens"] = int(chunk["usage"].get("completion_tokens") or 0)
            choices = chunk.get("choices") or []
            if not (choices and choices[0].get("text")):
                continue
            if last is None:
                timing["ttft"] = now - start
            else:
                timing["itl"].append(now - last)
            last = now
        conn.close()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        timing["error"] = str(exc) or type(exc).__name__
        timing["ended"] = time.perf_counter()
        return timing
    timing["ended"] = time.perf_counter()
    timing["e2e"] = timing["ended"] - start
    if last is None:
        timing["error"] = "no token streamed"
    elif not finished:  # the server went away mid-answer: not a completed request
        timing["error"] = f"the stream ended before [DONE], after {len(timing['itl']) + 1} chunks"
    return timing


# Streams per client process: one Python process reads its chunks under one GIL, and a
# client that cannot keep up measures itself, not the server. On the H200 one process was
# 62 % busy reading 128 streams of a 6.7 B model (6.2 k tok/s); a fast server or a slower
# host CPU would saturate it, so each process takes a share well below that.
STREAMS_PER_PROCESS = 16
MAX_PROCESSES = 8


def client_processes(concurrency: int, cpus: int | None = None) -> int:
    """How many processes share a level's streams: one per STREAMS_PER_PROCESS, at most half
    the host's CPUs (the server's own processes need the rest) and MAX_PROCESSES."""
    spare = max(1, (cpus if cpus is not None else (os.cpu_count() or 1)) // 2)
    return max(1, min(-(-concurrency // STREAMS_PER_PROCESS), spare, MAX_PROCESSES))


class Streamed(TypedDict):
    timings: list[Timing]  # in the order the requests ended
    seconds: float  # from the first stream's start to the last one's end
    processes: int
    busy: float  # the busiest client process's CPU seconds ÷ its wall seconds


def run_streams(args: BenchArgs, requests: list[tuple[int, int]]) -> Streamed:
    """Keep `concurrency` streams busy until every request (prompt index, output tokens) has
    finished, the streams spread over the level's `client_processes` (0: as many as
    `client_processes` gives)."""
    streams = min(args["concurrency"], len(requests))
    asked = args.get("client_processes") or client_processes(streams)
    processes = min(asked, max(1, streams))
    if processes == 1:
        return _streams_here(args, streams, _ListTaker(requests))
    return _forked_streams(args, requests, streams, processes)


class _ListTaker:
    """Hands out the requests one at a time to the threads of this process."""

    def __init__(self, requests: list[tuple[int, int]]) -> None:
        import threading

        self.requests, self.next, self.lock = requests, 0, threading.Lock()

    def take(self) -> tuple[int, int] | None:
        with self.lock:
            if self.next >= len(self.requests):
                return None
            self.next += 1
            return self.requests[self.next - 1]


class _SharedTaker:
    """Hands out the requests one at a time to the threads of every client process, through
    a counter in memory the forked processes share."""

    def __init__(self, requests: list[tuple[int, int]]) -> None:
        import multiprocessing

        self.requests = requests
        self.counter = multiprocessing.get_context("fork").Value("l", 0)

    def take(self) -> tuple[int, int] | None:
        with self.counter.get_lock():
            index = int(self.counter.value)
            if index >= len(self.requests):
                return None
            self.counter.value = index + 1
        return self.requests[index]


def _streams_here(args: BenchArgs, streams: int, taker: _ListTaker | _SharedTaker) -> Streamed:
    """`streams` threads of this process, each taking requests until none is left."""
    import threading

    timings: list[Timing] = []
    lock = threading.Lock()

    def worker() -> None:
        while (request := taker.take()) is not None:
            index, output_len = request
            timing = stream_completion(args, bench_prompt(index, args["input_len"]), output_len)
            with lock:
                timings.append(timing)

    begin, cpu = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=worker) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - begin
    busy = (time.process_time() - cpu) / seconds if seconds > 0 else 0.0
    timings.sort(key=lambda t: t["ended"])
    return {"timings": timings, "seconds": seconds, "processes": 1, "busy": busy}


def _forked_streams(
    args: BenchArgs, requests: list[tuple[int, int]], streams: int, processes: int
) -> Streamed:
    """The streams split over forked processes that take requests from one shared counter;
    each sends back its timings (with perf_counter's begin and end: CLOCK_MONOTONIC, one
    clock for every process of the host) through a pipe."""
    taker = _SharedTaker(requests)
    shares = [streams // processes + (i < streams % processes) for i in range(processes)]
    sys.stdout.flush()  # nothing buffered is written twice by a child
    children: list[tuple[int, int]] = []  # (pid, read end)
    for share in shares:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: run its share, send its result, leave without cleanup
            os.close(read_end)
            status = 1
            try:
                begin = time.perf_counter()
                result = _streams_here(args, share, taker)
                reply = {**result, "begin": begin}
                with os.fdopen(write_end, "wb") as pipe:
                    pipe.write(json.dumps(reply).encode())
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        children.append((pid, read_end))
    replies = []
    for pid, read_end in children:
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        if status != 0 or not data:
            fail(f"a bench client process ended with status {status} and no result", "host")
        replies.append(json.loads(data))
    timings = sorted((t for r in replies for t in r["timings"]), key=lambda t: t["ended"])
    begin = min(r["begin"] for r in replies)
    end = max(r["begin"] + r["seconds"] for r in replies)
    return {
        "timings": timings,
        "seconds": end - begin,
        "processes": processes,
        "busy": max(r["busy"] for r in replies),
    }


# Warm-up prompts are seeded apart from any level's.
WARMUP_PROMPTS = 1 << 30


def warm_up(args: BenchArgs) -> tuple[float, float | None]:
    """Run the level's concurrency before its samples, uncounted: first one request a stream
    shaped as the level's (what a cold first sample measures), then c - 1 requests of 1/c …
    (c - 1)/c of the output length at once, so the batch steps down through every size
    below c (each CUDA-graph bucket the level touches has run). Return the seconds it took
    and the first requests' output tok/s (None: none completed)."""
    concurrency, length = args["concurrency"], args["output_len"]
    first = run_streams(args, [(WARMUP_PROMPTS + i, length) for i in range(concurrency)])
    stairs = [
        (WARMUP_PROMPTS + concurrency + k, -(-length * k // concurrency))
        for k in range(1, concurrency)
    ]
    stair_seconds = run_streams(args, stairs)["seconds"]
    seconds = first["seconds"]
    tokens = sum(t["tokens"] for t in first["timings"] if not t["error"])
    return seconds + stair_seconds, (tokens / seconds if tokens and seconds > 0 else None)


def rounds_of(rates: list[float], concurrency: int) -> list[float]:
    """Per-request output tok/s, in the order the requests ended, summed `concurrency` at a
    time: one round of the streams each (at concurrency 1, one request), in the level's
    units. Requests of one round share their batches; rounds are nearly independent."""
    return [
        sum(rates[i : i + concurrency]) for i in range(0, len(rates) - concurrency + 1, concurrency)
    ]


def cmd_bench(args: BenchArgs) -> BenchLevel:
    """One load level: warm up (when asked), flush the prefix cache, then keep
    `concurrency` streams busy until `prompts` requests have finished; report the level's
    figures."""
    # The warm-up's prompts are seeded apart from the level's, whose flush follows.
    warmup_s, first = warm_up(args) if args["warmup"] else (None, None)
    level = bench_serving_level(args) if args["tool"] == "sglang" else builtin_level(args)
    return {**level, "warmup_s": warmup_s, "first_sample_tokens_per_s": first}


def builtin_level(args: BenchArgs) -> BenchLevel:
    """The level measured by this agent's own streams."""
    if args["flush"]:
        http_get(args["bind_host"], args["port"], "/flush_cache", method="POST")
    streamed = run_streams(args, [(i, args["output_len"]) for i in range(args["prompts"])])
    timings, duration = streamed["timings"], streamed["seconds"]
    done = [t for t in timings if not t["error"]]
    tokens = sum(t["tokens"] for t in done)
    rates = [t["tokens"] / t["e2e"] for t in done if t["e2e"] > 0]
    return {
        "concurrency": args["concurrency"],
        "prompts": args["prompts"],
        "completed": len(done),
        "failed": len(timings) - len(done),
        "errors": sorted({t["error"] for t in timings if t["error"]})[:3],
        "duration_s": duration,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / duration if duration > 0 else 0.0,
        "requests_per_s": len(done) / duration if duration > 0 else 0.0,
        "ttft_ms": spread_ms([t["ttft"] for t in done]),
        "itl_ms": spread_ms([gap for t in done for gap in t["itl"]]),
        "e2e_ms": spread_ms([t["e2e"] for t in done]),
        "rounds_tokens_per_s": rounds_of(rates, args["concurrency"]),
        "client_processes": streamed["processes"],
        "client_busy": streamed["busy"],
    }


def bench_serving_module(site: str) -> str | None:
    """SGLang's serving benchmark in this installation: `sglang.benchmark.serving` since
    0.5.23 (where `sglang.bench_serving` is a deprecated alias), `sglang.bench_serving` before."""
    for module in ("sglang.benchmark.serving", "sglang.bench_serving"):
        if os.path.isfile(os.path.join(site, *module.split(".")) + ".py"):
            return module
    return None


def bench_serving_argv(module: str, args: BenchArgs, output_file: str) -> list[str]:
    """SGLang's benchmark for one level, as close to the builtin's as it goes: its default
    backend (native /generate), random token ids sent as ids (exact input lengths, no
    dataset download), exact output lengths, EOS ignored (its default)."""
    address = server_address(args["bind_host"])
    argv = [
        sys.executable, "-m", module, "--backend", "sglang",
        "--host", address, "--port", str(args["port"]),
        "--dataset-name", "random-ids", "--tokenize-prompt", "--random-range-ratio", "1.0",
        "--random-input-len", str(args["input_len"]), "--random-output-len", str(args["output_len"]),
        "--num-prompts", str(args["prompts"]), "--max-concurrency", str(args["concurrency"]),
        "--request-rate", "inf", "--disable-tqdm", "--output-details", "--output-file", output_file,
    ]  # fmt: skip
    return [*argv, "--flush-cache"] if args["flush"] else argv


def bench_serving_level(args: BenchArgs) -> BenchLevel:
    """One level run by SGLang's own serving benchmark, read back from its JSONL result."""
    install = sglang_install()
    if "error" in install:
        fail(install["error"] + "; --tool builtin needs only the standard library", "host")
    module = bench_serving_module(install["site"])
    if module is None:
        fail(f"SGLang {install.get('version')} for {sys.executable} has no bench_serving", "host")
    with tempfile.TemporaryDirectory(prefix="deployctl-bench-") as folder:
        result_file = os.path.join(folder, "result.jsonl")
        try:
            done = subprocess.run(
                bench_serving_argv(module, args, result_file),
                check=False,
                cwd=folder,
                # Unbuffered, so its last line is its last word.
                env={**os.environ, **args["env"], "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=args["timeout"],
            )
        except subprocess.TimeoutExpired:
            fail(f"{module} ran past {args['timeout']:g} s", "host")
        lines = (read_bytes(result_file) or b"").decode(errors="replace").splitlines()
        if done.returncode != 0 or not lines:
            said = [ln for ln in done.stdout.decode(errors="replace").splitlines() if ln.strip()]
            last = said[-1].strip() if said else "no output"
            fail(f"{module} exited {done.returncode}: {last}", "host")
    try:
        return bench_serving_result(args, json.loads(lines[-1]))
    except (ValueError, KeyError, TypeError) as exc:
        fail(f"{module} wrote a result this agent cannot read ({exc!r})", "host")


def bench_serving_result(args: BenchArgs, result: dict[str, Any]) -> BenchLevel:
    """SGLang's benchmark result (one JSONL line with --output-details) as a level."""

    def spread(name: str) -> Spread:
        return {"p50": result[f"median_{name}"], "p99": result[f"p99_{name}"]}

    errors = sorted({e.strip().splitlines()[-1] for e in result.get("errors", []) if e.strip()})
    # Per request (in the order sent): its tokens over its first token's time and gaps.
    details = zip(
        result.get("output_lens", []), result.get("ttfts", []), result.get("itls", []),
        result.get("errors", []), strict=False,
    )  # fmt: skip
    rates = [
        tokens / (ttft + sum(itl))
        for tokens, ttft, itl, error in details
        if not error and ttft + sum(itl) > 0
    ]
    return {
        "concurrency": args["concurrency"],
        "prompts": args["prompts"],
        "completed": result["completed"],
        "failed": args["prompts"] - result["completed"],
        "errors": errors[:3],
        "duration_s": result["duration"],
        "output_tokens": result["total_output_tokens"],
        "output_tokens_per_s": result["output_throughput"],
        "requests_per_s": result["request_throughput"],
        "ttft_ms": spread("ttft_ms"),
        "itl_ms": spread("itl_ms"),
        "e2e_ms": spread("e2e_latency_ms"),
        "rounds_tokens_per_s": rounds_of(rates, args["concurrency"]),
    }
