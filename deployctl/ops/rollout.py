"""Rollouts: bring serving deployments to what the inventory says now, one unit at a time
(K at a time), each taken out of its router, drained, replaced and put back before the next.

A unit that already matches (its command, environment and patch sets) is skipped unless
`restart`. A unit whose new configuration fails is relaunched on its previous one and put
back, and the rollout stops there: run it again to go on. A router's last healthy worker is
never taken out unless downtime is allowed; a unit with no router is replaced with a
warning that it is down meanwhile.
"""

from __future__ import annotations

import difflib
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from deployctl import events as ev
from deployctl.choices import PdRole
from deployctl.connection import Connection
from deployctl.crash import Catalog, CrashReport
from deployctl.deployments import node_rank
from deployctl.errors import DeployctlError, PatchError, UsageError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet, FleetResult, HostResult
from deployctl.inventory import Host
from deployctl.launchers import launcher_of
from deployctl.ops.driver import drive
from deployctl.ops.patch import PatchAction, apply_patches, patch_facts, revert_patches, set_state
from deployctl.ops.plan import Plan, Role
from deployctl.ops.router import (
    ListedWorker,
    RouterState,
    change_registration,
    registered_url,
    roles_missing,
    router_locks,
    router_of,
    router_state,
    serving_workers,
)
from deployctl.ops.runs import (
    DEFAULT_STOP_TIMEOUT,
    DrainSignal,
    LaunchReport,
    RunStatus,
    StopResult,
    drain,
    replace,
    run_status,
    stop_run,
    units,
)
from deployctl.ops.serving import capture, relaunch
from deployctl.patchset import PatchSet, select_sets
from deployctl.shell import split


@dataclass
class PatchChange:
    """The patch sets one node's host must change to match its `patches` now."""

    apply: list[PatchSet] = field(default_factory=list)
    revert: list[PatchSet] = field(default_factory=list)

    def words(self) -> list[str]:
        return [f"apply {s.name} {s.version}" for s in self.apply] + [
            f"revert {s.name}" for s in self.revert
        ]


@dataclass
class UnitPlan:
    """One unit of the rollout: its new plans (rank order), its current runs, and why it
    changes (empty: it matches)."""

    name: str
    plans: list[Plan]
    statuses: list[RunStatus]
    reasons: list[str]
    command_diff: list[str]
    env_diff: list[str]
    patches: dict[str, PatchChange]  # node label -> its change
    router: Host | None
    blocked: str = ""

    @property
    def changes(self) -> bool:
        return bool(self.reasons)

    @property
    def rank0(self) -> Host:
        return self.plans[0].host

    @property
    def port(self) -> int | None:
        """The port its current run serves on (what its router lists it by)."""
        run = self.statuses[0].run if self.statuses else None
        return run.get("port") if run is not None else None

    @property
    def head(self) -> str:
        """The head node of the Slurm job its current run is; "" for a process on its host."""
        if not self.statuses:
            return ""
        first = self.statuses[0]
        return launcher_of(first.run).head(first.placement)

    @property
    def url(self) -> str:
        """Where its router lists its current run: the URL the run recorded when it
        registered, so an edited `worker_url` never takes another worker out."""
        run = self.statuses[0].run if self.statuses else None
        return registered_url(self.rank0, run, self.head) if run is not None else ""

    @property
    def serving(self) -> bool:
        """Its current run answers (rank 0's /health)."""
        return bool(self.statuses) and self.statuses[0].ready


class UnitOutcome(StrEnum):
    """What the rollout did with a unit."""

    SKIPPED = "skipped"  # it matches already
    REPLACED = "replaced"  # serving its new configuration, back in its router
    FAILED = "failed"  # its new configuration failed: put back on its previous one
    REFUSED = "refused"  # not touched: the router's last healthy worker, or not removable
    UNDONE = "undone"  # Ctrl-C before it was stopped: put back in its router as it was
    NOT_REACHED = "not reached"  # the rollout stopped before it


