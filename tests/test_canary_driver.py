"""`deployctl canary`'s driver (deployctl/ops/canary.py) with its remote steps faked: each
replica's /metrics scripted read by read, the split, promotion and rollback recorded instead of
run, and the record kept by the real agent call into a folder of the test. What the driver
decides from what it reads, what it puts back, and what it keeps on the router's host; the
same over real sshd hosts and the real router is in test_canary_lab.py."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deployctl import agent
from deployctl.canary_stats import BucketStat
from deployctl.errors import DeployctlError
from deployctl.fanout import FleetResult, HostResult, attempt
from deployctl.inventory import Host
from deployctl.metrics import Counts
from deployctl.ops import canary as driver
from deployctl.ops.canary import (
    Canary,
    CanaryOptions,
    CanaryPlan,
    CanaryReport,
    Decision,
    plan_canary,
)
from deployctl.ops.rollout import RolloutOptions, UnitOutcome, UnitResult
from deployctl.remote.records import cmd_canary_keep, cmd_canary_records
from tests.test_canary import units

# The histograms' upper bounds: a gap of `gap` seconds lands in the bucket it bounds, so an
# interval's median is the middle of that bucket (0.015 for 0.02, 0.03 for 0.04).
BOUNDS = (0.01, 0.02, 0.04, 0.08, math.inf)


@dataclass
class Replica:
    """One replica's cumulative /metrics; each read adds one interval of its traffic."""

    gap: float = 0.02  # where its inter-token gaps land
    ttft: float = 0.08  # where its times to first token land
    decodes: bool = True  # False: its requests finish with no token timed (a PD prefill's)
    done: int = 10  # requests finished per interval
    aborted: Callable[[int], int] = lambda _: 0  # requests aborted in the interval of read N
    serving: Callable[[int], bool] = lambda _: True
    running: float = 8.0
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, dict[float, float]] = field(default_factory=dict)

    def read(self, number: int) -> Counts:
        for name, amount in (
            ("num_requests_total", self.done),
            ("num_aborted_requests_total", self.aborted(number)),
            ("generation_tokens_total", 100 * self.done),
        ):
            self.counters[name] = self.counters.get(name, 0.0) + amount
        for name, gap in (
            ("inter_token_latency_seconds", self.gap),
            ("time_to_first_token_seconds", self.ttft),
        ):
            buckets = self.histograms.setdefault(name, dict.fromkeys(BOUNDS, 0.0))
            for bound in BOUNDS:
                buckets[bound] += 50 if bound >= gap and self.decodes else 0
        return Counts(
            {"num_running_reqs": self.running},
            dict(self.counters),
            {k: dict(v) for k, v in self.histograms.items()},
        )


class FakeFleet:
    """Runs each operation here, on no connection (every remote step is faked)."""

    def __init__(self, select: Callable[[str], list[Host]] | None = None) -> None:
        self.select = select or (lambda _: [])

    def run(self, operation: Callable[[Host, Any], Any], hosts: list[Host]) -> FleetResult[Any]:
        return FleetResult(attempt(h, lambda h=h: operation(h, None)) for h in hosts)

    def keep_agents(self) -> None:  # no connection, no agent
        pass


