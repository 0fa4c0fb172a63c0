"""Tune: measure a deployment as baseline and as unthrottled speculative, find the largest
concurrency at which speculation still pays, relaunch it with that `--threshold`, check that
the tuned server holds the better of both curves at every level, and leave it serving.

The search is pure (`Search`, `judge`): it decides which levels each phase's server must
measure next. `Tuner` drives one deployment through its phases with the shared steps (the
replace step to launch, `run_bench` to measure, the patch step for the threshold's set) and
keeps one tune record on the host. Each deployment is tuned in its own thread; Ctrl-C or a
failure puts back the run that was serving before.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from deployctl import agent
from deployctl import events as ev
from deployctl.choices import Keep, ThresholdMode
from deployctl.errors import CommandTimeoutError, ConnectError, DeployctlError, UsageError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet, FleetResult, HostResult, next_backoff
from deployctl.ops.bench import BenchPlan, run_bench
from deployctl.ops.driver import drive
from deployctl.ops.flags import server_argv
from deployctl.ops.kept import Kept
from deployctl.ops.patch import apply_patches
from deployctl.ops.plan import Plan, Role, plan_launch
from deployctl.ops.preflight import client_identity, is_stale
from deployctl.ops.router import router_lock_of
from deployctl.ops.runs import (
    DEFAULT_STOP_TIMEOUT,
    LaunchReport,
    Replacement,
    RunState,
    StopResult,
    recorded_run,
    replace,
    run_status,
    stop_run,
)
from deployctl.ops.runs import Outcome as RunOutcome
from deployctl.ops.serving import Serving, capture, relaunch
from deployctl.ops.tune.search import (
    DEFAULT_MAX_GRAPH_BS,
    Levels,
    Objective,
    Phase,
    Search,
    by_concurrency,
    level_figures,
    median_sample,
    median_tps,
    rounds,
    speculative_graph_sizes,
    tps,
)
from deployctl.patchset import speculates
from deployctl.remote.measures import (
    CrashRecord,
    PhaseRecord,
    TuneParams,
    TuneRecord,
    TuneRecordsArgs,
    TuneSaveArgs,
    Verdict,
)
from deployctl.remote.protocol import ReleaseArgs, TuneLockArgs
from deployctl.text import is_number

if TYPE_CHECKING:
    from deployctl.connection import Connection
    from deployctl.crash import Catalog
    from deployctl.crash.model import CrashReport
    from deployctl.inventory import Host
    from deployctl.patchset import PatchSet
    from deployctl.project import Project
    from deployctl.remote.measures import BenchLevel, LevelFigures
    from deployctl.remote.server_argv import CommandValues

T = TypeVar("T")


class Outcome(StrEnum):
    TUNED = "tuned"  # the tuned server ran every level (`held` says whether it kept up)
    CRASHED = "crashed"  # a phase's server crashed: the best stable one was relaunched
    FAILED = "failed"  # a step failed (a host, a launch, requests): the previous run put back
    INTERRUPTED = "interrupted"  # Ctrl-C: the previous run put back


# ---- driving one deployment --------------------------------------------------------------


@dataclass(frozen=True)
class TuneOptions:
    """What one tune measures and how it decides."""

    levels: list[int]
    input_len: int = 512
    output_len: int = 128
    per_stream: int = 4
    level_timeout: float = 900
    objective: Objective = field(default_factory=Objective)
    keep: Keep = Keep.TUNED
    min_ratio: float = 0.95
    noise: float = 0.03
    repeats: int = 3
    points: int = 3
    warmup: bool = True  # each level warmed up on each server before it is measured
    threshold_mode: ThresholdMode | None = None  # None: each host's `threshold_mode`
    baseline_template: str = "baseline"
    speculative_template: str | None = None  # None: the deployment's, when it speculates
    timeout: float = 900  # seconds for each launch to get ready
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    drain_timeout: float = 60.0  # a worker behind a router finishes its requests first
    max_visits: int = 12  # launches of the two servers, at most, while searching
    reconnect_window: float = 31.0  # seconds a lost host is tried again before giving up

    def __post_init__(self) -> None:
        # A level given twice, or out of order, is one level, measured in order.
        object.__setattr__(self, "levels", sorted(set(self.levels)))

    def bench_plan(self, levels: Sequence[int], warmed: Collection[int] = ()) -> BenchPlan:
        """The sweep of `levels` on a server already warmed up at `warmed`."""
        return BenchPlan(
            list(levels), self.input_len, self.output_len, self.per_stream, self.level_timeout,
            warmup=self.warmup, warmed=frozenset(warmed),
        )  # fmt: skip

    def describe(self) -> TuneParams:
        return {
            "concurrency": self.levels,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "requests_per_stream": self.per_stream,
            "objective": self.objective.describe(),
            "keep": str(self.keep),
            "min_ratio": self.min_ratio,
            "noise": self.noise,
            "repeats": self.repeats,
            "warmup": self.warmup,
        }


@dataclass
class PhaseRun:
    """One phase's server: its run and every level measured on it, in order."""

    phase: Phase
    template: str
    threshold: int | None
    runs: list[str] = field(default_factory=list)  # one per visit (the search returns to it)
    state: str = "not started"  # a RunState value once launched
    measured: list[BenchLevel] = field(default_factory=list)
    sweeps: list[str] = field(default_factory=list)  # kept bench files on the host
    _warmed: dict[str, set[int]] = field(default_factory=dict)  # run → levels warmed up at

    @property
    def run(self) -> str | None:
        """The phase's latest run."""
        return self.runs[-1] if self.runs else None

    def levels(self) -> list[BenchLevel]:
        """One level per concurrency: the median of its samples (as `bench --json` has it)."""
        return [median_sample(s) for s in by_concurrency(self.measured).values()]

    def samples(self) -> dict[int, list[float]]:
        return {c: [tps(s) for s in found] for c, found in by_concurrency(self.measured).items()}

    def figures(self) -> dict[int, LevelFigures]:
        """Each level's warm-up and the spread and drift of all its rounds."""
        return {c: level_figures(found) for c, found in by_concurrency(self.measured).items()}

    def warmed(self) -> set[int]:
        """The levels the phase's current run has been warmed up at."""
        return self._warmed.setdefault(self.run or "", set())


