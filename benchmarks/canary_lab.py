"""How often and how fast the real `deployctl canary` decides, end to end over sshd (issue 43).

Starts one real sshd test host (tests.sshd_hosts.start_lab; needs root and openssh-server)
running what tests/test_canary_lab.py `canary_fleet()` builds: the real sglang-router 0.3.2
(round robin) and two stand-in replicas r1, r2 on fake GPUs of their own, with the lab test's
KNOBS (10 ms + 0.5 ms a running request per decode step). The fleet is launched once and
kept for every run. Each run puts tests/canary_load.py `PoissonLoad` through the router (the
lab test's 28 arrivals a second of 64-token streamed completions, seeded) for as long as
`deployctl canary --json --no-promote --interval 0.5 --drain-timeout 10 --timeout 60` runs:

  null        `canary --restart`: r1 relaunched on the configuration it runs (what the lab
              test's null run does), judged against r2; --null-runs (40) runs, seeds 1..N,
              --null-max-duration (60 s, as the lab test)
  regression  the candidate's model folder (`model-new`, tests/test_canary_lab.py
              `to_new_model`) with the stand-in's `slowdown` knob: every decode step over a
              batch of at least B requests takes 1 + X % longer; for each X of --regressions
              (3,5,8,15 at every batch; `8@16` is the lab test's 8 % only at batches of 16
              and more) --seeds runs (3), seeds 1001.., --max-duration (120 s)

Every run ends with the fleet back on the control's configuration: a rolled-back candidate is
back already; a kept one (no regression, or inconclusive: --no-promote never rolls the rest
out) is put back by `deployctl rollout` of the restored inventory. A run whose canary did not
end in a verdict for infrastructure's sake (the split failed, the command timed out, no JSON)
is recorded as such with its reason, the fleet checked and relaunched if need be.

Per run: the verdict `canary --json` reports (regression / no_regression / undecided, with
`inconclusive` for an undecided run that reached --max-duration), the decision, matched
samples, `elapsed_s` (the judging time: split done to verdict), the command's wall time, the
estimate and its interval, the load's arrivals/done/failed/dropped, and the 1-min load
average. Summary: the null runs' counts by verdict and false alarms (verdict regression);
per regression size the counts and the median samples and seconds to a verdict.

Run: python benchmarks/canary_lab.py [--null-runs 40] [--regressions 3,5,8,15] [--seeds 3].
Writes benchmarks/canary-lab.json (committed, as canary-stats.json is for the simulated
judge). The client, the load, the sshd host, the router and the stand-ins share this
machine's CPUs: the load average is stored with each run.
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.tune import loadavg, uptime  # noqa: E402
from tests.conftest import CLI  # noqa: E402
from tests.sshd_hosts import SSHLab, sh, start_lab, stop_lab  # noqa: E402
from tests.test_canary_lab import KNOBS, canary_fleet, load_through, to_new_model  # noqa: E402
from tests.test_router import run_json  # noqa: E402

OUTPUT = Path(__file__).resolve().parent / "canary-lab.json"
HOST = "alpha"  # the host canary_fleet() puts everything on
VERDICTS = ("regression", "no_regression", "inconclusive", "undecided", "infrastructure")
CANARY_ARGS = ("--json", "--no-promote", "--interval", "0.5", "--drain-timeout", "10")


def scenario(text: str) -> tuple[str, float, int]:
    """`8` (8 % at every batch) or `8@16` (only at batches of 16 and more): name, factor, B."""
    percent, _, batch = text.partition("@")
    return text, 1 + float(percent) / 100, int(batch or 1)


def outcome(doc: dict[str, Any]) -> str:
    """The verdict `canary --json` reports; an undecided one that ran out of time is
    inconclusive (the reason says so)."""
    verdict = doc.get("verdict") or "undecided"
    if verdict == "undecided" and str(doc.get("reason", "")).startswith("inconclusive"):
        return "inconclusive"
    return str(verdict)


def canary_run(cli: CLI, inv: Path, *extra: str) -> tuple[int, dict[str, Any] | None, str, float]:
    """`deployctl canary` as the lab test runs it: exit code, document (None: none), stderr,
    wall seconds. A timeout comes back as exit -1."""
    # Not through CLI.__call__: its JSON contract check would raise where a benchmark records.
    argv = [sys.executable, "-m", "deployctl", "canary", "-i", str(inv), *CANARY_ARGS]
    began = time.monotonic()
    try:
        done = subprocess.run(
            [*argv, "--timeout", "60", *extra], cwd=cli.cwd, env=cli.env(), capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        return -1, None, f"timed out after {exc.timeout} s", time.monotonic() - began
    wall = time.monotonic() - began
    try:
        document = json.loads(done.stdout)
    except ValueError:
        document = None
    return done.returncode, document, done.stderr, wall


def one_run(
    cli: CLI, inv: Path, lab: SSHLab, port: int, kind: str, name: str, seed: int, extra: list[str]
) -> dict[str, Any]:
    """One canary under its own seeded load; the row the JSON keeps."""
    load1 = loadavg()
    with load_through(port, lab.hosts[HOST].address, seed=seed) as load:
        code, doc, err, wall = canary_run(cli, inv, *extra)
    report = load.report()
    row: dict[str, Any] = {
        "kind": kind, "scenario": name, "seed": seed, "exit": code, "wall_s": round(wall, 2),
        "load1": load1,
        "load": {
            "arrivals": report.arrivals, "done": report.done, "failed": report.failed,
            "dropped": report.dropped, "peak_in_flight": report.peak_in_flight,
            "errors": sorted(set(report.errors))[:5],
        },
    }  # fmt: skip
    if "Traceback" in err:
        row["stderr"] = err[-3000:]
    if doc is None:
        row.update(verdict="infrastructure", infrastructure=f"exit {code}, no JSON: {err[-800:]}")
        return row
    row.update(
        verdict=outcome(doc),
        judge_state=doc.get("verdict"),
        decision=doc.get("decision"),
        reason=doc.get("reason"),
        samples=doc.get("samples"),
        elapsed_s=doc.get("elapsed_s"),
        estimate=doc.get("estimate"),
        low=doc.get("low"),
        high=doc.get("high"),
        buckets=[[b["bucket"], b["control_n"], b["candidate_n"]] for b in doc.get("buckets", [])],
        # The split, the rollback if any, and the process's own start and plan.
        outside_judging_s=round(wall - float(doc.get("elapsed_s") or 0), 2),
        canary=doc.get("canary"),
        keep_error=doc.get("keep_error"),
    )
    if doc.get("decision") == "failed" or (doc.get("verdict") is None and not doc.get("samples")):
        # The canary never came to be judged: its split (rollout's engine) did not serve.
        row["verdict"] = "infrastructure"
        row["infrastructure"] = f"decision {doc.get('decision')}: {doc.get('reason')}"
    return row


def fleet_state(cli: CLI, inv: Path) -> tuple[bool, str]:
    """Every deployment ready and none differing from the inventory (a dry-run rollout)."""
    try:
        code, status, err = run_json(cli, "status", "-i", str(inv))
        states = {d: e.get("state") for d, e in status["hosts"][HOST]["deployments"].items()}
        if code != 0 or any(s != "ready" for s in states.values()):
            return False, f"status exit {code}: {states} {err[-300:]}"
        code, plan, err = run_json(cli, "rollout", "-i", str(inv), "--dry-run")
        changed = [u["unit"] for u in plan.get("units", []) if u.get("changes")]
        if code != 0 or changed:
            return False, f"rollout --dry-run exit {code}, differing: {changed} {err[-300:]}"
    except (AssertionError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        return False, f"{type(exc).__name__}: {str(exc)[-300:]}"
    return True, ""


def restore(cli: CLI, inv: Path, control: str) -> list[str]:
    """The inventory back on the control's model folder, the fleet on it; what it took."""
    inv.write_text(control)
    done: list[str] = []
    ok, why = fleet_state(cli, inv)
    if ok:
        return done
    done.append(f"check: {why}")
    code, doc, err = run_json(cli, "rollout", "-i", str(inv), "--drain-timeout", "10")
    outcomes = {u["unit"]: u.get("outcome") for u in doc.get("units", [])}
    done.append(f"rollout exit {code}: {outcomes}")
    ok, why = fleet_state(cli, inv)
    if ok:
        return done
    done.append(f"check: {why}; relaunching")
    cli("stop", "-i", str(inv), timeout=180)
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    done.append(f"launch exit {code} {err[-300:]}")
    ok, why = fleet_state(cli, inv)
    if not ok:
        raise SystemExit(f"the fleet could not be put back: {done} {why}")
    return done


