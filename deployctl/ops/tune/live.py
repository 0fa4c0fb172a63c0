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
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from deployctl import agent
from deployctl import events as ev
from deployctl.canary_stats import (
    CUDA_GRAPH_SIZES,
    MIN_CELL,
    BucketInterval,
    Judge,
    Sample,
    bucket_index,
    interval_sample,
)
from deployctl.choices import SpeculationPolicy
from deployctl.connection import Connection
from deployctl.crash import Catalog
from deployctl.errors import UsageError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet, FleetResult
from deployctl.inventory import Host
from deployctl.metrics import Spans
from deployctl.ops.canary import (
    ROUTER_SILENT_ROUNDS,
    Keeper,
    Read,
    put_back,
    read_replica,
    read_router,
    run_under_lock,
    split_failure,
)
from deployctl.ops.kept import Kept
from deployctl.ops.plan import Plan
from deployctl.ops.rollout import (
    Rollout,
    RolloutOptions,
    UnitOutcome,
    UnitPlan,
    UnitResult,
    plan_rollout,
)
from deployctl.ops.rounds import status_rounds
from deployctl.ops.router import Select, router_of
from deployctl.ops.serving import Serving, capture
from deployctl.ops.tune.race import PolicyRace, RaceResult
from deployctl.ops.tune.search import Phase
from deployctl.ops.tune.tuner import TunePlan, decode_graph_sizes
from deployctl.patchset import PatchSet
from deployctl.remote.measures import EndLook, LiveRecord, LiveRecordsArgs, LiveSample
from deployctl.render import ADAPTIVE_FLAG

# The judge's regression margin: not used here (each bucket's interval decides), only by
# the pooled estimate the progress line shows.
LIVE_MARGIN = 0.03

# What a window's crossover says of speculation, what it says of a threshold set elsewhere, and
# how the window ended: the words `tune --live --json` has (its schema's enums).
Speculation = Literal["threshold", "never", "always", "undecided"]
ThresholdVerdict = Literal["agrees", "too high", "too low"]
LiveDecision = Literal["promoted", "reported", "failed", "interrupted"]


# ---- the live crossover (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class LiveCrossover:
    """Where speculation stops paying on the live traffic, from each bucket's interval of
    speculative ÷ plain (worse-ratio: > 1 speculation is worse)."""

    wins: tuple[int, ...]  # buckets where speculation is better beyond the interval
    losses: tuple[int, ...]  # buckets where it is worse beyond the interval
    undecided: tuple[int, ...]  # matched buckets whose interval holds 1
    reached: int  # the largest bucket both replicas served at (0: none)
    sizes: tuple[int, ...] = CUDA_GRAPH_SIZES  # the buckets there are (the width counts them)

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
    def speculation(self) -> Speculation:
        """ "threshold" (wins, then loses), "never", "always" (as far as the traffic went), or
        "undecided"."""
        if self.last_win is not None and self.first_loss is not None:
            return "threshold"
        if self.first_loss is not None:
            return "never"
        if self.wins:
            return "always"
        return "undecided"

    @property
    def width(self) -> int | None:
        """The bracket's width in buckets (1: T and the first loss are neighbours); None
        without a threshold."""
        if self.last_win is None or self.first_loss is None:
            return None
        return bucket_index(self.first_loss, self.sizes) - bucket_index(self.last_win, self.sizes)

    def judge(self, threshold: int) -> ThresholdVerdict | None:
        """A threshold set elsewhere (a synthetic tune's) against this traffic: "too high"
        (it speculates at a bucket speculation lost), "too low" (it stops below a bucket
        speculation won), "agrees", or None when nothing was decided."""
        if self.first_loss is not None and threshold >= self.first_loss:
            return "too high"
        if self.last_win is not None and threshold < self.last_win:
            return "too low"
        return "agrees" if self.first_loss is not None or self.last_win is not None else None


