"""Bench: load sweeps against a deployment from its own host, kept results, comparisons
and the `--threshold` the numbers suggest."""

from __future__ import annotations

import getpass
import math
import socket
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from deployctl import __version__, agent
from deployctl import events as ev
from deployctl.choices import BenchTool
from deployctl.connection import Connection
from deployctl.deployments import node_rank
from deployctl.errors import DeployctlError, UsageError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet, FleetResult
from deployctl.inventory import Host
from deployctl.launchers import launcher_of
from deployctl.ops.runs import recorded_run
from deployctl.patchset import speculates
from deployctl.remote.measures import (
    BenchArgs,
    BenchLevel,
    BenchResultsArgs,
    BenchResultsReply,
    BenchSaveArgs,
)
from deployctl.shell import split


@dataclass(frozen=True)
class BenchPlan:
    """What one sweep does at each level."""

    concurrency: list[int]
    input_len: int = 512
    output_len: int = 128
    per_stream: int = 4  # requests per level: this many per concurrent stream
    level_timeout: float = 900
    tool: BenchTool = BenchTool.BUILTIN
    warmup: bool = False  # a warm-up at each level's concurrency before its samples
    warmed: frozenset[int] = frozenset()  # levels this server has been warmed up at: skipped
    client_processes: int = 0  # builtin: the processes a level's streams are spread over; 0: auto

    def prompts_for(self, concurrency: int) -> int:
        return self.per_stream * concurrency

    def warms(self, concurrency: int) -> bool:
        return self.warmup and concurrency not in self.warmed


# The most streams one level may open: each is a thread of the benchmark on the host.
MAX_CONCURRENCY = 4096


def parse_levels(text: str) -> list[int]:
    """`1,4,16,64` → [1, 4, 16, 64]; anything else is a usage error."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or any(level < 1 for level in levels):
        raise UsageError(
            f"--concurrency {text!r} is not a list of positive numbers", hint="e.g. 1,4,16,64"
        )
    if max(levels) > MAX_CONCURRENCY:
        raise UsageError(
            f"--concurrency {max(levels)} is more streams than one benchmark opens "
            f"(at most {MAX_CONCURRENCY})",
            hint="e.g. 1,4,16,64",
        )
    return levels


def per_token_ms(level: Mapping[str, Any]) -> float | None:
    """Time per output token after the first, in ms, from the level's p50 end-to-end and
    first-token times: comparable across servers, where ITL is per streamed chunk (a
    speculative server sends several tokens in one)."""
    e2e = (level.get("e2e_ms") or {}).get("p50")
    ttft = (level.get("ttft_ms") or {}).get("p50")
    per_request = level.get("output_tokens", 0) / max(1, level.get("completed", 0))
    if e2e is None or ttft is None or per_request <= 1:
        return None
    return float(e2e - ttft) / float(per_request - 1)


# Student's t at 0.975 (a two-sided 95 % interval) for 1 … 30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """Student's t quantile at 0.975 (past 30 degrees of freedom, within 0.002 of it)."""
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def spread_of(rounds: Sequence[float]) -> float | None:
    """The half-width of a 95 % confidence interval of the rounds' mean, as a fraction of
    it; None with fewer than two rounds (one round says nothing of the next)."""
    if len(rounds) < 2:
        return None
    mean = statistics.fmean(rounds)
    if mean <= 0:
        return None
    return t975(len(rounds) - 1) * statistics.stdev(rounds) / math.sqrt(len(rounds)) / mean


def drift_of(rounds: Sequence[float]) -> float | None:
    """The mean of the rounds' second half less their first half's, as a fraction of their
    mean (an odd middle round is in neither); None with fewer than two rounds."""
    half = len(rounds) // 2
    if not half:
        return None
    mean = statistics.fmean(rounds)
    if mean <= 0:
        return None
    return (statistics.fmean(rounds[-half:]) - statistics.fmean(rounds[:half])) / mean


def drifting(spread: float | None, drift: float | None) -> bool:
    """Whether the rounds still move: their halves differ by more than the spread."""
    return spread is not None and drift is not None and abs(drift) > spread


def round_figures(
    rounds: Sequence[float], first: float | None, middle: float
) -> dict[str, float | bool | None]:
    """What a level's rounds and its warm-up say: the rounds' spread and drift, and how far
    the warm-up's first sample (`first`) was from the level's throughput (`middle`)."""
    spread, drift = spread_of(rounds), drift_of(rounds)
    return {
        "first_sample_bias": first / middle - 1 if first is not None and middle > 0 else None,
        "spread": spread,
        "drift": drift,
        "drifting": drifting(spread, drift),
    }


def with_figures(level: BenchLevel) -> BenchLevel:
    """The level with what its rounds and its warm-up say (`round_figures`)."""
    rounds = level.get("rounds_tokens_per_s", [])
    first = level.get("first_sample_tokens_per_s")
    return cast(BenchLevel, {**level, **round_figures(rounds, first, level["output_tokens_per_s"])})