@dataclass
class TuneResult:
    """One deployment's tune: what each phase measured, T, and what is serving now."""

    host: str
    deployment: str | None
    threshold_mode: str
    options: TuneOptions
    phases: dict[Phase, PhaseRun] = field(default_factory=dict)
    search: Search | None = None
    threshold: int | None = None
    speculation: str = ""
    outcome: Outcome = Outcome.FAILED
    note: str = ""
    envelope_ratio: dict[int, float] = field(default_factory=dict)
    capacity: int | None = None  # with a latency bound: the highest tuned level meeting it
    serving: str | None = None
    serving_known: bool = True  # False: the host did not answer when it was last asked
    previous: str | None = None
    crash: CrashReport | None = None
    patches: list[str] = field(default_factory=list)  # sets tune applied for T
    started_at: float = field(default_factory=time.time)
    wall_s: float = 0.0
    launches: int = 0
    record: int | None = None  # the tune record's number on the host
    saved: str | None = None

    @property
    def held(self) -> bool:
        """The tuned server kept up with the better of both curves at every level."""
        ratios = self.envelope_ratio.values()
        return bool(ratios) and min(ratios) >= self.options.min_ratio

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.TUNED and self.held

    @property
    def levels_measured(self) -> int:
        return sum(len(p.measured) for p in self.phases.values())


class Interrupted(Exception):
    """Ctrl-C reached the tune of this deployment at a safe point."""


class PhaseFailed(Exception):
    """A phase's server crashed, died or failed requests (tune falls back; not an error of
    the command)."""

    def __init__(
        self, message: str, crashed: bool = False, crash: CrashReport | None = None
    ) -> None:
        super().__init__(message)
        self.message, self.crashed, self.crash = message, crashed, crash


def envelope_ratios(result: TuneResult) -> dict[int, float]:
    """Each level's tuned throughput (the median of its samples: a level measured again is
    not judged by its last sample) over the better of the two curves there."""
    search = result.search
    assert search is not None
    by_level = by_concurrency(result.phases[Phase.TUNED].measured)
    ratios = {}
    for c, judged in search.judged().items():
        best = max(judged.baseline, judged.speculative)
        if c in by_level and best > 0:
            ratios[c] = median_tps(by_level[c]) / best
    return ratios


def drafting_off(threshold: int | None, level: int) -> bool:
    """Whether the tuned run drafts nothing at this concurrency: above T in either threshold
    mode. A shortfall there is the engine's off path (on SGLang 0.5.17 the speculative
    worker's 1-token verify), which more samples do not cure, so tune does not re-measure it."""
    return threshold is not None and level > threshold


