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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from deployctl import events as ev
from deployctl.canary_stats import Judge, Sample, Verdict
from deployctl.connection import Connection
from deployctl.crash import Catalog
from deployctl.errors import DeployctlError, MetricsError, UsageError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet
from deployctl.inventory import Host
from deployctl.metrics import Counts, interval, read_counts
from deployctl.ops.driver import drive
from deployctl.ops.plan import Role
from deployctl.ops.rollout import (
    Rollout,
    RolloutOptions,
    UnitOutcome,
    UnitPlan,
    UnitResult,
)
from deployctl.ops.router import router_locks
from deployctl.ops.runs import recorded_run
from deployctl.ops.server import status_rounds
from deployctl.ops.serving import Serving, capture, relaunch
from deployctl.patchset import PatchSet


class Decision(StrEnum):
    """What the canary did in the end."""

    PROMOTED = "promoted"  # no regression: the other replicas rolled out too
    ROLLED_BACK = "rolled back"  # a regression, a crash or failed requests: canaries put back
    KEPT = "kept"  # no regression but --no-promote, or inconclusive: the canaries serve on
    FAILED = "failed"  # the canaries' new configuration did not serve (rollout put them back)


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
    """The replicas of one router: the canaries (replaced first) and the control."""

    router: str
    candidates: list[UnitPlan]
    controls: list[UnitPlan]


@dataclass
class CanaryReport:
    plan: CanaryPlan
    split: list[UnitResult] = field(default_factory=list)
    verdict: Verdict | None = None
    reason: str = ""  # why it ended as it did
    decision: Decision | None = None
    actions: list[UnitResult] = field(default_factory=list)  # the promotion's or rollback's
    elapsed_s: float = 0.0  # judging time
    interrupted: bool = False
    dry_run: bool = False

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
    the canaries. Refused, naming why, without a router, with fewer than two replicas, with
    replicas of several routers, or when nothing differs (unless `restart`)."""
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
    if len(workers) < 2:
        raise UsageError(
            f"a canary needs at least 2 replicas behind one router; {len(workers)} selected",
            hint="add a replica, or use rollout",
        )
    changed = [u for u in workers if u.changes or restart]
    if not changed:
        raise UsageError(
            "no replica differs from the inventory: nothing to try",
            hint="change the inventory first, or pass --restart to try the same configuration",
        )
    if replicas >= len(workers):
        raise UsageError(
            f"--replicas {replicas} leaves no control among {len(workers)} replicas",
            hint=f"at most --replicas {len(workers) - 1}",
        )
    candidates = changed[:replicas]
    controls = [u for u in workers if u not in candidates]
    return CanaryPlan(routers[0], candidates, controls)


@dataclass
class _Read:
    """One replica's /metrics read: when, and the counts (None: not serving or unreadable)."""

    at: float
    counts: Counts | None
    serving: bool