def print_row(index: int, total: int, row: dict[str, Any]) -> None:
    load = row["load"]
    if row["verdict"] == "infrastructure" and "decision" not in row:
        print(f"[{index}/{total}] {row['kind']} {row['scenario']} seed {row['seed']}: "
              f"INFRASTRUCTURE {row['infrastructure']}", flush=True)  # fmt: skip
        return
    estimate = "-" if row.get("estimate") is None else f"{row['estimate']:.3f}"
    print(
        f"[{index}/{total}] {row['kind']:>10} {row['scenario']:>5} seed {row['seed']:>4}: "
        f"{row['verdict']:>13} {row['decision']!s:>11} samples {row['samples']!s:>4} "
        f"judged {row['elapsed_s']!s:>6} s (wall {row['wall_s']:.1f} s) est {estimate} "
        f"load {load['arrivals']} arr {load['failed']} failed {load['dropped']} dropped "
        f"(load1 {row['load1']:.2f})" + (f" | {row['infrastructure']}" if "infrastructure" in row else ""),
        flush=True,
    )  # fmt: skip


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    decided = [r for r in rows if r["verdict"] in ("regression", "no_regression")]
    summary: dict[str, Any] = {
        "runs": len(rows),
        "verdicts": counts,
        "decisions": {
            d: sum(r.get("decision") == d for r in rows)
            for d in sorted({str(r.get("decision")) for r in rows})
        },
        "load_failed": sum(r["load"]["failed"] for r in rows),
    }
    if decided:
        summary["samples_median"] = statistics.median(r["samples"] for r in decided)
        summary["seconds_median"] = round(statistics.median(r["elapsed_s"] for r in decided), 1)
    estimates = [r["estimate"] for r in rows if r.get("estimate") is not None]
    if estimates:
        summary["estimate_median"] = round(statistics.median(estimates), 4)
    judged = [r for r in rows if r["verdict"] != "infrastructure"]
    if judged:
        summary["samples_median_all"] = statistics.median(r["samples"] or 0 for r in judged)
        summary["seconds_median_all"] = round(
            statistics.median(r["elapsed_s"] or 0 for r in judged), 1
        )
    return summary


