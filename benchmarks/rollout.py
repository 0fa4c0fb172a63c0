"""What a rollout costs the users of a serving fleet, and what deployctl adds to each unit.

Starts one real sshd test host (tests.sshd_hosts.start_lab; needs root and openssh-server)
running what tests/test_router.py `fleet()` builds: a router deployment with the real
sglang-router 0.3.2 (tests/router_venv.py) and N stand-in workers, each a deployment on a
fake GPU of its own, registered with the router, with tests/test_rollout.py KNOBS (16 tokens
at 20 ms a step: about 0.35 s a request; the stand-in takes 0.3 s to start, and 0.5 s from
SIGTERM to its exit, which falls in the stop step). For each N (--workers, default 3) the fleet is launched once, untimed, and then,
--runs times (default 3):

  before  tests/test_rollout.py `Load` (--streams client threads, default 3, each streaming
          16-token completions through the router one after another) alone for --before s
          (default 10)
  during  `deployctl rollout --json --drain-timeout 30` of the inventory with every worker's
          `mem_fraction_static` changed (0.8, then 0.75, then 0.8 ...: each run replaces
          every worker), under the same load; the process's wall time
  after   the load alone for --after s (default 5)

A request counts in the phase in which it ends. Per phase: requests sent (ended), failed
(an OSError, or a stream not ending with `data: [DONE]`; the reasons are kept), p50 and p99
of the successful ones' latency (p99 of a hundred-odd requests is near their maximum). Per
replaced unit, from the rollout's JSON: `timings_s` (remove, drain, stop, launch,
server_start, total) and `overhead_s` (deployctl's own time: total less the drain and the
server's start; `launch_less_start` is the launch's own part of it), as the median over
the run's units; and the rollout's time outside its units (process start, plan, the router
reads before each batch, output), next to the wall time of the same command's --dry-run
(start and plan alone, run just before). The tables give the median over runs.

Run: python benchmarks/rollout.py [--workers 2,3,4] [--runs 3]. JSON (each run's phases,
units and rollout document) goes to benchmarks/results/rollout.json (git-ignored). The
client, the load threads, the sshd host, the router and the stand-ins share this machine's
CPUs: the load (uptime) is printed and stored with each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.tune import loadavg, uptime  # noqa: E402
from tests.conftest import CLI  # noqa: E402
from tests.sshd_hosts import SSHLab, start_lab, stop_lab  # noqa: E402
from tests.test_rollout import KNOBS, Load, healthy_workers, rewrite  # noqa: E402
from tests.test_router import fleet, run_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HOST = "alpha"  # the host fleet() puts everything on
STEPS = ("remove", "drain", "stop", "launch", "server_start", "total")
EXTRA = ("overhead_s", "launch_less_start")
PHASES = ("before", "during", "after")


def percentile(values: list[float], p: int) -> float | None:
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def phase_row(done: list[float], failed: list[str]) -> dict[str, Any]:
    """What one phase's requests saw; `failed` keeps each distinct reason with its count."""
    reasons: dict[str, int] = {}
    for why in failed:
        reasons[why] = reasons.get(why, 0) + 1
    return {
        "sent": len(done) + len(failed),
        "failed": len(failed),
        "reasons": reasons,
        "p50_s": percentile(done, 50),
        "p99_s": percentile(done, 99),
    }


def rollout_process(
    cli: CLI, inv: Path, *extra: str
) -> tuple[int, dict[str, Any] | None, str, float]:
    """`deployctl rollout --json`: its exit code, document, stderr and wall seconds."""
    argv = [sys.executable, "-m", "deployctl", "rollout", "-i", str(inv), "--json", *extra]
    began = time.monotonic()
    done = subprocess.run(
        argv, cwd=cli.cwd, env=cli.env(), capture_output=True, text=True, timeout=600
    )
    wall = time.monotonic() - began
    try:
        document = json.loads(done.stdout)
    except ValueError:
        document = None
    return done.returncode, document, done.stderr, wall


