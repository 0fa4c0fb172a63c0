"""The ceiling of `deployctl bench`'s built-in load generator on one core.

Runs the generator (deployctl.remote.bench.cmd_bench, exactly what the host agent runs) in
this process against the stand-in server started beside it, with a decode model fast
enough (1 ms steps, one token per chunk: the worst case) that the generator works flat out,
and measures the CPU seconds this process spends per streamed token. tokens / CPU seconds
is what one core can sustain: the generator must not be the bottleneck below 5,000 tok/s.
The stand-in runs in its own process, so its CPU is not counted.

Run: python benchmarks/bench_generator.py [--rounds 3]. JSON goes to
benchmarks/results/bench_generator.json (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deployctl.remote.bench import cmd_bench  # noqa: E402
from deployctl.remote.protocol import BenchArgs  # noqa: E402
from deployctl.remote.runs import health  # noqa: E402
from tests.sshd_hosts import STANDIN, free_port  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    model = Path(tempfile.mkdtemp(prefix="deployctl-gen-"))
    (model / "standin.json").write_text(
        json.dumps({"startup_s": 0.2, "step_ms": 1.0, "per_req_ms": 0.0})
    )
    port = free_port("127.0.0.1")
    server = subprocess.Popen(
        [sys.executable, str(STANDIN), "--model-path", str(model), "--tp", "1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while health("127.0.0.1", port) != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the stand-in did not get ready within 30 s")
            time.sleep(0.05)
        samples = []
        for _ in range(args.rounds):
            level: BenchArgs = {
                "bind_host": "127.0.0.1", "port": port, "concurrency": args.concurrency,
                "prompts": 4 * args.concurrency, "input_len": 16, "output_len": 256,
                "flush": True, "timeout": 120, "tool": "builtin", "env": {},
            }  # fmt: skip
            before = cpu_seconds()
            result = cmd_bench(level)
            cpu = cpu_seconds() - before
            assert result["failed"] == 0, result["errors"]
            samples.append(
                {
                    "tokens": result["output_tokens"],
                    "tokens_per_s": result["output_tokens_per_s"],
                    "generator_cpu_s": cpu,
                    "ceiling_tokens_per_cpu_s": result["output_tokens"] / cpu,
                }
            )
    finally:
        os.killpg(server.pid, 9)
        server.wait()
    summary = {
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "load": os.getloadavg(),
        "achieved_tokens_per_s_median": round(
            statistics.median(s["tokens_per_s"] for s in samples)
        ),
        "ceiling_tokens_per_cpu_s_median": round(
            statistics.median(s["ceiling_tokens_per_cpu_s"] for s in samples)
        ),
        "samples": samples,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_generator.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