def live_crossover(
    intervals: Sequence[BucketInterval], sizes: Sequence[int] = CUDA_GRAPH_SIZES
) -> LiveCrossover:
    ordered = sorted(intervals, key=lambda i: i.bucket)
    wins = tuple(i.bucket for i in ordered if i.high is not None and i.high < 1)
    losses = tuple(i.bucket for i in ordered if i.low is not None and i.low > 1)
    undecided = tuple(i.bucket for i in ordered if i.bucket not in (*wins, *losses))
    reached = ordered[-1].bucket if ordered else 0
    return LiveCrossover(wins, losses, undecided, reached, tuple(sorted(sizes)))


# ---- the window --------------------------------------------------------------------------------


@dataclass
class LiveOptions:
    interval: float = 2.0
    max_duration: float = 1800.0  # each window's: the crossover's, then the race's
    confidence: float = 0.95
    min_samples: int = 20
    promote: bool = True
    rollout: RolloutOptions = field(default_factory=lambda: RolloutOptions(what="tune --live"))
    # Raced after the crossover, one replica each, in the selected replicas' order.
    policies: tuple[SpeculationPolicy, ...] = ()
    threshold: int | None = None  # race this T: no crossover window first
    # End the crossover window once the bracket is this many CUDA-graph buckets wide (0:
    # run it whole, one look at the end).
    precision: int = 1
    resume: LiveRecord | None = None  # a kept window whose samples this one starts from


@dataclass
class LivePlan:
    """The replicas of one router a live window compares, and how every selected replica
    would serve under each policy (the race, then the promotion)."""

    router: Host
    speculative: UnitPlan | None  # relaunched with speculation always on (None: T given)
    plain: UnitPlan | None  # relaunched without speculation
    # Every selected replica's plan, in order, under a policy (with threshold T).
    serving: Callable[[SpeculationPolicy, int], list[Plan]]
    others: list[str] = field(default_factory=list)  # replicas left serving as they are

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        """The buckets samples are judged in: the decode CUDA-graph sizes the replicas pad a
        batch to, from the speculative command (SGLang's default sizes as bins when it runs
        without graphs or their padding). Read once: every keep of the record says them."""
        unit = self.speculative
        plan = unit.plans[0] if unit else self.serving(SpeculationPolicy.THRESHOLD, 1)[0]
        return decode_graph_sizes(plan.values) or CUDA_GRAPH_SIZES

    replicas: list[Host] = field(default_factory=list)  # every selected replica, in order

    @property
    def inventory_threshold(self) -> int | None:
        """The replicas' `threshold` in the inventory (what `tune` wrote from a synthetic
        bench): the first replica's that has one."""
        return next((h.settings.threshold for h in self.replicas if h.settings.threshold), None)


@dataclass
class LiveReport:
    plan: LivePlan
    options: LiveOptions
    started_at: float = 0.0
    split: list[UnitResult] = field(default_factory=list)
    intervals: list[BucketInterval] = field(default_factory=list)
    samples: dict[str, int] = field(default_factory=lambda: {"speculative": 0, "plain": 0})
    crossover: LiveCrossover | None = None
    threshold: int | None = None  # the crossover's T, or the one given to race
    precise: bool = False  # the crossover window ended early: its bracket reached --precision
    race_split: list[UnitResult] = field(default_factory=list)
    race: RaceResult | None = None
    kept: SpeculationPolicy | None = None  # what serves after (promoted, or would be)
    decision: LiveDecision | Literal[""] = ""  # "": the window has not ended
    reason: str = ""
    actions: list[UnitResult] = field(default_factory=list)  # the promotion's or put-back's
    elapsed_s: float = 0.0
    interrupted: bool = False
    window: int | None = None  # the number its record is kept as on the router's host
    keep_error: str = ""  # why the record could not be kept there

    @property
    def ok(self) -> bool:
        return self.decision in ("promoted", "reported") and all(a.ok for a in self.actions)


SIDE = {"speculative": "candidate", "plain": "control"}


