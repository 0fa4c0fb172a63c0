"""A run's life cycle, in one place: its states, starting it, waiting for it, reading it,
stopping it and replacing it.

A *deployment* is one server; a *run* is one start of it (its record, its versioned log);
a *unit* is what starts and stops as one: a single server, or every node of a multi-node
server. Everything a command does to a server is a step here: `launch` starts runs and
waits for them, `run_status` reads one, `stop_run` ends one, and `replace` (check, stop,
preflight, start, wait) is the one step `restart`, `watch`, rollouts, tuning and
`launch --replace` use.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import dataclasses
import functools
import getpass
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from deployctl import __version__, agent
from deployctl import events as ev
from deployctl.connection import Connection
from deployctl.crash import Catalog, CrashReport, CrashScanner, scan_text
from deployctl.deployments import GroupKey, gpu_set, group_of, node_rank
from deployctl.errors import ConnectError, DeployctlError, HostKeyError, MetricsError
from deployctl.events import DISCARD, EventSink
from deployctl.facts import parse_gpus_command
from deployctl.fanout import (
    POLL_RETRY_FIRST,
    RECONNECT_BACKOFF_MAX,
    Fleet,
    FleetResult,
    HostResult,
    next_backoff,
)
from deployctl.inventory import Host, secret_values
from deployctl.launchers import launcher_of
from deployctl.masking import mask_text
from deployctl.metrics import METRICS_LIMIT_BYTES, parse_metrics
from deployctl.ops.gpus import (
    DEFAULT_MAX_USED_MIB,
    GpuReport,
    check_gpus,
    find_holders,
    gpu_report,
)
from deployctl.ops.plan import Plan, Role, shares_a_gpu
from deployctl.ops.preflight import Preflight, check_software, release_lock, run_preflight
from deployctl.ops.router import (
    Registration,
    RouterState,
    change_registration,
    is_router_run,
    launch_url,
    listed_load,
    register_workers_of,
    registered_url,
    router_state,
)
from deployctl.remote.protocol import (
    MetricsPage,
    Placement,
    PollReply,
    RunInfo,
    RunRecord,
    StartArgs,
    StatusArgs,
    StatusReply,
    StopArgs,
    StopReply,
)
from deployctl.remote.wire import (
    FIRST_SIGNAL_GROUP,
    FIRST_SIGNAL_LEADER,
    FIRST_SIGNAL_NONE,
    GPUS_COMMAND,
    SHUTDOWN_DRAINED,
    STOP_MARGIN_S,
    poll_args,
)
from deployctl.text import plain

# Seconds a replaced run gets between SIGTERM and SIGKILL unless the caller says otherwise.
DEFAULT_STOP_TIMEOUT = 30.0
# How far a host's wall clock may be from this one's, where a stop's mark (host time) is read.
CLOCK_SKEW_S = 60.0


class RunState(StrEnum):
    """Where a run is in its life cycle, as one look at it (or one wait for it) saw it."""

    STARTED = "started"  # started; nobody waited for it
    STARTING = "starting"  # alive, not (yet) answering /health with 200
    READY = "ready"
    TIMEOUT = "timeout"  # still not ready when the wait gave up; left running
    CRASHED = "crashed"  # a fatal trace in its log, or dead while meant to run
    DIED = "died"  # exited during the wait without a trace that explains it
    ABORTED = "aborted"  # ended because another node of its server failed
    STOPPED = "stopped"  # ended by deployctl

    @property
    def is_terminal(self) -> bool:
        """The run is over: nothing of it runs any more."""
        return self in _TERMINAL_RUN_STATES


_TERMINAL_RUN_STATES = frozenset(
    {RunState.CRASHED, RunState.DIED, RunState.ABORTED, RunState.STOPPED}
)


class UnitState(StrEnum):
    """A unit's state: a single server's, or a multi-node server's as a whole."""

    READY = "ready"
    STARTING = "starting"
    DEGRADED = "degraded"  # some node other than rank 0 is down: the API still answers
    CRASHED = "crashed"  # rank 0 (a single server's only node) is down
    STOPPED = "stopped"

    @property
    def is_terminal(self) -> bool:
        """Nothing of the unit serves: it must be started again."""
        return self in (UnitState.CRASHED, UnitState.STOPPED)


class Verdict(StrEnum):
    """How the wait of one node settles its multi-node server's wait."""

    READY = "ready"
    TIMEOUT = "timeout"
    FAILED = "failed"

    @classmethod
    def of(cls, state: RunState) -> Verdict:
        if state is RunState.READY:
            return cls.READY
        return cls.TIMEOUT if state is RunState.TIMEOUT else cls.FAILED


READY_LINE = "The server is fired up and ready to roll!"


# The agent long-polls: it returns as soon as the log grows or the run dies or is ready.
POLL_WAIT = 1.0


# A node of a multi-node server other than rank 0 learns that the group is ready only when
# its own poll returns: a shorter wait keeps the group's ready lag short on any node count.
NODE_POLL_WAIT = 0.25


# The most log one poll brings back.
POLL_LIMIT_BYTES = 1 << 20


