"""Canary: the inventory's configuration tried on K replicas behind their router while the
others keep their current run, judged against them at matched load from each replica's own
/metrics, then promoted (the rest rolled out) or rolled back (the canaries back on their
previous run), on its own.

The canaries are replaced by rollout's engine (out of the router, drained, stopped, patched,
relaunched, back in); a rollback is the same replacement with the captured previous run. The
router's lock is held from the split to the decision: nothing else changes its workers
meanwhile. The statistics are deployctl.canary_stats (pure).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from deployctl import agent
from deployctl import events as ev
from deployctl.canary_stats import Judge, Verdict, interval_sample
from deployctl.choices import CanaryMetric, PdRole
from deployctl.connection import Connection
from deployctl.crash import Catalog
from deployctl.errors import DeployctlError, MetricsError, UsageError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet, FleetResult, HostResult
from deployctl.inventory import Host
from deployctl.metrics import Counts, Spans, interval, read_counts
from deployctl.ops.driver import drive
from deployctl.ops.kept import Kept
from deployctl.ops.plan import Plan, Role
from deployctl.ops.rollout import (
    Rollout,
    RolloutOptions,
    UnitOutcome,
    UnitPlan,
    UnitResult,
    launched_run,
)
from deployctl.ops.rounds import status_rounds
from deployctl.ops.router import WorkerKind, router_locks, router_of, router_silence
from deployctl.ops.runs import recorded_run
from deployctl.ops.serving import Serving, capture, relaunch
from deployctl.patchset import PatchSet
from deployctl.remote.measures import (
    CanaryKeepReply,
    CanaryRecord,
    CanaryRecordsArgs,
    CanaryStep,
)
from deployctl.remote.protocol import Call

# A running canary's record on the router's host is brought up to date at most this often
# (one call; `canary --report` and the dashboard read it from there).
KEEP_EVERY_S = 5.0
# Rounds in a row the router may not answer before the canary ends: one slow answer is not
# a dead router, and past that its replicas are judged on no traffic.
ROUTER_SILENT_ROUNDS = 2


class Decision(StrEnum):
    """What the canary did in the end."""

    PROMOTED = "promoted"  # no regression: the other replicas rolled out too
    ROLLED_BACK = "rolled back"  # a regression, a crash or failed requests: canaries put back
    KEPT = "kept"  # no regression but --no-promote, or inconclusive: the canaries serve on
    # Not carried through: the canaries' new configuration did not serve (rollout put them
    # back), or nothing could be judged (the router stopped answering, or the canaries gave
    # no sample to compare): the canaries put back.
    FAILED = "failed"


class _Ending(StrEnum):
    """How the judging ended: what the canary does next."""

    JUDGED = "judged"  # a verdict (or none by --max-duration) to act on
    BAD = "bad"  # a regression, a crash, failed requests or Ctrl-C: roll back
    NOT_JUDGED = "not judged"  # nothing to compare, or no router: failed, and put back


@dataclass
class CanaryOptions:
    replicas: int = 1
    metric: str = "itl"
    max_regression: float = 0.05
    confidence: float = 0.95
    min_samples: int = 20
    max_duration: float = 1800.0
    interval: float = 2.0
    promote: bool = True
    rollout: RolloutOptions = field(default_factory=lambda: RolloutOptions(what="canary"))


@dataclass
class CanaryPlan:
    """The replicas of one router: the canaries (replaced first), the control, those
    already on the inventory's configuration, and those a canary cannot judge (neither)."""

    router: str
    candidates: list[UnitPlan]
    controls: list[UnitPlan]
    already_current: list[str] = field(default_factory=list)
    # Replicas that differ but cannot be judged (prefills, a role that changes) -> why: they
    # are neither canary nor control, and a promotion leaves them as they run.
    not_judged: dict[str, str] = field(default_factory=dict)


