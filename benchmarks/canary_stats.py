"""How fast and how often `deployctl canary`'s judge (deployctl/canary_stats.py) decides.

Drives the property tests' simulation (tests/test_canary_stats.py `simulate`): one replica
pair, one sample per side every 2 s interval; running requests Poisson around 16 (so the load
bucket varies, about half the samples at buckets >= 16); ITL p50 growing with the batch, 3 %
lognormal noise, AR(1) serial correlation 0.3 between successive intervals, 1 % stalled
intervals 1.5 times slower. The judge is asked after every interval, with its defaults
(--metric itl, --max-regression 5 %, --confidence 0.95, --min-samples 20), until it decides or
--max-duration's 30 min (900 intervals) pass.

For regressions of 0, 3, 5, 8 and 15 % (only at buckets >= 16 as in the issue's done-when,
then at every load) and --runs seeds each: the verdict counts, and for the decided runs the
matched samples and simulated time (intervals x 2 s, per replica pair) to the verdict, median
and p90. The false alarms over the null runs: regressions called when stopping at the first
verdict (what canary does), and when peeking on to 900 intervals after a promotion.

Run: python benchmarks/canary_stats.py [--runs 40]. Prints a table; writes
benchmarks/canary-stats.json. Under 2 min on one core.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.test_canary_stats import INTERVAL_S, Run, simulate  # noqa: E402

OUTPUT = Path(__file__).resolve().parent / "canary-stats.json"
REGRESSIONS = (0.0, 0.03, 0.05, 0.08, 0.15)
BUDGET = 900  # --max-duration 30 min at --interval 2 s
SCENARIOS = {"from bucket 16": 16, "every load": 1}


def p90(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[max(0, round(0.9 * len(ordered)) - 1)]


def summary(found: list[Run]) -> dict[str, Any]:
    counts = {
        state: sum(r.state == state for r in found)
        for state in ("regression", "no_regression", "undecided")
    }
    decided = [r for r in found if r.state != "undecided"]
    row: dict[str, Any] = {"runs": len(found), "verdicts": counts}
    if decided:
        samples = [r.samples for r in decided]
        seconds = [int(r.intervals * INTERVAL_S) for r in decided]
        row.update(
            samples_median=statistics.median(samples),
            samples_p90=p90(samples),
            time_s_median=statistics.median(seconds),
            time_s_p90=p90(seconds),
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    started = time.monotonic()
    results: dict[str, Any] = {
        "model": {
            "interval_s": INTERVAL_S,
            "budget_intervals": BUDGET,
            "load": "Poisson(16) running requests per interval and side",
            "noise": "3 % lognormal, AR(1) 0.3, 1 % stalls x1.5",
            "judge": "itl, max_regression 0.05, confidence 0.95, min_samples 20",
        },
        "python": platform.python_version(),
        "scenarios": {},
    }
    print(
        f"{'regression':>10} {'scenario':>15} {'regr':>5} {'pass':>5} {'undec':>5}  "
        f"{'samples med/p90':>16}  {'time s med/p90':>15}"
    )
    for scenario, from_bucket in SCENARIOS.items():
        rows = {}
        for regression in REGRESSIONS:
            found = [
                simulate(seed, regression, from_bucket=from_bucket, budget=BUDGET)
                for seed in range(args.runs)
            ]
            row = summary(found)
            rows[f"{regression:.2f}"] = row
            verdicts = row["verdicts"]
            spans = (
                f"{row['samples_median']:>7.0f} / {row['samples_p90']:<6}  "
                f"{row['time_s_median']:>6.0f} / {row['time_s_p90']:<6}"
                if "samples_median" in row
                else f"{'-':>16}  {'-':>15}"
            )
            print(
                f"{regression * 100:>9.0f}% {scenario:>15} {verdicts['regression']:>5} "
                f"{verdicts['no_regression']:>5} {verdicts['undecided']:>5}  {spans}"
            )
        results["scenarios"][scenario] = rows
    # The null runs again, now peeking on past a promotion to the whole budget.
    peeking = [simulate(seed, 0.0, budget=BUDGET, stop_at_first=False) for seed in range(args.runs)]
    null = results["scenarios"]["from bucket 16"]["0.00"]
    results["false_alarms"] = {
        "null_runs": args.runs,
        "stopping_at_first_verdict": null["verdicts"]["regression"],
        "peeking_to_budget": sum(r.state == "regression" for r in peeking),
    }
    results["wall_s"] = round(time.monotonic() - started, 1)
    alarms = results["false_alarms"]
    print(
        f"false alarms over {args.runs} null runs: {alarms['stopping_at_first_verdict']} "
        f"(stopping at the first verdict), {alarms['peeking_to_budget']} (peeking on to "
        f"{BUDGET} intervals); {results['wall_s']} s"
    )
    OUTPUT.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