def start_run(
    plan: Plan,
    conn: Connection,
    lock_token: str | None,
    restart_of: str | None = None,
    min_version: int = 1,
    origin: str = "",
) -> RunRecord:
    """Start the server detached with a new versioned log; record the run (and `origin`, the
    inventory that started it); release the lock."""
    host, rendered = plan.host, plan.rendered
    run: RunInfo = {
        "env": rendered.env_shown,
        "deployment": host.deployment,
        "gpus": plan.gpus,
        "template": rendered.template,
        "threshold": rendered.threshold,
        "command": rendered.display,
        "port": plan.port,
        "bind_host": plan.bind_host,
        "tp": plan.tp,
        "patches": {s.name: s.version for s in plan.needed_sets},
        "deployctl_version": __version__,
        "started_by": f"{getpass.getuser()}@{socket.gethostname()}",
        "restart_of": restart_of,
        "origin": origin,
        "worker_url": launch_url(host, plan.port, plan.launcher.address_known_at_start),
    }
    if plan.mem_fraction is not None:  # a later launch beside it and `status` read it here
        run["mem_fraction_static"] = plan.mem_fraction
    args: StartArgs = {
        "state_dir": host.settings.state_dir,
        "deployment": host.deployment,
        "log_dir": host.settings.log_dir,
        "log_stem": rendered.log_stem,
        "command": rendered.command,
        "env": rendered.env,
        "min_version": min_version,
        "run": run,
        "files": rendered.files,
        "lock_token": lock_token,
        "launcher": plan.launcher.kind,
        "script": plan.launcher_script(masked=False),
    }
    return agent.call(host, conn, agent.START, args)["run"]


@dataclass
class Outcome:
    """How a started run ended up: ready, crashed, died or still starting at the timeout."""

    run: RunRecord
    state: RunState
    elapsed: float
    crashes: list[CrashReport] = field(default_factory=list)
    last_line: str = ""
    warnings: list[CrashReport] = field(default_factory=list)  # traces while healthy
    note: str = ""  # why a node of a multi-node server was stopped (state "aborted")
    connection_losses: list[str] = field(default_factory=list)  # while waited for, each mended
    placement: Placement | None = None  # its placement as the wait last saw it (a job's)

    @property
    def ok(self) -> bool:
        return self.state in (RunState.READY, RunState.STARTED)


class GroupWatch:
    """The nodes of one multi-node server waiting together: rank 0's readiness is the
    group's, and the first node that fails (or times out) settles it for all of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state: Verdict | None = None
        self.by = ""

    def settle(self, state: Verdict, by: str) -> None:
        """The first word stands, except that a failure overrides readiness: a node that
        dies once rank 0 is up still fails the group."""
        with self._lock:
            failure_after_ready = state is Verdict.FAILED and self.state is Verdict.READY
            if self.state is None or failure_after_ready:
                self.state, self.by = state, by


def wait_ready(
    host: Host,
    conn: Connection,
    run: RunRecord,
    catalog: Catalog,
    timeout: float,
    events: EventSink = DISCARD,
    group: GroupWatch | None = None,
) -> Outcome:
    """Poll the run until /health answers 200 or the ready line appears; fail fast on a crash.

    A node of a multi-node server other than rank 0 serves no API (its /health is a dummy):
    it is ready when rank 0 is and it is still alive.
    """
    losses: list[str] = []
    try:
        outcome = _wait_ready(host, conn, run, catalog, timeout, events, group, losses)
    except BaseException:
        if group is not None:  # the other nodes stop waiting for this one
            group.settle(Verdict.FAILED, host.label)
        raise
    outcome.connection_losses = losses
    if group is not None and outcome.state is not RunState.ABORTED:
        group.settle(Verdict.of(outcome.state), host.label)
    events.emit(
        ev.WaitEnded(
            target=host.label, run=run["id"], state=outcome.state.value, elapsed=outcome.elapsed
        )
    )
    return outcome


def _wait_ready(
    host: Host,
    conn: Connection,
    run: RunRecord,
    catalog: Catalog,
    timeout: float,
    events: EventSink,
    group: GroupWatch | None,
    losses: list[str],
) -> Outcome:
    serves_api = group is None or node_rank(host) == 0
    scanner = CrashScanner(catalog)
    # One decoder for the whole log: a character split across two polls stays whole.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offset, started, last_line, buffer = 0, time.monotonic(), "", ""
    secrets = log_secrets(host)
    backoff = 0.0  # > 0 while the connection is lost: the wait before the next try
    placed: Placement | None = None
    launcher = launcher_of(run)
    while True:
        try:
            doc = poll(host, conn, run, offset, POLL_WAIT if serves_api else NODE_POLL_WAIT)
        except HostKeyError:
            raise
        except ConnectError as exc:
            # The run goes on without us: connect again (each try a fresh handshake, the
            # host key checked again), saying so once, until the wait's own timeout.
            elapsed = time.monotonic() - started
            if elapsed >= timeout or (group is not None and group.state is Verdict.FAILED):
                raise
            if not backoff:
                losses.append(str(exc))
                events.emit(ev.ConnectionLost(target=host.label, elapsed=elapsed, error=str(exc)))
            backoff = next_backoff(backoff, POLL_RETRY_FIRST, RECONNECT_BACKOFF_MAX)
            time.sleep(min(backoff, timeout - elapsed))
            continue
        if backoff:
            events.emit(ev.Reconnected(target=host.label, elapsed=time.monotonic() - started))
        backoff = 0.0
        raw = base64.b64decode(doc["data"])
        offset += len(raw)
        buffer += decoder.decode(raw, final=not doc["alive"])
        # Whole lines only (all of it once the server is gone), masked before anything
        # reads them: a secret split between two polls is still masked.
        cut = len(buffer) if not doc["alive"] else buffer.rfind("\n") + 1
        data, buffer = mask_text(buffer[:cut], secrets), buffer[cut:]
        lines = data.split("\n")
        if any(line.strip() for line in lines):
            last_line = plain(next(line for line in reversed(lines) if line.strip()))
        crashes = scanner.feed(data)
        elapsed = time.monotonic() - started
        placed = doc["placement"]
        # A trace while /health answers 200 is a failed request, not a failed server.
        if crashes and (doc["health"] != 200 or not serves_api):
            return Outcome(
                run, RunState.CRASHED, elapsed, scanner.reports, last_line, placement=placed
            )
        # A job's ready line is written on its node before the login node can reach it.
        ready_line = launcher.trusts_ready_line and any(READY_LINE in line for line in lines)
        if serves_api and (doc["health"] == 200 or ready_line):
            ready = RunState.READY
            return Outcome(run, ready, elapsed, [], last_line, scanner.reports, placement=placed)
        if not doc["alive"]:
            crashes = scanner.finish() or scanner.reports
            state = RunState.STOPPED if was_stopped(host, conn, run) else RunState.DIED
            note = launcher.words(placed)
            return Outcome(run, state, elapsed, crashes, last_line, note=note, placement=placed)
        last_line = launcher.waiting_line(placed) or last_line
        if group is not None and group.state is not None:
            if group.state is not Verdict.FAILED:  # a timeout leaves every node running
                state = RunState(group.state.value)
                return Outcome(run, state, elapsed, [], last_line, warnings=scanner.reports)
            note = f"node {group.by} failed"
            return Outcome(run, RunState.ABORTED, elapsed, scanner.reports, last_line, note=note)
        if elapsed >= timeout:
            return Outcome(run, RunState.TIMEOUT, elapsed, [], last_line, placement=placed)
        events.emit(ev.Waiting(target=host.label, elapsed=elapsed, last_line=last_line))


def was_stopped(host: Host, conn: Connection, run: RunRecord) -> bool:
    """Whether a run that ended was ended by a stop (`deployctl stop` from elsewhere)."""
    try:
        record = recorded_run(host, conn, run["id"])["run"]
    except DeployctlError:
        return False  # it died either way; the wait says so
    return record is not None and "stop_requested_at" in record


def poll(
    host: Host, conn: Connection, run: RunRecord, offset: int, wait: float = POLL_WAIT
) -> PollReply:
    """What the run's log gained since `offset`, and whether it is alive and healthy."""
    ref = launcher_of(run).placement_ref(host.settings.state_dir, run)
    return agent.call(host, conn, agent.POLL, poll_args(run, ref, offset, POLL_LIMIT_BYTES, wait))


