"""Acting on recorded runs: stray runs, restart, watch and `top`'s metric rounds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from deployctl import agent
from deployctl import events as ev
from deployctl.choices import PdRole
from deployctl.connection import Connection
from deployctl.crash import Catalog
from deployctl.disaggregation import PrefillLoss, TransferWatch
from deployctl.errors import DeployctlError, UsageError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet, FleetResult, HostResult
from deployctl.inventory import Host
from deployctl.launchers import launcher_for, launcher_of
from deployctl.ops.router import Registration, change_registration, router_of
from deployctl.ops.runs import (
    DEFAULT_STOP_TIMEOUT,
    LaunchReport,
    RunState,
    RunStatus,
    Unit,
    UnitState,
    end_run,
    launch,
    replace,
    run_status,
    units,
)
from deployctl.ops.serving import capture, point_back, recorded_plan
from deployctl.patchset import PatchSet
from deployctl.remote.protocol import RunsArgs

T = TypeVar("T")


@dataclass(frozen=True)
class Stray:
    """A run alive on a selected host that no selected deployment names."""

    host: Host  # the host, with the run's deployment
    run: str
    origin: str | None  # the inventory that launched it (None: not recorded)
    ours: bool  # launched from this very inventory: its leftover, provably


def stray_runs(fleet: Fleet) -> list[Stray]:
    """Runs alive on the fleet's hosts that no selected deployment names: the host's single
    server from before it had `deployments`, a deployment that left the inventory, or a run
    another inventory (another project or checkout sharing the host) launched. Only the
    ones this inventory launched are its own. A host that cannot be asked adds none (its own
    stop reports why)."""
    known = {(h.name, h.deployment) for h in fleet.hosts}
    hosts = list({h.name: h for h in fleet.hosts}.values())

    def strays(host: Host, conn: Connection) -> list[Stray]:
        args: RunsArgs = {"state_dir": host.settings.state_dir}
        runs = agent.call(host, conn, agent.RUNS, args)["live_runs"]
        return [
            Stray(
                Host(host.name, host.vars, run["deployment"]),
                run["id"],
                run.get("origin"),
                bool(fleet.origin) and run.get("origin") == fleet.origin,
            )
            for run in runs
            if (host.name, run["deployment"]) not in known
        ]

    return [stray for result in fleet.run(strays, hosts) for stray in result.value or []]


TOP_TAIL_BYTES = 16 * 1024


# A round of a front end that polls waits this long at least for a host's answer (else its
# interval): a host still at work then is shown as not answering, and the others go on.
ROUND_ANSWER_MIN = 2.0


def answer_within(interval: float) -> float:
    """How long a polling round waits for its slowest host (Fleet.poll's `answer_within`)."""
    return max(interval, ROUND_ANSWER_MIN)


def metrics_round(
    fleet: Fleet,
    catalog: Catalog,
    tail_bytes: int = TOP_TAIL_BYTES,
    within: float | None = None,
) -> FleetResult[RunStatus]:
    """Every deployment's status with metrics, over the fleet's open connections (a host
    that dropped its connection keeps its error and is reconnected with backoff; one still
    at work after `within` seconds is shown as not answering: Fleet.poll)."""
    return fleet.poll(
        lambda host, conn: run_status(host, conn, catalog, metrics=True, tail_bytes=tail_bytes),
        answer_within=within,
    )


def status_rounds(
    step: Callable[[], T],
    interval: float,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    stop: threading.Event | None = None,
    pace: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[T]:
    """`step`'s result every `interval` seconds (less the round's own time when `pace`),
    `rounds` times (None: until stopped). The one status-rounds loop: `top`, `watch` and the
    dashboard's collector. `stop` ends the rounds, also in the middle of a wait."""
    done = 0
    while (rounds is None or done < rounds) and not (stop is not None and stop.is_set()):
        started = clock()
        result = step()
        done += 1
        yield result
        if rounds is None or done < rounds:
            left = max(0.0, interval - (clock() - started)) if pace else interval
            if stop is not None:
                stop.wait(left)
            else:
                sleep(left)


def metrics_rounds(
    fleet: Fleet,
    catalog: Catalog,
    interval: float,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[FleetResult[RunStatus]]:
    """`top`'s rounds: a metrics round every `interval` seconds; over more than one round,
    through one kept agent per host (agent.KeptAgent)."""
    if rounds != 1:
        fleet.keep_agents()
    within = answer_within(interval)
    return status_rounds(
        lambda: metrics_round(fleet, catalog, within=within), interval, rounds, sleep
    )


def restart(
    fleet: Fleet,
    catalog: Catalog,
    patch_sets: Mapping[str, PatchSet],
    *,
    crashed_only: bool,
    timeout: float,
    stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    wait: bool = True,
    events: EventSink = DISCARD,
) -> RestartReport:
    """Replace each recorded run by a new one with the same command and the next log
    version; a multi-node server's nodes all together when any of them crashed."""
    statuses = fleet.run(lambda host, conn: run_status(host, conn, catalog))
    chosen = {
        node.name: node.value
        for unit in units(statuses)
        if unit.restartable and (unit.crashed or not crashed_only)
        for node in unit.nodes
        if node.value is not None
    }
    if not chosen:
        return RestartReport(statuses, None)
    hosts = {h.label: h for h in fleet.hosts}
    plans = [recorded_plan(hosts[name], status, patch_sets) for name, status in chosen.items()]
    restart_of = {name: status.run["id"] for name, status in chosen.items() if status.run}
    replaced = replace(
        fleet, plans, catalog, restart_of=restart_of, stop_timeout=stop_timeout, wait=wait,
        timeout=timeout, events=events,
    )  # fmt: skip
    failed_stops: list[HostResult[RunStatus]] = [
        HostResult(r.host, exception=r.exception) for r in replaced.stops if r.failed
    ]
    return RestartReport(FleetResult([*failed_stops, *statuses]), replaced.launch)


@dataclass
class RestartReport:
    """What restart saw on each host, and the launch of the runs it chose (None: none)."""

    statuses: FleetResult[RunStatus]
    launch: LaunchReport | None

    @property
    def ok(self) -> bool:
        """Every host could be read and stopped, and every relaunch came up."""
        # A crashed run is why restart was called: it does not fail the restart itself.
        read = not self.statuses.failed
        return read and (self.launch is None or self.launch.ok)


# ---- renewing Slurm jobs before their time limit -------------------------------------------


@dataclass
class Renewal:
    """A Slurm job's successor, started beside it and swapped in at its router."""

    old_run: str
    launch: LaunchReport
    removal: Registration | None = None  # the old job's, from its router
    error: str = ""

    @property
    def new_run(self) -> str | None:
        outcomes = self.launch.outcomes.results
        return outcomes[0].value.run["id"] if outcomes and outcomes[0].value else None

    @property
    def state(self) -> str:
        outcomes = self.launch.outcomes.results
        if not outcomes:
            return "refused"
        return outcomes[0].value.state.value if outcomes[0].value else "failed"


def renew(
    fleet: Fleet,
    host: Host,
    status: RunStatus,
    catalog: Catalog,
    patch_sets: Mapping[str, PatchSet],
    *,
    timeout: float,
    stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    events: EventSink = DISCARD,
) -> Renewal:
    """Submit the successor of a Slurm job with the same command and the next log version,
    beside it; once the successor serves and its router lists it, take the old job out of
    the router and cancel it. A successor that does not come up is cancelled and the old
    job stays the deployment's current run, serving until its limit."""
    assert status.run is not None
    old = capture(host, status, patch_sets)
    report = launch(
        fleet, [old.plan], catalog, timeout=timeout, restart_of={host.label: old.run},
        beside={host.label: old.run},
    )  # fmt: skip
    renewal = Renewal(old.run, report)
    conn = fleet.connection(host)
    if not report.ok:
        renewal.error = _renewal_failure(report)
        if report.started:
            try:  # what is left of the successor, then the old job is current again
                point_back(host, conn, old, stop_timeout)
            except DeployctlError as exc:
                renewal.error += f"; {old.run} not made current again: {exc.message}"
        return renewal
    renewal.removal = change_registration(fleet, host, False, old.port, events, old.head, old.url)
    end_run(host, conn, stop_timeout, run_id=old.run)
    return renewal


def _renewal_failure(report: LaunchReport) -> str:
    """Why a successor did not take over, in one line."""
    for pre in report.preflights:
        if pre.value is None:
            return pre.error or "its preflight failed"
        if pre.value.problems:
            return pre.value.problems[0]
    for out in report.outcomes:
        if out.value is None:
            return out.error or "it did not start"
        if out.value.state is not RunState.READY:
            crash = out.value.crashes[0].summary() if out.value.crashes else out.value.note
            return f"its successor {out.value.run['id']} {out.value.state.value}" + (
                f": {crash}" if crash else ""
            )
    failed = next((r for r in report.registrations if not r.ok), None)
    return f"its successor was not registered: {failed.error}" if failed else "it failed"


@dataclass
class Renewals:
    """What watch knows of the Slurm jobs it renews `window` seconds before their limit. Each
    job is renewed once; a successor that is within the window as soon as it serves (its
    whole limit is not longer than the window: a partition's cap, `slurm_extra`'s --time) is
    not renewed again, which would renew it at every round without end."""

    window: float
    done: set[str] = field(default_factory=set)  # jobs whose time limit was dealt with
    far: set[str] = field(default_factory=set)  # jobs seen with more than the window left
    successors: set[str] = field(default_factory=set)  # runs this watch submitted


def check_renew_window(hosts: Sequence[Host], window: float) -> None:
    """Refuse a window that is not shorter than a Slurm deployment's time limit (slurm_time),
    before anything is touched."""
    for host in hosts:
        found = launcher_for(host.settings).time_limit(host.settings)
        if found is None:
            continue
        text, limit = found
        if window >= limit:
            raise UsageError(
                f"--renew-before {window:g}s is not shorter than {host.label}'s time limit "
                f"(slurm_time {text}: {limit:g}s): each successor would be renewed as soon "
                "as it serves, without end",
                hint=f"renew within the limit, e.g. --renew-before {max(1.0, limit / 4):g}s",
            )


def renew_if_near(
    fleet: Fleet,
    host: Host,
    status: RunStatus,
    catalog: Catalog,
    patch_sets: Mapping[str, PatchSet],
    renewals: Renewals,
    *,
    timeout: float,
    stop_timeout: float,
    events: EventSink,
) -> None:
    """watch's look at one Slurm job's time limit: renew it once within the window."""
    run = status.run
    lease = launcher_of(run).lease(status.job)
    if lease is None or run is None:
        return
    job, left = lease.id, lease.time_left
    if left > renewals.window:
        renewals.far.add(job)
        return
    if job in renewals.done or not status.ready:
        return
    renewals.done.add(job)
    if run["id"] in renewals.successors and job not in renewals.far:
        events.emit(
            ev.Renewed(
                target=host.label, old_run=run["id"], new_run=None, state="refused",
                error=f"job {job} had {left:.0f}s left as soon as it served, within "
                f"--renew-before {renewals.window:g}s: its time limit is not longer than "
                "the window, so it is not renewed again",
            )
        )  # fmt: skip
        return
    renewing = host.settings.router is not None
    events.emit(
        ev.TimeLimitNear(
            target=host.label, run=run["id"], job=job, time_left_s=left, renewing=renewing
        )
    )
    if not renewing:
        return
    renewal = renew(
        fleet, host, status, catalog, patch_sets, timeout=timeout, stop_timeout=stop_timeout,
        events=events,
    )  # fmt: skip
    if renewal.new_run is not None:
        renewals.successors.add(renewal.new_run)
    events.emit(
        ev.Renewed(
            target=host.label, old_run=renewal.old_run, new_run=renewal.new_run,
            state=renewal.state, error=renewal.error,
        )
    )  # fmt: skip


# How long after a prefill of its router was last seen down a decode's failing health is
# blamed on the prefill (sglang#12779), and how long a decode's requests may wait for KV with
# no token out before watch reports a stuck transfer.
PD_WINDOW = 60.0
STUCK_AFTER = 60.0


PdSide = tuple[PdRole | None, str | None]


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


def unit_run(unit: Unit) -> str:
    status = unit.nodes[0].value
    return status.run["id"] if status is not None and status.run else ""


def watch_pair(
    unit: Unit,
    side: PdSide,
    now: float,
    losses: PrefillLoss,
    transfers: TransferWatch,
    events: EventSink,
) -> None:
    """Note a prefill seen down; report a decode whose transfers are stuck."""
    role, router = side
    if role is PdRole.PREFILL and router is not None and unit.state is not UnitState.READY:
        losses.down(router, unit.name, now)
    status = unit.nodes[0].value
    if role is not PdRole.DECODE or status is None or not status.ready or not status.metrics:
        return
    metrics = status.metrics
    waiting = int(
        (metrics.get("num_running_reqs") or 0)
        + (metrics.get("num_decode_transfer_queue_reqs") or 0)
    )
    stuck = transfers.look(
        unit.name,
        now,
        waiting,
        metrics.get("generation_tokens_total"),
        metrics.get("gen_throughput"),
    )
    if stuck is not None:
        events.emit(
            ev.StuckTransfer(target=unit.name, run=unit_run(unit), waiting=waiting, stuck_s=stuck)
        )


def held_decode(
    unit: Unit, side: PdSide, now: float, losses: PrefillLoss
) -> tuple[str, float] | None:
    """The prefill a crashed decode's failure is blamed on (and how long ago it was down), so
    the decode is not restarted; None to restart it as any crashed unit. A decode whose
    process died is restarted: that is its own failure."""
    role, router = side
    if role is not PdRole.DECODE or not all(n.value and n.value.alive for n in unit.nodes):
        return None
    return losses.blames(router, now)


@dataclass
class WatchEnded:
    """How a streaming command (`watch`, `top`) ended; its events were shown as they came.
    Not ok when watch gave up on every deployment it watched."""

    ok: bool = True


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
    history: dict[str, list[tuple[float, str]]] = {}
    losses = PrefillLoss(pd_window)
    transfers = TransferWatch(stuck_after)
    held: set[str] = set()  # decodes held since their prefill was last seen down
    sides: dict[str, PdSide] = {}  # the inventory does not change while watch runs

    def side_of(unit: Unit) -> PdSide:
        if unit.name not in sides:
            sides[unit.name] = pd_side(fleet, unit)
        return sides[unit.name]

    next_try: dict[str, float] = {}
    given_up: set[str] = set()
    renewals = None if renew_before is None else Renewals(renew_before)
    if renewals is not None:
        check_renew_window(fleet.hosts, renewals.window)

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
        for result in statuses:
            if result.exception is not None:
                events.emit(ev.HostFailed(target=result.name, exception=result.exception))
            elif renewals is not None and result.value is not None:
                renew_if_near(
                    fleet, result.host, result.value, catalog, patch_sets, renewals,
                    timeout=timeout, stop_timeout=stop_timeout, events=events,
                )  # fmt: skip
        now = time.monotonic()
        for unit in units(statuses):
            watch_pair(unit, side_of(unit), now, losses, transfers, events)
        for unit in units(statuses):
            name = unit.name
            if name in given_up or not unit.crashed or time.monotonic() < next_try.get(name, 0):
                continue
            blamed = held_decode(unit, side_of(unit), now, losses)
            if blamed is not None:
                if name not in held:
                    held.add(name)
                    events.emit(
                        ev.DecodeHeld(
                            target=name, run=unit_run(unit), prefill=blamed[0],
                            down_s=blamed[1], window_s=losses.window,
                        )
                    )  # fmt: skip
                continue
            held.discard(name)
            if not unit.restartable:
                continue  # a node could not be read: its error is shown above
            signature = unit.crash_signature()
            now = time.monotonic()
            recent = [(t, s) for t, s in history.get(name, []) if now - t <= window] + [
                (now, signature)
            ]
            history[name] = recent
            runs = {n.name: n.value.run["id"] for n in unit.nodes if n.value and n.value.run}
            run_id = runs[unit.nodes[0].name]
            repeated = len(recent) >= 2 and recent[-2][1] == signature and signature != "died"
            if len(recent) > max_restarts or repeated:
                events.emit(
                    ev.CrashLoop(
                        target=name, run=run_id, signature=signature, repeated=repeated,
                        crashes=len(recent), window_s=window,
                    )
                )  # fmt: skip
                given_up.add(name)
                continue
            down = unit.down if len(unit.nodes) > 1 else []
            events.emit(
                ev.Restarting(
                    target=name, run=run_id, signature=signature, attempt=len(recent), down=down
                )
            )
            plans = [recorded_plan(n.host, n.value, patch_sets) for n in unit.nodes if n.value]
            replaced = replace(
                fleet, plans, catalog, restart_of=runs, stop_timeout=stop_timeout,
                timeout=timeout,
            )  # fmt: skip
            if replaced.launch is None:
                first = next(r for r in replaced.stops if r.failed)
                assert first.exception is not None
                events.emit(ev.StopFailed(target=name, exception=first.exception))
                continue
            outcomes = replaced.launch.outcomes
            outcome = outcomes[0].value if outcomes else None
            events.emit(
                ev.Replaced(
                    target=name,
                    old_run=run_id,
                    new_run=outcome.run["id"] if outcome else None,
                    state=outcome.state.value if outcome else "refused",
                )
            )
            next_try[name] = time.monotonic() + min(300.0, interval * 2 ** (len(recent) - 1))
        watched = {unit.name for unit in units(statuses)}
        if watched and watched <= given_up:
            events.emit(ev.WatchStopped(target="", gave_up=True))
            return WatchEnded(ok=False)
    return WatchEnded()