@dataclass
class CanaryReport:
    plan: CanaryPlan
    options: CanaryOptions = field(default_factory=CanaryOptions)
    started_at: float = 0.0  # seconds since the epoch
    split: list[UnitResult] = field(default_factory=list)
    verdict: Verdict | None = None
    reason: str = ""  # why it ended as it did
    decision: Decision | None = None
    actions: list[UnitResult] = field(default_factory=list)  # the promotion's or rollback's
    elapsed_s: float = 0.0  # judging time
    interrupted: bool = False
    dry_run: bool = False
    kept: int | None = None  # the record's number on the router's host
    keep_error: str = ""  # why the record could not be kept there

    @property
    def ok(self) -> bool:
        """A clear verdict acted on (or a dry run); not a rollback, a failure or Ctrl-C."""
        if self.dry_run:
            return True
        return (
            self.decision in (Decision.PROMOTED, Decision.KEPT)
            and all(a.ok for a in self.actions)
            and not self.interrupted
        )


def plan_canary(unit_plans: Sequence[UnitPlan], replicas: int, restart: bool) -> CanaryPlan:
    """Split the selected replicas: the first `replicas` that differ from the inventory are
    the canaries, the others that differ the control (with `restart`, every replica counts as
    differing). Only replicas of one role are compared: prefills and replicas whose role
    changes are left out (`not_judged`). Refused, naming why, without a router, with fewer
    than two replicas to judge, with replicas of several routers or roles, when nothing
    differs, or when no control is left."""
    workers = [u for u in unit_plans if u.plans[0].role is not Role.ROUTER]
    if replicas < 1:
        raise UsageError("--replicas must be 1 or more")
    unrouted = [u.name for u in workers if u.router is None]
    if unrouted:
        raise UsageError(
            f"{', '.join(unrouted)} has no router: a canary splits a router's traffic",
            hint="give the replicas a router (router: HOST/DEPLOYMENT), or use rollout",
        )
    routers = sorted({u.router.label for u in workers if u.router is not None})
    if len(routers) > 1:
        raise UsageError(
            f"the replicas are behind several routers ({', '.join(routers)})",
            hint="select the replicas of one router with -H/-d",
        )
    apart = {u.name: why for u in workers if (why := _not_judged(u))}
    not_judged = {
        u.name: apart[u.name] for u in workers if u.name in apart and (u.changes or restart)
    }
    workers = [u for u in workers if u.name not in apart]
    _check_one_role(workers)
    if len(workers) < 2:
        unjudged = "; ".join(f"{name}: {why}" for name, why in apart.items())
        raise UsageError(
            f"a canary needs at least 2 replicas behind one router; {len(workers)} selected"
            + (f" to judge (not judged: {unjudged})" if unjudged else ""),
            hint="add a replica, or use rollout",
        )
    changed = [u for u in workers if u.changes or restart]
    if not changed:
        raise UsageError(
            "no replica differs from the inventory: nothing to try",
            hint="change the inventory first, or pass --restart to try the same configuration",
        )
    # A replica that matches the inventory already runs what the canaries try: as a control
    # it would judge the new configuration against itself, so only replicas that differ are.
    same = [u.name for u in workers if u not in changed]
    if replicas >= len(changed) and not same:
        raise UsageError(
            f"--replicas {replicas} leaves no control among {len(workers)} replicas",
            hint=f"at most --replicas {len(workers) - 1}",
        )
    if replicas >= len(changed):
        hint = (
            f"at most --replicas {len(changed) - 1}"
            if len(changed) > 1
            else "roll the one that differs out (deployctl rollout), or pass --restart to "
            "compare replicas on one configuration"
        )
        raise UsageError(
            f"--replicas {replicas} leaves no control: {', '.join(same)} already run the "
            f"inventory's configuration, and {len(changed)} replica(s) differ from it",
            hint=hint,
        )
    candidates = changed[:replicas]
    controls = [u for u in changed if u not in candidates]
    current = [*same, *(name for name in apart if name not in not_judged)]
    return CanaryPlan(routers[0], candidates, controls, current, not_judged)