@dataclass
class UnitResult:
    name: str
    outcome: UnitOutcome
    old_run: str | None = None
    new_run: str | None = None
    state: str | None = None  # the state of the run serving at the end
    error: str = ""
    crash: CrashReport | None = None
    warnings: list[str] = field(default_factory=list)
    drained: bool | None = None  # None: not drained (no router, or not serving)
    drain_signal: DrainSignal | None = None  # what the drain watched; None: no drain
    gpus_clean: bool | None = None  # after the stop, before the start (None: not checked)
    timings: dict[str, float] = field(default_factory=dict)  # step -> seconds
    patches: list[PatchAction] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outcome not in (UnitOutcome.FAILED, UnitOutcome.REFUSED)

    @property
    def overhead_s(self) -> float | None:
        """deployctl's own time: the whole unit, less the drain and the server's start."""
        if "total" not in self.timings:
            return None
        server = self.timings.get("drain", 0.0) + self.timings.get("server_start", 0.0)
        return max(0.0, self.timings["total"] - server)


@dataclass
class RolloutOptions:
    max_unavailable: int = 1
    drain_timeout: float = 60.0
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    timeout: float = 900.0  # for each new run to become ready
    restart: bool = False
    allow_downtime: bool = False
    what: str = "rollout"  # the command, as the router lock names its holder to others


@dataclass
class RolloutReport:
    units: list[UnitResult]
    plans: list[UnitPlan]
    dry_run: bool = False
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        # A dry run is refused where the rollout would be: a unit that cannot be replaced.
        return all(u.ok for u in self.units) and not (
            self.dry_run and any(p.blocked and p.changes for p in self.plans)
        )


# ---- planning --------------------------------------------------------------------------------


