"""What `deployctl tune`'s bisection saves against a full sweep, and how stable its T is.

Starts one real sshd test host (tests.sshd_hosts.start_lab; needs root and openssh-server)
with its own copy of the real SGLang 0.5.23 wheel (tests.sglang_wheel: patch mode, so tune
applies the shipped spec-disable set for T) and the stand-in server, whose decode model
gives analytic curves (tests/test_tune.py: `model_for(cross)` puts the crossover at `cross`,
`crossover(model)` computes it back). For each model (cross 6.5 with levels 1,4,16 and 24.5
with 1,4,16,32):

  tune    `deployctl tune --json` --runs times (default 5): the process's wall time and the
          record's wall_s, levels_measured (every level benched, all three phases, repeats
          included), the baseline and speculative levels of the search alone, launches,
          refined_levels, T, outcome and held
  sweep   once, between the tune runs: `deployctl launch --replace` of the baseline, then
          `deployctl bench --concurrency 1,2,...,top` on it, the same for eagle3 (no
          threshold); the four processes' wall times, and the T the sweep itself gives
          (`bench --suggest-threshold`'s rule: the last level before speculation first
          stops beating the baseline, one sample each)

Every run uses the lab test's settings (tests/test_tune.py SCALE and OUTPUT_LEN: the model
near 24 runs 3 times slower with 30-token answers): --input-len 8 --requests-per-stream 2,
launch --timeout 60. Before the first tune the baseline is launched once, untimed, so every
measured tune starts with a server to replace. The first tune applies the patch set; later
ones find it applied.

Run: python benchmarks/tune.py [--runs 5] [--models 6.5,24.5]. JSON (each tune record whole)
goes to benchmarks/results/tune.json (git-ignored). The client, the sshd host and the
stand-in share this machine's CPUs: the load (uptime) is printed and stored with each step.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.sglang_wheel import build_template, install_on  # noqa: E402
from tests.sshd_hosts import STANDIN, SSHLab, TestHost, start_lab, stop_lab  # noqa: E402
from tests.test_lifecycle import prepare  # noqa: E402
from tests.test_tune import OUTPUT_LEN, SCALE, crossover, model_for  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HOST = "tunebench"
# The coarse levels tune starts from, per analytic crossover (the brief's and the lab test's).
MODELS: dict[float, list[int]] = {6.5: [1, 4, 16], 24.5: [1, 4, 16, 32]}


def load_args(cross: float) -> list[str]:
    """The lab test's load for the model: its output length (tests/test_tune.py)."""
    return [
        "--input-len",
        "8",
        "--output-len",
        str(OUTPUT_LEN[cross]),
        "--requests-per-stream",
        "2",
    ]


SPECULATIVE_TEMPLATE = "eagle3"  # what tune picks when the deployment's template is baseline


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