@dataclass
class BenchResult:
    """One deployment's sweep, as kept on its host."""

    document: dict[str, Any]
    saved: str

    @property
    def levels(self) -> list[BenchLevel]:
        levels: list[BenchLevel] = self.document["levels"]
        return levels

    @property
    def ok(self) -> bool:
        return all(level["failed"] == 0 for level in self.levels)


def run_bench(
    host: Host,
    conn: Connection,
    plan: BenchPlan,
    events: EventSink = DISCARD,
    stop: Callable[[], bool] = lambda: False,
) -> BenchResult | None:
    """Sweep the deployment's current run; None for a node that serves no API (rank > 0).
    `stop` is asked before each level: once it says so, the levels done are kept and the
    sweep ends."""
    if node_rank(host) != 0:
        return None
    state_dir = host.settings.state_dir
    status = recorded_run(host, conn)
    run = status["run"]
    if run is None or not status["alive"] or status["health"] != 200:
        state = "no run" if run is None else "not ready" if status["alive"] else "not running"
        raise DeployctlError(
            f"{host.label}: {state} to bench", hint=f"deployctl launch -H {host.name} first"
        )
    began = time.monotonic()
    levels: list[BenchLevel] = []
    for concurrency in plan.concurrency:
        if stop():
            break
        elapsed = time.monotonic() - began
        events.emit(
            ev.BenchLevelStarted(target=host.label, elapsed=elapsed, concurrency=concurrency)
        )
        level_args: BenchArgs = {
            # A Slurm job serves on its head node: the load goes there from the login node.
            "bind_host": launcher_of(run).answers_at(run, status["placement"]),
            "port": run["port"],
            "concurrency": concurrency,
            "prompts": plan.prompts_for(concurrency),
            "input_len": plan.input_len,
            "output_len": plan.output_len,
            "flush": True,
            "timeout": plan.level_timeout,
            "tool": plan.tool,
            "env": run.get("env", {}),
            "warmup": plan.warms(concurrency),
            "client_processes": plan.client_processes,
        }
        limit = max(conn.command_timeout, plan.level_timeout + 30)
        if plan.warms(concurrency):  # the warm-up's time too: a level's again at most
            limit += plan.level_timeout
        level = with_figures(agent.call(host, conn, agent.BENCH, level_args, timeout=limit))
        levels.append(level)
        events.emit(
            ev.BenchLevelDone(
                target=host.label,
                elapsed=time.monotonic() - began,
                concurrency=concurrency,
                output_tokens_per_s=level["output_tokens_per_s"],
                failed=level["failed"],
            )
        )
    document: dict[str, Any] = {
        "run": run["id"],
        "deployment": host.deployment,
        "template": run["template"],
        "threshold": run["threshold"],
        "patches": run["patches"],
        "env": run.get("env", {}),
        "command": run["command"],
        "deployctl_version": __version__,
        "by": f"{getpass.getuser()}@{socket.gethostname()}",
        "at": time.time(),
        "params": {
            "tool": plan.tool,
            "input_len": plan.input_len,
            "output_len": plan.output_len,
            "concurrency": plan.concurrency,
            "prompts": [plan.prompts_for(c) for c in plan.concurrency],
            "warmup": plan.warmup,
        },
        "levels": levels,
    }
    save: BenchSaveArgs = {"state_dir": state_dir, "run": run["id"], "result": document}
    saved = agent.call(host, conn, agent.BENCH_SAVE, save)["path"]
    return BenchResult(document, saved)


@dataclass
class Comparison:
    """Kept sweeps of the named runs, side by side (each run's sweeps merged, the newest
    measurement of each level)."""

    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run id → its document
    missing: list[str] = field(default_factory=list)
    failed: dict[str, BaseException] = field(default_factory=dict)
    unreadable: dict[str, list[str]] = field(default_factory=dict)  # host → kept files skipped

    @property
    def ok(self) -> bool:
        return not self.missing and not self.failed


# What makes two sweeps' levels comparable: the same load shape from the same tool.
SWEEP_SHAPE = ("tool", "input_len", "output_len")