def unit_medians(units: list[dict[str, Any]]) -> dict[str, float]:
    """Each step's median over the replaced units (overhead_s among them)."""
    medians: dict[str, float] = {}
    for step in STEPS:
        values = [u["timings_s"][step] for u in units if step in u["timings_s"]]
        if values:
            medians[step] = statistics.median(values)
    medians["overhead_s"] = statistics.median(u["overhead_s"] for u in units)
    # The launch's own part: preflight, start, registration and the router's health check.
    medians["launch_less_start"] = statistics.median(
        u["timings_s"]["launch"] - u["timings_s"]["server_start"] for u in units
    )
    return medians


def one_run(
    cli: CLI, inv: Path, router: tuple[str, int], index: int, opts: argparse.Namespace
) -> dict[str, Any]:
    """One rollout of every worker between two stretches of load alone."""
    rewrite(inv, {"mem_fraction_static": 0.8 if index % 2 else 0.75})
    # The same process up to its plan (every run's status, the router's workers): the part
    # of the rollout's time outside its units that a dry run accounts for.
    planned, _, _, plan_wall = rollout_process(cli, inv, "--dry-run")
    load1 = loadavg()
    with Load(*router, streams=opts.streams) as load:
        marks = [(0, 0)]
        time.sleep(opts.before)
        marks.append((len(load.done), len(load.failed)))
        code, document, stderr, wall = rollout_process(cli, inv, "--drain-timeout", "30")
        marks.append((len(load.done), len(load.failed)))
        time.sleep(opts.after)
    marks.append((len(load.done), len(load.failed)))
    spans = pairwise(marks)  # each phase: from its mark to the next
    phases = {
        phase: phase_row(load.done[d0:d1], load.failed[f0:f1])
        for phase, ((d0, f0), (d1, f1)) in zip(PHASES, spans, strict=True)
    }
    units = [u for u in (document or {}).get("units", []) if u["outcome"] == "replaced"]
    row: dict[str, Any] = {
        "run": index, "exit": code, "rollout_wall_s": wall, "load1": load1,
        "dry_run_exit": planned, "dry_run_wall_s": plan_wall,
        "phases": phases, "replaced": len(units),
        "outcomes": {u["unit"]: u["outcome"] for u in (document or {}).get("units", [])},
    }  # fmt: skip
    row["document"] = document
    if code != 0 or not units:
        row["error"] = stderr[-1500:]
        print(f"  run {index}: rollout exited {code}: {row['error']}", flush=True)
        return row
    row["unit_medians"] = unit_medians(units)
    # Process start, inventory, connections, the plan (every run's status, the router's
    # workers) and the output: the rollout's time outside its units.
    row["outside_units_s"] = wall - sum(u["timings_s"]["total"] for u in units)
    row["stderr"] = stderr
    m = row["unit_medians"]
    print(
        f"  run {index}: rollout {wall:.1f} s ({row['outside_units_s']:.1f} outside units; "
        f"dry run {plan_wall:.1f}), "
        f"{len(units)} replaced, per unit "
        + ", ".join(f"{s} {m[s]:.2f}" for s in (*STEPS, *EXTRA) if s in m)
        + " | "
        + "; ".join(
            f"{p} {r['sent']} sent {r['failed']} failed p50 {fmt(r['p50_s'])} p99 {fmt(r['p99_s'])}"
            for p, r in phases.items()
        )
        + f" (load {load1:.2f})",
        flush=True,
    )
    return row


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def median_of(rows: list[dict[str, Any]], *path: str) -> float | None:
    values = []
    for row in rows:
        value: Any = row
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            values.append(value)
    return statistics.median(values) if values else None


