"""`tune --live`: the speculation threshold measured on the traffic a router's replicas
serve. One replica is relaunched with speculation always on, one without it (rollout's
engine: out of the router, drained, relaunched, back in); each interval both are read and
compared per load bucket as `canary` compares (deployctl.canary_stats); the live crossover
is the largest bucket where speculation is better beyond its interval, below the smallest
where it is worse. Then the threshold is rolled out to every replica, or (--no-promote, or
nothing decided) both replicas are put back on their previous runs. Ctrl-C puts them back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from deployctl import events as ev
from deployctl.canary_stats import BucketInterval, Judge, Sample
from deployctl.connection import Connection
from deployctl.crash import Catalog
from deployctl.errors import UsageError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet
from deployctl.inventory import Host
from deployctl.metrics import interval
from deployctl.ops.canary import (
    ROUTER_SILENT_ROUNDS,
    Read,
    put_back,
    read_replica,
    read_router,
    run_under_lock,
    split_failure,
)
from deployctl.ops.plan import Plan
from deployctl.ops.rollout import (
    Rollout,
    RolloutOptions,
    UnitOutcome,
    UnitPlan,
    UnitResult,
    plan_rollout,
)
from deployctl.ops.router import Select, router_of
from deployctl.ops.server import status_rounds
from deployctl.ops.serving import Serving, capture
from deployctl.patchset import PatchSet

# The judge's regression margin: not used here (each bucket's interval decides), only by
# the pooled estimate the progress line shows.
LIVE_MARGIN = 0.03


# ---- the live crossover (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class LiveCrossover:
    """Where speculation stops paying on the live traffic, from each bucket's interval of
    speculative ÷ plain (worse-ratio: > 1 speculation is worse)."""

    wins: tuple[int, ...]  # buckets where speculation is better beyond the interval
    losses: tuple[int, ...]  # buckets where it is worse beyond the interval
    undecided: tuple[int, ...]  # matched buckets whose interval holds 1
    reached: int  # the largest bucket both replicas served at (0: none)

    @property
    def first_loss(self) -> int | None:
        return self.losses[0] if self.losses else None

    @property
    def last_win(self) -> int | None:
        """The largest win below the first loss (a win past a loss a threshold cannot use)."""
        below = [b for b in self.wins if self.first_loss is None or b < self.first_loss]
        return below[-1] if below else None

    @property
    def threshold(self) -> int | None:
        """T: speculation on while the batch is at most T; None without a win and a loss."""
        return self.last_win if self.first_loss is not None else None

    @property
    def speculation(self) -> str:
        """ "threshold" (wins, then loses), "never", "always" (as far as the traffic went), or
        "undecided"."""
        if self.last_win is not None and self.first_loss is not None:
            return "threshold"
        if self.first_loss is not None:
            return "never"
        if self.wins:
            return "always"
        return "undecided"


def live_crossover(intervals: Sequence[BucketInterval]) -> LiveCrossover:
    ordered = sorted(intervals, key=lambda i: i.bucket)
    wins = tuple(i.bucket for i in ordered if i.high is not None and i.high < 1)
    losses = tuple(i.bucket for i in ordered if i.low is not None and i.low > 1)
    undecided = tuple(i.bucket for i in ordered if i.bucket not in (*wins, *losses))
    return LiveCrossover(wins, losses, undecided, ordered[-1].bucket if ordered else 0)


# ---- the window --------------------------------------------------------------------------------


@dataclass
class LiveOptions:
    interval: float = 2.0
    max_duration: float = 1800.0
    confidence: float = 0.95
    min_samples: int = 20
    promote: bool = True
    rollout: RolloutOptions = field(default_factory=lambda: RolloutOptions(what="tune --live"))


@dataclass
class LivePlan:
    """The two replicas of one router a live window compares, and how each replica would
    serve with a threshold T (the promotion)."""

    router: Host
    speculative: UnitPlan  # relaunched with speculation always on
    plain: UnitPlan  # relaunched without speculation
    tuned: Callable[[int], list[Plan]]  # every replica of the router with threshold T
    others: list[str] = field(default_factory=list)  # replicas left serving as they are


@dataclass
class LiveReport:
    plan: LivePlan
    options: LiveOptions
    started_at: float = 0.0
    split: list[UnitResult] = field(default_factory=list)
    intervals: list[BucketInterval] = field(default_factory=list)
    samples: dict[str, int] = field(default_factory=lambda: {"speculative": 0, "plain": 0})
    crossover: LiveCrossover | None = None
    decision: str = ""  # "promoted", "reported", "failed", "interrupted"
    reason: str = ""
    actions: list[UnitResult] = field(default_factory=list)  # the promotion's or put-back's
    elapsed_s: float = 0.0
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return self.decision in ("promoted", "reported") and all(a.ok for a in self.actions)


SIDE = {"speculative": "candidate", "plain": "control"}


class LiveTune:
    """One window: split, judge, then promote the threshold or put the two back."""

    def __init__(
        self,
        fleet: Fleet,
        plan: LivePlan,
        catalog: Catalog,
        available: Mapping[str, PatchSet],
        options: LiveOptions,
        events: EventSink,
        cancel: threading.Event,
    ) -> None:
        self.fleet, self.plan, self.catalog = fleet, plan, catalog
        self.available, self.options, self.events, self.cancel = available, options, events, cancel

    def run(self) -> LiveReport:
        report = LiveReport(self.plan, self.options, time.time())
        units = [self.plan.speculative, self.plan.plain]
        previous = [
            capture(p.host, s, self.available)
            for u in units
            for p, s in zip(u.plans, u.statuses, strict=True)
        ]
        report.split = Rollout(
            self.fleet, units, self.catalog, self.available, self._one_at_a_time(), self.events,
            self.cancel,
        ).run()  # fmt: skip
        if not all(r.outcome is UnitOutcome.REPLACED for r in report.split):
            report.decision, report.reason = "failed", split_failure(report.split)
            report.actions = self._put_back(units, previous, report.split)
            report.interrupted = self.cancel.is_set()
            return report
        failure = self._judge(report)
        crossover = report.crossover
        if self.cancel.is_set() or failure:
            report.decision = "interrupted" if self.cancel.is_set() else "failed"
            report.reason = failure or "interrupted"
            report.interrupted = self.cancel.is_set()
            report.actions = self._put_back(units, previous, report.split)
        elif self.options.promote and crossover is not None and crossover.threshold is not None:
            report.decision = "promoted"
            tuned = plan_rollout(
                self.fleet, self.plan.tuned(crossover.threshold), self.catalog, self.available,
                restart=False,
            )  # fmt: skip
            report.actions = Rollout(
                self.fleet, tuned, self.catalog, self.available, self._one_at_a_time(),
                self.events, self.cancel,
            ).run()  # fmt: skip
        else:
            report.decision = "reported"
            report.actions = self._put_back(units, previous, report.split)
        return report

    def _one_at_a_time(self) -> RolloutOptions:
        o = self.options.rollout
        return RolloutOptions(
            1, o.drain_timeout, o.stop_timeout, o.timeout, True, o.allow_downtime, o.what
        )

    def _put_back(
        self, units: Sequence[UnitPlan], previous: Sequence[Serving], split: Sequence[UnitResult]
    ) -> list[UnitResult]:
        o = self.options.rollout
        return put_back(
            self.fleet, units, previous, split, self.catalog, o.timeout, o.stop_timeout,
            o.drain_timeout, self.events,
        )  # fmt: skip

    def _judge(self, report: LiveReport) -> str:
        """Sample both replicas (and ask the router) each interval for `max_duration` (or
        until Ctrl-C), then judge each bucket once; "" or why the window failed."""
        options = self.options
        judge = Judge("throughput", LIVE_MARGIN, options.confidence, options.min_samples)
        speculative, plain = self.plan.speculative.rank0, self.plan.plain.rank0
        side = {speculative.label: "speculative", plain.label: "plain"}
        router = self.plan.router
        last: dict[str, Read] = {}
        started = time.monotonic()
        silent = 0  # rounds in a row the router has not answered

        def read(host: Host, conn: Connection) -> Read:
            if host.label == router.label:
                return read_router(host, conn)
            return read_replica(host, conn)

        rounds = status_rounds(
            lambda: self.fleet.run(read, [speculative, plain, router]),
            options.interval,
            stop=self.cancel,
        )
        for reads in rounds:
            for result in reads:
                now = result.value
                if result.name == router.label:
                    silent = silent + 1 if now is None or now.silence else 0
                    continue
                if now is None:
                    continue  # not read this round: asked again next
                if not now.serving:
                    return f"{result.name} ({side[result.name]}) stopped serving"
                before = last.get(result.name)
                if now.counts is None:
                    continue
                last[result.name] = now
                if before is None or before.counts is None:
                    continue
                part = interval(before.counts, now.counts, now.at - before.at)
                rate = part.value("throughput")
                if rate is not None and part.requests > 0:
                    who = side[result.name]
                    judge.add(SIDE[who], Sample(part.running, rate, part.requests, result.name))
                    report.samples[who] += 1
            if silent >= ROUTER_SILENT_ROUNDS:
                return f"router {router.label} stopped answering"
            report.elapsed_s = time.monotonic() - started
            progress = judge.verdict()
            self.events.emit(
                ev.CanaryProgress(
                    target=router.label, samples=progress.samples,
                    buckets={str(b.bucket): [b.control_n, b.candidate_n] for b in progress.buckets},
                    estimate=progress.estimate, low=progress.low, high=progress.high,
                    elapsed_s=report.elapsed_s,
                )
            )  # fmt: skip
            if report.elapsed_s >= options.max_duration:
                break
        # One look, at the window's end: the intervals hold for it, not for every round.
        report.intervals = judge.bucket_intervals()
        report.crossover = live_crossover(report.intervals)
        return ""


def choose_pair(targets: Sequence[Host], select: Select) -> tuple[Host, list[Host]]:
    """The router and its selected replicas, in inventory order, from the inventory alone
    (no host is asked): the first is the speculative one, the second the plain one. Refused
    with fewer than two, replicas of more than one router, or a multi-node replica."""
    behind = [(host, router_of(host, select)) for host in targets]
    replicas = [(host, router) for host, router in behind if router is not None]
    routers = {router.label: router for _, router in replicas}
    if len(routers) > 1:
        raise UsageError(
            "tune --live compares replicas of one router; these are behind "
            + ", ".join(sorted(routers)),
            hint="select one router's replicas with -H/-d",
        )
    if len(replicas) < 2:
        raise UsageError(
            f"tune --live compares two replicas behind one router: {len(replicas)} selected",
            hint="select a router's replicas (two or more) with -H/-d",
        )
    multi = next((h.label for h, _ in replicas if h.settings.nnodes > 1), None)
    if multi is not None:
        raise UsageError(
            f"{multi} is a multi-node server: tune --live compares single-node replicas"
        )
    [router] = routers.values()
    return router, [host for host, _ in replicas]


def tune_live(
    fleet: Fleet,
    plan: LivePlan,
    catalog: Catalog,
    available: Mapping[str, PatchSet],
    options: LiveOptions,
    events: EventSink = DISCARD,
) -> LiveReport:
    """Run the window with the router locked; Ctrl-C puts both replicas back (a second
    Ctrl-C leaves at once)."""
    cancel = threading.Event()
    engine = LiveTune(fleet, plan, catalog, available, options, events, cancel)
    return run_under_lock(fleet, plan.router, "tune --live", engine.run, cancel)