@dataclass
class LaunchReport:
    """The result of a launch over all selected hosts.

    `refused`: some host failed its preflight, so nothing was started anywhere. A dry run
    starts nothing either way, and is refused when a real launch would have been.
    """

    preflights: FleetResult[Preflight]
    outcomes: FleetResult[Outcome]
    refused: bool
    dry_run: bool = False
    # The nodes of multi-node servers that failed on some node, ended so none holds GPUs.
    cleanup: FleetResult[StopReply] = field(default_factory=lambda: FleetResult([]))
    # Ready workers added to their routers, and workers added to routers that came up.
    registrations: list[Registration] = field(default_factory=list)
    # `launch --replace`: the live runs stopped first, per target (a failed stop kept its
    # plan from starting).
    stops: FleetResult[StopResult] = field(default_factory=lambda: FleetResult([]))

    @property
    def started(self) -> bool:
        return bool(self.outcomes.results)

    @property
    def up(self) -> bool:
        """Every server started and ready (its registration aside)."""
        return not self.refused and not self.stops.failed and self.outcomes.ok

    @property
    def ok(self) -> bool:
        return self.up and all(r.ok for r in self.registrations)


def launch(
    fleet: Fleet,
    plans: Sequence[Plan],
    catalog: Catalog,
    *,
    wait: bool = True,
    timeout: float = 900,
    dry_run: bool = False,
    max_used_mib: int = DEFAULT_MAX_USED_MIB,
    events: EventSink = DISCARD,
    restart_of: Mapping[str, str] | None = None,
    beside: Mapping[str, str] | None = None,
    replacing: Collection[str] = (),
) -> LaunchReport:
    """Preflight all hosts; start on all only if every one passed; then wait for ready.
    `beside`: per target, a live run the new one starts beside (a Slurm job's successor).
    `replacing` (with `dry_run`): the targets whose run still serves and is stopped after
    this check; theirs checks only what does not depend on that run."""
    by_name = {p.host.label: p for p in plans}
    launch_id = uuid.uuid4().hex  # a lock of this very launch is one of its own targets'

    def preflight(host: Host, conn: Connection) -> Preflight:
        plan = by_name[host.label]
        # The lock is held until the wait ends: a second launch must not slip in while
        # the first server has not yet bound its port.
        alongside = (beside or {}).get(host.label)
        return run_preflight(
            plan,
            conn,
            max_used_mib,
            timeout + 120,
            alongside,
            host.label in replacing,
            launch_id,
            fleet.select,
        )

    preflights = fleet.run(preflight, [p.host for p in plans])
    check_software(plans, fleet.select, preflights.succeeded)
    refused = not preflights.ok
    if refused or dry_run:
        held = [r.value for r in preflights if r.value is not None and r.value.lock_token]
        fleet.run(
            lambda host, conn: release_lock(
                by_name[host.label], conn, _token(preflights, host.label)
            ),
            [p.plan.host for p in held],
        )
        return LaunchReport(preflights, FleetResult([]), refused=refused, dry_run=dry_run)

    # One log version on every node of a multi-node server: the highest any node needs.
    versions: dict[GroupKey | None, int] = {}
    for result in preflights:
        if result.value is not None and result.value.plan.group is not None:
            key = result.value.plan.group
            versions[key] = max(versions.get(key, 1), result.value.next_version)
    groups = {key: GroupWatch() for key in versions}

    def start(host: Host, conn: Connection) -> RunRecord:
        plan = by_name[host.label]
        token = _token(preflights, host.label)
        try:
            # Without waiting, a successful start releases the lock itself.
            return start_run(
                plan,
                conn,
                None if wait else token,
                (restart_of or {}).get(host.label),
                versions.get(plan.group, 1),
                fleet.origin,
            )
        except BaseException:
            with contextlib.suppress(DeployctlError):
                release_lock(plan, conn, token)
            raise

    def start_all(wave: Sequence[Plan]) -> FleetResult[RunRecord]:
        # Every node starts before any waits: a multi-node server comes up only as a whole.
        starts = fleet.run(start, [p.host for p in wave])
        for result in starts:
            watch = groups.get(group_of(result.host))
            if result.failed and watch is not None:
                watch.settle(Verdict.FAILED, result.name)
        return starts

    if not wait:
        outcomes = FleetResult(
            HostResult(r.host, exception=r.exception)
            if r.value is None
            else HostResult(r.host, Outcome(r.value, RunState.STARTED, 0.0))
            for r in start_all(plans)
        )
        return LaunchReport(preflights, outcomes, refused=False)

    def wait_for(host: Host, conn: Connection) -> Outcome:
        plan = by_name[host.label]
        try:
            return wait_ready(
                host, conn, runs[host.label], catalog, timeout, events, groups.get(plan.group)
            )
        finally:
            # Every way out of a launch gives the lock back; a host that cannot be reached
            # now keeps it until it expires, and the error that got us here is the one shown.
            with contextlib.suppress(DeployctlError):
                release_lock(plan, conn, _token(preflights, host.label))

    # Deployments sharing a GPU start one after another, each once the one before is ready:
    # SGLang sizes its memory from what is free when it starts.
    runs: dict[str, RunRecord] = {}
    started: list[HostResult[RunRecord]] = []
    waited: dict[str, HostResult[Outcome]] = {}
    for wave in start_waves(plans):
        starts = start_all(wave)
        started += starts
        runs.update(starts.succeeded)
        # Rank 0s first: with fewer forks than nodes, a rank 0 must not queue behind the
        # nodes that wait for it.
        waiting = sorted((p.host for p in wave if p.host.label in runs), key=node_rank)
        waited.update({r.name: r for r in fleet.run(wait_for, waiting)})
    outcomes = FleetResult(
        waited.get(r.name) or HostResult(r.host, exception=r.exception) for r in started
    )
    # A multi-node server that failed on one node leaves no process on any other.
    failed = {key for key, watch in groups.items() if watch.state is Verdict.FAILED}
    cleanup = fleet.run(
        lambda host, conn: end_run(host, conn, let_drain=False),
        [p.host for p in plans if p.group in failed],
    )
    ready = [
        by_name[r.name] for r in outcomes if r.value is not None and r.value.state is RunState.READY
    ]
    heads = {r.name: launcher_of(r.value.run).head(r.value.placement) for r in outcomes if r.value}
    registrations = register_ready(fleet, ready, events, heads)
    return LaunchReport(
        preflights, outcomes, refused=False, cleanup=cleanup, registrations=registrations
    )