def best_stable(result: TuneResult) -> Phase | None:
    """Of the unthrottled phases that ran without crashing, the one with the higher
    throughput at the highest level both measured (saturation is where a fleet lives)."""
    stable = [
        p
        for p in (Phase.BASELINE, Phase.SPECULATIVE)
        if p in result.phases and result.phases[p].state == RunState.READY
    ]
    if len(stable) < 2 or result.search is None:
        return stable[0] if stable else None
    judged = result.search.judged()
    if not judged:
        return Phase.BASELINE
    top = judged[max(judged)]
    return Phase.SPECULATIVE if top.speculative > top.baseline else Phase.BASELINE


def decode_graph_sizes(values: CommandValues) -> tuple[int, ...] | None:
    """The decode batch sizes a speculative server pads a batch to, from its command: its
    --cuda-graph-bs-decode list, else SGLang's sizes up to --cuda-graph-max-bs-decode; None
    without CUDA graphs or their padding (every batch size is its own then)."""
    if any(values.has(d) for d in ("disable_cuda_graph", "disable_cuda_graph_padding")):
        return None
    given = values.last("cuda_graph_bs_decode")
    if given is not None and given.values and all(v.isdecimal() for v in given.values):
        return tuple(sorted({int(v) for v in given.values}))
    most = str(values.get("cuda_graph_max_bs_decode") or "")
    return tuple(speculative_graph_sizes(int(most) if is_number(most) else DEFAULT_MAX_GRAPH_BS))