class LiveTune:
    """One window (or two): split, judge, race the policies, then promote what won or put
    every replica touched back."""

    def __init__(
        self,
        fleet: Fleet,
        plan: LivePlan,
        catalog: Catalog,
        available: Mapping[str, PatchSet],
        options: LiveOptions,
        events: EventSink,
        cancel: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fleet, self.plan, self.catalog = fleet, plan, catalog
        self.available, self.options, self.events, self.cancel = available, options, events, cancel
        self.clock = clock  # what a window's elapsed time and --max-duration are read by
        self.touched: dict[str, UnitPlan] = {}  # every unit relaunched, by name
        self.previous: dict[str, Serving] = {}  # what each of their hosts served before
        self.keeper = Keeper(fleet, plan.router, agent.LIVE_KEEP)
        resumed = options.resume
        self.samples: list[LiveSample] = list(resumed["samples"]) if resumed else []

    def run(self) -> LiveReport:
        report = LiveReport(self.plan, self.options, time.time())
        if self.options.resume is not None:
            report.elapsed_s = self.options.resume["elapsed_s"]
        try:
            return self._run(report)
        finally:
            if self.keeper.last is not None:  # finish the record the window started
                self._keep(report, done=True)

    def _keep(self, report: LiveReport, done: bool = False) -> None:
        """Keep the crossover window's record (its samples: what --resume starts from)."""
        if self.plan.speculative is None or self.plan.plain is None:
            return  # a race of a given T has no crossover window to keep
        self.keeper.keep(lambda number: live_record(report, self.samples, number, done), done)
        report.window, report.keep_error = self.keeper.number, self.keeper.error

    def _run(self, report: LiveReport) -> LiveReport:
        report.threshold = self.options.threshold
        failure = ""
        if report.threshold is None:
            failure = self._crossover(report)
            if report.crossover is not None:
                report.threshold = report.crossover.threshold
        if not failure and self.options.policies and not self.cancel.is_set():
            if report.threshold is None:
                report.reason = "no threshold to race: " + _no_threshold(report.crossover)
            else:
                failure = self._race(report, report.threshold)
        elif report.threshold is not None and not failure:
            report.kept = SpeculationPolicy.THRESHOLD
        if self.cancel.is_set() or failure:
            report.decision = "interrupted" if self.cancel.is_set() else "failed"
            report.reason = failure or "interrupted"
            report.interrupted = self.cancel.is_set()
            report.kept = None
            report.actions = self._put_back(report)
        elif self.options.promote and report.kept is not None and report.threshold is not None:
            report.decision = "promoted"
            kept = plan_rollout(
                self.fleet, self.plan.serving(report.kept, report.threshold), self.catalog,
                self.available, restart=False,
            )  # fmt: skip
            report.actions = self._rollout(kept)
        else:
            report.decision = "reported"
            report.actions = self._put_back(report)
        return report

    def _relaunch(self, units: Sequence[UnitPlan]) -> list[UnitResult]:
        """Relaunch `units` one at a time, first keeping what their hosts serve now (the
        first time each is touched: what put-back restores)."""
        for unit in units:
            for plan, status in zip(unit.plans, unit.statuses, strict=True):
                if plan.host.label not in self.previous:
                    self.previous[plan.host.label] = capture(plan.host, status, self.available)
        fresh = [u.name for u in units if u.name not in self.touched]
        self.touched.update((u.name, u) for u in units)
        results = self._rollout(units)
        for result in results:  # one already serving its policy needs no putting back
            if result.outcome is UnitOutcome.SKIPPED and result.name in fresh:
                del self.touched[result.name]
        return results

    def _rollout(self, units: Sequence[UnitPlan]) -> list[UnitResult]:
        o = self.options.rollout
        one_at_a_time = RolloutOptions(
            1, o.drain_timeout, o.stop_timeout, o.timeout, True, o.allow_downtime, o.what
        )
        return Rollout(
            self.fleet, units, self.catalog, self.available, one_at_a_time, self.events,
            self.cancel,
        ).run()  # fmt: skip

    def _put_back(self, report: LiveReport) -> list[UnitResult]:
        o = self.options.rollout
        return put_back(
            self.fleet, list(self.touched.values()), list(self.previous.values()),
            [*report.split, *report.race_split], self.catalog, o.timeout, o.stop_timeout,
            o.drain_timeout, self.events,
        )  # fmt: skip

    def _crossover(self, report: LiveReport) -> str:
        """The first window: speculation always on against none; "" or why it failed."""
        speculative, plain = self.plan.speculative, self.plan.plain
        assert speculative is not None and plain is not None  # planned when no T is given
        report.split = self._relaunch([speculative, plain])
        if not all(r.outcome is UnitOutcome.REPLACED for r in report.split):
            return split_failure(report.split)
        options = self.options
        sizes = self.plan.sizes
        judge = window_judge(options.confidence, options.min_samples, sizes)
        sides = {speculative.rank0.label: "speculative", plain.rank0.label: "plain"}

        def add(side: str, sample: Sample) -> None:
            judge.add(SIDE[side], sample)
            report.samples[side] += 1
            self.samples.append(
                LiveSample(side=side, running=sample.running, value=sample.value,
                           requests=sample.requests, source=sample.source)
            )  # fmt: skip

        for kept in list(self.samples):  # a resumed window's evidence first
            judge.add(SIDE[kept["side"]], sample_of(kept))
            report.samples[kept["side"]] += 1
        self._keep(report)

        def each_round(elapsed: float) -> None:
            now = judge.verdict()
            self.events.emit(
                ev.CanaryProgress(
                    target=self.plan.router.label, samples=now.samples,
                    buckets={str(b.bucket): [b.control_n, b.candidate_n] for b in now.buckets},
                    estimate=now.estimate, low=now.low, high=now.high, elapsed_s=elapsed,
                )
            )  # fmt: skip
            self._keep(report)

        share = error_share(options)

        def enough() -> bool:
            if not options.precision:
                return False
            width = live_crossover(judge.bucket_sequences(share, MIN_CELL), sizes).width
            report.precise = width is not None and width <= options.precision
            return report.precise

        failure = self._window(report, sides, add, each_round, enough)
        if not failure:
            report.intervals = end_look_intervals(judge, end_look(report))
            report.crossover = live_crossover(report.intervals, sizes)
        return failure

    def _race(self, report: LiveReport, threshold: int) -> str:
        """The policies on one replica each, judged on the same traffic; sets the kept
        policy. "" or why it failed."""
        policies = self.options.policies
        serving = {p: self.plan.serving(p, threshold) for p in policies}
        plans = [serving[p][i] for i, p in enumerate(policies)]
        units = plan_rollout(self.fleet, plans, self.catalog, self.available, restart=False)
        report.race_split = self._relaunch(units)
        done = (UnitOutcome.REPLACED, UnitOutcome.SKIPPED)  # the plain replica stays plain
        if not all(r.outcome in done for r in report.race_split):
            return split_failure(report.race_split)
        race = PolicyRace([str(p) for p in policies], self.options.confidence,
                          self.options.min_samples, self.plan.sizes)  # fmt: skip
        sides = {plan.host.label: str(p) for plan, p in zip(plans, policies, strict=True)}

        def each_round(elapsed: float) -> None:
            counts: dict[str, list[int]] = {}
            for row in race.result().buckets:
                counts[str(row.bucket)] = [row.samples[str(p)] for p in policies]
            self.events.emit(
                ev.RaceProgress(
                    target=self.plan.router.label, policies=tuple(map(str, policies)),
                    buckets=counts, elapsed_s=elapsed,
                )
            )  # fmt: skip

        failure = self._window(report, sides, race.add, each_round, lambda: False)
        if failure:
            return failure
        report.race = race.result()
        overall = report.race.overall
        if overall.decided and overall.winner is not None:
            report.kept = SpeculationPolicy(overall.winner)
        elif SpeculationPolicy.THRESHOLD in policies:  # the crossover's evidence stands
            report.kept = SpeculationPolicy.THRESHOLD
            report.reason = "the race did not separate the policies: the threshold is kept"
        else:
            report.reason = "the race did not separate the policies: nothing changes"
        return ""

    def _window(
        self,
        report: LiveReport,
        sides: Mapping[str, str],
        add: Callable[[str, Sample], None],
        each_round: Callable[[float], None],
        enough: Callable[[], bool],
    ) -> str:
        """Sample the replicas of `sides` (label -> side) and ask the router each interval
        for `max_duration` (or until Ctrl-C, or `enough`); "" or why the window failed."""
        options = self.options
        router = self.plan.router
        replicas = [h for h in self.plan.replicas if h.label in sides]
        spans = Spans()
        before_window, started = report.elapsed_s, self.clock()
        silent = 0  # rounds in a row the router has not answered

        def read(host: Host, conn: Connection) -> Read:
            if host.label == router.label:
                return read_router(host, conn)
            return read_replica(host, conn)

        self.fleet.keep_agents()  # a read a round for minutes: one agent process per host
        rounds = status_rounds(
            lambda: self.fleet.run(read, [*replicas, router]),
            options.interval,
            stop=self.cancel,
            clock=self.clock,
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
                    return f"{result.name} ({sides[result.name]}) stopped serving"
                if now.counts is None:
                    continue
                part = spans.add(result.name, now.at, now.counts)
                sample = interval_sample(part, "throughput", result.name)
                if sample is not None:
                    add(sides[result.name], sample)
            if silent >= ROUTER_SILENT_ROUNDS:
                return f"router {router.label} stopped answering"
            elapsed = self.clock() - started
            report.elapsed_s = before_window + elapsed  # the windows' lengths, summed
            each_round(elapsed)
            if elapsed >= options.max_duration or enough():
                break
        return ""


def error_share(options: LiveOptions) -> float:
    """With --precision the window looks every round (always-valid intervals) and may end
    early: half the error rate goes to those looks, half to the one at the end."""
    return 0.5 if options.precision else 1.0


def end_look(report: LiveReport) -> EndLook:
    """The window's last look. A resumed window's end is one look more at samples already
    looked at: it too takes the always-valid intervals."""
    always_valid = report.precise or report.options.resume is not None
    return EndLook(always_valid=always_valid, error_share=error_share(report.options))


def end_look_intervals(judge: Judge, look: EndLook) -> list[BucketInterval]:
    if look["always_valid"]:
        return judge.bucket_sequences(look["error_share"], MIN_CELL)
    return judge.bucket_intervals(look["error_share"], MIN_CELL)


def sample_of(kept: LiveSample) -> Sample:
    return Sample(kept["running"], kept["value"], kept["requests"], kept["source"])


def live_record(
    report: LiveReport, samples: list[LiveSample], number: int | None, done: bool
) -> LiveRecord:
    """The crossover window's record as kept on the router's host."""
    plan, resumed = report.plan, report.options.resume
    assert plan.speculative is not None and plan.plain is not None
    record = LiveRecord(
        window=number, router=plan.router.label, state="done" if done else "running",
        started_at=report.started_at, updated_at=time.time(),
        speculative=plan.speculative.name, plain=plan.plain.name,
        confidence=report.options.confidence,
        resumed=[*resumed["resumed"], resumed["window"] or 0] if resumed else [],
        samples=samples, sizes=list(plan.sizes), decision=report.decision if done else None,
        threshold=report.crossover.threshold if report.crossover else None,
        elapsed_s=report.elapsed_s,
    )  # fmt: skip
    if done and report.crossover:
        record["end_look"] = end_look(report)
    return record


def window_judge(confidence: float, min_samples: int, sizes: Sequence[int]) -> Judge:
    """The crossover window's judge: speculative (candidate) against plain (control) output
    tokens/s per running request, per bucket of `sizes`, the load adjusted for."""
    return Judge("throughput", LIVE_MARGIN, confidence, min_samples, adjust_load=True, sizes=sizes)


def check_resumable(record: LiveRecord, sizes: tuple[int, ...]) -> None:
    """Refuse to add to a kept window whose samples were bucketed by other CUDA-graph sizes:
    they came from servers that padded batches otherwise."""
    kept = record_sizes(record)
    if record.get("sizes") and kept != sizes:
        raise UsageError(
            f"window {record['window']} was bucketed by CUDA-graph sizes {list(kept)}; the "
            f"replicas now capture {list(sizes)}: its samples came from servers that padded "
            "batches otherwise",
            hint="start a new window (no --resume)",
        )


def record_sizes(record: LiveRecord) -> tuple[int, ...]:
    """The buckets a kept window's samples are judged in (SGLang's sizes for a record kept
    before windows said theirs)."""
    return tuple(sorted(record.get("sizes") or CUDA_GRAPH_SIZES))


def rejudge(record: LiveRecord) -> list[BucketInterval]:
    """A kept window's buckets judged from its samples. A window that ended is shown as its
    end look judged it: the same samples, the same look, so no look more. A running one (or
    one kept before records said their end look) takes always-valid intervals: a report of
    it is one look more."""
    judge = window_judge(record["confidence"], 0, record_sizes(record))
    for kept in record["samples"]:
        judge.add(SIDE[kept["side"]], sample_of(kept))
    ended = record.get("end_look") if record["state"] == "done" else None
    return end_look_intervals(judge, ended or EndLook(always_valid=True, error_share=1.0))


KeptLive = Kept[LiveRecord]


def find_live(fleet: Fleet, routers: Sequence[Host], number: int | None) -> FleetResult[KeptLive]:
    """Each router's kept live window `number` (None: its newest), from the router's host."""

    def lookup(host: Host, conn: Connection) -> KeptLive:
        args = LiveRecordsArgs(state_dir=host.settings.state_dir, router=host.label, number=number)
        reply = agent.call(host, conn, agent.LIVE_RECORDS, args)
        return Kept("tune --live", reply["record"], reply["numbers"], reply["unreadable"], number)

    return fleet.run(lookup, routers)


def _no_threshold(crossover: LiveCrossover | None) -> str:
    if crossover is None:
        return "no crossover was measured"
    return {
        "never": "speculation lost at every bucket it was judged",
        "always": f"speculation won as far as the traffic went (bucket {crossover.reached})",
    }.get(crossover.speculation, "no bucket was decided")


def policy_plan(tune: TunePlan, policy: SpeculationPolicy, threshold: int) -> Plan:
    """One replica's plan under a policy: its tune's run with threshold T, its speculative
    run under SGLang's own adaptive speculation (no config: SGLang's default), or its
    baseline."""
    if policy is SpeculationPolicy.OFF:
        return tune.tuned(None, False)
    if policy is SpeculationPolicy.THRESHOLD:
        return tune.tuned(threshold, True)
    speculative = tune.plans[Phase.SPECULATIVE]
    rendered = speculative.rendered
    if ADAPTIVE_FLAG in rendered.argv:
        return speculative
    adaptive = replace(
        rendered, template=f"{rendered.template}-adaptive", argv=[*rendered.argv, ADAPTIVE_FLAG]
    )
    return replace(speculative, rendered=adaptive)


def kept_window(
    fleet: Fleet, router: Host, number: int, speculative: Host, plain: Host
) -> LiveRecord:
    """Kept window `number` of the router, to resume: it must have compared the same two
    replicas, in the same roles."""
    [found] = find_live(fleet, [router], number)
    if found.value is None:
        raise UsageError(f"{router.label}: window {number} cannot be read: {found.error}")
    record = found.value.record
    if record is None:
        raise UsageError(f"{router.label}: {found.value.missing}", hint="tune --live --report")
    if (record["speculative"], record["plain"]) != (speculative.label, plain.label):
        raise UsageError(
            f"window {number} compared {record['speculative']} (speculative) and "
            f"{record['plain']} (plain); these are {speculative.label} and {plain.label}",
            hint="select the same replicas, in the same order",
        )
    return record


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
    if options.resume is not None:
        check_resumable(options.resume, plan.sizes)
    cancel = threading.Event()
    engine = LiveTune(fleet, plan, catalog, available, options, events, cancel)
    return run_under_lock(fleet, plan.router, "tune --live", engine.run, cancel)