class Site:
    """The faked remote side of one canary: replicas read round by round, the rollouts and
    rollbacks asked for, and the router host's canary records (in `state_dir`)."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, state_dir: Path, replicas: dict[str, Replica]
    ) -> None:
        self.replicas, self.state_dir = replicas, state_dir
        self.rounds = 0
        self.cancel = threading.Event()
        self.max_rounds = 400  # a driver that never decides is interrupted here
        self.on_round: Callable[[int], None] = lambda _: None
        self.rollouts: list[tuple[list[str], RolloutOptions]] = []
        self.outcomes: list[list[UnitOutcome]] = []  # each rollout's, in turn (default: replaced)
        self.on_rollout: Callable[[int], None] = lambda _: None
        self.relaunched: list[list[str]] = []
        self.relaunch_fails: str | None = None  # "raise" or "not back"
        self.keeps: list[dict[str, Any]] = []
        self.keep_fails = False
        # Why the router does not answer in round N ("": it does).
        self.router_silence: Callable[[int], str] = lambda _: ""
        self.router_reads = 0
        self.unlisted = ""  # the rollback's relaunch not added to the router: why
        monkeypatch.setattr(driver, "read_replica", self.read)
        monkeypatch.setattr(driver, "read_router", self.read_router)
        monkeypatch.setattr(driver, "Rollout", self.rollout)
        monkeypatch.setattr(
            driver, "capture", lambda host, status, available: SimpleNamespace(host=host)
        )
        monkeypatch.setattr(driver, "relaunch", self.relaunch)
        monkeypatch.setattr(driver, "launched_run", lambda launch: launch.run)
        monkeypatch.setattr(agent, "call", self.call)

    def read(self, host: Host, conn: Any) -> Any:
        if host.label == next(iter(self.replicas)):
            self.rounds += 1
            self.on_round(self.rounds)
            if self.rounds >= self.max_rounds:
                self.cancel.set()
        replica = self.replicas[host.label]
        return driver.Read(
            2.0 * self.rounds, replica.read(self.rounds), replica.serving(self.rounds)
        )

    def read_router(self, host: Host, conn: Any) -> Any:
        assert host.label == "edge/router", host.label
        self.router_reads += 1
        silence = self.router_silence(self.rounds)
        return driver.Read(2.0 * self.rounds, None, not silence, silence)

    def rollout(self, fleet: Any, unit_plans: Any, *rest: Any) -> Any:
        options = rest[2]
        self.rollouts.append(([u.name for u in unit_plans], options))
        which = len(self.rollouts) - 1
        outcomes = self.outcomes[which] if which < len(self.outcomes) else []

        def run() -> list[UnitResult]:
            self.on_rollout(which)
            return [
                UnitResult(
                    u.name,
                    outcomes[i] if i < len(outcomes) else UnitOutcome.REPLACED,
                    old_run=f"old-{u.name}",
                    new_run=f"new-{u.name}",
                    error="no GPU" if i < len(outcomes) else "",
                )
                for i, u in enumerate(unit_plans)
            ]

        return SimpleNamespace(run=run)

    def relaunch(self, fleet: Any, mine: Any, catalog: Any, **options: Any) -> Any:
        labels = [s.host.label for s in mine]
        self.relaunched.append(labels)
        if self.relaunch_fails == "raise":
            raise DeployctlError("the previous run would not start")
        up = self.relaunch_fails != "not back"
        registrations = [SimpleNamespace(ok=not self.unlisted, error=self.unlisted)]
        launch = SimpleNamespace(
            up=up, ok=up and not self.unlisted, registrations=registrations, run=f"back-{labels[0]}"
        )
        return SimpleNamespace(launch=launch)

    def call(self, host: Host, conn: Any, name: str, args: Any) -> Any:
        args = {**args, "state_dir": str(self.state_dir)}
        if name == agent.CANARY_KEEP:
            self.keeps.append(args["record"])
            if self.keep_fails:
                raise DeployctlError("no space left on device")
            return cmd_canary_keep(args)
        assert name == agent.CANARY_RECORDS, name
        return cmd_canary_records(args)

    def kept(self) -> dict[int, dict[str, Any]]:
        folder = self.state_dir / "canaries"
        return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


def split_of(count: int, replicas: int = 1) -> CanaryPlan:
    """`count` replicas r0… of edge/router, all changed; the first `replicas` the canaries."""
    plans = units(count)
    for unit in plans:
        unit.statuses = [None]  # type: ignore[list-item]  # capture is faked
    return plan_canary(plans, replicas, restart=False)


def options(**more: Any) -> CanaryOptions:
    return CanaryOptions(**{"interval": 0.0, "max_duration": 600.0, **more})


def run(site: Site, plan: CanaryPlan, opts: CanaryOptions) -> CanaryReport:
    fleet: Any = FakeFleet()
    return Canary(fleet, plan, None, {}, opts, driver.DISCARD, site.cancel).run()  # type: ignore[arg-type]


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Site]:
    yield Site(monkeypatch, tmp_path, {})


def pair(site: Site, *candidates: Replica, controls: int = 2, gap: float = 0.02) -> None:
    site.replicas = {f"r{i}": replica for i, replica in enumerate(candidates)}
    for i in range(len(candidates), len(candidates) + controls):
        site.replicas[f"r{i}"] = Replica(gap=gap)


# ---- the decision -------------------------------------------------------------------------


def test_slower_canaries_are_each_put_back_on_their_own_previous_run(site: Site) -> None:
    pair(site, Replica(gap=0.04), Replica(gap=0.04), controls=2)
    report = run(site, split_of(4, replicas=2), options())
    assert report.verdict is not None and report.verdict.state == "regression"
    assert (report.decision, report.reason) == (Decision.ROLLED_BACK, "itl regressed")
    assert site.relaunched == [["r0"], ["r1"]]  # each canary with its own captured run
    assert [(a.name, a.outcome, a.old_run, a.new_run) for a in report.actions] == [
        ("r0", UnitOutcome.REPLACED, "new-r0", "back-r0"),
        ("r1", UnitOutcome.REPLACED, "new-r1", "back-r1"),
    ]
    assert [names for names, _ in site.rollouts] == [["r0", "r1"]]  # the split only: no promotion
    assert not report.ok and not report.interrupted


def test_the_split_replaces_the_canaries_one_at_a_time_even_when_they_match(site: Site) -> None:
    pair(site, Replica(gap=0.04))
    wide = RolloutOptions(max_unavailable=3, restart=False, what="canary")
    run(site, split_of(3), options(rollout=wide))
    [(names, split)] = site.rollouts
    assert names == ["r0"] and split.max_unavailable == 1 and split.restart


def test_an_equal_canary_is_promoted_by_rolling_out_the_controls_only(site: Site) -> None:
    pair(site, Replica())
    report = run(site, split_of(3), options())
    assert report.verdict is not None and report.verdict.state == "no_regression"
    assert (report.decision, report.reason) == (Decision.PROMOTED, "no itl regression")
    [_, (promoted, promotion)] = site.rollouts
    assert promoted == ["r1", "r2"]
    # The rest as `rollout` would: those that match already are skipped, not restarted.
    assert not promotion.restart and promotion.max_unavailable == 1
    assert site.relaunched == [] and report.ok
    assert [a.name for a in report.actions] == ["r1", "r2"]


def test_a_failed_promotion_is_not_ok(site: Site) -> None:
    pair(site, Replica())
    site.outcomes = [[], [UnitOutcome.FAILED]]
    report = run(site, split_of(3), options())
    assert report.decision is Decision.PROMOTED and not report.ok


def test_no_promote_keeps_the_canaries_serving_and_rolls_out_nothing(site: Site) -> None:
    pair(site, Replica())
    report = run(site, split_of(3), options(promote=False))
    assert report.decision is Decision.KEPT and report.ok
    assert len(site.rollouts) == 1 and site.relaunched == []


def test_a_canary_still_undecided_at_max_duration_is_kept_inconclusive(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Undecided(driver.Judge):
        def verdict(self) -> driver.Verdict:
            bucket = BucketStat(8, 30, 15, 0.015, 0.015, 1.0)
            return driver.Verdict("undecided", 1.0, 0.9, 1.1, [bucket], 45)

    monkeypatch.setattr(driver, "Judge", Undecided)
    pair(site, Replica())
    report = run(site, split_of(3), options(max_duration=0.0))
    assert report.verdict is not None and report.verdict.state == "undecided"
    assert (report.decision, report.reason) == (Decision.KEPT, "inconclusive after 0s")
    assert site.rounds == 1 and report.ok  # the first round's verdict, then it ends
    assert len(site.rollouts) == 1 and site.relaunched == []


def test_a_canary_with_nothing_to_compare_fails_and_is_put_back_never_kept(site: Site) -> None:
    """Canaries that yield no sample (here: no token timed, as a PD prefill's requests) are
    never `kept` or `ok`: at --max-duration, or as soon as the control has given about
    --min-samples samples a replica, the canary fails and the canaries go back."""
    pair(site, Replica(decodes=False))
    report = run(site, split_of(3), options(max_duration=0.0))
    assert (report.decision, report.reason) == (
        Decision.FAILED,
        "not judged: the canaries gave no itl sample while the control gave 0",
    )
    assert not report.ok and site.relaunched == [["r0"]] and site.rounds == 1
    kept = site.kept()[report.kept or 0]
    assert (kept["decision"], kept["samples"]) == ("failed", 0)
    assert [s["step"] for s in kept["steps"]] == ["split", "rollback"]

    site.relaunched.clear()
    pair(site, Replica(decodes=False))  # r1, r2: the control, each gives one sample a round
    report = run(site, split_of(3), options(min_samples=20))
    assert report.decision is Decision.FAILED and not report.ok, report.reason
    assert report.reason == "not judged: the canaries gave no itl sample while the control gave 40"
    assert site.relaunched == [["r0"]]


def test_a_canary_whose_samples_never_meet_the_controls_at_one_load_is_not_judged(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Apart(driver.Judge):
        def verdict(self) -> driver.Verdict:
            buckets = [
                BucketStat(8, 30, 0, 0.015, None, None),
                BucketStat(48, 0, 15, None, 0.03, None),
            ]
            return driver.Verdict("undecided", None, None, None, buckets, 0)

    monkeypatch.setattr(driver, "Judge", Apart)
    pair(site, Replica())
    report = run(site, split_of(3), options(max_duration=0.0))
    assert (report.decision, report.reason) == (
        Decision.FAILED,
        "not judged: no load bucket had samples of both sides in 0s",
    )
    assert not report.ok and site.relaunched == [["r0"]]


def test_a_router_that_stops_answering_fails_the_canary_naming_it(site: Site) -> None:
    """Its replicas get no traffic to judge: the canary ends (no `kept (inconclusive)` after
    judging idle replicas), the router named, and the canaries go back on their previous run
    (serving, not yet in the router: launching the router adds them)."""
    # It dies during round 4's interval: the requests in flight then abort on every replica
    # (more of the canary's, here), which is the router's doing, not the canary's.
    pair(site, Replica(aborted=lambda n: 5 if n == 4 else 0), controls=2)
    for control in list(site.replicas.values())[1:]:
        control.aborted = lambda n: 1 if n == 4 else 0
    site.router_silence = lambda n: "nothing answers on 127.0.0.1:30000" if n >= 5 else ""
    site.unlisted = "nothing answers on 127.0.0.1:30000"
    report = run(site, split_of(3), options(min_samples=10_000))
    assert (report.decision, report.reason) == (
        Decision.FAILED,
        "router edge/router stopped answering: nothing answers on 127.0.0.1:30000",
    )
    assert not report.ok and site.rounds == 6  # silent in rounds 5 and 6: ended
    assert site.relaunched == [["r0"]]
    [back] = report.actions
    assert (back.outcome, back.new_run) == (UnitOutcome.REPLACED, "back-r0")
    assert back.error == (
        "back on its previous run, not in its router: nothing answers on 127.0.0.1:30000"
    )
    assert len(site.rollouts) == 1  # the split only: nothing promoted


def test_a_router_silent_for_one_round_or_its_host_unread_once_is_judged_on(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair(site, Replica())
    site.router_silence = lambda n: "nothing answers on 127.0.0.1:30000" if n == 3 else ""
    report = run(site, split_of(3), options())
    assert report.decision is Decision.PROMOTED, report.reason
    assert site.router_reads == site.rounds  # asked every round
    # Its host not read, round after round: as good as silent.
    real = site.read_router

    def unread(host: Host, conn: Any) -> Any:
        if site.rounds >= 2:
            raise DeployctlError("cannot connect to edge: timed out")
        return real(host, conn)

    monkeypatch.setattr(driver, "read_router", unread)
    report = run(site, split_of(3), options())
    assert report.decision is Decision.FAILED and report.reason == (
        "router edge/router stopped answering: its host cannot be read: "
        "cannot connect to edge: timed out"
    ), report.reason


def test_the_judge_is_given_the_metric_and_min_samples(site: Site) -> None:
    # Same ITL, the candidate's TTFT twice the control's: only --metric ttft sees it.
    pair(site, Replica(ttft=0.08))
    for replica in list(site.replicas.values())[1:]:
        replica.ttft = 0.04
    report = run(site, split_of(3), options(metric="ttft", min_samples=90))
    assert report.decision is Decision.ROLLED_BACK and report.reason == "ttft regressed"
    assert report.verdict is not None and report.verdict.samples >= 90


# ---- faults: a crash, failed requests, Ctrl-C, a split that fails ----------------------------


def test_a_canary_that_stops_serving_is_rolled_back_at_once(site: Site) -> None:
    pair(site, Replica(serving=lambda n: n < 3))
    report = run(site, split_of(3), options())
    assert (report.decision, report.reason) == (
        Decision.ROLLED_BACK,
        "canary r0 crashed (not serving)",
    )
    assert site.rounds == 3 and site.relaunched == [["r0"]]


def test_a_control_that_stops_serving_is_not_taken_for_a_crashed_canary(site: Site) -> None:
    pair(site, Replica())
    site.replicas["r2"].serving = lambda n: n != 3
    report = run(site, split_of(3), options())
    assert report.decision is Decision.PROMOTED, report.reason


def test_canaries_failing_a_larger_share_of_requests_are_rolled_back(site: Site) -> None:
    # One abort in the canary's 4th interval, none in the control's: the share is counted
    # over every interval (10 + 10 + 10 + 10 finished, 1 aborted), not the last read alone.
    pair(site, Replica(aborted=lambda n: 1 if n == 5 else 0))
    report = run(site, split_of(3), options())
    # Counted once the router answers the round after (it did not die meanwhile).
    assert report.decision is Decision.ROLLED_BACK and site.rounds == 6
    assert report.reason == "the canaries failed 1 of 41 requests, the control 0 of 80"


def test_canaries_failing_no_more_than_the_control_are_judged_on(site: Site) -> None:
    # The same share of requests fails on both sides (and, next, only on the control).
    pair(site, Replica(aborted=lambda n: 1))
    for control in list(site.replicas.values())[1:]:
        control.aborted = lambda n: 1
    assert run(site, split_of(3), options()).decision is Decision.PROMOTED
    site.rollouts.clear()
    pair(site, Replica())
    for control in list(site.replicas.values())[1:]:
        control.aborted = lambda n: 1
    assert run(site, split_of(3), options()).decision is Decision.PROMOTED


def test_ctrl_c_while_judging_puts_the_canaries_back(site: Site) -> None:
    pair(site, Replica())
    site.max_rounds = 4
    report = run(site, split_of(3), options())
    assert (report.decision, report.reason) == (Decision.ROLLED_BACK, "interrupted")
    assert report.interrupted and not report.ok and site.relaunched == [["r0"]]
    assert len(site.rollouts) == 1


def test_ctrl_c_as_the_verdict_comes_puts_the_canaries_back_not_promotes(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Clear(driver.Judge):
        def verdict(self) -> driver.Verdict:
            return driver.Verdict("no_regression", 1.0, 0.99, 1.01, [], 40)

    monkeypatch.setattr(driver, "Judge", Clear)
    pair(site, Replica())
    site.max_rounds = 1  # Ctrl-C during the round that gives the clear verdict
    report = run(site, split_of(3), options())
    assert report.decision is Decision.ROLLED_BACK and report.interrupted
    assert len(site.rollouts) == 1 and site.relaunched == [["r0"]]


def test_a_split_that_fails_is_neither_judged_nor_rolled_back_again(site: Site) -> None:
    pair(site, Replica(), Replica(), controls=2)
    site.outcomes = [[UnitOutcome.REPLACED, UnitOutcome.FAILED]]
    report = run(site, split_of(4, replicas=2), options())
    assert (report.decision, report.reason) == (Decision.FAILED, "r1 failed: no GPU")
    assert site.rounds == 0 and site.relaunched == [] and not report.ok
    assert not report.interrupted


def test_ctrl_c_during_the_split_is_said(site: Site) -> None:
    pair(site, Replica())
    site.outcomes = [[UnitOutcome.UNDONE]]
    site.on_rollout = lambda _: site.cancel.set()
    report = run(site, split_of(3), options())
    assert report.decision is Decision.FAILED and report.interrupted and not report.ok


def test_a_canary_not_put_back_is_a_failed_rollback(site: Site) -> None:
    pair(site, Replica(gap=0.04))
    site.relaunch_fails = "raise"
    report = run(site, split_of(3), options())
    [back] = report.actions
    assert (back.outcome, back.error) == (UnitOutcome.FAILED, "the previous run would not start")
    site.relaunch_fails = "not back"
    pair(site, Replica(gap=0.04))
    [back] = run(site, split_of(3), options()).actions
    assert (back.outcome, back.error) == (UnitOutcome.FAILED, "previous run not back")


# ---- the record kept on the router's host -----------------------------------------------------


def test_the_record_is_kept_before_the_split_and_finished_under_the_same_number(
    site: Site,
) -> None:
    seen: list[dict[int, dict[str, Any]]] = []
    site.on_rollout = lambda which: seen.append(site.kept())
    pair(site, Replica(gap=0.04))
    report = run(site, split_of(3), options())
    [before_split] = seen  # the split (the rollback relaunches)
    assert [(n, r["state"], r["candidates"]) for n, r in before_split.items()] == [
        (1, "running", ["r0"])
    ]
    kept = site.kept()
    assert list(kept) == [1] and report.kept == 1
    assert (kept[1]["state"], kept[1]["decision"], kept[1]["verdict"]) == (
        "done", "rolled back", "regression",
    )  # fmt: skip
    assert [s["step"] for s in kept[1]["steps"]] == ["split", "rollback"]


def test_the_running_record_is_brought_up_to_date_while_judged(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver, "KEEP_EVERY_S", 0.0)
    seen: list[tuple[str, int]] = []
    site.on_round = lambda n: seen.extend(
        (r["state"], r["samples"]) for r in site.kept().values() if n == 6
    )
    pair(site, Replica())
    run(site, split_of(3), options())
    [(state, samples)] = seen
    assert state == "running" and samples > 0


@pytest.mark.usefixtures("fresh_boot_clock")  # no clock origin assumed: the first keep writes
def test_the_record_is_written_at_most_every_few_seconds(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A period no run of this test reaches, even on a loaded machine (5 s might be).
    monkeypatch.setattr(driver, "KEEP_EVERY_S", 3600.0)
    pair(site, Replica())
    run(site, split_of(3), options())
    assert site.rounds > 10
    assert [r["state"] for r in site.keeps] == ["running", "done"]  # created, then finished


def test_a_record_the_host_will_not_keep_is_said_and_judging_goes_on(site: Site) -> None:
    pair(site, Replica())
    site.keep_fails = True
    report = run(site, split_of(3), options())
    assert report.decision is Decision.PROMOTED and report.kept is None
    assert report.keep_error == "no space left on device"


def test_a_dry_run_keeps_no_record(site: Site) -> None:
    plan = split_of(3)
    fleet: Any = FakeFleet()
    canary = Canary(fleet, plan, None, {}, options(), driver.DISCARD, site.cancel)  # type: ignore[arg-type]
    canary._keep(CanaryReport(plan, dry_run=True), done=True)
    assert site.keeps == []
    canary._keep(CanaryReport(plan), done=True)  # a real one is kept
    assert len(site.keeps) == 1


# ---- Ctrl-C through the command's driver ---------------------------------------------------


def test_a_ctrl_c_the_driver_saw_leaves_the_canary_interrupted(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C while the promotion's last unit finished: the canary's own run ends promoted,
    # the command's driver saw the interrupt; the report says so (not ok, exit 1).
    import contextlib

    from deployctl.ops.driver import Driven

    real = driver.drive

    def drive(jobs: Any, workers: int, cancel: threading.Event) -> Driven[Any]:
        return Driven(real(jobs, workers, cancel).futures, True)

    monkeypatch.setattr(driver, "router_locks", lambda *_: contextlib.nullcontext())
    monkeypatch.setattr(driver, "drive", drive)
    pair(site, Replica())
    fleet: Any = FakeFleet()
    report = driver.canary(fleet, split_of(3), None, {}, options())  # type: ignore[arg-type]
    assert report.decision is Decision.PROMOTED
    assert report.interrupted and not report.ok


# ---- reading a replica, finding the routers and their records ---------------------------------


@pytest.mark.parametrize(
    ("reply", "serving", "read"),
    [
        ({"alive": True, "health": 200, "metrics": {"status": 200}}, True, True),
        ({"alive": True, "health": 503, "metrics": {"status": 200}}, False, True),
        ({"alive": False, "health": 200, "metrics": None}, False, False),
        ({"alive": True, "health": 200, "metrics": {"status": 500}}, True, False),
        ({"alive": True, "health": 200, "metrics": {"status": 200, "text": "{oops"}}, True, False),
    ],
)
def test_a_replica_serves_when_alive_and_healthy_and_is_read_from_a_good_page(
    monkeypatch: pytest.MonkeyPatch, reply: dict[str, Any], serving: bool, read: bool
) -> None:
    from tests.test_canary import page

    good = page(8, {0.02: 10, math.inf: 10}, 100, 5)
    if reply["metrics"] is not None:
        reply["metrics"].setdefault("text", good)
    monkeypatch.setattr(driver, "recorded_run", lambda host, conn, metrics: reply)
    found = driver.read_replica(Host("r0", {}), None)  # type: ignore[arg-type]
    assert found.serving is serving
    assert (found.counts is not None) is read
    if read:
        assert found.counts is not None and found.counts.running == 8


def test_the_routers_are_those_selected_and_those_the_replicas_name(site: Site) -> None:
    from deployctl.deployments import deployment_targets
    from deployctl.inventory import DEFAULT_VARS, Inventory
    from deployctl.ops.plan import plan_launch
    from deployctl.project import Project

    replica = Host("r0", {**DEFAULT_VARS, "model_path": "/m", "tp": 1, "router": "edge/router"})
    edge = Host("edge", {**DEFAULT_VARS, "deployments": {"router": {"template": "router"}}})
    inv = Inventory({"r0": replica, "edge": edge}, {"all": ["r0", "edge"]}, "t")
    targets = deployment_targets([replica, edge], resolve=inv.select)
    plans = plan_launch(Project(None), targets, None, None, [], {})
    fleet: Any = FakeFleet(inv.select)
    assert [r.label for r in driver.routers_of(fleet, plans)] == ["edge/router"]
    router_only = [p for p in plans if p.host.name == "edge"]
    assert [r.label for r in driver.routers_of(fleet, router_only)] == ["edge/router"]


def test_report_n_finds_that_canary_on_the_routers_host(site: Site) -> None:
    plan = split_of(2)
    router = plan.candidates[0].router
    assert router is not None
    for samples in (10, 20, 30):
        record = driver.canary_record(CanaryReport(plan), done=True)
        cmd_canary_keep(
            {"state_dir": str(site.state_dir), "number": None, "record": {**record, "router": router.label, "samples": samples}}
        )  # fmt: skip
    fleet: Any = FakeFleet()
    [second] = driver.find_canaries(fleet, [router], 2)
    assert isinstance(second, HostResult) and second.value is not None
    assert second.value.record is not None and second.value.record["samples"] == 20
    assert second.value.numbers == [1, 2, 3]
    [missing] = driver.find_canaries(fleet, [router], 7)
    assert missing.value is not None and missing.value.record is None
    assert missing.value.missing == "no canary 7 is kept here (kept: 1, 2, 3)"