def _roles(unit: UnitPlan) -> tuple[PdRole | None, ...]:
    """As what the replica serves now (its run's command) and next (the inventory's): one
    entry when they are the same."""
    host = unit.rank0
    now = unit.statuses[0] if unit.statuses else None
    current = () if now is None or now.run is None else (WorkerKind.of_run(now.run, host).role,)
    return tuple(dict.fromkeys((*current, host.settings.pd_role)))


def _role_words(role: PdRole | None) -> str:
    return "whole requests" if role is None else str(role)


def _not_judged(unit: UnitPlan) -> str:
    """Why a canary cannot judge the replica ("" when it can): SGLang's prefill servers
    record neither time to first token nor inter-token latency (their decodes see the
    tokens), and a replica whose role changes has no like to compare with."""
    roles = _roles(unit)
    if PdRole.PREFILL in roles:
        return "a prefill records no time to first token or inter-token latency"
    if len(roles) > 1:
        return f"its role changes ({' → '.join(_role_words(r) for r in roles)})"
    return ""


def _check_one_role(units: Sequence[UnitPlan]) -> None:
    """Refuse replicas of several roles: a canary compares like with like."""
    roles = {u.name: _roles(u)[0] for u in units}
    if len(set(roles.values())) > 1:
        said = ", ".join(f"{name} ({_role_words(role)})" for name, role in roles.items())
        raise UsageError(
            f"the replicas serve in different roles: {said}; a canary compares one role's",
            hint="select the replicas of one role with -H/-d",
        )


@dataclass
class Read:
    """One replica's /metrics read: when, and the counts (None: not serving or unreadable);
    or its router's answer (`silence`: why it does not answer, "" when it does)."""

    at: float
    counts: Counts | None
    serving: bool
    silence: str = ""


def read_replica(host: Host, conn: Connection) -> Read:
    """Is the replica's run alive and healthy, and its /metrics counts (one round trip)."""
    reply = recorded_run(host, conn, metrics=True)
    serving = bool(reply["alive"]) and reply["health"] == 200
    page = reply["metrics"]
    counts = None
    if page is not None and page["status"] == 200:
        try:
            counts = read_counts(page["text"])
        except MetricsError:
            counts = None
    return Read(time.monotonic(), counts, serving)


def read_router(host: Host, conn: Connection) -> Read:
    """Does the router answer for its worker list now (one call to the agent on its host)?"""
    silence = router_silence(host, conn)
    return Read(time.monotonic(), None, not silence, silence)


