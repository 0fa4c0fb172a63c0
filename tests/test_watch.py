"""watch's rounds (ops/watch.py): the policies' decisions acted on, with in-memory statuses
and fake actions for the relaunch and the renewal. Pure: no host."""

from __future__ import annotations

from typing import cast

from deployctl import events as ev
from deployctl.disaggregation import PrefillLoss, TransferWatch
from deployctl.errors import DeployctlError
from deployctl.events import Collect
from deployctl.fanout import FleetResult, HostResult
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.ops.renewal import Renewal
from deployctl.ops.runs import LaunchReport, Replacement, RunStatus, StopResult, Unit
from deployctl.ops.supervision import CrashRestarts, PdPairs, PdSide, RenewBeforeLimit
from deployctl.ops.watch import Supervisor
from tests.test_supervision import DECODE, DIED, NO_PAIR, PREFILL, crashed, job, status


class Fakes:
    """The actions a round takes, recorded instead of done."""

    def __init__(self, stop_fails: bool = False) -> None:
        self.relaunched: list[str] = []
        self.renewed: list[str] = []
        self.stop_fails = stop_fails

    def relaunch(self, unit: Unit) -> Replacement:
        self.relaunched.append(unit.name)
        if self.stop_fails:
            host = unit.nodes[0].host
            failed = HostResult[StopResult](host, exception=DeployctlError("stop hung"))
            return Replacement(FleetResult([failed]), None)
        return Replacement(FleetResult([]), LaunchReport(FleetResult([]), FleetResult([]), True))

    def renew(self, host: Host, status: RunStatus) -> Renewal:
        assert status.run is not None
        self.renewed.append(status.run["id"])
        return Renewal(status.run["id"], LaunchReport(FleetResult([]), FleetResult([]), True))


def supervisor(
    fakes: Fakes,
    sides: dict[str, PdSide] | None = None,
    renew_before: float | None = None,
    max_restarts: int = 3,
) -> tuple[Supervisor, Collect]:
    seen = Collect()
    watching = Supervisor(
        restarts=CrashRestarts(max_restarts, window=600, interval=5),
        pairs=PdPairs(PrefillLoss(60), TransferWatch(60)),
        renewals=None if renew_before is None else RenewBeforeLimit(renew_before),
        side_of=lambda unit: (sides or {}).get(unit.name, NO_PAIR),
        relaunch=fakes.relaunch,
        renew=fakes.renew,
        events=seen,
        clock=lambda: 100.0,
    )
    return watching, seen


def look(
    *targets: tuple[str, RunStatus | Exception], router: str | None = None
) -> FleetResult[RunStatus]:
    """One round's statuses, each target a host of its own."""
    variables = {**DEFAULT_VARS, **({"router": router} if router else {})}
    results = [
        HostResult(Host(name, dict(variables)), exception=value)
        if isinstance(value, Exception)
        else HostResult(Host(name, dict(variables)), value)
        for name, value in targets
    ]
    return FleetResult(cast(list[HostResult[RunStatus]], results))


def kinds(seen: Collect) -> list[tuple[str, str]]:
    return [(e.kind, e.target) for e in seen.events]


def test_a_decode_whose_prefill_died_in_the_same_round_is_held_and_the_prefill_restarted() -> None:
    fakes = Fakes()
    sides = {"d0": DECODE, "p0": PREFILL}
    watching, seen = supervisor(fakes, sides)
    # The decode comes first: the prefill's death is noted before any unit is judged.
    assert watching.round(look(("d0", crashed("kv-transfer")), ("p0", DIED)))
    assert fakes.relaunched == ["p0"]
    assert kinds(seen) == [
        ("decode_held", "d0"), ("restarting", "p0"), ("replaced", "p0"),
    ]  # fmt: skip


def test_a_crash_loop_is_given_up_and_ends_the_watch_once_nothing_is_left() -> None:
    fakes = Fakes()
    watching, seen = supervisor(fakes, max_restarts=1)
    assert watching.round(look(("a", DIED), ("b", status())))
    watching.restarts.next_try.clear()  # its backoff is CrashRestarts' own test
    assert watching.round(look(("a", DIED), ("b", status())))  # b still runs
    assert fakes.relaunched == ["a"]
    assert kinds(seen)[-1] == ("crash_loop", "a")
    assert not watching.round(look(("a", DIED)))  # all that is watched was given up


def test_a_relaunch_whose_stop_failed_says_so_and_waits_no_backoff() -> None:
    fakes = Fakes(stop_fails=True)
    watching, seen = supervisor(fakes)
    watching.round(look(("a", DIED)))
    assert kinds(seen) == [("restarting", "a"), ("stop_failed", "a")]
    assert watching.restarts.next_try == {}


def test_a_host_that_cannot_be_read_is_said_and_nothing_is_done() -> None:
    fakes = Fakes()
    watching, seen = supervisor(fakes, renew_before=120)
    watching.round(look(("a", DeployctlError("unreachable"))))
    assert kinds(seen) == [("host_failed", "a")] and fakes.relaunched == fakes.renewed == []


def test_a_job_near_its_limit_is_renewed_through_its_router_and_its_successor_kept() -> None:
    fakes = Fakes()
    watching, seen = supervisor(fakes, renew_before=120)
    watching.round(look(("login", status(job=job(100))), router="edge/router"))
    assert fakes.renewed == ["r_v1"]
    assert kinds(seen) == [("time_limit_near", "login"), ("renewed", "login")]
    # Without a router it is only announced.
    alone, said = supervisor(Fakes(), renew_before=120)
    alone.round(look(("login", status(job=job(100)))))
    assert kinds(said) == [("time_limit_near", "login")]
    assert isinstance(said.events[0], ev.TimeLimitNear) and not said.events[0].renewing