def merged_sweeps(kept: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A run's kept sweeps (oldest first) as one: the newest sweep, with each level only an
    older sweep of the same load shape measured added (tune measures a level again on its
    own; a sweep of one level must not hide the run's others)."""
    newest = kept[-1]
    shape = {k: newest.get("params", {}).get(k) for k in SWEEP_SHAPE}
    levels = {lv["concurrency"]: lv for lv in newest["levels"]}
    for older in reversed(kept[:-1]):
        if {k: older.get("params", {}).get(k) for k in SWEEP_SHAPE} == shape:
            for level in older["levels"]:
                levels.setdefault(level["concurrency"], level)
    return {**newest, "levels": [levels[c] for c in sorted(levels)]}


def find_results(fleet: Fleet, run_ids: Sequence[str]) -> Comparison:
    """Look for the runs' kept sweeps on every selected deployment's host."""

    def lookup(host: Host, conn: Connection) -> BenchResultsReply:
        args: BenchResultsArgs = {"state_dir": host.settings.state_dir, "runs": list(run_ids)}
        return agent.call(host, conn, agent.BENCH_RESULTS, args)

    found = fleet.run(lookup, list({h.name: h for h in fleet.hosts}.values()))
    comparison = Comparison(failed=found.failed)
    comparison.unreadable = {
        n: r["unreadable"] for n, r in found.succeeded.items() if r["unreadable"]
    }
    for reply in found.succeeded.values():
        for run_id, kept in reply["results"].items():
            if kept and run_id not in comparison.runs:
                comparison.runs[run_id] = merged_sweeps(kept)
    comparison.missing = [r for r in run_ids if r not in comparison.runs]
    comparison.runs = {r: comparison.runs[r] for r in run_ids if r in comparison.runs}
    return comparison


@dataclass
class Suggestion:
    """The largest concurrency at which speculation still wins, the threshold it gives, and
    what the two sweeps cannot show."""

    baseline: str
    speculative: str
    rows: list[tuple[int, float, float]]  # concurrency, baseline tok/s, speculative tok/s
    threshold: int | None  # None: speculation never wins
    # The crossover lies between the last level speculation wins at (None: none) and the first
    # it does not win at (None: it wins at every level measured).
    between: tuple[int | None, int | None] = (None, None)
    wins_after_loss: list[int] = field(default_factory=list)  # past the first loss: unusable
    # The speculative run's own --threshold: above it its curve is the baseline's.
    speculative_threshold: int | None = None
    baseline_speculates: bool = False  # the "baseline" run's command has --speculative-algorithm

    @property
    def ok(self) -> bool:
        return True

    def measured(self, concurrency: int) -> bool:
        """Whether the speculative run speculated at this level."""
        return self.speculative_threshold is None or concurrency <= self.speculative_threshold

    @property
    def unmeasured(self) -> list[int]:
        """Shared levels above the speculative run's own threshold."""
        return [c for c, _, _ in self.rows if not self.measured(c)]

    @property
    def crossover_unresolved(self) -> bool:
        """Whether levels between the last win and the first loss were not measured."""
        last_win, first_loss = self.between
        return first_loss is not None and first_loss - (last_win or 0) > 1


def suggest_threshold(comparison: Comparison, baseline: str, speculative: str) -> Suggestion:
    """Compare output throughput level by level: speculation pays up to the largest
    concurrency where it still beats the baseline (and at every level below it)."""
    if comparison.missing:
        raise DeployctlError(
            f"no kept bench results for {', '.join(comparison.missing)}",
            hint="run deployctl bench on each run first (see deployctl status for run ids)",
        )
    base_doc, spec_doc = comparison.runs[baseline], comparison.runs[speculative]
    base = _throughputs(base_doc)
    spec = _throughputs(spec_doc)
    shared = sorted(set(base) & set(spec))
    if not shared:
        raise DeployctlError(
            f"{baseline} and {speculative} share no concurrency level",
            hint="bench both with the same --concurrency",
        )
    rows = [(c, base[c], spec[c]) for c in shared]
    own_threshold: int | None = spec_doc.get("threshold")
    measured = [r for r in rows if own_threshold is None or r[0] <= own_threshold]
    if not measured:
        raise DeployctlError(
            f"{speculative} ran with --threshold {own_threshold}: no level both runs share "
            f"is at or below it, so none measured speculation",
            hint="bench a speculative run launched without --threshold, or add lower levels",
        )
    first_loss = next((c for c, b, s in measured if s <= b), None)  # a tie is not a win
    before = [c for c, _, _ in measured if first_loss is None or c < first_loss]
    threshold = before[-1] if before else None
    return Suggestion(
        baseline,
        speculative,
        rows,
        threshold,
        between=(threshold, first_loss),
        wins_after_loss=[
            c for c, b, s in measured if first_loss is not None and c > first_loss and s > b
        ],
        speculative_threshold=own_threshold,
        baseline_speculates=_speculates(base_doc),
    )


def _speculates(document: Mapping[str, Any]) -> bool:
    command = document.get("command") or ""
    try:
        argv = split(command)
    except ValueError:  # an unbalanced quote in a masked display copy
        argv = command.split()
    return speculates(argv)


def _throughputs(document: Mapping[str, Any]) -> dict[int, float]:
    return {lv["concurrency"]: lv["output_tokens_per_s"] for lv in document["levels"]}


def bench_fleet(
    fleet: Fleet, plan: BenchPlan, events: EventSink = DISCARD
) -> FleetResult[BenchResult | None]:
    return fleet.run(lambda host, conn: run_bench(host, conn, plan, events))