def start_waves(plans: Sequence[Plan]) -> list[list[Plan]]:
    """The plans in the order they start: all at once, but deployments of one machine that
    share a GPU in successive waves (the nodes of a multi-node server in one)."""
    waves: list[list[Plan]] = []
    for unit in _units_of(plans):
        index = next(
            (
                i
                for i, wave in enumerate(waves)
                if not any(shares_a_gpu(p, q) for p in unit for q in wave)
            ),
            len(waves),
        )
        if index == len(waves):
            waves.append([])
        waves[index] += unit
    return waves


def _units_of(plans: Sequence[Plan]) -> list[list[Plan]]:
    units: dict[GroupKey | str, list[Plan]] = {}
    for plan in plans:
        units.setdefault(plan.group or plan.host.label, []).append(plan)
    return list(units.values())


def register_ready(
    fleet: Fleet,
    ready: Sequence[Plan],
    events: EventSink = DISCARD,
    heads: Mapping[str, str] | None = None,
) -> list[Registration]:
    """Add each ready worker to its router; a router that came up adds the workers of ours
    that name it and serve. `heads`: the head node of each worker that is a Slurm job."""
    workers = {p.host.label: p for p in ready if p.role is not Role.ROUTER}

    def add(host: Host, conn: Connection) -> Registration | None:
        head = (heads or {}).get(host.label, "")
        plan = workers[host.label]
        return change_registration(fleet, host, True, plan.port, events, head, kind=plan.kind)

    added = fleet.run(add, [p.host for p in workers.values()])
    found = [
        r.value if r.value is not None else Registration(r.name, "", "", True, r.error or "")
        for r in added
        if r.value is not None or r.failed
    ]
    routers = [p.host for p in ready if p.role is Role.ROUTER]
    return found + register_workers_of(fleet, routers, events)


def recorded_run(
    host: Host, conn: Connection, run_id: str | None = None, metrics: bool = False
) -> StatusReply:
    """The deployment's current (or named) run record and whether it lives and answers
    /health (and, asked for, its /metrics page): no log tail, no GPU query."""
    args: StatusArgs = {
        "state_dir": host.settings.state_dir,
        "deployment": host.deployment,
        "run": run_id,
        "tail_bytes": 0,
        "metrics_bytes": METRICS_LIMIT_BYTES if metrics else 0,
    }
    return agent.call(host, conn, agent.STATUS, args)