class Tuner:
    """Tune one deployment (a single-node server) through its phases."""

    def __init__(
        self,
        fleet: Fleet,
        host: Host,
        plans: Mapping[Phase, Plan],
        tuned_plan: Callable[[int | None, bool], Plan],
        catalog: Catalog,
        patch_sets: Mapping[str, PatchSet],
        options: TuneOptions,
        events: EventSink,
        cancel: threading.Event,
    ) -> None:
        self.fleet, self.host, self.plans = fleet, host, plans
        self.tuned_plan, self.patch_sets = tuned_plan, patch_sets
        self.catalog, self.options, self.events, self.cancel = catalog, options, events, cancel
        self.began = time.monotonic()
        self.level_seconds: list[float] = []
        self.launch_seconds: list[float] = []
        self.current: str | None = None  # the run tune last started
        self.touched = False  # tune stopped, started or patched something on the host
        self.tuning = False  # the tuned phase has begun
        self.search: Search | None = None

    @property
    def conn(self) -> Connection:
        return self.fleet.connection(self.host)

    def run(self) -> TuneResult:
        mode = self.options.threshold_mode or str(self.host.settings.value("threshold_mode"))
        result = TuneResult(self.host.name, self.host.deployment, mode, self.options)
        previous: Serving | None = None
        try:
            previous = self._previous()
            result.previous = previous.run if previous else None
            self._search(result)
            self._tune(result)
            self._keep(result, previous)
        except PhaseFailed as exc:
            result.crash = exc.crash
            result.outcome = Outcome.CRASHED if exc.crashed else Outcome.FAILED
            result.note = exc.message
            if exc.crashed and self.options.keep is not Keep.NONE:
                self._fall_back(result, previous)
            else:
                self._put_back(result, previous)
        except Interrupted:
            result.outcome, result.note = Outcome.INTERRUPTED, "interrupted"
            self._put_back(result, previous)
        except DeployctlError as exc:
            result.outcome, result.note = Outcome.FAILED, exc.message
            self._put_back(result, previous)
        except Exception:  # a bug: what served is still put back, then the bug is reported
            self._put_back(result, previous)
            raise
        if not result.serving_known:
            self._read_serving(result)
        result.wall_s = time.monotonic() - self.began
        self._save(result)
        return result

    def _read_serving(self, result: TuneResult) -> None:
        """After the host stopped answering: once it answers again, say what serves there
        now (what tune last started may still be), so the record can be kept too."""
        try:
            reply = _reconnecting(
                lambda: recorded_run(self.host, self.conn), self.options.reconnect_window
            )
        except DeployctlError as exc:
            result.note += f"; what serves is unknown: {exc.message}"
            return
        run = reply["run"]
        result.serving = run["id"] if run is not None and reply["alive"] else None
        result.serving_known = True
        result.note += f"; the host answered again: {result.serving or 'nothing'} serving"

    def _previous(self) -> Serving | None:
        """The run serving before tune started, captured to be put back."""
        status = run_status(self.host, self.conn, self.catalog)
        if status.run is None or status.state is not RunState.READY:
            return None
        return capture(self.host, status, self.patch_sets)

    # -- the phases ----------------------------------------------------------------------------

    def _search(self, result: TuneResult) -> None:
        options = self.options
        levels = Levels()
        if result.threshold_mode == "adaptive":
            sizes = decode_graph_sizes(self.plans[Phase.SPECULATIVE].values)
            if sizes is not None:  # without graphs or padding every batch size is its own
                levels = Levels(sizes)
        search = Search(
            list(options.levels), levels, options.objective, options.noise, options.repeats,
            options.points,
        )  # fmt: skip
        result.search = self.search = search
        order = [Phase.BASELINE, Phase.SPECULATIVE]
        visits = 0
        up: Phase | None = None
        while True:
            # No launch left: the server that is up measures only what the other one did.
            last = visits >= options.max_visits
            owing = ([up] if up else []) + order
            nxt = next((p for p in owing if search.owed(p, last and p is up)), None)
            if nxt is None:
                break
            if nxt is not up:
                if last:
                    result.note = f"the search stopped at --max-launches {visits}"
                    search.stop()
                    break
                self._launch(result, nxt, self.plans[nxt])
                visits += 1
                up = nxt
            while wanted := search.owed(nxt, visits >= options.max_visits):
                search.add(nxt, self._measure(result, nxt, wanted))
            order = [p for p in order if p is not nxt] + [nxt]  # the other one next
        result.threshold = search.threshold
        result.speculation = search.speculation

    def _tune(self, result: TuneResult) -> None:
        """Relaunch with T (or the one that wins everywhere), measure every level searched,
        and compare each with the better of both."""
        search = result.search
        assert search is not None
        plan = self.tuned_plan(result.threshold, result.speculation != "never")
        self.tuning = True
        if plan.needed_sets:
            self._step(Phase.TUNED, "patching")
            self.touched = True
            actions = apply_patches(self.host, self.conn, plan.needed_sets)
            result.patches = [f"{a.set} {a.version} ({a.action})" for a in actions]
        self._launch(result, Phase.TUNED, plan)
        levels = list(search.planned)
        tuned = result.phases[Phase.TUNED]
        self._measure(result, Phase.TUNED, levels)
        for _ in range(self.options.repeats - 1):
            low = [
                c
                for c, r in envelope_ratios(result).items()
                if r < self.options.min_ratio and not drafting_off(result.threshold, c)
            ]
            if not low:
                break
            self._measure(result, Phase.TUNED, low)  # a single slow sample is not the verdict
        result.envelope_ratio = envelope_ratios(result)
        if self.options.objective.bound is not None:
            result.capacity = self._capacity(result)
        result.outcome = Outcome.TUNED
        result.serving = tuned.run

    def _capacity(self, result: TuneResult) -> int | None:
        """The highest concurrency at which the tuned server meets the latency bound,
        narrowed down on it between the levels measured."""
        objective = self.options.objective
        tuned = result.phases[Phase.TUNED]

        def meets(level: int) -> bool:
            return objective.meets(by_concurrency(tuned.measured).get(level, []))

        measured = list(by_concurrency(tuned.measured))
        good = [c for c in measured if meets(c)]
        if not good:
            return None
        low = max(good)
        high = next((c for c in measured if c > low), None)
        while high is not None and high - low > 1:
            middle = (low + high) // 2
            self._measure(result, Phase.TUNED, [middle])
            low, high = (middle, high) if meets(middle) else (low, middle)
        return low

    def _keep(self, result: TuneResult, previous: Serving | None) -> None:
        keep = self.options.keep
        if keep is Keep.BASELINE:
            self._step(Phase.BASELINE, "keeping")
            result.serving = self._start(result, Phase.BASELINE, self.plans[Phase.BASELINE])
        elif keep is Keep.NONE:
            self._put_back(result, previous)

    # -- when it goes wrong ----------------------------------------------------------------

    def _fall_back(self, result: TuneResult, previous: Serving | None) -> None:
        """After a crash: relaunch the best configuration that did not crash (no threshold),
        else put back what was serving before."""
        best = best_stable(result)
        if best is None:
            self._put_back(result, previous)
            return
        try:
            self._step(best, "restoring")
            result.serving = self._start(result, best, self.plans[best])
        except (DeployctlError, PhaseFailed) as exc:
            result.note += f"; relaunching {best} failed: {exc}"

    def _put_back(self, result: TuneResult, previous: Serving | None) -> None:
        """Relaunch the run that was serving before tune (or stop tune's own run), trying
        again while the host cannot be reached (the reason we may be here). A host tune has
        not changed yet is left alone."""
        if not self.touched:
            result.serving = result.previous
            return
        try:
            if previous is None:
                if self.current is not None:
                    _reconnecting(
                        lambda: stop_run(self.host, self.conn, self.options.stop_timeout),
                        self.options.reconnect_window,
                    )
                result.serving = None
                return
            run_id = previous.run
            self._step("previous", "restoring")
            _reconnecting(
                lambda: recorded_run(self.host, self.conn), self.options.reconnect_window
            )  # until it answers
            replaced = relaunch(
                self.fleet, [previous], self.catalog, restart_of={self.host.label: run_id},
                timeout=self.options.timeout, stop_timeout=self.options.stop_timeout,
                events=self.events, drain_timeout=self.options.drain_timeout,
            )  # fmt: skip
            outcome = _outcome(replaced.launch)
            result.launches += 1
            result.serving = outcome.run["id"] if outcome is not None and outcome.ok else None
            if result.serving is None:
                result.note += f"; putting back {run_id} failed"
        except DeployctlError as exc:
            result.note += f"; putting back failed: {exc.message}"
            result.serving, result.serving_known = None, False

    # -- steps -------------------------------------------------------------------------------

    def _replace(self, plan: Plan, restart_of: Mapping[str, str]) -> Replacement:
        touched, self.touched = self.touched, True  # until it says it stopped nothing
        replaced = replace(
            self.fleet, [plan], self.catalog, restart_of=restart_of,
            stop_timeout=self.options.stop_timeout, timeout=self.options.timeout,
            events=self.events, drain_timeout=self.options.drain_timeout,
        )  # fmt: skip
        self.touched = touched or not replaced.untouched
        return replaced

    def _launch(self, result: TuneResult, phase: Phase, plan: Plan) -> None:
        self._check_cancel()
        if phase not in result.phases:
            result.phases[phase] = PhaseRun(phase, plan.rendered.template, plan.rendered.threshold)
        self._start(result, phase, plan, result.phases[phase])

    def _start(
        self, result: TuneResult, phase: Phase, plan: Plan, phase_run: PhaseRun | None = None
    ) -> str:
        """Replace the current run with the plan's; wait until ready; return the run id."""
        self._step(phase, "launching")
        began = time.monotonic()
        replaced = self._replace(plan, {})
        result.launches += 1
        self.launch_seconds.append(time.monotonic() - began)
        outcome = _outcome(replaced.launch)
        if outcome is None:
            raise _failure(self.host, replaced.launch, replaced.stops)
        self.current = outcome.run["id"]
        if phase_run is not None:
            phase_run.runs.append(outcome.run["id"])
            phase_run.state = str(outcome.state)
        if not outcome.ok:
            crash = outcome.crashes[0] if outcome.crashes else None
            crashed = outcome.state in (RunState.CRASHED, RunState.DIED)
            raise PhaseFailed(
                f"{phase} server {outcome.run['id']} {outcome.state} while starting", crashed, crash
            )
        return str(outcome.run["id"])

    def _measure(self, result: TuneResult, phase: Phase, levels: Sequence[int]) -> list[BenchLevel]:
        self._check_cancel()
        phase_run = result.phases[phase]
        self._step(phase, "measuring", list(levels))
        began = time.monotonic()
        try:
            warmed = phase_run.warmed()
            swept = run_bench(
                self.host, self.conn, self.options.bench_plan(levels, warmed), self.events,
                stop=self.cancel.is_set,
            )  # fmt: skip
        except DeployctlError as exc:
            self._check_crash(phase_run, exc.message)
            raise
        assert swept is not None  # single-node only: rank 0 serves the API
        self.level_seconds.append((time.monotonic() - began) / max(1, len(swept.levels)))
        phase_run.measured += swept.levels
        phase_run.sweeps.append(swept.saved)
        warmed.update(lv["concurrency"] for lv in swept.levels)
        failed = [lv for lv in swept.levels if lv["failed"]]
        if failed:
            first = failed[0]
            detail = f": {first['errors'][0]}" if first["errors"] else ""
            self._check_crash(
                phase_run,
                f"{first['failed']} of {first['prompts']} requests failed at concurrency "
                f"{first['concurrency']}{detail}",
            )
        self._check_cancel()  # Ctrl-C during the sweep: the levels done are kept
        return swept.levels

    def _check_crash(self, phase_run: PhaseRun, what: str) -> None:
        """Raise PhaseFailed, with the crash report when the server crashed."""
        status = run_status(self.host, self.conn, self.catalog)
        if status.crashed or not status.alive:
            phase_run.state = str(RunState.CRASHED)
            crash = status.crashes[0] if status.crashes else None
            raise PhaseFailed(
                f"{phase_run.phase} server {phase_run.run} crashed: {what}", True, crash
            )
        raise PhaseFailed(f"{phase_run.phase} server {phase_run.run}: {what}")

    def _check_cancel(self) -> None:
        if self.cancel.is_set():
            raise Interrupted

    def _step(self, phase: str, step: str, levels: Sequence[int] = ()) -> None:
        self.events.emit(
            ev.TuneStep(
                target=self.host.label, phase=str(phase), step=step, levels=list(levels),
                elapsed=time.monotonic() - self.began, eta=self._eta(),
            )
        )  # fmt: skip

    def _eta(self) -> float | None:
        """Seconds left, from the launches and levels timed so far (None before any)."""
        if not self.level_seconds or not self.launch_seconds:
            return None
        search = self.search
        if search is None:
            return None
        owed = sum(search.short(p) for p in (Phase.BASELINE, Phase.SPECULATIVE))
        levels = owed + (0 if self.tuning else len(search.planned))
        launches = search.launches_left() + (0 if self.tuning else 1)
        return launches * statistics.mean(self.launch_seconds) + levels * statistics.mean(
            self.level_seconds
        )

    def _save(self, result: TuneResult) -> None:
        args = TuneSaveArgs(state_dir=self.host.settings.state_dir, record=tune_record(result))
        try:
            reply = agent.call(self.host, self.conn, agent.TUNE_SAVE, args)
        except DeployctlError as exc:
            result.note += f"; the tune record could not be kept: {exc.message}"
            return
        result.record, result.saved = reply["number"], reply["path"]


