"""`watch`: status rounds, each one handed to the supervision policies (ops/supervision.py),
whose decisions are acted on here: a relaunch, a renewal, the events that say them."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from deployctl import events as ev
from deployctl.choices import PdRole
from deployctl.connection import Connection
from deployctl.crash import Catalog
from deployctl.disaggregation import PrefillLoss, TransferWatch
from deployctl.errors import DeployctlError
from deployctl.events import EventSink
from deployctl.fanout import Fleet, FleetResult
from deployctl.inventory import Host
from deployctl.ops.renewal import Renewal, renew
from deployctl.ops.restart import relaunch_recorded
from deployctl.ops.rounds import WatchEnded, answer_within, status_rounds
from deployctl.ops.router import router_of
from deployctl.ops.runs import DEFAULT_STOP_TIMEOUT, Replacement, RunStatus, Unit, run_status, units
from deployctl.ops.supervision import (
    PD_WINDOW,
    STUCK_AFTER,
    CrashRestarts,
    PdPairs,
    PdSide,
    RenewBeforeLimit,
    check_renew_window,
)
from deployctl.patchset import PatchSet


@dataclass
class Supervisor:
    """One watch's policies, and the actions their decisions take (the fleet's, bound by
    `watch`): a round at a time."""

    restarts: CrashRestarts
    pairs: PdPairs
    renewals: RenewBeforeLimit | None  # None: no --renew-before
    side_of: Callable[[Unit], PdSide]
    relaunch: Callable[[Unit], Replacement]
    renew: Callable[[Host, RunStatus], Renewal]
    events: EventSink
    clock: Callable[[], float] = time.monotonic

    def round(self, statuses: FleetResult[RunStatus]) -> bool:
        """Act on one look at the fleet; False once every unit watched was given up on."""
        for result in statuses:
            if result.exception is not None:
                self.events.emit(ev.HostFailed(target=result.name, exception=result.exception))
            elif self.renewals is not None and result.value is not None:
                self._renew_if_near(self.renewals, result.host, result.value)
        now = self.clock()
        found = units(statuses)
        for unit in found:
            stuck = self.pairs.observe(unit, self.side_of(unit), now)
            if stuck is not None:
                self.events.emit(stuck)
        for unit in found:
            self._restart_if_crashed(unit, now)
        return not self.restarts.gave_up_on_all(found)

    def _renew_if_near(self, renewals: RenewBeforeLimit, host: Host, status: RunStatus) -> None:
        renewing = host.settings.router is not None
        decision = renewals.look(host.label, status, renewing)
        if decision is None:
            return
        self.events.emit(decision)
        if not isinstance(decision, ev.TimeLimitNear) or not renewing:
            return
        renewal = self.renew(host, status)
        renewals.submitted(renewal.new_run)
        self.events.emit(
            ev.Renewed(
                target=host.label, old_run=renewal.old_run, new_run=renewal.new_run,
                state=renewal.state, error=renewal.error,
            )
        )  # fmt: skip

    def _restart_if_crashed(self, unit: Unit, now: float) -> None:
        # The backoff is judged by the clock now (an earlier unit's relaunch this round may
        # have taken minutes); a hold by the round's `now`, when the prefills were noted.
        if not self.restarts.due(unit, self.clock()):
            return
        hold = self.pairs.hold(unit, self.side_of(unit), now)
        if hold is not None:
            if hold.first:
                self.events.emit(hold.event)
            return
        decision = self.restarts.decide(unit, self.clock())
        if decision is None:
            return
        self.events.emit(decision)
        if isinstance(decision, ev.CrashLoop):
            return
        replaced = self.relaunch(unit)
        if replaced.launch is None:
            first = next(r for r in replaced.stops if r.failed)
            assert first.exception is not None
            self.events.emit(ev.StopFailed(target=unit.name, exception=first.exception))
            return
        outcomes = replaced.launch.outcomes
        outcome = outcomes[0].value if outcomes else None
        self.events.emit(
            ev.Replaced(
                target=unit.name,
                old_run=decision.run,
                new_run=outcome.run["id"] if outcome else None,
                state=outcome.state.value if outcome else "refused",
            )
        )
        self.restarts.relaunched(decision, self.clock())


def pd_side(fleet: Fleet, unit: Unit) -> PdSide:
    """A unit's side of a prefill/decode pair and its router's label (None: neither)."""
    host = unit.nodes[0].host
    role = host.settings.pd_role
    if role is None:
        return None, None
    try:
        router = router_of(host, fleet.select)
    except DeployctlError:
        return role, None
    return role, None if router is None else router.label


def watch(
    fleet: Fleet,
    catalog: Catalog,
    patch_sets: Mapping[str, PatchSet],
    *,
    interval: float,
    max_restarts: int,
    window: float,
    timeout: float,
    events: EventSink,
    stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    renew_before: float | None = None,
    pd_window: float = PD_WINDOW,
    stuck_after: float = STUCK_AFTER,
) -> WatchEnded:
    """Replace crashed runs with exponential backoff; give up on a crash loop. Ends (not ok)
    once it has given up on every unit, or after `rounds` checks. With `renew_before`, a
    Slurm job that has that little time left is renewed (one with a router) or its gap is
    announced (one without). Of a prefill/decode pair, a decode whose health fails within
    `pd_window` of a prefill of its router being down is held, not restarted, and a decode
    whose requests wait for KV with no token out for `stuck_after` is reported."""
    renewals = None if renew_before is None else RenewBeforeLimit(renew_before)
    if renewals is not None:
        check_renew_window(fleet.hosts, renewals.window)
    sides: dict[str, PdSide] = {}  # the inventory does not change while watch runs

    def side_of(unit: Unit) -> PdSide:
        if unit.name not in sides:
            sides[unit.name] = pd_side(fleet, unit)
        return sides[unit.name]

    def relaunch_unit(unit: Unit) -> Replacement:
        return relaunch_recorded(
            fleet, catalog, patch_sets, unit.nodes, timeout=timeout, stop_timeout=stop_timeout
        )

    def renew_job(host: Host, status: RunStatus) -> Renewal:
        return renew(
            fleet, host, status, catalog, patch_sets, timeout=timeout, stop_timeout=stop_timeout,
            events=events,
        )  # fmt: skip

    supervisor = Supervisor(
        restarts=CrashRestarts(max_restarts, window, interval),
        pairs=PdPairs(PrefillLoss(pd_window), TransferWatch(stuck_after)),
        renewals=renewals,
        side_of=side_of,
        relaunch=relaunch_unit,
        renew=renew_job,
        events=events,
    )

    # A full interval after each round: one that restarted a unit waits before the next look.
    fleet.keep_agents()
    within = answer_within(interval)

    def look(host: Host, conn: Connection) -> RunStatus:
        # A decode's metrics say whether its transfers move.
        decode = host.settings.pd_role is PdRole.DECODE
        return run_status(host, conn, catalog, metrics=decode)

    def statuses_now() -> FleetResult[RunStatus]:
        return fleet.poll(look, answer_within=within)

    looks = status_rounds(statuses_now, interval, rounds, sleep, pace=False)
    for look_number, statuses in enumerate(looks):
        if look_number == 0:  # the first look is in: say what is supervised from now on
            events.emit(
                ev.Watching(
                    target="", deployments=len(units(statuses)),
                    hosts=len({r.host.name for r in statuses}),
                    unreadable=len({r.host.name for r in statuses if r.exception is not None}),
                    interval_s=interval,
                )
            )  # fmt: skip
        if not supervisor.round(statuses):
            events.emit(ev.WatchStopped(target="", gave_up=True))
            return WatchEnded(ok=False)
    return WatchEnded()
