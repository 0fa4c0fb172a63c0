"""A closed-loop load whose concurrency sweeps, for `tune --live` on a GPU machine: stdlib only.

Each level holds that many streamed /v1/completions in flight for --step-s seconds, then the
next; the levels go up, then back down, and again, until --stop-file appears or --max-s has
passed. Every request's outcome is counted per level; the summary goes to --out as JSON.

    python scripts/sweep_load.py --url http://127.0.0.1:31100 --levels 2,8,32,128 \
        --step-s 20 --max-tokens 128 --stop-file /tmp/stop --out /tmp/load.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

# The lab's load reads a streamed completion (and says why one failed) once, for both.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.canary_load import RequestResult, loopback_target, stream_completion


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--levels", required=True, help="comma list of concurrencies")
    parser.add_argument("--step-s", type=float, default=20.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-s", type=float, default=3600.0)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    host, port, path = loopback_target(args.url)
    up = [int(v) for v in args.levels.split(",")]
    schedule = up + up[-2:0:-1]  # up, then down, without repeating the ends
    body = json.dumps(
        {"model": "m", "prompt": "the server model", "max_tokens": args.max_tokens,
         "stream": True, "temperature": 0}
    ).encode()  # fmt: skip
    lock = threading.Lock()
    level = {"now": schedule[0]}
    stop = threading.Event()
    counts: dict[int, dict[str, int]] = {}
    errors: list[str] = []

    def worker(index: int) -> None:
        while not stop.is_set():
            current = level["now"]
            if index >= current:
                time.sleep(0.05)
                continue
            result = RequestResult(0.0, 0.0)
            stream_completion(host, port, path, body, 300.0, result)
            with lock:
                row = counts.setdefault(current, {"done": 0, "failed": 0})
                row["done" if result.error is None else "failed"] += 1
                if result.error and len(errors) < 20:
                    errors.append(result.error)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(max(up))]
    for thread in threads:
        thread.start()
    start, step = time.monotonic(), 0
    while not os.path.exists(args.stop_file) and time.monotonic() - start < args.max_s:
        level["now"] = schedule[step % len(schedule)]
        print(f"+{time.monotonic() - start:.0f}s concurrency {level['now']}", flush=True)
        step_end = time.monotonic() + args.step_s
        while time.monotonic() < step_end and not os.path.exists(args.stop_file):
            time.sleep(0.5)
        step += 1
    stop.set()
    for thread in threads:
        thread.join(330.0)
    summary = {"levels": schedule, "step_s": args.step_s, "elapsed_s": time.monotonic() - start,
               "by_level": {str(k): v for k, v in sorted(counts.items())}, "errors": errors}  # fmt: skip
    with open(args.out, "w") as out:
        json.dump(summary, out, indent=1)
    failed = sum(v["failed"] for v in counts.values())
    done = sum(v["done"] for v in counts.values())
    print(f"{done} requests ended with [DONE], {failed} failed", flush=True)


if __name__ == "__main__":
    main()