# Putting a run back after a lost connection: the longest wait between two tries.
RECONNECT_WAIT_MAX = 30.0


def _reconnecting(step: Callable[[], T], window: float) -> T:
    """Run `step` (one agent call, which raises when the host cannot be reached), again
    after a backoff (1 s, 2, 4 …) while it cannot, for `window` seconds; the last try is
    at the window's end."""
    deadline = time.monotonic() + window
    wait_s = 0.0
    while time.monotonic() < deadline:
        try:
            return step()
        except (ConnectError, CommandTimeoutError):
            wait_s = next_backoff(wait_s, 1.0, RECONNECT_WAIT_MAX)
            time.sleep(min(wait_s, max(0.0, deadline - time.monotonic())))
    return step()


def _outcome(report: LaunchReport | None) -> RunOutcome | None:
    """The one target's outcome of a launch that started it (None: it did not start)."""
    if report is None or not report.outcomes.results:
        return None
    return report.outcomes.results[0].value


def _failure(
    host: Host, report: LaunchReport | None, stops: FleetResult[StopResult]
) -> BaseException:
    """Why a launch did not start: the stop or the preflight that failed (a bug stays one)."""
    preflights = list(report.preflights) if report else []
    outcomes = list(report.outcomes) if report else []
    for result in [*stops, *preflights, *outcomes]:
        error: BaseException | None = result.exception
        if error is not None:
            return error
    for preflight in preflights:
        if preflight.value is not None and preflight.value.problems:
            hint = preflight.value.hints[0] if preflight.value.hints else None
            return DeployctlError(f"{host.label}: {preflight.value.problems[0]}", hint=hint)
    return DeployctlError(f"{host.label}: the launch did not start")