def read_replica(host: Host, conn: Connection) -> _Read:
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
    return _Read(time.monotonic(), counts, serving)


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
    ) -> None:
        self.fleet, self.plan, self.catalog = fleet, plan, catalog
        self.available, self.options, self.events, self.cancel = available, options, events, cancel

    def run(self) -> CanaryReport:
        report = CanaryReport(self.plan)
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
        report.split = engine.run()
        if not all(r.outcome is UnitOutcome.REPLACED for r in report.split):
            report.decision, report.reason = Decision.FAILED, _split_failure(report.split)
            report.interrupted = self.cancel.is_set()
            return report
        verdict, reason, bad = self._judge(report)
        report.verdict, report.reason = verdict, reason
        if bad or self.cancel.is_set():
            report.decision = Decision.ROLLED_BACK
            report.interrupted = self.cancel.is_set()
            report.actions = self._roll_back(previous)
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

    def _judge(self, report: CanaryReport) -> tuple[Verdict | None, str, bool]:
        """Sample every replica each interval until the verdict is clear, `max_duration`
        passes or Ctrl-C: the verdict, why it ended, and whether to roll back."""
        options = self.options
        judge = Judge(
            options.metric, options.max_regression, options.confidence, options.min_samples
        )
        canaries = [u.rank0 for u in self.plan.candidates]
        controls = [u.rank0 for u in self.plan.controls]
        side = {h.label: "candidate" for h in canaries} | {h.label: "control" for h in controls}
        last: dict[str, _Read] = {}
        failed = {"candidate": 0, "control": 0}
        finished = {"candidate": 0, "control": 0}
        started = time.monotonic()
        verdict: Verdict | None = None
        replicas = [*canaries, *controls]
        rounds = status_rounds(
            lambda: self.fleet.run(read_replica, replicas), options.interval, stop=self.cancel
        )
        for reads in rounds:
            for result in reads:
                if result.value is None:
                    continue  # a host not read this round is not a crash: asked again next
                if side[result.name] == "candidate" and not result.value.serving:
                    return verdict, f"canary {result.name} crashed (not serving)", True
                if result.value.counts is None:
                    continue
                before = last.get(result.name)
                last[result.name] = result.value
                if before is None or before.counts is None:
                    continue
                seconds = result.value.at - before.at
                part = interval(before.counts, result.value.counts, seconds)
                who = side[result.name]
                failed[who] += part.aborted
                finished[who] += part.requests + part.aborted
                value = part.value(options.metric)
                if value is not None and part.requests > 0:
                    judge.add(who, Sample(part.running, value, part.requests, result.name))
            if _fails_more(failed, finished):
                return (
                    verdict,
                    (
                        f"the canaries failed {failed['candidate']} of {finished['candidate']} "
                        f"requests, the control {failed['control']} of {finished['control']}"
                    ),
                    True,
                )
            verdict = judge.verdict()
            report.verdict, report.elapsed_s = verdict, time.monotonic() - started
            self.events.emit(
                ev.CanaryProgress(
                    target=self.plan.router, samples=verdict.samples,
                    buckets={str(b.bucket): [b.control_n, b.candidate_n] for b in verdict.buckets},
                    estimate=verdict.estimate, low=verdict.low, high=verdict.high,
                    elapsed_s=report.elapsed_s,
                )
            )  # fmt: skip
            if verdict.state == "regression":
                return verdict, f"{options.metric} regressed", True
            if verdict.state == "no_regression":
                return verdict, f"no {options.metric} regression", False
            if report.elapsed_s >= options.max_duration:
                return verdict, f"inconclusive after {options.max_duration:g}s", False
        return verdict, "interrupted", True

    def _roll_back(self, previous: Sequence[Serving]) -> list[UnitResult]:
        """Each canary back on its previous run, drained out of its router first."""
        results = []
        options = self.options.rollout
        for unit in self.plan.candidates:
            labels = {p.host.label for p in unit.plans}
            mine = [s for s in previous if s.host.label in labels]
            result = UnitResult(unit.name, UnitOutcome.REPLACED)
            try:
                back = relaunch(
                    self.fleet, mine, self.catalog, restart_of={}, timeout=options.timeout,
                    stop_timeout=options.stop_timeout, events=self.events,
                    drain_timeout=options.drain_timeout,
                )  # fmt: skip
            except DeployctlError as exc:
                result.outcome, result.error = UnitOutcome.FAILED, exc.message
            else:
                if back.launch is None or not back.launch.ok:
                    result.outcome, result.error = UnitOutcome.FAILED, "previous run not back"
            results.append(result)
        return results


def _fails_more(failed: Mapping[str, int], finished: Mapping[str, int]) -> bool:
    """The canaries fail a larger share of their requests than the control does."""
    if failed["candidate"] == 0:
        return False
    rate = failed["candidate"] / max(finished["candidate"], 1)
    return rate > failed["control"] / max(finished["control"], 1)


def _split_failure(results: Sequence[UnitResult]) -> str:
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
    router = plan.candidates[0].router
    assert router is not None  # plan_canary refused replicas without one
    with router_locks(fleet, [router], "canary"):
        driven = drive([engine.run], 1, cancel)
    [future] = driven.futures
    report = future.result()
    report.interrupted = report.interrupted or driven.interrupted
    return report