def report(fleets: dict[int, list[dict[str, Any]]]) -> None:
    print()
    print("load through the router (medians over runs; a request counts where it ends)")
    print(f"{'N':>2} {'phase':>6} {'sent':>5} {'failed':>6} {'p50 s':>6} {'p99 s':>6}")
    for n, rows in fleets.items():
        for phase in PHASES:
            sent = median_of(rows, "phases", phase, "sent")
            failed = sum(r["phases"][phase]["failed"] for r in rows)
            print(
                f"{n:>2} {phase:>6} {sent or 0:5g} {failed:6} "
                f"{fmt(median_of(rows, 'phases', phase, 'p50_s')):>6} "
                f"{fmt(median_of(rows, 'phases', phase, 'p99_s')):>6}"
            )
        reasons: dict[str, int] = {}
        for row in rows:
            for phase in PHASES:
                for why, count in row["phases"][phase]["reasons"].items():
                    reasons[why] = reasons.get(why, 0) + count
        for why, count in reasons.items():
            print(f"   failed {count}x: {why}")
    print()
    print("per replaced unit, from timings_s (medians over the units of a run, then over runs)")
    header = " ".join(f"{s:>12}" for s in (*STEPS, *EXTRA))
    print(f"{'N':>2} {'rollout s':>9} {'outside':>7} {'dry run':>7} {header}")
    for n, rows in fleets.items():
        good = [r for r in rows if "unit_medians" in r]
        cells = " ".join(f"{fmt(median_of(good, 'unit_medians', s)):>12}" for s in (*STEPS, *EXTRA))
        wall, outside = median_of(good, "rollout_wall_s"), median_of(good, "outside_units_s")
        dry = median_of(good, "dry_run_wall_s")
        print(f"{n:>2} {fmt(wall):>9} {fmt(outside):>7} {fmt(dry):>7} {cells}")


def fleet_runs(
    lab: SSHLab, cli: CLI, base: Path, workers: int, opts: argparse.Namespace
) -> list[dict[str, Any]]:
    """Launch a router and `workers` workers, run the rollouts, stop them."""
    lab.hosts[HOST].reset()
    folder = base / f"fleet-{workers}"
    folder.mkdir()
    inv, table = fleet(lab, folder, workers=workers, knobs=KNOBS)
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    if code != 0:
        raise SystemExit(f"launch of {workers} workers exited {code}: {err[-1500:]}")
    print(f"{workers} workers behind alpha/router", flush=True)
    rows = []
    try:
        for index in range(1, opts.runs + 1):
            router = (lab.hosts[HOST].address, table["router"]["port"])
            rows.append(one_run(cli, inv, router, index, opts))
            # The next run starts from a fleet whose every worker serves and is registered.
            try:
                serving = healthy_workers(cli, inv)
            except AssertionError as exc:  # the router itself is not ready
                serving = [f"router not ready: {exc}"]
            if len(serving) != workers:
                rows[-1]["fleet_after"] = serving
                print(f"  after run {index}: {serving}; no more runs of {workers}", flush=True)
                break
    finally:
        cli("stop", "-i", str(inv))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="3", help="fleet sizes, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="rollouts per fleet size")
    parser.add_argument("--streams", type=int, default=3, help="client threads of the load")
    parser.add_argument("--before", type=float, default=10.0, help="seconds of load alone first")
    parser.add_argument("--after", type=float, default=5.0, help="seconds of load alone after")
    parser.add_argument("--output", type=Path, default=RESULTS / "rollout.json")
    opts = parser.parse_args()
    sizes = [int(n) for n in opts.workers.split(",")]
    if any(n < 2 for n in sizes):
        raise SystemExit("every fleet size must be 2 or more: a rollout keeps one worker serving")
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        raise SystemExit("needs root and openssh-server (it starts sshd and creates a user)")
    base = Path(tempfile.mkdtemp(prefix="deployctl-bench-rollout-", dir="/tmp"))
    uptime_before = uptime()
    print(f"before: {uptime_before}", flush=True)
    lab = start_lab(base, [HOST])
    fleets: dict[int, list[dict[str, Any]]] = {}
    began = time.monotonic()
    try:
        home, work = base / "client-home", base / "work"
        home.mkdir()
        work.mkdir()
        cli = CLI(work, home)
        for workers in sizes:
            fleets[workers] = fleet_runs(lab, cli, base, workers, opts)
    finally:
        stop_lab(lab)
    uptime_after = uptime()
    report(fleets)
    print(f"\nload before: {uptime_before}\nload after:  {uptime_after}")
    print(f"{os.cpu_count()} CPUs, {time.monotonic() - began:.0f} s in all")
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(
        json.dumps(
            {
                "runs": opts.runs,
                "streams": opts.streams,
                "phase_s": {"before": opts.before, "after": opts.after},
                "knobs": KNOBS,
                "cpu_count": os.cpu_count(),
                "uptime_before": uptime_before,
                "uptime_after": uptime_after,
                "fleets": {str(n): rows for n, rows in fleets.items()},
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {opts.output}")


if __name__ == "__main__":
    main()