# ---- the record kept on the host (and printed by --json) ----------------------------------


def tune_record(result: TuneResult) -> TuneRecord:
    """The tune as one document: what `tune --json` prints for the deployment and what is
    kept on its host for `tune --report`."""
    search = result.search
    judged = search.judged() if search else {}
    phases: dict[str, PhaseRecord] = {
        str(phase): {
            "run": run.run,
            "runs": run.runs,
            "template": run.template,
            "threshold": run.threshold,
            "state": run.state,
            "levels": run.levels(),
            "samples": {str(c): v for c, v in run.samples().items()},
            "sweeps": run.sweeps,
            "per_level": {str(c): v for c, v in run.figures().items()},
        }
        for phase, run in result.phases.items()
    }
    verdicts: dict[str, Verdict] = {
        str(c): {
            "verdict": str(j.verdict),
            "baseline": j.baseline,
            "speculative": j.speculative,
            "spread": j.spread,
            "samples": j.samples,
            "level_spread": j.level_spread,
            "within_spread": j.within_spread,
        }
        for c, j in judged.items()
    }
    crash: CrashRecord | None = result.crash.to_json() if result.crash else None
    last_win, first_loss = search.bracket() if search else (0, None)
    return {
        "host": result.host,
        "deployment": result.deployment,
        "tune": result.record,
        "outcome": str(result.outcome),
        "outcome_note": result.note,
        "threshold": result.threshold,
        "threshold_mode": result.threshold_mode,
        "speculation": result.speculation,
        "crossover": {"last_win": last_win or None, "first_loss": first_loss} if search else None,
        "phases": phases,
        "refined_levels": search.refined if search else [],
        "narrowed": search.narrowed if search else None,
        "wins_again": search.wins_again() if search else [],
        "verdicts": verdicts,
        "envelope_ratio": {str(c): r for c, r in sorted(result.envelope_ratio.items())},
        "min_ratio": result.options.min_ratio,
        "held": result.held,
        "capacity": result.capacity,
        "serving": result.serving,
        "serving_known": result.serving_known,
        "previous": result.previous,
        "crash": crash,
        "patches": result.patches,
        "params": result.options.describe(),
        "started_at": result.started_at,
        "wall_s": round(result.wall_s, 3),
        "launches": result.launches,
        "levels_measured": result.levels_measured,
    }