def end_run(
    host: Host,
    conn: Connection,
    timeout: float = 10,
    run_id: str | None = None,
    let_drain: bool = True,
) -> StopReply:
    """End the deployment's current run (or run `run_id`) on one host: SIGTERM its main
    process (SGLang drains: what it runs finishes, then it ends its children), and after
    `timeout` its whole group, SIGKILL leftovers; a Slurm job: scancel.

    A node > 0 of a multi-node server gets no signal of its own at first: its schedulers
    end when rank 0's drain shuts them down (a SIGTERM to its main process would take them
    down at once and break rank 0's requests). `let_drain` False: the group gets SIGTERM at
    once (a server that failed has nothing to finish)."""
    args: StopArgs = {
        "state_dir": host.settings.state_dir,
        "deployment": host.deployment,
        "timeout": timeout,
        "run": run_id,
        "first_signal": FIRST_SIGNAL_LEADER,
    }
    if not let_drain:
        args["first_signal"] = FIRST_SIGNAL_GROUP
    elif node_rank(host) > 0:
        args["first_signal"] = FIRST_SIGNAL_NONE
    # The agent waits `timeout` for the drain, up to 10 s for the group's SIGTERM, then up
    # to 10 s after SIGKILL: the round trip must outlast them all, whatever the host's
    # command timeout.
    limit = max(conn.command_timeout, timeout + STOP_MARGIN_S)
    return agent.call(host, conn, agent.STOP, args, timeout=limit)


def _token(preflights: FleetResult[Preflight], name: str) -> str:
    for result in preflights:
        if result.name == name and result.value is not None and result.value.lock_token:
            return result.value.lock_token
    raise DeployctlError(f"{name}: no lock held")


STATUS_TAIL_BYTES = 256 * 1024
# The most log lines a status keeps (the dashboard's tail of a run).
TAIL_LINES = 60


@dataclass
class RunStatus:
    """The current run on a host as one status probe sees it."""

    run: RunRecord | None
    alive: bool = False
    health: int | None = None
    last_line: str = ""
    crashes: list[CrashReport] = field(default_factory=list)
    gpus: GpuReport | None = None
    command: str | None = None
    env: dict[str, str] | None = None  # the server's real environment, for restart
    metrics: dict[str, Any] | None = None  # when asked for: see deployctl.metrics
    metrics_note: str | None = None  # None: not asked; else why there are none, or ""
    router: RouterState | None = None  # a live router's list and drift (see ops/router.py)
    placement: Placement | None = None  # its placement's state (a Slurm job's)
    tail: list[str] = field(default_factory=list)  # the log's last lines read, plain text
    members: list[int] = field(default_factory=list)  # its live processes on the host

    @property
    def running(self) -> bool:
        """Deployctl started it and is not stopping it: a run dead between its stop's signal
        and the record's `stopped` (a relaunch's old run) never reads crashed."""
        run = self.run
        return run is not None and run.get("status") == "running" and not self.stopping

    @property
    def stopping(self) -> bool:
        """A stop of it began and may still be under way: its mark is younger than the stop's
        budget (older, the stop's agent died and the run is meant to run again)."""
        run = self.run
        if run is None or "stop_requested_at" not in run:
            return False
        budget = run.get("stop_budget_s", DEFAULT_STOP_TIMEOUT + STOP_MARGIN_S)  # older marks
        return time.time() - run["stop_requested_at"] < budget + CLOCK_SKEW_S

    @property
    def crashed(self) -> bool:
        """Dead, or failing its health check with a fatal trace in its log.

        SGLang logs a traceback for a failed request and goes on serving: a trace in a live,
        healthy server is a warning, never a reason to restart it.
        """
        return self.running and (not self.alive or (bool(self.crashes) and not self.ready))

    @property
    def up_since(self) -> float | None:
        """When the run started; None while nothing of it runs (a job waiting to start, or
        to start again after a requeue)."""
        if self.run is None or not self.alive:
            return None
        if launcher_of(self.run).waiting(self.placement):
            return None
        return self.run["started_at"]

    @property
    def warnings(self) -> list[CrashReport]:
        """Traces in the log of a server that is alive and healthy."""
        return self.crashes if self.alive and not self.crashed else []

    @property
    def ready(self) -> bool:
        return self.alive and self.health == 200

    @property
    def ok(self) -> bool:
        return not self.crashed

    @property
    def state(self) -> RunState | None:
        """The run's state as this look saw it; None when no run is recorded."""
        if self.run is None:
            return None
        if self.crashed:
            return RunState.CRASHED
        if self.ready:
            return RunState.READY
        if self.alive:
            return RunState.STARTING
        return RunState.STOPPED


def run_status(
    host: Host,
    conn: Connection,
    catalog: Catalog,
    run_id: str | None = None,
    metrics: bool = False,
    tail_bytes: int = STATUS_TAIL_BYTES,
) -> RunStatus:
    """Read the run, its liveness, health, log tail, GPUs and (asked for) its metrics in one
    round trip. Of a multi-node server only rank 0 has metrics: the others serve none."""
    with_metrics = metrics and node_rank(host) == 0
    args: StatusArgs = {
        "state_dir": host.settings.state_dir,
        "deployment": host.deployment,
        "run": run_id,
        "tail_bytes": tail_bytes,
        "metrics_bytes": METRICS_LIMIT_BYTES if with_metrics else 0,
    }
    probes = {"gpus": GPUS_COMMAND}
    outputs, doc = agent.call_beside(host, conn, probes, agent.STATUS, args)
    run = doc["run"]
    try:  # a host without working GPUs still has a status
        if not launcher_of(run).checks_host:
            raise DeployctlError("the run's GPUs are on the nodes its launcher picked")
        gpu_probe = outputs["gpus"]
        state = parse_gpus_command(gpu_probe.exit_code, gpu_probe.output, gpu_probe.stderr)
        only = run.get("gpus") if run else gpu_set(host)
        gpus: GpuReport | None = gpu_report(state, DEFAULT_MAX_USED_MIB, only)
    except DeployctlError:
        gpus = None
    if run is None and run_id is not None:
        raise DeployctlError(
            f"no run {run_id} recorded on {host.name}", hint="check the run id (deployctl status)"
        )
    if run is None:
        return RunStatus(None, gpus=gpus)
    tail = mask_text(
        base64.b64decode(doc["data"]).decode("utf-8", errors="replace"), log_secrets(host)
    )
    lines = [line for line in tail.splitlines() if line.strip()]
    placed = doc["placement"]
    # A run waiting to (re)start has an earlier start's log (requeued): none of its crashes.
    latest = launcher_of(run).current_log(tail, placed)
    crashes = scan_text(latest, catalog) if run["status"] == "running" and latest else []
    status = RunStatus(
        run,
        alive=doc["alive"],
        health=doc["health"],
        last_line=plain(lines[-1]) if lines else "",
        tail=[plain(line) for line in lines[-TAIL_LINES:]],
        crashes=crashes,
        gpus=gpus,
        command=doc["command"],
        env=doc["env"],
        placement=placed,
        members=doc["members"],
    )
    if with_metrics:
        status.metrics, status.metrics_note = read_metrics(doc["metrics"])
    return status


