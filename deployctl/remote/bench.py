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


def stream_completion(args: BenchArgs, prompt: str) -> Timing:
    """One streamed /v1/completions request (EOS ignored), timed from the request."""
    import http.client

    body = json.dumps(
        {
            "model": "default",
            "prompt": prompt,
            "max_tokens": args["output_len"],
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    address = server_address(args["bind_host"])
    timing: Timing = {"error": "", "ttft": 0.0, "itl": [], "e2e": 0.0, "tokens": 0}
    start = time.perf_counter()
    last: float | None = None
    try:
        conn = http.client.HTTPConnection(address, args["port"], timeout=args["timeout"])
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            timing["error"] = f"HTTP {response.status} from /v1/completions"
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
        return timing
    timing["e2e"] = time.perf_counter() - start
    if last is None:
        timing["error"] = "no token streamed"
    elif not finished:  # the server went away mid-answer: not a completed request
        timing["error"] = f"the stream ended before [DONE], after {len(timing['itl']) + 1} chunks"
    return timing


def cmd_bench(args: BenchArgs) -> BenchLevel:
    """One load level: flush the prefix cache, then keep `concurrency` streams busy until
    `prompts` requests have finished; report the level's figures."""
    import threading

    if args["tool"] == "sglang":
        return bench_serving_level(args)
    if args["flush"]:
        http_get(args["bind_host"], args["port"], "/flush_cache", method="POST")
    timings: list[Timing] = []
    lock = threading.Lock()
    indices = iter(range(args["prompts"]))

    def worker() -> None:
        while True:
            with lock:
                index = next(indices, None)
            if index is None:
                return
            timing = stream_completion(args, bench_prompt(index, args["input_len"]))
            with lock:
                timings.append(timing)

    begin = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args["concurrency"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    duration = time.perf_counter() - begin
    done = [t for t in timings if not t["error"]]
    tokens = sum(t["tokens"] for t in done)
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
    }