@dataclass
class Client:
    """`python -m deployctl` as a user runs it, with a HOME and working folder of its own."""

    home: Path
    work: Path
    logs: Path
    host: TestHost  # the one test host, whose kept bench files are read directly

    def run(self, name: str, *args: str, timeout: float = 1800) -> tuple[int, Any, float]:
        """Run one command with --json; return its exit code, document (None: none) and wall s."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPLOYCTL_", "SSH_AUTH"))}
        env.update(HOME=str(self.home), PYTHONPATH=str(REPO), COLUMNS="200")
        began = time.monotonic()
        with (self.logs / f"{name}.err").open("w") as err:
            done = subprocess.run(
                [sys.executable, "-m", "deployctl", *args, "--json"],
                cwd=self.work, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                timeout=timeout,
            )  # fmt: skip
        wall = time.monotonic() - began
        try:
            document = json.loads(done.stdout)
        except ValueError:
            document = None
        return done.returncode, document, wall

    def stderr_tail(self, name: str) -> str:
        return (self.logs / f"{name}.err").read_text()[-1500:]


def inventory(lab: SSHLab, host: TestHost, base: Path, cross: float, fixed: dict[str, Any]) -> Path:
    """The stand-in with `model_for(cross)`'s knobs, on the host's one port and venv."""
    model = model_for(cross, SCALE[cross])
    variables = {**prepare(host, tp=1, **model), "template": "baseline", **fixed}
    return lab.inventory(base / f"inv-{cross}.yml", [HOST], {HOST: variables})


def benched(host: TestHost, since: float, until: float) -> dict[str, float]:
    """The levels of the bench sweeps kept on the host between two times, and their load
    seconds (each level's duration_s): what was measured, whatever a record says."""
    levels, seconds = 0, 0.0
    for path in (host.home / ".deployctl" / "runs").glob("*.bench/*.json"):
        document = json.loads(path.read_text())
        if since <= document["at"] <= until:
            levels += len(document["levels"])
            seconds += sum(level["duration_s"] for level in document["levels"])
    return {"levels": levels, "load_s": seconds}


def tune_once(client: Client, inv: Path, cross: float, index: int) -> dict[str, Any]:
    levels = ",".join(map(str, MODELS[cross]))
    name = f"tune-{cross}-{index}"
    load, since = loadavg(), time.time()
    code, document, wall = client.run(
        name, "tune", "-i", str(inv), "--concurrency", levels, "--threshold-mode", "patch",
        "--timeout", "60", *load_args(cross),
    )  # fmt: skip
    entry = (document or {}).get("hosts", {}).get(HOST)
    on_host = benched(client.host, since, time.time())
    row: dict[str, Any] = {
        "run": index, "exit": code, "wall_s": wall, "load1": load,
        "benched_levels": on_host["levels"], "load_s": on_host["load_s"],
    }  # fmt: skip
    if not isinstance(entry, dict) or "threshold" not in entry:
        row["error"] = client.stderr_tail(name)
        print(f"  tune #{index}: exit {code}, no record: {row['error']}", flush=True)
        return row
    # From the verdicts (the search's own samples), not the phases: tune as of d758f3b kept
    # only a phase's last launch in its record, and levels_measured with it.
    verdicts = entry["verdicts"].values()
    searching = sum(v["samples"]["baseline"] + v["samples"]["speculative"] for v in verdicts)
    row.update(
        threshold=entry["threshold"],
        outcome=entry["outcome"],
        note=entry["outcome_note"],
        held=entry["held"],
        record_wall_s=entry["wall_s"],
        launches=entry["launches"],
        levels_measured=entry["levels_measured"],
        search_levels=searching,
        distinct_levels=sorted(int(c) for c in entry["verdicts"]),
        refined_levels=entry["refined_levels"],
        record=entry,
    )
    print(
        f"  tune #{index}: T={row['threshold']} {row['outcome']} held={row['held']} "
        f"{wall:.1f} s ({row['load_s']:.1f} s of load), {row['benched_levels']} levels benched "
        f"({row['search_levels']} searching, levels_measured {row['levels_measured']}), "
        f"{row['launches']} launches, refined {row['refined_levels']} (load {load:.2f})",
        flush=True,
    )
    return row


def sweep_threshold(base: list[dict[str, Any]], spec: list[dict[str, Any]]) -> int | None:
    """The last level before speculation first stops beating the baseline (None: never wins)."""
    b = {lv["concurrency"]: lv["output_tokens_per_s"] for lv in base}
    s = {lv["concurrency"]: lv["output_tokens_per_s"] for lv in spec}
    threshold = None
    for c in sorted(set(b) & set(s)):
        if s[c] <= b[c]:
            break
        threshold = c
    return threshold


def full_sweep(client: Client, inv: Path, cross: float) -> dict[str, Any]:
    """Launch each server and bench every integer level from 1 to the top one on it."""
    top = max(MODELS[cross])
    every = ",".join(str(c) for c in range(1, top + 1))
    steps: dict[str, float] = {}
    levels: dict[str, list[dict[str, Any]]] = {}
    load = loadavg()
    for phase, template in (("baseline", "baseline"), ("speculative", SPECULATIVE_TEMPLATE)):
        name = f"sweep-{cross}-{phase}"
        code, document, wall = client.run(
            f"{name}-launch", "launch", "-i", str(inv), "--template", template, "--replace",
            "--timeout", "60",
        )  # fmt: skip
        steps[f"{phase}_launch_s"] = wall
        if code != 0:
            raise SystemExit(
                f"{name}: launch exited {code}: {client.stderr_tail(name + '-launch')}"
            )
        code, document, wall = client.run(
            f"{name}-bench", "bench", "-i", str(inv), "--concurrency", every, *load_args(cross)
        )
        steps[f"{phase}_bench_s"] = wall
        entry = (document or {}).get("hosts", {}).get(HOST) or {}
        if code != 0 or "levels" not in entry:
            raise SystemExit(f"{name}: bench exited {code}: {client.stderr_tail(name + '-bench')}")
        levels[phase] = entry["levels"]
    failed = sum(lv["failed"] for phase in levels.values() for lv in phase)
    load_s = sum(lv["duration_s"] for phase in levels.values() for lv in phase)
    row = {
        "top": top,
        "levels": 2 * top,
        "launches": 2,
        "wall_s": sum(steps.values()),
        "load_s": load_s,
        **steps,
        "failed_requests": failed,
        "threshold": sweep_threshold(levels["baseline"], levels["speculative"]),
        "load1": load,
        "tok_s": {
            phase: {lv["concurrency"]: lv["output_tokens_per_s"] for lv in found}
            for phase, found in levels.items()
        },
    }
    print(
        f"  sweep 1..{top}: {row['wall_s']:.1f} s ({load_s:.1f} s of load, {row['levels']} "
        f"levels, launches "
        f"{steps['baseline_launch_s']:.1f} + {steps['speculative_launch_s']:.1f} s), "
        f"its T={row['threshold']}, {failed} failed requests (load {load:.2f})",
        flush=True,
    )
    return row


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def report(models: dict[float, dict[str, Any]]) -> None:
    print()
    print("tune against a full sweep of every level on both servers (tune: medians of its runs)")
    print(
        f"{'cross':>5} {'levels':>10} {'tune s':>7} {'(min-max)':>13} {'sweep s':>7} "
        f"{'s ratio':>7} {'tune ld':>7} {'swp ld':>6} {'benched':>7} {'search':>6} "
        f"{'record':>6} {'sweep':>5} "
        f"{'lv ratio':>8} {'search/sweep':>12} {'launches':>8}"
    )
    for cross, found in models.items():
        runs = [r for r in found["tunes"] if "threshold" in r]
        sweep = found["sweep"]
        if not runs:
            print(f"{cross:>5} no tune record")
            continue
        wall = summary([r["wall_s"] for r in runs])
        benched = statistics.median(r["benched_levels"] for r in runs)
        searching = statistics.median(r["search_levels"] for r in runs)
        recorded = statistics.median(r["levels_measured"] for r in runs)
        launches = statistics.median(r["launches"] for r in runs)
        load_s = statistics.median(r["load_s"] for r in runs)
        ratios = found["ratios"] = {
            "wall": wall["median"] / sweep["wall_s"],
            "load": load_s / sweep["load_s"],
            "levels": benched / sweep["levels"],
            "search_levels": searching / sweep["levels"],
        }
        levels = ",".join(map(str, MODELS[cross]))
        span = f"({wall['min']:.1f}-{wall['max']:.1f})"
        print(
            f"{cross:>5} {levels:>10} {wall['median']:7.1f} {span:>13} {sweep['wall_s']:7.1f} "
            f"{ratios['wall']:7.2f} {load_s:7.1f} {sweep['load_s']:6.1f} {benched:7g} "
            f"{searching:6g} {recorded:6g} {sweep['levels']:5} "
            f"{ratios['levels']:8.2f} {ratios['search_levels']:12.2f} {launches:4g} / 2"
        )
    print()
    print("T over the tune runs against the analytic crossover")
    print(f"{'cross':>5} {'sweep T':>7} {'T min':>5} {'median':>6} {'max':>5}  each T (T - cross)")
    for cross, found in models.items():
        ts = [r["threshold"] for r in found["tunes"] if r.get("threshold") is not None]
        each = ", ".join(
            f"{r.get('threshold')} ({r['threshold'] - cross:+.1f})"
            if r.get("threshold") is not None
            else f"{r.get('threshold', 'failed')}"
            for r in found["tunes"]
        )
        if ts:
            found["T"] = summary([float(t) for t in ts])
            t = found["T"]
            print(
                f"{cross:>5} {found['sweep']['threshold']!s:>7} {t['min']:5g} {t['median']:6g} "
                f"{t['max']:5g}  {each}"
            )
        else:
            print(f"{cross:>5} {found['sweep']['threshold']!s:>7} no T: {each}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="tune runs per model")
    parser.add_argument(
        "--models", default="6.5,24.5", help=f"analytic crossovers, of {sorted(MODELS)}"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "tune.json")
    opts = parser.parse_args()
    crosses = [float(c) for c in opts.models.split(",")]
    if unknown := [c for c in crosses if c not in MODELS]:
        raise SystemExit(f"no levels for crossover {unknown}: pick from {sorted(MODELS)}")
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        raise SystemExit("needs root and openssh-server (it starts sshd and creates a user)")
    base = Path(tempfile.mkdtemp(prefix="deployctl-bench-tune-", dir="/tmp"))
    uptime_before = uptime()
    print(f"before: {uptime_before}", flush=True)
    lab = start_lab(base, [HOST])
    models: dict[float, dict[str, Any]] = {}
    began = time.monotonic()
    try:
        host = lab.hosts[HOST]
        client = Client(base / "client-home", base / "work", base / "stderr", host)
        for folder in (client.home, client.work, client.logs):
            folder.mkdir()
        python = install_on(host, build_template(base), standin=STANDIN)
        # One port and venv for every model: a tune replaces whatever the last one left.
        fixed = {"python": python, "port": prepare(host, tp=1)["port"]}
        first = inventory(lab, host, base, crosses[0], fixed)
        code, _, _ = client.run("warm-up", "launch", "-i", str(first), "--template", "baseline")
        if code != 0:
            raise SystemExit(f"warm-up launch exited {code}: {client.stderr_tail('warm-up')}")
        for cross in crosses:
            inv = inventory(lab, host, base, cross, fixed)
            analytic = crossover(model_for(cross))
            print(f"model crossing at {analytic:g} (levels {MODELS[cross]})", flush=True)
            found: dict[str, Any] = {"crossover": analytic, "levels": MODELS[cross], "tunes": []}
            models[cross] = found
            for index in range(1, opts.runs + 1):
                found["tunes"].append(tune_once(client, inv, cross, index))
                if index == (opts.runs + 1) // 2:
                    found["sweep"] = full_sweep(client, inv, cross)
        client.run("stop", "stop", "-i", str(first))
    finally:
        stop_lab(lab)
    uptime_after = uptime()
    report(models)
    print(f"\nload before: {uptime_before}\nload after:  {uptime_after}")
    print(f"{os.cpu_count()} CPUs, {time.monotonic() - began:.0f} s in all")
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(
        json.dumps(
            {
                "runs": opts.runs,
                "load": {str(c): load_args(c) for c in crosses},
                "cpu_count": os.cpu_count(),
                "uptime_before": uptime_before,
                "uptime_after": uptime_after,
                "models": {str(c): found for c, found in models.items()},
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {opts.output}")


if __name__ == "__main__":
    main()