class Canary:
    """One canary run: split, judge, act; `cancel` (Ctrl-C) puts the canaries back."""

    def __init__(
        self,
        fleet: Fleet,
        plan: CanaryPlan,
        catalog: Catalog,
        available: Mapping[str, PatchSet],
        options: CanaryOptions,
        events: EventSink,
        cancel: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fleet, self.plan, self.catalog = fleet, plan, catalog
        self.available, self.options, self.events, self.cancel = available, options, events, cancel
        self.clock = clock  # what the judging's elapsed time and --max-duration are read by
        router = plan.candidates[0].router
        assert router is not None  # plan_canary refused replicas without one
        self.keeper = Keeper(fleet, router, agent.CANARY_KEEP)

    def run(self) -> CanaryReport:
        report = CanaryReport(self.plan, self.options, time.time())
        try:
            return self._run(report)
        finally:
            self._keep(report, done=True)

    def _keep(self, report: CanaryReport, done: bool = False) -> None:
        if report.dry_run:
            return
        self.keeper.keep(lambda _: canary_record(report, done), done)
        report.kept, report.keep_error = self.keeper.number, self.keeper.error

    def _run(self, report: CanaryReport) -> CanaryReport:
        # What serves the canaries now: what a rollback relaunches.
        previous = [
            capture(p.host, s, self.available)
            for u in self.plan.candidates
            for p, s in zip(u.plans, u.statuses, strict=True)
        ]
        engine = Rollout(
            self.fleet, self.plan.candidates, self.catalog, self.available,
            self._unit_options(restart=True), self.events, self.cancel,
        )  # fmt: skip
        self._keep(report)
        report.split = engine.run()
        if not all(r.outcome is UnitOutcome.REPLACED for r in report.split):
            report.decision, report.reason = Decision.FAILED, split_failure(report.split)
            report.interrupted = self.cancel.is_set()
            return report
        verdict, reason, ending = self._judge(report)
        report.verdict, report.reason = verdict, reason
        cancelled = self.cancel.is_set()
        if ending is not _Ending.JUDGED or cancelled:
            failed = ending is _Ending.NOT_JUDGED and not cancelled
            report.decision = Decision.FAILED if failed else Decision.ROLLED_BACK
            report.interrupted = cancelled
            report.actions = self._roll_back(previous, report.split)
        elif verdict is not None and verdict.state == "no_regression" and self.options.promote:
            report.decision = Decision.PROMOTED
            # The rest as `rollout` would: those that match already are skipped.
            promotion = Rollout(
                self.fleet, self.plan.controls, self.catalog, self.available,
                self._unit_options(restart=self.options.rollout.restart), self.events,
                self.cancel,
            )  # fmt: skip
            report.actions = promotion.run()
        else:
            report.decision = Decision.KEPT
        return report

    def _unit_options(self, restart: bool) -> RolloutOptions:
        """One unit at a time (the canaries are replaced whether they match or not)."""
        options = self.options.rollout
        return RolloutOptions(
            1, options.drain_timeout, options.stop_timeout, options.timeout, restart,
            options.allow_downtime, "canary",
        )  # fmt: skip

    def _judge(self, report: CanaryReport) -> tuple[Verdict | None, str, _Ending]:
        """Sample every replica (and ask the router) each interval until the verdict is
        clear, `max_duration` passes, the router stops answering, or Ctrl-C: the verdict,
        why it ended, and what follows."""
        options = self.options
        judge = Judge(
            options.metric, options.max_regression, options.confidence, options.min_samples
        )
        canaries = [u.rank0 for u in self.plan.candidates]
        controls = [u.rank0 for u in self.plan.controls]
        side = {h.label: "candidate" for h in canaries} | {h.label: "control" for h in controls}
        last: dict[str, Read] = {}
        # Throughput only: spans (see below); a latency canary reads no span at all.
        spans = Spans() if options.metric == CanaryMetric.THROUGHPUT else None
        failed = {"candidate": 0, "control": 0}
        finished = {"candidate": 0, "control": 0}
        # A round's aborted and finished requests, counted once the router answers the round
        # after: a router that dies aborts the requests in flight on every replica.
        held: list[tuple[str, int, int]] = []
        started = self.clock()
        verdict: Verdict | None = None
        router = self.keeper.router
        silent = 0  # rounds in a row the router has not answered

        def read(host: Host, conn: Connection) -> Read:
            return (
                read_router(host, conn) if host.label == router.label else read_replica(host, conn)
            )

        self.fleet.keep_agents()  # a read a round for minutes: one agent process per host
        rounds = status_rounds(
            lambda: self.fleet.run(read, [*canaries, *controls, router]),
            options.interval,
            stop=self.cancel,
            clock=self.clock,
        )
        for reads in rounds:
            silence = next(_silence(r) for r in reads if r.name == router.label)
            silent = silent + 1 if silence else 0
            for who, aborted, done in [] if silence else held:
                failed[who] += aborted
                finished[who] += done
            held = []
            if silent >= ROUTER_SILENT_ROUNDS:  # its replicas get no traffic to judge
                return (
                    verdict,
                    f"router {router.label} stopped answering: {silence}",
                    _Ending.NOT_JUDGED,
                )
            for result in reads:
                if result.value is None or result.name == router.label:
                    continue  # a host not read this round is not a crash: asked again next
                if side[result.name] == "candidate" and not result.value.serving:
                    return verdict, f"canary {result.name} crashed (not serving)", _Ending.BAD
                if result.value.counts is None:
                    continue
                at, counts = result.value.at, result.value.counts
                span = None if spans is None else spans.add(result.name, at, counts)
                before = last.get(result.name)
                last[result.name] = result.value
                if before is None or before.counts is None:
                    continue
                seconds = result.value.at - before.at
                part = interval(before.counts, result.value.counts, seconds)
                who = side[result.name]
                if not silence:
                    held.append((who, part.aborted, part.requests + part.aborted))
                # A latency is a median of the interval's observations: one without any
                # loses no time. Throughput is tokens over time, and tokens are counted as
                # requests finish: over spans, which keep the time in which none did.
                sampled = part if spans is None else span
                sample = interval_sample(sampled, options.metric, result.name)
                if sample is not None:
                    judge.add(who, sample)
            if _fails_more(failed, finished):
                return (
                    verdict,
                    (
                        f"the canaries failed {failed['candidate']} of {finished['candidate']} "
                        f"requests, the control {failed['control']} of {finished['control']}"
                    ),
                    _Ending.BAD,
                )
            verdict = judge.verdict()
            report.verdict, report.elapsed_s = verdict, self.clock() - started
            self.events.emit(
                ev.CanaryProgress(
                    target=self.plan.router, samples=verdict.samples,
                    buckets={str(b.bucket): [b.control_n, b.candidate_n] for b in verdict.buckets},
                    estimate=verdict.estimate, low=verdict.low, high=verdict.high,
                    elapsed_s=report.elapsed_s,
                )
            )  # fmt: skip
            self._keep(report)
            if verdict.state == "regression":
                return verdict, verdict.note or f"{options.metric} regressed", _Ending.BAD
            if verdict.state == "no_regression":
                return verdict, f"no {options.metric} regression", _Ending.JUDGED
            ended = report.elapsed_s >= options.max_duration
            unjudged = _nothing_to_compare(verdict, options, len(controls), ended)
            if unjudged:
                return verdict, f"not judged: {unjudged}", _Ending.NOT_JUDGED
            if ended:
                return verdict, f"inconclusive after {options.max_duration:g}s", _Ending.JUDGED
        return verdict, "interrupted", _Ending.BAD

    def _roll_back(
        self, previous: Sequence[Serving], split: Sequence[UnitResult]
    ) -> list[UnitResult]:
        """Each canary back on its previous run, drained out of its router first."""
        o = self.options.rollout
        return put_back(
            self.fleet, self.plan.candidates, previous, split, self.catalog, o.timeout,
            o.stop_timeout, o.drain_timeout, self.events,
        )  # fmt: skip


def put_back(
    fleet: Fleet,
    units: Sequence[UnitPlan],
    previous: Sequence[Serving],
    split: Sequence[UnitResult],
    catalog: Catalog,
    timeout: float,
    stop_timeout: float,
    drain_timeout: float,
    events: EventSink,
) -> list[UnitResult]:
    """Each unit replaced by `split` back on its `previous` run, drained out of its router
    first (a canary's rollback, a live tune's end)."""
    replaced = {r.name: r.new_run for r in split}
    results = []
    for unit in units:
        labels = {p.host.label for p in unit.plans}
        mine = [s for s in previous if s.host.label in labels]
        result = UnitResult(unit.name, UnitOutcome.REPLACED, old_run=replaced.get(unit.name))
        try:
            back = relaunch(
                fleet, mine, catalog, restart_of={}, timeout=timeout, stop_timeout=stop_timeout,
                events=events, drain_timeout=drain_timeout,
            )  # fmt: skip
        except DeployctlError as exc:
            result.outcome, result.error = UnitOutcome.FAILED, exc.message
        else:
            if back.launch is None or not back.launch.up:
                result.outcome, result.error = UnitOutcome.FAILED, "previous run not back"
            else:
                result.new_run = launched_run(back.launch)
                # Serving again; a router that does not answer (why a canary may end) adds
                # it when it is launched again.
                unlisted = [r.error for r in back.launch.registrations if not r.ok]
                if unlisted:
                    result.error = f"back on its previous run, not in its router: {unlisted[0]}"
        results.append(result)
    return results


class Keeper:
    """Keeps a window's record on its router's host (a canary's, a live tune's): created
    when the window starts, brought up to date while it is judged (every KEEP_EVERY_S at
    most), finished at the end. A record that cannot be written is said (`error`), never a
    reason to stop judging live traffic."""

    def __init__(self, fleet: Fleet, router: Host, call: Call[Any, CanaryKeepReply]) -> None:
        self.fleet, self.router, self.call = fleet, router, call
        self.number: int | None = None  # what the host kept it as
        self.error = ""
        # None until the first keep, which always writes: the monotonic clock's origin is
        # unspecified (boot, on Linux), so no constant start is safely "long ago".
        self.last: float | None = None

    def keep(self, record: Callable[[int | None], Any], done: bool = False) -> None:
        """Write `record(number)` unless one was written less than KEEP_EVERY_S ago (and
        this is not the last)."""
        now = time.monotonic()
        if not done and self.last is not None and now - self.last < KEEP_EVERY_S:
            return
        self.last = now
        args = {
            "state_dir": self.router.settings.state_dir,
            "number": self.number,
            "record": record(self.number),
        }
        [result] = self.fleet.run(
            lambda host, conn: agent.call(host, conn, self.call, args), [self.router]
        )
        if result.value is not None:
            self.number = result.value["number"]
        elif result.exception is not None:
            self.error = str(getattr(result.exception, "message", result.exception))


def canary_record(report: CanaryReport, done: bool) -> CanaryRecord:
    """The record kept on the router's host (and the core of `canary --json`)."""
    verdict, options, plan = report.verdict, report.options, report.plan
    return {
        "canary": report.kept,
        "router": plan.router,
        "state": "planned" if report.dry_run else "done" if done else "running",
        "started_at": report.started_at,
        "updated_at": time.time(),
        "candidates": [u.name for u in plan.candidates],
        "controls": [u.name for u in plan.controls],
        "metric": options.metric,
        "max_regression": options.max_regression,
        "confidence": options.confidence,
        "verdict": None if verdict is None else verdict.state,
        "estimate": None if verdict is None else verdict.estimate,
        "low": None if verdict is None else verdict.low,
        "high": None if verdict is None else verdict.high,
        "samples": 0 if verdict is None else verdict.samples,
        "buckets": []
        if verdict is None
        else [
            {
                "bucket": b.bucket, "control_n": b.control_n, "candidate_n": b.candidate_n,
                "control": b.control, "candidate": b.candidate, "ratio": b.ratio,
            }
            for b in verdict.buckets
        ],
        "reason": report.reason,
        "decision": None if report.decision is None else report.decision.value,
        "elapsed_s": round(report.elapsed_s, 3),
        "interrupted": report.interrupted,
        "steps": [
            *_steps("split", report.split),
            *_steps("promotion" if report.decision is Decision.PROMOTED else "rollback",
                    report.actions),
        ],
    }  # fmt: skip


def _steps(step: str, results: Sequence[UnitResult]) -> list[CanaryStep]:
    return [
        {
            "step": step,
            "unit": r.name,
            "outcome": r.outcome.value,
            "old_run": r.old_run,
            "new_run": r.new_run,
            "error": r.error or None,
        }
        for r in results
    ]


def _fails_more(failed: Mapping[str, int], finished: Mapping[str, int]) -> bool:
    """The canaries fail a larger share of their requests than the control does."""
    if failed["candidate"] == 0:
        return False
    rate = failed["candidate"] / max(finished["candidate"], 1)
    return rate > failed["control"] / max(finished["control"], 1)


def _silence(asked: HostResult[Read]) -> str:
    """Why the router did not answer this round ("" when it did)."""
    if asked.value is None:
        return f"its host cannot be read: {asked.error}"
    return asked.value.silence


def _nothing_to_compare(
    verdict: Verdict, options: CanaryOptions, controls: int, ended: bool
) -> str:
    """Why the judging can come to nothing ("" when it may yet): the canaries gave no sample
    while the control gave about `min_samples` a replica (they get no traffic, or none that
    measures the metric), or by the end no load bucket had samples of both sides."""
    candidate = sum(b.candidate_n for b in verdict.buckets)
    control = sum(b.control_n for b in verdict.buckets)
    if not candidate and (ended or control >= max(options.min_samples, 2) * controls):
        return f"the canaries gave no {options.metric} sample while the control gave {control}"
    if ended and not verdict.samples:
        return f"no load bucket had samples of both sides in {options.max_duration:g}s"
    return ""


def split_failure(results: Sequence[UnitResult]) -> str:
    """Why a replacement of units did not serve: the first that was not replaced."""
    failed = next((r for r in results if r.outcome is not UnitOutcome.REPLACED), None)
    if failed is None:
        return ""
    return (
        f"{failed.name} {failed.outcome}: {failed.error}" if failed.error else str(failed.outcome)
    )


def canary(
    fleet: Fleet,
    plan: CanaryPlan,
    catalog: Catalog,
    available: Mapping[str, PatchSet],
    options: CanaryOptions,
    events: EventSink = DISCARD,
) -> CanaryReport:
    """Run the canary with its router locked; Ctrl-C puts the canaries back (a second
    Ctrl-C leaves at once)."""
    cancel = threading.Event()
    engine = Canary(fleet, plan, catalog, available, options, events, cancel)
    return run_under_lock(fleet, engine.keeper.router, "canary", engine.run, cancel)


class _Interruptible(Protocol):
    interrupted: bool


Report = TypeVar("Report", bound=_Interruptible)


def run_under_lock(
    fleet: Fleet, router: Host, what: str, run: Callable[[], Report], cancel: threading.Event
) -> Report:
    """`run` in a driven thread with the router's lock held: the first Ctrl-C sets `cancel`
    (the run puts back what it changed), a second leaves at once."""
    with router_locks(fleet, [router], what):
        driven = drive([run], 1, cancel)
    [future] = driven.futures
    report = future.result()
    report.interrupted = report.interrupted or driven.interrupted
    return report


# ---- kept canaries ---------------------------------------------------------------------------


KeptCanary = Kept[CanaryRecord]


def routers_of(fleet: Fleet, plans: Sequence[Plan]) -> list[Host]:
    """The routers of the selected deployments: a selected router itself, a replica's the
    one it names; once each, in inventory order."""
    found: dict[str, Host] = {}
    for plan in plans:
        router = plan.host if plan.role is Role.ROUTER else router_of(plan.host, fleet.select)
        if router is not None:
            found.setdefault(router.label, router)
    return list(found.values())


def keeping_routers(fleet: Fleet, plans: Sequence[Plan], kept: str) -> list[Host]:
    """routers_of, refused when there is none: `kept` (a canary, a live window) is kept on
    its router's host."""
    routers = routers_of(fleet, plans)
    if not routers:
        raise UsageError(
            f"no selected deployment is a router or behind one: {kept} is kept on its "
            "router's host",
            hint="select the replicas (or their router) with -H/-d",
        )
    return routers


def find_canaries(
    fleet: Fleet, routers: Sequence[Host], number: int | None
) -> FleetResult[KeptCanary]:
    """Each router's canary record `number` (None: its newest), from the router's host."""

    def lookup(host: Host, conn: Connection) -> KeptCanary:
        args = CanaryRecordsArgs(
            state_dir=host.settings.state_dir, router=host.label, number=number
        )
        reply = agent.call(host, conn, agent.CANARY_RECORDS, args)
        return Kept("canary", reply["record"], reply["numbers"], reply["unreadable"], number)

    return fleet.run(lookup, routers)