# ---- the fleet ------------------------------------------------------------------------------


@dataclass
class TunePlan:
    """What a tune of one deployment will launch and measure (also its dry run)."""

    host: Host
    plans: dict[Phase, Plan]
    tuned: Callable[[int | None, bool], Plan]
    options: TuneOptions
    patch_sets: Mapping[str, PatchSet]

    def estimate(self) -> dict[str, Any]:
        """Launches, sweeps and a duration guess before anything is measured."""
        coarse = self.options.levels
        gaps = [b - a - 1 for a, b in zip([0, *coarse], coarse, strict=False)]
        # The search launches each server once, then once a split, up to --max-launches.
        splits = min(rounds(max(gaps), self.options.points), self.options.max_visits - 2)
        launches = 2 + splits + 1  # and the tuned run
        measured = len(coarse) * 3 + splits * self.options.points * 3
        # A warm-up runs about two requests a stream (the level's, then the smaller batches).
        requests = self.options.per_stream + (2 if self.options.warmup else 0)
        per_level = requests * self.options.output_len * ASSUMED_TOKEN_S
        return {
            "launches": launches,
            "levels": measured,
            "estimated_s": launches * ASSUMED_LAUNCH_S + measured * per_level,
            "assumed": {"launch_s": ASSUMED_LAUNCH_S, "token_s": ASSUMED_TOKEN_S},
        }


# A dry run's duration guess: a large model's load, and a busy server's time per token.
ASSUMED_LAUNCH_S = 300.0
ASSUMED_TOKEN_S = 0.02


def plan_tune(
    project: Project,
    targets: Sequence[Host],
    patch_sets: Mapping[str, PatchSet],
    options: TuneOptions,
) -> list[TunePlan]:
    """Render every phase's command for every deployment; refuse before any host is touched."""
    found = []
    for host in targets:
        if host.settings.nnodes > 1:
            raise UsageError(
                f"{host.label} is a multi-node server: tune works on single-node deployments"
            )

        def plan(template: str, threshold: int | None, host: Host = host) -> Plan:
            [made] = plan_launch(
                project, [host], template, threshold, [], patch_sets, inventory_threshold=False,
                threshold_mode=options.threshold_mode,
            )  # fmt: skip
            return made

        if host.settings.template:  # what serves there now must be an SGLang server
            _refuse_non_server(plan(host.settings.template, None), "its template")
        speculative = options.speculative_template or _speculative_template(host, plan)
        plans = {
            Phase.BASELINE: plan(options.baseline_template, None),
            Phase.SPECULATIVE: plan(speculative, None),
        }
        for made in plans.values():
            _refuse_non_server(made, "template")
        if speculates(plans[Phase.BASELINE].rendered.argv):
            raise UsageError(
                f"{host.label}: baseline template {options.baseline_template!r} speculates",
                hint="name a plain template with --baseline-template",
            )
        if not speculates(plans[Phase.SPECULATIVE].rendered.argv):
            raise UsageError(
                f"{host.label}: template {speculative!r} does not speculate",
                hint="name a speculative template with --template, e.g. eagle3",
            )
        plan(speculative, 1)  # what a threshold needs (topk 1, draft steps) is checked now

        def tuned(
            threshold: int | None,
            speculate: bool,
            speculative: str = speculative,
            plan: Callable[[str, int | None], Plan] = plan,
        ) -> Plan:
            if not speculate:
                return plan(options.baseline_template, None)
            return plan(speculative, threshold)

        found.append(TunePlan(host, plans, tuned, options, patch_sets))
    return found


def _refuse_non_server(plan: Plan, what: str) -> None:
    """Tune replaces an SGLang server by SGLang servers: never a router, nor another program."""
    host, template = plan.host, plan.rendered.template
    if plan.role is Role.ROUTER:
        raise UsageError(
            f"{host.label} is a router ({what} {template!r}): tune measures SGLang servers",
            hint="tune the router's workers (-H WORKER)",
        )
    if server_argv(plan.rendered.argv, host.settings.launch_module) is None:
        raise UsageError(
            f"{host.label}: {what} {template!r} does not run an SGLang server "
            f"(`-m {host.settings.launch_module}` or `sglang serve`): tune measures SGLang servers",
            hint="tune a deployment whose template runs SGLang's launch_server",
        )


