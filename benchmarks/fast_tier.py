"""The fast tier's time on this machine, idle and beside one busy loop per core (the goal: under
60 s both ways), and where its CPU goes.

Each run is `python -m pytest -q -n WORKERS -p no:cacheprovider -m "not lab"` from this
checkout, in turn idle and busy (one `while :; do :; done` per core, started before and ended
after the run), --runs times. For each run:

  wall      seconds from the start of pytest to its end
  waited    CPU seconds of pytest and every process it waited for (getrusage of children):
            workers, subprocesses a test ran to the end
  machine   CPU seconds the whole machine spent over the run (/proc/stat), less the busy
            loops' own (/proc/PID/stat): adds what no one waited for, as servers started
            detached and CLI runs forked from tests/cli_server.py
  result    pytest's last line

Medians per mode. Run it on a machine doing nothing else: another process's CPU counts as
the suite's in `machine`. Run: python benchmarks/fast_tier.py [--runs 3] [--workers 2]
[--modes idle,busy] [-- PYTEST_ARGS...]; a table on stdout and benchmarks/results/fast_tier.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "fast_tier.json"
sys.path.insert(0, str(ROOT))

from benchmarks.fleet import CLK_TCK, cpu_jiffies, process_cpu_s  # noqa: E402 - needs the path


def machine_busy_s() -> float:
    """CPU seconds the machine has spent on anything but idle and I/O wait since boot."""
    return cpu_jiffies()[0] / CLK_TCK


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(busy: bool, workers: int, extra: list[str]) -> dict[str, Any]:
    loops = (
        [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 1)]
        if busy
        else []
    )
    try:
        loops_before = sum(process_cpu_s(p.pid) for p in loops)
        machine_before, waited_before = machine_busy_s(), children_cpu_s()
        started = time.monotonic()
        argv = [sys.executable, "-m", "pytest", "-q", "-n", str(workers), "-p", "no:cacheprovider"]
        done = subprocess.run(
            [*argv, "-m", "not lab", *extra], cwd=ROOT, capture_output=True, text=True
        )
        wall = time.monotonic() - started
        waited = children_cpu_s() - waited_before  # before the busy loops are reaped
        machine = machine_busy_s() - machine_before
        loops_cpu = sum(process_cpu_s(p.pid) for p in loops) - loops_before
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {
        "mode": "busy" if busy else "idle",
        "wall_s": round(wall, 2),
        "waited_cpu_s": round(waited, 2),
        "machine_cpu_s": round(machine - loops_cpu, 2),
        "returncode": done.returncode,
        "result": lines[-1] if lines else "(no output)",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", default="idle,busy")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    modes = args.modes.split(",")
    runs = []
    for n in range(args.runs):
        for mode in modes:  # alternating, so a drift of the machine falls on both alike
            run = one_run(mode == "busy", args.workers, args.pytest_args)
            runs.append(run)
            print(
                f"run {n + 1} {mode}: {run['wall_s']:.1f} s wall, {run['waited_cpu_s']:.1f} "
                f"CPU-s waited, {run['machine_cpu_s']:.1f} machine: {run['result']}",
                flush=True,
            )
    print(f"\n{'mode':<6} {'wall s':>8} {'waited CPU-s':>13} {'machine CPU-s':>14}  (medians)")
    summary = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        summary[mode] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("wall_s", "waited_cpu_s", "machine_cpu_s")
        }
        figures = summary[mode]
        print(
            f"{mode:<6} {figures['wall_s']:>8.1f} {figures['waited_cpu_s']:>13.1f} "
            f"{figures['machine_cpu_s']:>14.1f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": runs, "medians": summary}, indent=1) + "\n")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