def log_secrets(host: Host) -> tuple[str, ...]:
    """The known secret values to mask in a host's log text (see mask_text): its variables'."""
    return secret_values(host.vars)


def masked_reports(reports: Sequence[CrashReport], host: Host | None = None) -> list[CrashReport]:
    """Crash reports with the secrets in their text masked (see mask_text); `host`'s known
    secret values too. A scan reads the log in pieces, so its reports are masked, not its
    text."""
    secrets = log_secrets(host) if host is not None else ()
    return [
        dataclasses.replace(
            r, exception=mask_text(r.exception, secrets), message=mask_text(r.message, secrets)
        )
        for r in reports
    ]


def read_metrics(page: MetricsPage | None) -> tuple[dict[str, Any] | None, str]:
    """The server's metrics, or none and why."""
    if page is None:
        return None, "not running"
    if page["status"] == 404:
        return None, "metrics off"  # started without --enable-metrics
    if page["status"] != 200:
        return None, f"no answer from /metrics ({page['status'] or 'nothing listening'})"
    try:
        return parse_metrics(page["text"]), ""
    except MetricsError as exc:
        return None, exc.message


@dataclass
class StopResult:
    run: str | None
    ended: list[int]
    killed: list[int]
    gpus_clean: bool | None
    note: str = ""
    # Its removal from its router before the stop (None: it names no router).
    router: Registration | None = None
    drained: bool | None = None  # None: not drained (no router, or not asked)
    placement: Placement | None = None  # its placement as the stop left it (a job's)
    # How the run ended: "drained" (by itself after SIGTERM to its main process: what it
    # ran finished), "cut" (still running at the timeout: its whole group was signalled);
    # None: nothing of it was running.
    shutdown: str | None = None
    shutdown_s: float | None = None  # seconds from the first signal until it had ended

    @property
    def ok(self) -> bool:
        """False only when the GPUs were checked and are still not clean."""
        return self.gpus_clean is not False


def stop_run(
    host: Host,
    conn: Connection,
    timeout: float,
    gpu_timeout: float = 120,
    let_drain: bool = True,
) -> StopResult:
    """End the run (`end_run`: its main process drains for up to `timeout`), then wait
    until the GPUs it was given (the deployment's, or the host's) are clean; a run that
    may share them (its fraction recorded) waits until every process left on them is
    another live run's of ours (its own gone, none of anyone else's), so the deployment
    beside it keeps serving. `let_drain`: as `end_run`'s."""
    doc = end_run(host, conn, timeout, let_drain=let_drain)
    run = doc["run"]
    if run is None:
        return StopResult(None, [], [], None, "no run recorded")
    if doc["left"]:
        raise DeployctlError(f"{host.label}: processes {doc['left']} survived SIGKILL")
    note = "" if doc["ended"] or doc["shutdown"] is not None else "was not running"
    ended = functools.partial(
        StopResult, run["id"], shutdown=doc["shutdown"], shutdown_s=doc["shutdown_s"],
        placement=doc["placement"],
    )  # fmt: skip
    launcher = launcher_of(run)
    if not launcher.checks_host:  # its GPUs were its nodes': its scheduler gives them back
        return ended([], [], None, launcher.words(doc["placement"]))
    if run.get("gpus") == []:  # a router: it held no GPU
        return ended(doc["ended"], doc["killed"], None, note or "holds no GPU")
    deadline = time.monotonic() + gpu_timeout
    while True:
        try:
            gpus = check_gpus(host, conn, only=run.get("gpus"))
        except DeployctlError as exc:
            return ended(doc["ended"], doc["killed"], None, f"GPUs not checked: {exc.message}")
        clean = gpus.clean
        if not clean and run.get("mem_fraction_static") is not None:
            # What is left may be the servers it shared its GPUs with: those may stay.
            clean = find_holders(host, conn, gpus).held_by_ours
        if clean or time.monotonic() > deadline:
            return ended(doc["ended"], doc["killed"], clean, note)
        time.sleep(0.5)


# How often a draining worker's /metrics is read.
DRAIN_POLL = 0.5


class DrainSignal(StrEnum):
    """What a drain watched to know the worker runs no request any more."""

    METRICS = "metrics"  # the worker's own num_running_reqs (/metrics)
    ROUTER_LOAD = "router load"  # the router's per-worker load, while it still lists it
    TIMEOUT = "timeout"  # neither: the whole timeout was waited


@dataclass
class Drain:
    """How a drain ended. `idle`: True once the worker ran nothing (or the whole timeout was
    waited without any signal), False when still busy at the timeout, None on cancel."""

    idle: bool | None
    signal: DrainSignal
    warning: str = ""


