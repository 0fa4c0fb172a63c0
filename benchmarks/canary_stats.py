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

Then `tune --live`: how soon one bucket's gain of 3 or 5 % (either way) is told from none.

Run: python benchmarks/canary_stats.py [--runs 40]. Prints tables; writes
benchmarks/canary-stats.json. Under 2 min on one core.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deployctl.canary_stats import BucketInterval, Judge, Sample  # noqa: E402
from tests.test_canary_stats import INTERVAL_S, Run, poisson, simulate  # noqa: E402

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


# ---- tune --live: how soon a bucket's gain is told from none ----------------------------------

GAINS = (0.0, 0.03, -0.03, 0.05, -0.05)  # speculative ÷ plain - 1, at every load
WATCHED = 16  # the bucket with the most samples under Poisson(16) running requests


@dataclass
class LiveRun:
    decided_at: int | None  # intervals until bucket 16's always-valid interval excluded 1
    wrong: bool  # it excluded 1 on the wrong side (or at all, for a null gain)
    decided_at_end: bool  # the one look at the budget's end (--precision 0) decided it
    detectable_at_end: float | None  # that look's half-width, as a fraction


def decides(found: BucketInterval) -> bool:
    """The interval lies wholly on one side of even."""
    return (found.high is not None and found.high < 1) or (found.low is not None and found.low > 1)


def simulate_live(seed: int, gain: float, budget: int, adjust: bool) -> LiveRun:
    """One live window, as the canary simulation draws its samples (throughput per running
    request, Poisson(16) load per side and interval, 3 % noise, AR(1) 0.3, 1 % stalls), the
    speculative side `gain` better everywhere. Bucket 16 is read after every interval with
    the always-valid intervals at half the error rate (--precision's looks), and at the end
    with one fixed look at the whole rate (--precision 0). `adjust`: the judge regresses
    each sample on its load within the bucket, as tune --live's does."""
    rng = random.Random(seed)
    judge = Judge("throughput", 0.03, 0.95, 20, adjust_load=adjust)
    state = {"control": 0.0, "candidate": 0.0}
    decided_at, wrong = None, False
    for interval in range(1, budget + 1):
        for side in ("control", "candidate"):
            running = float(poisson(rng, 16.0))
            state[side] = 0.3 * state[side] + math.sqrt(1 - 0.09) * rng.gauss(0, 0.03)
            itl = (0.010 + 0.0004 * running) * math.exp(state[side])
            if rng.random() < 0.01:
                itl *= 1.5
            value = (1 + gain if side == "candidate" else 1.0) / itl
            judge.add(side, Sample(running, value, max(int(running), 1), side))
        if decided_at is None:
            found = {i.bucket: i for i in judge.bucket_sequences(0.5)}.get(WATCHED)
            if found and decides(found):
                decided_at = interval
                # worse-ratio: below 1 the candidate (speculative) side is better
                wrong = gain == 0 or (found.high is not None and found.high < 1) != (gain > 0)
    last = {i.bucket: i for i in judge.bucket_intervals()}.get(WATCHED)
    decided_at_end = bool(last and decides(last))
    detectable = None if last is None or last.low is None else last.ratio / last.low - 1
    return LiveRun(decided_at, wrong, decided_at_end, detectable)


def live_summary(found: list[LiveRun]) -> dict[str, Any]:
    decided = [r.decided_at for r in found if r.decided_at is not None]
    seconds = [int(i * INTERVAL_S) for i in decided]
    detectable = [r.detectable_at_end for r in found if r.detectable_at_end is not None]
    return {
        "runs": len(found),
        "decided_looking": len(decided),
        "wrong_looking": sum(r.wrong for r in found),
        "time_s_median": statistics.median(seconds) if seconds else None,
        "time_s_p90": p90(seconds) if seconds else None,
        "decided_one_look_at_end": sum(r.decided_at_end for r in found),
        "detectable_at_end_median": round(statistics.median(detectable), 4) if detectable else None,
    }


def live_table(runs: int) -> dict[str, Any]:
    print(
        f"\n{'gain':>6} {'load':>8} {'decided (looking)':>18} {'wrong':>6} {'time s med/p90':>15} "
        f"{'decided (one look)':>19} {'detectable':>11}"
    )
    rows = {}
    for gain, adjust in ((g, a) for g in GAINS for a in (False, True)):
        row = live_summary([simulate_live(seed, gain, BUDGET, adjust) for seed in range(runs)])
        rows[f"{gain:+.2f} {'adjusted' if adjust else 'raw'}"] = row
        spans = (
            f"{row['time_s_median']:>6.0f} / {row['time_s_p90']:<6}"
            if row["time_s_median"] is not None
            else f"{'-':>15}"
        )
        print(
            f"{gain * 100:>+5.0f}% {'adjusted' if adjust else 'raw':>8} "
            f"{row['decided_looking']:>12}/{runs:<5} {row['wrong_looking']:>6} "
            f"{spans} {row['decided_one_look_at_end']:>13}/{runs:<5} "
            f"{row['detectable_at_end_median']:>10.1%}"
        )
    return rows


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
    results["live_window"] = {
        "model": "bucket 16, the speculative side better by the gain at every load; raw or "
        "load-adjusted (each sample regressed on its log running requests in its bucket); looking: "
        "always-valid intervals after every interval at half the error rate (--precision); "
        "one look: fixed-horizon at the 30 min end (--precision 0)",
        "gains": live_table(args.runs),
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