def _speculative_template(host: Host, plan: Callable[[str, int | None], Plan]) -> str:
    """The deployment's own template when it speculates, else the shipped eagle3."""
    own = host.settings.template
    if own and speculates(plan(own, None).rendered.argv):
        return own
    return "eagle3"


@dataclass
class TuneReport:
    """Every deployment's tune; `interrupted`: Ctrl-C ended it (the previous runs put back)."""

    results: FleetResult[TuneResult]
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return self.results.ok and all(r.ok for r in self.results.succeeded.values())


def tune_fleet(
    fleet: Fleet,
    tune_plans: Sequence[TunePlan],
    catalog: Catalog,
    events: EventSink = DISCARD,
) -> TuneReport:
    """Tune every planned deployment, each in its own thread.

    Ctrl-C asks each to stop at its next safe point (between levels and launches) and put
    back the run that was serving before; a second Ctrl-C leaves at once.
    """
    cancel = threading.Event()

    def one(tune_plan: TunePlan) -> TuneResult:
        host = tune_plan.host
        tuner = Tuner(
            fleet, host, tune_plan.plans, tune_plan.tuned, catalog,
            tune_plan.patch_sets, tune_plan.options, events, cancel,
        )  # fmt: skip
        token = _take_tune_lock(host, fleet.connection(host))
        try:
            # No rollout through its router meanwhile (nor one of ours through a rollout's).
            with router_lock_of(fleet, host, "tune"):
                return tuner.run()
        finally:
            with contextlib.suppress(DeployctlError):  # unreachable: it expires
                args = ReleaseArgs(
                    state_dir=host.settings.state_dir, deployment=host.deployment, token=token
                )
                agent.call(host, fleet.connection(host), agent.TUNE_UNLOCK, args)

    driven = drive(
        [functools.partial(one, p) for p in tune_plans],
        min(fleet.forks, len(tune_plans)),
        cancel,
        lambda: events.emit(ev.TuneStep(target="", phase="", step="interrupting", elapsed=0.0)),
    )
    results = []
    for tune_plan, future in zip(tune_plans, driven.futures, strict=True):
        error = future.exception()
        results.append(
            HostResult(tune_plan.host, exception=error)
            if error is not None
            else HostResult(tune_plan.host, future.result())
        )
    return TuneReport(FleetResult(results), driven.interrupted)


# How long a tune's lock holds at most when its holder cannot be asked (another machine's).
TUNE_LOCK_HOLD = 24 * 3600.0


def _take_tune_lock(host: Host, conn: Connection) -> str:
    """The deployment's tune lock, or a refusal naming the tune that holds it; a lock whose
    holder has died (or whose time is up) is broken, as launch's is."""
    args = TuneLockArgs(
        state_dir=host.settings.state_dir, deployment=host.deployment,
        client=client_identity("tune", TUNE_LOCK_HOLD), break_lock=None,
    )  # fmt: skip
    reply = agent.call(host, conn, agent.TUNE_LOCK, args)
    holder = reply["holder"] or {}
    if not reply["acquired"] and is_stale(holder):
        args["break_lock"] = holder["token"]
        reply = agent.call(host, conn, agent.TUNE_LOCK, args)
        holder = reply["holder"] or {}
    if reply["token"] is None:
        raise DeployctlError(
            f"{host.label}: another deployctl tune of it is in progress "
            f"(pid {holder.get('pid')} on {holder.get('host')}, by {holder.get('user')})",
            hint="wait for it to end (or end it with Ctrl-C)",
        )
    return reply["token"]


# ---- kept tunes -----------------------------------------------------------------------------


KeptTune = Kept[TuneRecord]


def find_tunes(
    fleet: Fleet, number: int | None, hosts: Sequence[Host] | None = None
) -> FleetResult[KeptTune]:
    """Each selected deployment's (or each of `hosts`') tune record `number` (None: its
    newest)."""

    def lookup(host: Host, conn: Connection) -> KeptTune:
        args = TuneRecordsArgs(
            state_dir=host.settings.state_dir, number=number, deployment=host.deployment
        )
        reply = agent.call(host, conn, agent.TUNE_RECORDS, args)
        return Kept("tune", reply["record"], reply["numbers"], reply["unreadable"], number)

    return fleet.run(lookup, hosts)