def drain(
    fleet: Fleet,
    host: Host,
    timeout: float,
    url: str = "",
    cancel: threading.Event | None = None,
    on_step: Callable[[str], None] = lambda step: None,
) -> Drain:
    """Wait until a worker taken out of its router (at `url`) runs no request. Its /metrics
    say so; without them, the router's load for it while it still lists it; without either,
    the whole `timeout` is waited: unreadable metrics are never taken for idle."""
    conn = fleet.connection(host)
    deadline = time.monotonic() + timeout
    said = ""
    while True:
        if cancel is not None and cancel.is_set():
            return Drain(None, DrainSignal.METRICS)
        # Liveness and /metrics only: no log tail, no nvidia-smi at every poll.
        reply = recorded_run(host, conn, metrics=True)
        metrics, _ = read_metrics(reply["metrics"])
        running = (metrics or {}).get("num_running_reqs")
        signal = DrainSignal.METRICS
        if running is None:  # no metrics (enable_metrics: false, or unreadable): not idle
            try:
                running = listed_load(fleet, host, url) if url else None
            except DeployctlError:  # the router cannot say: the timeout is the signal
                running = None
            signal = DrainSignal.TIMEOUT if running is None else DrainSignal.ROUTER_LOAD
        if not reply["alive"] or running == 0:
            return Drain(True, signal)
        if time.monotonic() >= deadline:
            if signal is DrainSignal.TIMEOUT:
                warning = (
                    "no metrics and no load from its router: "
                    f"waited the whole --drain-timeout {timeout:g}s"
                )
                return Drain(True, signal, warning)
            return Drain(False, signal)
        step = f"draining ({running:.0f} running)" if running is not None else "draining"
        if step != said:  # once per change: a piped log gets no line every poll
            on_step(step)
            said = step
        time.sleep(DRAIN_POLL)


def stop_serving(
    fleet: Fleet,
    host: Host,
    conn: Connection,
    timeout: float,
    gpu_timeout: float = 120,
    drain_timeout: float = 0.0,
    let_drain: bool = True,
) -> StopResult:
    """Remove a worker from its router (when it names one), let it finish what it runs (up
    to `drain_timeout`), then `stop_run` it (`let_drain`: as `end_run`'s). A router that cannot
    be reached does not keep the worker running: its result says so."""
    head, url = "", ""
    if host.settings.router is not None and node_rank(host) == 0:
        # The URL the run was registered at: the inventory's may name another server now.
        recorded = recorded_run(host, conn)
        head = launcher_of(recorded["run"]).head(recorded["placement"])  # a placed run: at its head
        url = registered_url(host, recorded["run"], head) if recorded["run"] else ""
    removed = change_registration(fleet, host, add=False, head=head, url=url)
    drained = None
    if removed is not None and removed.ok and drain_timeout > 0:
        drained = drain(fleet, host, drain_timeout, removed.url).idle
    result = stop_run(host, conn, timeout, gpu_timeout, let_drain=let_drain)
    result.router, result.drained = removed, drained
    return result


def stop_in_rank_order(
    fleet: Fleet,
    targets: Sequence[Host],
    stop: Callable[[Host, Connection, bool], StopResult],
) -> FleetResult[StopResult]:
    """Stop each target with `stop(host, conn, let_drain)`: single servers and the rank 0s of
    multi-node servers first, then their other nodes. Those get no signal while their rank
    0 drained (its ShutdownReq ends their schedulers; they only follow), and are cut at
    once where it did not (it was not running, or it was cut: their schedulers wait on
    collectives that never complete). Results in the targets' order."""
    firsts = [h for h in targets if node_rank(h) == 0]
    first = fleet.run(lambda host, conn: stop(host, conn, True), firsts)
    drained = {
        group_of(r.host)
        for r in first
        if r.value is not None and r.value.shutdown == SHUTDOWN_DRAINED
    }
    rest = fleet.run(
        lambda host, conn: stop(host, conn, group_of(host) in drained),
        [h for h in targets if node_rank(h) > 0],
    )
    found = {id(r.host): r for r in (*first, *rest)}
    return FleetResult(found[id(h)] for h in targets)


@dataclass
class Unit:
    """What restarts as one: a single server, or every node of a multi-node server."""

    name: str
    nodes: list[HostResult[RunStatus]]  # one for a single server; rank order for a group

    @property
    def down(self) -> list[str]:
        """The nodes that crashed or died (or could not be read) while meant to run."""
        return [n.host.name for n in self.nodes if n.value is None or n.value.crashed]

    @property
    def crashed(self) -> bool:
        return any(n.value is not None and n.value.crashed for n in self.nodes)

    @property
    def restartable(self) -> bool:
        return all(n.value is not None and n.value.run for n in self.nodes)

    @property
    def state(self) -> UnitState:
        """Ready, starting or stopped; a group with nodes `down` is degraded, or crashed
        when rank 0 is among them."""
        statuses = [n.value for n in self.nodes]
        if self.down:
            # Without rank 0 there is no API: the group is down whatever the others do.
            rank0_down = self.nodes[0].host.name in self.down
            return UnitState.CRASHED if rank0_down else UnitState.DEGRADED
        if not any(s and (s.running or s.alive) for s in statuses):  # alive: stopping
            return UnitState.STOPPED
        first = statuses[0]
        ready = first is not None and first.ready and all(s and s.alive for s in statuses)
        return UnitState.READY if ready else UnitState.STARTING

    def crash_signature(self) -> str:
        for node in self.nodes:
            status = node.value
            if status is not None and status.crashed and status.crashes:
                return status.crashes[0].signature
        return "died"