def report(results: dict[str, Any]) -> None:
    print()
    print("verdicts per scenario (decided: regression or no_regression; medians over those)")
    print(
        f"{'scenario':>9} {'runs':>4} {'regr':>4} {'no_regr':>7} {'inconcl':>7} {'undec':>5} "
        f"{'infra':>5}  {'samples':>7} {'s to verdict':>12}  {'all: samples':>12} {'s':>6} "
        f"{'estimate':>8}"
    )
    for name, found in results["summary"].items():
        v = found["verdicts"]
        print(
            f"{name:>9} {found['runs']:>4} {v['regression']:>4} {v['no_regression']:>7} "
            f"{v['inconclusive']:>7} {v['undecided']:>5} {v['infrastructure']:>5}  "
            f"{found.get('samples_median', '-')!s:>7} {found.get('seconds_median', '-')!s:>12}  "
            f"{found.get('samples_median_all', '-')!s:>12} {found.get('seconds_median_all', '-')!s:>6} "
            f"{found.get('estimate_median', '-')!s:>8}"
        )  # fmt: skip
    null = results["null"]
    print(
        f"\nnull runs: {null['runs']}; false alarms (verdict regression): {null['false_alarms']}; "
        f"rolled back: {null['rolled_back']}; promoted/kept or inconclusive, never rolled "
        f"back: {null['never_rolled_back']} of {null['runs']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--null-runs", type=int, default=40, help="candidate = control runs")
    parser.add_argument(
        "--regressions", default="3,5,8,15", help="percent slower (X, or X@B from batch B on)"
    )
    parser.add_argument("--seeds", type=int, default=3, help="runs per regression size")
    parser.add_argument("--null-max-duration", default="60s", help="canary --max-duration")
    parser.add_argument("--max-duration", default="120s", help="the regression runs' one")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    opts = parser.parse_args()
    sizes = [scenario(s) for s in opts.regressions.split(",") if s]
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        raise SystemExit("needs root and openssh-server (it starts sshd and creates a user)")
    base = Path(tempfile.mkdtemp(prefix="deployctl-bench-canary-", dir="/tmp"))
    uptime_before = uptime()
    print(f"before: {uptime_before}", flush=True)
    began = time.monotonic()
    lab = start_lab(base, [HOST])
    rows: list[dict[str, Any]] = []
    total = opts.null_runs + len(sizes) * opts.seeds
    try:
        home, work = base / "client-home", base / "work"
        home.mkdir()
        work.mkdir()
        cli = CLI(work, home)
        lab.hosts[HOST].reset()
        inv, port = canary_fleet(lab, base, {})
        code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
        if code != 0:
            raise SystemExit(f"launch exited {code}: {err[-1500:]}")
        control = inv.read_text()
        print(f"fleet launched ({time.monotonic() - began:.0f} s)", flush=True)
        new = lab.hosts[HOST].home / "model-new" / "standin.json"
        for seed in range(1, opts.null_runs + 1):
            row = one_run(
                cli, inv, lab, port, "null", "0", seed,
                ["--restart", "--max-duration", opts.null_max_duration],
            )  # fmt: skip
            row["restore"] = restore(cli, inv, control)
            rows.append(row)
            print_row(len(rows), total, row)
        for name, factor, batch in sizes:
            new.write_text(
                json.dumps({**KNOBS, "slowdown": {"factor": factor, "min_batch": batch}})
            )
            sh("chown", f"{lab.hosts[HOST].user}:{lab.hosts[HOST].user}", new)
            for seed in range(1001, 1001 + opts.seeds):
                to_new_model(inv, lab)
                row = one_run(
                    cli, inv, lab, port, "regression", name, seed,
                    ["--max-duration", opts.max_duration],
                )  # fmt: skip
                row.update(factor=factor, min_batch=batch)
                row["restore"] = restore(cli, inv, control)
                rows.append(row)
                print_row(len(rows), total, row)
        cli("stop", "-i", str(inv), timeout=180)
    finally:
        stop_lab(lab)
        wall = time.monotonic() - began
        uptime_after = uptime()
        nulls = [r for r in rows if r["kind"] == "null"]
        results: dict[str, Any] = {
            "command": "python benchmarks/canary_lab.py " + " ".join(sys.argv[1:]),
            "setup": {
                "knobs": KNOBS,
                "load": "PoissonLoad 28/s, 64 tokens, max_in_flight 96 (tests/test_canary_lab.py)",
                "router": "sglang-router 0.3.2, round_robin",
                "canary": " ".join(CANARY_ARGS) + " --timeout 60",
                "null": f"--restart --max-duration {opts.null_max_duration}",
                "regression": f"model-new, slowdown knob, --max-duration {opts.max_duration}",
                "judge": "itl, max_regression 5 %, confidence 0.95, min_samples 20 (defaults)",
            },
            "cpu_count": os.cpu_count(),
            "uptime_before": uptime_before,
            "uptime_after": uptime_after,
            "wall_s": round(wall, 1),
            "null": {
                "runs": len(nulls),
                "planned": opts.null_runs,
                "false_alarms": sum(r["verdict"] == "regression" for r in nulls),
                "rolled_back": sum(r.get("decision") == "rolled back" for r in nulls),
                "never_rolled_back": sum(r.get("decision") in ("promoted", "kept") for r in nulls),
            },
            "summary": {},
            "runs": rows,
        }
        if nulls:
            results["summary"]["null"] = summarise(nulls)
        for name, _, _ in sizes:
            mine = [r for r in rows if r["kind"] == "regression" and r["scenario"] == name]
            if mine:
                results["summary"][f"{name}%"] = summarise(mine)
        opts.output.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        report(results)
        print(f"\nload before: {uptime_before}\nload after:  {uptime_after}")
        print(f"{os.cpu_count()} CPUs, {wall:.0f} s in all; wrote {opts.output}")


if __name__ == "__main__":
    main()