def token_diff(old: Sequence[str], new: Sequence[str]) -> list[str]:
    """`- word` / `+ word` lines: what changes between two argvs (or env lines)."""
    return [
        line
        for line in difflib.unified_diff(list(old), list(new), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def env_lines(env: Mapping[str, str]) -> list[str]:
    return [f"{name}={value}" for name, value in sorted(env.items())]


def patch_change(
    host: Host, recorded: Sequence[str], plan: Plan, available: Mapping[str, PatchSet]
) -> tuple[list[PatchSet], set[str]]:
    """The sets the host should have now: its `patches` (when set) and those the new command
    needs; and the names it must not keep (recorded, no longer wanted). Without `patches`,
    nothing is reverted."""
    given = host.settings.given("patches")
    wanted = select_sets(available, host.settings.patches) if given is not None else []
    for needed in plan.needed_sets:
        if needed.name not in {s.name for s in wanted}:
            wanted.append(needed)
    unwanted = set() if given is None else set(recorded) - {s.name for s in wanted}
    return wanted, unwanted


def plan_unit(
    fleet: Fleet,
    name: str,
    plans: Sequence[Plan],
    statuses: Sequence[RunStatus],
    patches: Mapping[str, PatchChange],
    restart: bool,
) -> UnitPlan:
    """Compare one unit's current runs with its plans now; `patches`: each node's change."""
    rank0 = plans[0]
    reasons: list[str] = []
    command_diff: list[str] = []
    env_diff: list[str] = []
    changes: dict[str, PatchChange] = {}
    for plan, status in zip(plans, statuses, strict=True):
        label = plan.host.label
        if status.run is None or not status.alive:
            reasons.append(f"{label}: not running")
        elif status.command is not None and split(status.command) != plan.rendered.argv:
            reasons.append(f"{label}: command")
            command_diff += token_diff(split(status.run["command"]), split(plan.rendered.display))
        if status.run is not None and status.alive and (status.env or {}) != plan.rendered.env:
            reasons.append(f"{label}: environment")
            env_diff += token_diff(
                env_lines(status.run.get("env", {})), env_lines(plan.rendered.env_shown)
            )
        change = patches.get(label, PatchChange())
        if change.apply or change.revert:
            changes[label] = change
            reasons.append(f"{label}: patches ({', '.join(change.words())})")
    if restart and not reasons:
        reasons.append("--restart")
    router, blocked = None, ""
    try:
        router = router_of(rank0.host, fleet.select)
    except DeployctlError as exc:
        blocked = exc.message
    return UnitPlan(
        name, list(plans), list(statuses), reasons, command_diff, env_diff, changes, router,
        blocked,
    )  # fmt: skip


def _patch_change(
    host: Host, conn: Connection, plan: Plan, available: Mapping[str, PatchSet]
) -> PatchChange:
    if host.settings.given("patches") is None and not plan.needed_sets:
        return PatchChange()
    facts = patch_facts(host, conn, list(available.values()))
    wanted, unwanted = patch_change(host, list(facts.records), plan, available)
    apply = [s for s in wanted if not set_state(facts, s).good]
    revert = [available[n] for n in sorted(unwanted) if n in available]
    return PatchChange(apply, revert)


def plan_rollout(
    fleet: Fleet,
    plans: Sequence[Plan],
    catalog: Catalog,
    available: Mapping[str, PatchSet],
    restart: bool = False,
    forced: PatchChange | None = None,
) -> list[UnitPlan]:
    """Each unit's current runs against its plans now, in inventory order, routers last.
    `forced`: a patch change every node makes whatever its `patches` say (patch
    apply|revert --rolling). A unit whose host cannot be read is planned as blocked."""
    by_label = {p.host.label: p for p in plans}

    def read(host: Host, conn: Connection) -> tuple[RunStatus, PatchChange, str]:
        status = run_status(host, conn, catalog, tail_bytes=0)  # no log to scan here
        change = forced or _patch_change(host, conn, by_label[host.label], available)
        # The sets to apply are tried now, without writing (SGLang there, a variant for its
        # version, diffs that apply): a unit that would fail once stopped is never taken out.
        try:
            if change.apply:
                apply_patches(host, conn, change.apply, dry_run=True)
        except PatchError as exc:
            return status, change, f"{host.label}: cannot apply: {exc.message}"
        return status, change, ""

    read_all = fleet.run(read, [p.host for p in plans])
    patches = {r.name: r.value[1] for r in read_all if r.value is not None}
    refusals = {r.name: r.value[2] for r in read_all if r.value is not None and r.value[2]}
    statuses = FleetResult(
        HostResult(r.host, r.value[0] if r.value else None, r.exception) for r in read_all
    )
    found = []
    for unit in units(statuses):
        unit_plans = [by_label[n.host.label] for n in unit.nodes]
        failed = next((n for n in unit.nodes if n.value is None), None)
        if failed is not None:
            blocked = f"{failed.name}: cannot be read: {failed.error}"
            found.append(UnitPlan(unit.name, unit_plans, [], [blocked], [], [], {}, None, blocked))
            continue
        read_ok = [n.value for n in unit.nodes if n.value is not None]
        planned = plan_unit(fleet, unit.name, unit_plans, read_ok, patches, restart)
        refusal = next((refusals[n.name] for n in unit.nodes if n.name in refusals), "")
        if refusal:
            planned.blocked = refusal
        found.append(planned)
    return sorted(found, key=rollout_order)


def lacking_roles(state: RouterState, left: Sequence[ListedWorker]) -> str:
    """What the router would lack with only `left` serving ("": nothing): a worker, or for a
    router in PD mode a prefill or a decode (each role must keep one healthy)."""
    if not left:
        return "worker"
    if not state.pd:
        return ""
    return " or ".join(map(str, roles_missing(left)))


def rollout_order(unit: UnitPlan) -> int:
    """Prefills first (a decode replaced next finds its new prefills serving), then the other
    workers; routers last: their workers are replaced through them first, and a router's own
    replacement (down meanwhile, as it has no router) comes once they are done."""
    plan = unit.plans[0]
    if plan.role is Role.ROUTER:
        return 2
    return 0 if plan.pd_role is PdRole.PREFILL else 1


# ---- replacing one unit ----------------------------------------------------------------


class Rollout:
    """One rollout's run: the units in batches of `max_unavailable`."""

    def __init__(
        self,
        fleet: Fleet,
        unit_plans: Sequence[UnitPlan],
        catalog: Catalog,
        available: Mapping[str, PatchSet],
        options: RolloutOptions,
        events: EventSink = DISCARD,
        cancel: threading.Event | None = None,
    ) -> None:
        self.fleet = fleet
        self.unit_plans = list(unit_plans)
        self.catalog = catalog
        self.available = available
        self.options = options
        self.events = events
        self.cancel = cancel or threading.Event()

    def run(self) -> list[UnitResult]:
        results: dict[str, UnitResult] = {}
        todo = [u for u in self.unit_plans if u.changes]
        for unit in self.unit_plans:
            if not unit.changes:
                results[unit.name] = UnitResult(
                    unit.name, UnitOutcome.SKIPPED, _run_id(unit), state="ready"
                )
        stopped = False
        size = max(1, self.options.max_unavailable)
        for start in range(0, len(todo), size):
            batch = todo[start : start + size]
            if stopped or self.cancel.is_set():
                for unit in batch:
                    results[unit.name] = UnitResult(
                        unit.name, UnitOutcome.NOT_REACHED, _run_id(unit)
                    )
                continue
            refused = self._capacity_refusals(batch)
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                done = [refused[u.name] for u in batch if u.name in refused]
                done += pool.map(self._replace, [u for u in batch if u.name not in refused])
            for result in done:
                results[result.name] = result
            stopped = any(not r.ok for r in done)
        return [results[u.name] for u in self.unit_plans]

    def _capacity_refusals(self, batch: Sequence[UnitPlan]) -> dict[str, UnitResult]:
        """Refuse the units whose router would be left with no healthy worker of ours."""
        refused: dict[str, UnitResult] = {}
        by_router: dict[str, list[UnitPlan]] = {}
        for unit in batch:
            if unit.blocked:
                refused[unit.name] = UnitResult(
                    unit.name, UnitOutcome.REFUSED, _run_id(unit), error=unit.blocked
                )
            elif unit.router is not None and unit.serving:
                by_router.setdefault(unit.router.label, []).append(unit)
        for router_label, taking in by_router.items():
            router = taking[0].router
            assert router is not None
            out = {u.rank0.label for u in taking}
            try:
                state = router_state(self.fleet, router)
                if self.options.allow_downtime:
                    continue
                # Any worker it lists that serves now carries its traffic meanwhile, ours or not.
                left = [
                    w for w in serving_workers(self.fleet, router, state) if w.worker not in out
                ]
            except DeployctlError as exc:
                why = f"router {router_label} not read: {exc.message}"
            else:
                lacking = lacking_roles(state, left)
                if not lacking:
                    continue
                why = ""
            for unit in taking:
                refused[unit.name] = UnitResult(
                    unit.name,
                    UnitOutcome.REFUSED,
                    _run_id(unit),
                    error=why
                    or f"{router_label} would have no healthy {lacking} left while {unit.name} "
                    "is replaced",
                )
        return refused

    def _step(self, unit: UnitPlan, step: str, started: float) -> None:
        self.events.emit(
            ev.RolloutStep(target=unit.name, step=step, elapsed=time.monotonic() - started)
        )

    def _replace(self, unit: UnitPlan) -> UnitResult:
        """Replace one unit; a host that fails on the way (an SSH failure, a patch that does
        not apply) leaves the unit back in its router, on its previous run if it was stopped."""
        started = time.monotonic()
        result = UnitResult(unit.name, UnitOutcome.REPLACED, _run_id(unit))
        progress: set[str] = set()  # "removed", "stopped": what has been done to the unit
        try:
            self._replace_steps(unit, result, started, progress)
        except DeployctlError as exc:
            result.outcome, result.error = UnitOutcome.FAILED, exc.message
            if "stopped" in progress:
                self._back_to_previous(unit, result, started)
            elif "removed" in progress:
                self._put_back(unit, result)
        result.timings["total"] = time.monotonic() - started
        return result

    def _put_back(self, unit: UnitPlan, result: UnitResult) -> None:
        back = change_registration(
            self.fleet, unit.rank0, add=True, port=unit.port, head=unit.head, url=unit.url
        )
        if back is not None and not back.ok:
            result.warnings.append(f"not put back in its router: {back.error}")

    def _replace_steps(
        self, unit: UnitPlan, result: UnitResult, started: float, progress: set[str]
    ) -> None:
        timings = result.timings
        if unit.router is None:
            result.warnings.append(f"{unit.name} has no router: it is down while it is replaced")
        elif unit.serving:
            self._step(unit, f"removing from {unit.router.label}", started)
            t = time.monotonic()
            removal = change_registration(
                self.fleet, unit.rank0, add=False, port=unit.port, head=unit.head, url=unit.url
            )
            timings["remove"] = time.monotonic() - t
            if removal is not None and not removal.ok:
                result.outcome, result.error = (
                    UnitOutcome.REFUSED,
                    f"not removed from {unit.router.label}: {removal.error}",
                )
                return
            progress.add("removed")
            t = time.monotonic()
            drained = self._drain(unit, result, started)
            timings["drain"] = time.monotonic() - t
            if drained is None:  # Ctrl-C while draining: put it back as it was
                self._put_back(unit, result)
                result.outcome = UnitOutcome.UNDONE
                return
            result.drained = drained
            if not drained:
                result.warnings.append(
                    f"still busy after --drain-timeout {self.options.drain_timeout:g}s: stopped anyway"
                )
        self._step(unit, "stopping", started)
        t = time.monotonic()
        progress.add("stopped")  # from here on, a failure goes back to the previous run

        def patch_between(stops: FleetResult[StopResult]) -> bool:
            """After the stops, before the start: the GPUs must be clean, then the unit's
            patch change (False: start nothing)."""
            nonlocal t
            for stop in stops.succeeded.values():
                if stop.gpus_clean is not None:
                    result.gpus_clean = stop.gpus_clean and result.gpus_clean is not False
            unclean = next((r.name for r in stops if r.value and r.value.gpus_clean is False), None)
            if unclean is not None:
                result.outcome = UnitOutcome.FAILED
                result.error = f"{unclean}: GPUs not clean after the stop"
                return False
            timings["stop"] = time.monotonic() - t
            self._patch(unit, result, started)
            self._step(unit, "starting", started)
            t = time.monotonic()
            return True

        replaced = replace(
            self.fleet, unit.plans, self.catalog, timeout=self.options.timeout, events=self.events,
            restart_of={p.host.label: s.run["id"] for p, s in zip(unit.plans, unit.statuses, strict=False) if s.run},
            stop_timeout=self.options.stop_timeout, checked=True, out_of_router=True,
            between=patch_between,
        )  # fmt: skip
        _raise_failed_stop(replaced.stops)
        if replaced.launch is None:  # the GPUs were not clean: `result` says so
            return
        report = replaced.launch
        timings["launch"] = time.monotonic() - t
        timings["server_start"] = _server_start(report)
        if report.ok:
            result.new_run, result.state = launched_run(report), "ready"
        elif not report.refused and report.outcomes.ok:
            # It serves its new configuration; only its router did not take it (a router that
            # died meanwhile): keep it, say so, and stop the rollout here.
            result.new_run, result.state = launched_run(report), "ready"
            result.outcome = UnitOutcome.FAILED
            result.error = f"{_why_failed(report)[0]}; {result.new_run} serves, outside its router"
            result.warnings.append("add it once the router is back: deployctl router sync")
        else:
            self._fail(unit, report, result, started)

    def _patch(self, unit: UnitPlan, result: UnitResult, started: float) -> None:
        """Apply and revert each node's sets (between its stop and its start)."""
        if not unit.patches:
            return
        self._step(unit, "patching", started)
        t = time.monotonic()
        for plan in unit.plans:
            change = unit.patches.get(plan.host.label)
            if change is None:
                continue
            conn = self.fleet.connection(plan.host)
            if change.revert:
                result.patches += revert_patches(plan.host, conn, change.revert)
            if change.apply:
                result.patches += apply_patches(plan.host, conn, change.apply)
        result.timings["patches"] = time.monotonic() - t

    def _drain(self, unit: UnitPlan, result: UnitResult, started: float) -> bool | None:
        """Wait until rank 0 runs no request: True; False at --drain-timeout; None on Ctrl-C.
        Its /metrics say so; without them, the router's load for it while it still lists it;
        without either, the whole --drain-timeout is waited (`result.drain_signal` says which)."""
        host = unit.rank0
        outcome = drain(
            self.fleet, host, self.options.drain_timeout, unit.url, self.cancel,
            lambda step: self._step(unit, step, started),
        )  # fmt: skip
        result.drain_signal = outcome.signal
        if outcome.warning:
            result.warnings.append(outcome.warning)
        return outcome.idle

    def _fail(
        self, unit: UnitPlan, report: LaunchReport, result: UnitResult, started: float
    ) -> None:
        """The new configuration failed: say why, end what is left of it, start the old one."""
        result.outcome = UnitOutcome.FAILED
        result.error, result.crash = _why_failed(report)
        self._back_to_previous(unit, result, started)

    def _back_to_previous(self, unit: UnitPlan, result: UnitResult, started: float) -> None:
        """End what is left of the new configuration; relaunch the previous one (which
        puts it back in its router)."""
        try:
            previous = (
                [capture(p.host, s, self.available) for p, s in zip(unit.plans, unit.statuses, strict=True)]
                if all(s.run is not None for s in unit.statuses)
                else None  # nothing ran before: nothing to go back to
            )  # fmt: skip
        except DeployctlError as exc:
            result.warnings.append(f"previous configuration not relaunched: {exc.message}")
            previous = None
        if previous is None:
            for plan in unit.plans:
                try:
                    stop_run(plan.host, self.fleet.connection(plan.host), self.options.stop_timeout)
                except DeployctlError as exc:
                    result.warnings.append(
                        f"{plan.host.label}: the failed run not stopped: {exc.message}"
                    )
            return
        self._step(unit, "starting the previous configuration", started)
        try:
            back = relaunch(
                self.fleet, previous, self.catalog, restart_of={}, timeout=self.options.timeout,
                stop_timeout=self.options.stop_timeout, events=self.events, checked=True,
                out_of_router=True,
            )  # fmt: skip
        except DeployctlError as exc:
            result.state = "down"
            result.warnings.append(f"previous configuration not relaunched: {exc.message}")
            return
        for stop in back.stops:
            if stop.exception is not None:
                result.warnings.append(f"{stop.name}: the failed run not stopped: {stop.error}")
        if back.launch is None:
            result.state = "down"
            result.warnings.append("previous configuration not relaunched: its stop failed")
            return
        result.new_run, result.state = (
            launched_run(back.launch),
            "ready" if back.launch.ok else "down",
        )
        if not back.launch.ok:
            result.warnings.append(
                f"the previous configuration did not come back either: {_why_failed(back.launch)[0]}"
            )


def _raise_failed_stop(stops: FleetResult[StopResult]) -> None:
    """A stop that raised fails the unit as it did when it raised here."""
    failed = next((r.exception for r in stops if r.exception is not None), None)
    if failed is not None:
        raise failed


def _run_id(unit: UnitPlan) -> str | None:
    status = unit.statuses[0] if unit.statuses else None
    return status.run["id"] if status is not None and status.run else None


def launched_run(report: LaunchReport) -> str | None:
    """The run id of the launch's rank 0 (None: none started)."""
    for out in report.outcomes:
        if out.value is not None and node_rank(out.host) == 0:
            return out.value.run["id"]
    return None


def _server_start(report: LaunchReport) -> float:
    return max((o.value.elapsed for o in report.outcomes if o.value is not None), default=0.0)


def _why_failed(report: LaunchReport) -> tuple[str, CrashReport | None]:
    """The first reason a launch did not serve: a refusal, a crash, a timeout or a router."""
    for pre in report.preflights:
        if pre.value is None:
            return f"{pre.name}: {pre.error}", None
        if pre.value.problems:
            return f"{pre.name}: {pre.value.problems[0]}", None
    for out in report.outcomes:
        if out.value is None:
            return f"{out.name}: {out.error}", None
        if not out.value.ok:
            crash = out.value.crashes[0] if out.value.crashes else None
            what = crash.summary() if crash else out.value.last_line
            return f"{out.name}: {out.value.state.value}" + (f": {what}" if what else ""), crash
    for change in report.registrations:
        if not change.ok:
            return f"{change.worker}: not added to {change.router}: {change.error}", None
    return "the launch failed", None


def rollout(
    fleet: Fleet,
    unit_plans: Sequence[UnitPlan],
    catalog: Catalog,
    available: Mapping[str, PatchSet],
    options: RolloutOptions,
    events: EventSink = DISCARD,
) -> RolloutReport:
    """Run the rollout. Ctrl-C finishes the units in hand (or, before they are stopped, puts
    them back in their routers) and starts no other; a second Ctrl-C leaves at once."""
    if options.max_unavailable < 1:
        raise UsageError("--max-unavailable must be 1 or more")
    # A rollout reads each unit's run again and again for minutes (drains, waits): one kept
    # agent process per host answers those reads, not a fresh Python per read.
    fleet.keep_agents()
    cancel = threading.Event()
    engine = Rollout(fleet, unit_plans, catalog, available, options, events, cancel)
    # One change through a router at a time: a second one is refused before anything moves.
    changing = [u for u in unit_plans if u.changes and not u.blocked]
    routers = [u.router for u in changing if u.router is not None]
    routers += [u.rank0 for u in changing if u.plans[0].role is Role.ROUTER]
    with router_locks(fleet, routers, options.what):
        driven = drive(
            [engine.run], 1, cancel,
            lambda: events.emit(ev.RolloutStep(target="", step="interrupting", elapsed=0.0)),
        )  # fmt: skip
    [future] = driven.futures
    return RolloutReport(future.result(), list(unit_plans), interrupted=driven.interrupted)