def units(results: FleetResult[RunStatus]) -> list[Unit]:
    """Group per-target statuses: a multi-node server's nodes into one unit."""
    found: dict[GroupKey | str, Unit] = {}
    for result in results:
        group = group_of(result.host)
        key = group or result.name
        if key not in found:
            name = result.name if group is None else f"{group[0]} ({', '.join(group[1])})"
            found[key] = Unit(name, [])
        found[key].nodes.append(result)
    return list(found.values())


# ---- replacing runs: restart, watch, rollout, tune, launch --replace -------------------


@dataclass
class Replacement:
    """What `replace` did: the stops (each host's), and the launch of the plans whose stops
    held (None: none was left to launch; refused and no stop: refused before the stop)."""

    stops: FleetResult[StopResult]
    launch: LaunchReport | None

    @property
    def untouched(self) -> bool:
        """Refused before anything was stopped: what served still serves."""
        return not self.stops.results and self.launch is not None and self.launch.refused


def replace(
    fleet: Fleet,
    plans: Sequence[Plan],
    catalog: Catalog,
    *,
    restart_of: Mapping[str, str],
    stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    wait: bool = True,
    timeout: float = 900,
    events: EventSink = DISCARD,
    drain_timeout: float = 0.0,
    checked: bool = False,
    out_of_router: bool = False,
    between: Callable[[FleetResult[StopResult]], bool] | None = None,
    stopping: Collection[str] | None = None,
) -> Replacement:
    """Check the plans, stop each plan's current run, then launch the plan (preflight,
    start, wait). The one stop-then-start: restart, watch, rollout and tune's put-back.

    A plan refused before the stop (SGLang missing, a patch set not applied, a path that
    does not exist) stops nothing: the launch says why and no stop is made. A stop that
    fails keeps its plan out; a multi-node server relaunches whole or not at all (a lone
    rank never rejoins its group). `restart_of` names each target's old run; a worker
    behind a router is drained up to `drain_timeout` once taken out of it.

    `checked`: the caller checked the plans already (a rollout, which applies patch sets
    between the stop and the start); `out_of_router`: the caller took the workers out of
    their routers itself, so the stop leaves the routers alone; `between`: run once the
    stops held, before the start (a rollout's patch change); False from it starts nothing;
    `stopping`: the targets whose run is stopped (None: every plan's); the others only
    start, so their check is a plain launch's.
    """
    stopped = [p.host for p in plans if stopping is None or p.host.label in stopping]
    if not checked:
        replacing = {h.label for h in stopped}
        check = launch(fleet, plans, catalog, dry_run=True, replacing=replacing, timeout=timeout)
        if check.refused:
            return Replacement(FleetResult([]), check)

    def stop(host: Host, conn: Connection, let_drain: bool) -> StopResult:
        if out_of_router:
            return stop_run(host, conn, stop_timeout, let_drain=let_drain)
        return stop_serving(
            fleet, host, conn, stop_timeout, drain_timeout=drain_timeout, let_drain=let_drain
        )

    # A failed stop is not judged by the GPUs (`ok`): only a stop that raised keeps a host out.
    stops = stop_in_rank_order(fleet, stopped, stop)
    broken = {p.group for p in plans if p.host.label in stops.failed and p.group is not None}
    kept = [p for p in plans if p.host.label not in stops.failed and p.group not in broken]
    if not kept or (between is not None and not between(stops)):
        return Replacement(stops, None)
    report = launch(
        fleet, kept, catalog, wait=wait, timeout=timeout, events=events, restart_of=restart_of
    )
    return Replacement(stops, report)


def with_router_states(fleet: Fleet, results: FleetResult[RunStatus]) -> FleetResult[RunStatus]:
    """Give each live router's status its list and drift (one more round trip per worker
    of ours that names it)."""
    live = {
        r.name: r.value
        for r in results
        if r.value is not None and r.value.alive and is_router_run(r.value.run)
    }
    states = fleet.run(
        lambda host, conn: router_state(fleet, host), [r.host for r in results if r.name in live]
    )
    for found in states:
        status = live[found.name]
        status.router = found.value or RouterState(found.name, None, error=found.error or "")
    return results


def launch_replacing(
    fleet: Fleet,
    plans: Sequence[Plan],
    catalog: Catalog,
    *,
    wait: bool = True,
    timeout: float = 900,
    dry_run: bool = False,
    events: EventSink = DISCARD,
) -> LaunchReport:
    """`launch --replace`: `replace` each plan whose deployment has a live run (out of its
    router, stopped, started again), and start the others; checked before anything stops,
    so a plan refused stops nothing. A dry run is that check.

    The new run names the one it replaced (`restart_of`), as restart's do; a run already
    dead is not replaced, only followed, as by a plain launch."""
    # Only whether each lives: no log tail, no GPU query. A host that cannot say is taken
    # for one with nothing alive: its check is then a plain launch's, which refuses a live run.
    read = fleet.run(recorded_run, [p.host for p in plans])
    live = {
        r.name: r.value["run"]["id"]
        for r in read
        if r.value is not None and r.value["alive"] and r.value["run"] is not None
    }
    if dry_run:
        return launch(
            fleet, plans, catalog, timeout=timeout, dry_run=True, replacing=live, events=events
        )
    replaced = replace(
        fleet, plans, catalog, restart_of=live, stopping=live, wait=wait, timeout=timeout,
        events=events,
    )  # fmt: skip
    # None: every stop failed, so nothing was left to start.
    report = replaced.launch or LaunchReport(FleetResult([]), FleetResult([]), refused=False)
    report.dry_run = False  # a refusal by the check, itself a dry run, refused this launch
    report.stops = replaced.stops
    return report
