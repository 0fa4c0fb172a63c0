"""Launch: render per host, preflight every host, start detached, wait until ready."""

from __future__ import annotations

import base64
import codecs
import contextlib
import getpass
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from deployctl import __version__, agent
from deployctl.connection import Connection
from deployctl.crash import Catalog, CrashReport, CrashScanner
from deployctl.deployments import GroupKey, describe_gpus, gpu_set, group_of, node_rank
from deployctl.errors import ConnectError, DeployctlError, HostKeyError, PreflightError, UsageError
from deployctl.facts import GPUS_COMMAND, GpuState, ProbeOutput, parse_gpus_command
from deployctl.fanout import (
    POLL_RETRY_FIRST,
    RECONNECT_BACKOFF_MAX,
    Fleet,
    FleetResult,
    HostResult,
    attempt,
    next_backoff,
)
from deployctl.host_agent import (
    ClientIdentity,
    LeaderIdentity,
    LiveRun,
    PollArgs,
    PollReply,
    PreflightArgs,
    PreflightReply,
    ReleaseArgs,
    RunInfo,
    RunRecord,
    StartArgs,
    StatusArgs,
    StatusReply,
    StopArgs,
    StopReply,
    shares_gpus,
)
from deployctl.inventory import Host, merge_layers
from deployctl.ops.flags import FlagReport, checked_argv, flag_report
from deployctl.ops.gpus import DEFAULT_MAX_USED_MIB, GpuReport, gpu_report
from deployctl.ops.patch import parse_patch_facts, set_state
from deployctl.patchset import PatchSet, command_flags, flag_violations, sets_for_flags
from deployctl.project import Project
from deployctl.render import RenderedCommand, TemplateSet, default_template, parse_overrides
from deployctl.text import is_number

READY_LINE = "The server is fired up and ready to roll!"
# The agent long-polls: it returns as soon as the log grows or the run dies or is ready.
POLL_WAIT = 1.0
# A node of a multi-node server other than rank 0 learns that the group is ready only when
# its own poll returns: a shorter wait keeps the group's ready lag short on any node count.
NODE_POLL_WAIT = 0.25
# The most log one poll brings back.
POLL_LIMIT_BYTES = 1 << 20
# How long a lock may be held when the holder says nothing shorter; past its expiry it is
# stale even when its owner cannot be checked (another machine).
LOCK_STALE_AFTER = 6 * 3600


def render_commands(
    project: Project,
    hosts: Sequence[Host],
    template: str | None,
    threshold: int | None,
    set_pairs: Sequence[str],
    patch_sets: Mapping[str, PatchSet] | None = None,
) -> FleetResult[RenderedCommand]:
    """Render the launch command for each host locally; check patch-set flag constraints."""
    overrides = parse_overrides(set_pairs)
    reached = sorted(k for k in overrides if k.startswith("ansible_"))
    if reached:
        raise UsageError(
            f"--set cannot change how hosts are reached: {', '.join(reached)}",
            hint="set connection variables in the inventory",
        )
    templates = TemplateSet(project.search_dirs("templates"))
    # The overrides are the host's variables from here on: its log_dir, state_dir, python…
    hosts = [
        Host(host.name, merge_layers([host.vars, overrides], "--set"), host.deployment)
        for host in hosts
    ]

    def render_one(host: Host) -> RenderedCommand:
        name = default_template(host, template, threshold)
        rendered = templates.render(host, name, threshold, overrides)
        problems = number_problems(host, rendered.argv)
        if problems:
            raise PreflightError(problems[0], hint="fix the value in the inventory or --set")
        if patch_sets is not None:
            problems = flag_violations(rendered.argv, sets_for_flags(rendered.argv, patch_sets))
            if problems:
                raise PreflightError(
                    problems[0],
                    hint="change the template's values with --set, e.g. --set speculative_eagle_topk=1",
                )
        return rendered

    return FleetResult(attempt(host, partial(render_one, host)) for host in hosts)


def number_problems(host: Host, argv: Sequence[str]) -> list[str]:
    """Say which of the command's port and tensor parallelism is not a usable number."""
    flags = command_flags(argv)
    port = str(flags.get("--port") or host.vars.get("port", 30000))
    problems = []
    if not (is_number(port) and 1 <= int(port) <= 65535):
        problems.append(f"--port {port!r} is not a port number (1-65535)")
    for flag in ("--tp-size", "--tp"):
        value = flags.get(flag)
        if value is not None and not (is_number(value) and int(value) >= 1):
            problems.append(f"{flag} {value!r} is not a number of GPUs")
    return problems


@dataclass
class Plan:
    """What will run on one host: the command, the sets it needs and where it logs."""

    host: Host
    rendered: RenderedCommand
    needed_sets: list[PatchSet]

    @property
    def port(self) -> int:
        flags = command_flags(self.rendered.argv)
        return int(flags.get("--port") or self.host.vars.get("port", 30000))

    @property
    def bind_host(self) -> str:
        return str(command_flags(self.rendered.argv).get("--host") or "127.0.0.1")

    @property
    def tp(self) -> int:
        flags = command_flags(self.rendered.argv)
        value = flags.get("--tp-size") or flags.get("--tp") or 1
        return int(value)

    @property
    def local_tp(self) -> int:
        """The GPUs this host gives the server: its share of the tensor parallelism."""
        return self.tp // int(self.host.vars.get("nnodes", 1))

    @property
    def group(self) -> GroupKey | None:
        """The multi-node deployment this plan is one node of."""
        return group_of(self.host)

    @property
    def node_rank(self) -> int:
        return node_rank(self.host)

    @property
    def gpus(self) -> list[int] | None:
        """The GPUs the server may use (None: all of the host's)."""
        return gpu_set(self.host)

    @property
    def launch_module(self) -> str | None:
        argv = self.rendered.argv
        return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None

    def check_paths(self) -> list[str]:
        flags = command_flags(self.rendered.argv)
        keys = ("--model-path", "--speculative-draft-model-path")
        return [str(flags[k]) for k in keys if flags.get(k)]


def client_identity(op: str, hold_for: float = LOCK_STALE_AFTER) -> ClientIdentity:
    """Who takes the host lock, and until when it may hold it at most."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "user": getpass.getuser(),
        "op": op,
        "expires": time.time() + hold_for,
    }


@dataclass
class Preflight:
    """One host's answer to 'may we start here?', with the lock when we hold it."""

    plan: Plan
    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    flags: FlagReport | None = None  # what the host's SGLang says of the command
    gpus: GpuReport | None = None
    next_log: str = ""
    next_version: int = 1
    lock_token: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ok,
            "problems": self.problems,
            "warnings": self.warnings,
            "flags": None if self.flags is None else self.flags.to_json(),
            "command": self.plan.rendered.display,
            "env": self.plan.rendered.env_shown,
            "log": self.next_log,
        }


def preflight_args(
    plan: Plan, break_lock: str | None = None, hold_for: float = LOCK_STALE_AFTER
) -> PreflightArgs:
    host = plan.host
    return {
        "state_dir": str(host.vars["state_dir"]),
        "deployment": host.deployment,
        "gpus": plan.gpus,
        "paths": sorted(
            {f for s in plan.needed_sets for v in s.variants.values() for f in v.files}
        ),
        "port": plan.port,
        # Rank 0 of a multi-node server also listens for the other nodes.
        "also_ports": [int(host.vars["dist_port"])] if plan.group and plan.node_rank == 0 else [],
        "bind_host": plan.bind_host,
        "check_paths": plan.check_paths(),
        "module": plan.launch_module,
        "log_dir": str(host.vars["log_dir"]),
        "log_stem": plan.rendered.log_stem,
        "client": client_identity("launch", hold_for),
        "break_lock": break_lock,
        "server_argv": checked_argv(host, plan.rendered.argv),
    }


def _stale(holder: Mapping[str, Any]) -> bool:
    """A lock is stale when its owner here is dead, or when its time is up.

    A record without a usable pid and expiry was not written by any deployctl (they all
    write both), and nothing would ever end it: it is stale too.
    """
    try:
        pid, expires = int(holder["pid"]), float(holder["expires"])
    except (KeyError, TypeError, ValueError):
        return True
    if pid <= 0 or time.time() > expires:
        return True
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _preflight_call(
    plan: Plan, conn: Connection, break_lock: str | None, hold_for: float
) -> tuple[dict[str, ProbeOutput], PreflightReply]:
    return agent.call_beside(
        plan.host,
        conn,
        {"gpus": GPUS_COMMAND},
        agent.PREFLIGHT,
        preflight_args(plan, break_lock, hold_for),
    )


def run_preflight(
    plan: Plan, conn: Connection, max_used_mib: int, hold_for: float = LOCK_STALE_AFTER
) -> Preflight:
    """Check one host in one round trip (two when a stale lock must be cleared)."""
    host = plan.host
    outputs, doc = _preflight_call(plan, conn, None, hold_for)
    lock = doc["lock"]
    if not lock["acquired"] and _stale(lock["holder"] or {}):
        token = (lock["holder"] or {}).get("token")
        outputs, doc = _preflight_call(plan, conn, token, hold_for)
        lock = doc["lock"]
    result = Preflight(
        plan, next_log=doc["next_log"], next_version=doc["next_version"], lock_token=lock["token"]
    )
    problems, hints = result.problems, result.hints
    if not lock["acquired"]:
        holder = lock["holder"] or {}
        problems.append(
            f"another deployctl {holder.get('op', 'operation')} is in progress on {host.name} "
            f"(pid {holder.get('pid')} on {holder.get('host')})"
        )
    gpus = outputs["gpus"]
    try:
        state = parse_gpus_command(gpus.exit_code, gpus.output, gpus.stderr)
    except DeployctlError as exc:
        problems.append(f"GPUs cannot be checked: {exc.message}")
        state = None
    if state is not None:
        result.gpus = gpu_problems(plan, state, max_used_mib, problems, hints)
    live_run_problems(plan, doc["live_runs"], problems, hints)
    for port, why in doc["busy_ports"].items():
        problems.append(
            f"port {port} (dist_port, where the other nodes join) is in use on {host.name} ({why})"
        )
    if not doc["port_free"]:
        problems.append(f"port {plan.port} is in use on {host.name} ({doc['port_error']})")
    if not doc["module_found"]:
        problems.append(
            f"{host.vars['python']} on {host.name} cannot find module {plan.launch_module}"
        )
        hints.append("set the host's `python` to the interpreter that has SGLang installed")
    facts = parse_patch_facts(doc)
    unpatched: list[str] = []  # flags whose missing patch set a problem names
    if plan.needed_sets and facts.error:
        problems.append(facts.error)
    elif plan.needed_sets:
        for patch_set in plan.needed_sets:
            state_of_set = set_state(facts, patch_set)
            if not state_of_set.good:
                unpatched += [r.flag for r in patch_set.flags]
                flags = ", ".join(r.flag for r in patch_set.flags)
                problems.append(
                    f"{flags} needs patch set {patch_set.name}, which is {state_of_set.state} on {host.name}"
                    + (f" ({state_of_set.detail})" if state_of_set.detail else "")
                )
                hints.append(f"deployctl patch apply {patch_set.name} -H {host.name}")
    sets = {s.name: s for s in plan.needed_sets}
    result.flags = flag_report(host, doc["argv_check"], doc["sglang"], sets, unpatched)
    problems += result.flags.problems
    hints += result.flags.hints
    result.warnings += result.flags.warnings
    for path, exists in doc["paths"].items():
        if not exists:
            problems.append(f"{path} does not exist on {host.name}")
    if not doc["log_dir_writable"]:
        problems.append(
            f"log folder {host.vars['log_dir']} is not writable: {doc['log_dir_error']}"
        )
    result.hints = list(dict.fromkeys(hints))  # two runs in the way: one hint
    return result


def gpu_problems(
    plan: Plan, state: GpuState, max_used_mib: int, problems: list[str], hints: list[str]
) -> GpuReport | None:
    """Are the plan's GPUs there, enough for its tensor parallelism, and clean?"""
    host, chosen = plan.host, plan.gpus
    have = [g.index for g in state.gpus]
    missing = [i for i in chosen or [] if i not in have]
    if missing:
        problems.append(
            f"{describe_gpus(missing)} not on {host.name} (it has {describe_gpus(have)})"
        )
        return None
    report = gpu_report(state, max_used_mib, chosen)
    if not report.clean:
        subject = "GPUs are"
        if chosen is not None:
            subject = (
                f"{describe_gpus(chosen)} of {host.name} {'is' if len(chosen) == 1 else 'are'}"
            )
        problems.append(f"{subject} not clean: {report.verdict()}")
        hints.append(f"stop what holds them (deployctl stop -H {host.name}) or kill those PIDs")
    if len(report.gpus) < plan.local_tp:
        has = f"{host.name} has {len(report.gpus)}"
        if chosen is not None:
            has = (
                f"{_deployment_words(host.deployment)} has {len(chosen)} ({describe_gpus(chosen)})"
            )
        needs = f"{plan.local_tp} GPUs"
        if plan.group is not None:
            needs += f" on each of its {host.vars['nnodes']} nodes"
        problems.append(f"tensor parallelism {plan.tp} needs {needs}; {has}")
    return report


def live_run_problems(
    plan: Plan, live: Sequence[LiveRun], problems: list[str], hints: list[str]
) -> None:
    """Refuse a deployment already running, or one whose GPUs or port another run holds."""
    host = plan.host
    select = f"-H {host.name}" + (f" -d {host.deployment}" if host.deployment else "")
    for run in live:
        if run["deployment"] == host.deployment:
            problems.append(f"run {run['id']} (pid {run['pid']}) is still running on {host.name}")
            hints.append(f"stop it first (deployctl stop {select}), or launch with --replace")
            continue
        other = _deployment_words(run["deployment"])
        if shares_gpus(plan.gpus, run["gpus"]):
            problems.append(
                f"{other} holds {describe_gpus(run['gpus'])} on {host.name} (run {run['id']}, "
                f"pid {run['pid']}); {_deployment_words(host.deployment)} needs "
                f"{describe_gpus(plan.gpus)}"
            )
            which = f" -d {run['deployment']}" if run["deployment"] else ""
            hints.append(
                "give deployments on one host disjoint `gpus`, or stop the other first "
                f"(deployctl stop -H {host.name}{which})"
            )
        elif run["port"] == plan.port:
            problems.append(
                f"port {plan.port} on {host.name} is {other}'s (run {run['id']}, pid {run['pid']})"
            )
            hints.append("give each deployment on a host its own `port`")


def _deployment_words(name: str | None) -> str:
    return f"deployment {name}" if name else "the host's default deployment"


def release_lock(plan: Plan, conn: Connection, token: str) -> None:
    args: ReleaseArgs = {
        "state_dir": str(plan.host.vars["state_dir"]),
        "deployment": plan.host.deployment,
        "token": token,
    }
    agent.call(plan.host, conn, agent.RELEASE, args)


def start_run(
    plan: Plan,
    conn: Connection,
    lock_token: str | None,
    restart_of: str | None = None,
    min_version: int = 1,
) -> RunRecord:
    """Start the server detached with a new versioned log; record the run; release the lock."""
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
    }
    args: StartArgs = {
        "state_dir": str(host.vars["state_dir"]),
        "deployment": host.deployment,
        "log_dir": str(host.vars["log_dir"]),
        "log_stem": rendered.log_stem,
        "command": rendered.command,
        "env": rendered.env,
        "min_version": min_version,
        "run": run,
        "files": rendered.files,
        "lock_token": lock_token,
    }
    return agent.call(host, conn, agent.START, args)["run"]


@dataclass
class Outcome:
    """How a started run ended up: ready, crashed, died or still starting at the timeout."""

    run: RunRecord
    state: str  # ready | crashed | died | timeout | started | aborted
    elapsed: float
    crashes: list[CrashReport] = field(default_factory=list)
    last_line: str = ""
    warnings: list[CrashReport] = field(default_factory=list)  # traces while healthy
    note: str = ""  # why a node of a multi-node server was stopped (state "aborted")
    connection_losses: list[str] = field(default_factory=list)  # while waited for, each mended

    @property
    def ok(self) -> bool:
        return self.state in ("ready", "started")

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run["id"],
            "log": self.run["log"],
            "pid": self.run["pid"],
            "state": self.state,
            "ready": self.state == "ready",
            "elapsed_s": round(self.elapsed, 2),
            "crashes": [c.to_json() for c in self.crashes],
            "warnings": [c.to_json() for c in self.warnings],
            "command": self.run["command"],
            "env": self.run.get("env", {}),
            "note": self.note,
            "connection_losses": self.connection_losses,
        }


def poll_args(run: RunRecord, offset: int, wait: float = 0) -> PollArgs:
    identity: LeaderIdentity = {"starttime": run["starttime"]} if "starttime" in run else {}
    return {
        **identity,
        "pgid": run["pgid"],
        "sid": run["sid"],
        "log": run["log"],
        "port": run["port"],
        "bind_host": run["bind_host"],
        "offset": offset,
        "limit": POLL_LIMIT_BYTES,
        "wait": wait,
    }


class GroupWatch:
    """The nodes of one multi-node server waiting together: rank 0's readiness is the
    group's, and the first node that fails (or times out) settles it for all of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state: str | None = None  # ready | failed | timeout
        self.by = ""

    def settle(self, state: str, by: str) -> None:
        """The first word stands, except that a failure overrides readiness: a node that
        dies once rank 0 is up still fails the group."""
        with self._lock:
            if self.state is None or (state == "failed" and self.state == "ready"):
                self.state, self.by = state, by


def wait_ready(
    host: Host,
    conn: Connection,
    run: RunRecord,
    catalog: Catalog,
    timeout: float,
    progress: Callable[[str, float, str], None] | None = None,
    group: GroupWatch | None = None,
) -> Outcome:
    """Poll the run until /health answers 200 or the ready line appears; fail fast on a crash.

    A node of a multi-node server other than rank 0 serves no API (its /health is a dummy):
    it is ready when rank 0 is and it is still alive.
    """
    losses: list[str] = []
    try:
        outcome = _wait_ready(host, conn, run, catalog, timeout, progress, group, losses)
    except BaseException:
        if group is not None:  # the other nodes stop waiting for this one
            group.settle("failed", host.label)
        raise
    outcome.connection_losses = losses
    if group is not None and outcome.state != "aborted":
        verdict = outcome.state if outcome.state in ("ready", "timeout") else "failed"
        group.settle(verdict, host.label)
    return outcome


def _wait_ready(
    host: Host,
    conn: Connection,
    run: RunRecord,
    catalog: Catalog,
    timeout: float,
    progress: Callable[[str, float, str], None] | None,
    group: GroupWatch | None,
    losses: list[str],
) -> Outcome:
    serves_api = group is None or node_rank(host) == 0
    scanner = CrashScanner(catalog)
    # One decoder for the whole log: a character split across two polls stays whole.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offset, started, last_line, buffer = 0, time.monotonic(), "", ""
    backoff = 0.0  # > 0 while the connection is lost: the wait before the next try
    while True:
        try:
            doc = poll(host, conn, run, offset, POLL_WAIT if serves_api else NODE_POLL_WAIT)
        except HostKeyError:
            raise
        except ConnectError as exc:
            # The run goes on without us: connect again (each try a fresh handshake, the
            # host key checked again), saying so once, until the wait's own timeout.
            elapsed = time.monotonic() - started
            if elapsed >= timeout or (group is not None and group.state == "failed"):
                raise
            if not backoff:
                losses.append(str(exc))
                if progress is not None:
                    progress(host.label, elapsed, f"connection lost ({exc}); reconnecting")
            backoff = next_backoff(backoff, POLL_RETRY_FIRST, RECONNECT_BACKOFF_MAX)
            time.sleep(min(backoff, timeout - elapsed))
            continue
        if backoff and progress is not None:
            progress(host.label, time.monotonic() - started, "reconnected")
        backoff = 0.0
        raw = base64.b64decode(doc["data"])
        offset += len(raw)
        data = decoder.decode(raw, final=not doc["alive"])
        buffer += data
        lines = buffer.split("\n")
        buffer = lines.pop()
        if any(line.strip() for line in lines):
            last_line = next(line for line in reversed(lines) if line.strip())
        crashes = scanner.feed(data)
        elapsed = time.monotonic() - started
        # A trace while /health answers 200 is a failed request, not a failed server.
        if crashes and (doc["health"] != 200 or not serves_api):
            return Outcome(run, "crashed", elapsed, scanner.reports, last_line)
        if serves_api and (doc["health"] == 200 or any(READY_LINE in line for line in lines)):
            return Outcome(run, "ready", elapsed, [], last_line, warnings=scanner.reports)
        if not doc["alive"]:
            return Outcome(run, "died", elapsed, scanner.finish() or scanner.reports, last_line)
        if group is not None and group.state is not None:
            if group.state in ("ready", "timeout"):  # a timeout leaves every node running
                return Outcome(run, group.state, elapsed, [], last_line, warnings=scanner.reports)
            note = f"node {group.by} failed"
            return Outcome(run, "aborted", elapsed, scanner.reports, last_line, note=note)
        if elapsed >= timeout:
            return Outcome(run, "timeout", elapsed, [], last_line)
        if progress is not None:
            progress(host.label, elapsed, last_line)


def poll(
    host: Host, conn: Connection, run: RunRecord, offset: int, wait: float = POLL_WAIT
) -> PollReply:
    """What the run's log gained since `offset`, and whether it is alive and healthy."""
    return agent.call(host, conn, agent.POLL, poll_args(run, offset, wait))


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

    @property
    def started(self) -> bool:
        return bool(self.outcomes.results)

    @property
    def ok(self) -> bool:
        return not self.refused and self.outcomes.ok


def plan_launch(
    project: Project,
    hosts: Sequence[Host],
    template: str | None,
    threshold: int | None,
    set_pairs: Sequence[str],
    patch_sets: Mapping[str, PatchSet],
) -> list[Plan]:
    """Render and check every host's command locally; refuse before any host is touched."""
    rendered = render_commands(project, hosts, template, threshold, set_pairs, patch_sets)
    failed = [r for r in rendered if r.failed]
    for result in failed:
        if result.is_bug and result.exception is not None:
            raise result.exception  # a bug keeps its traceback: the CLI writes it to a file
    if failed:
        first = failed[0]
        names = ", ".join(r.name for r in failed)
        raise DeployctlError(f"{names}: {first.error}", hint=first.hint)
    plans = [
        Plan(r.host, r.value, sets_for_flags(r.value.argv, patch_sets))
        for r in rendered
        if r.value is not None
    ]
    check_placement(plans)
    return plans


def check_placement(plans: Sequence[Plan]) -> None:
    """Refuse deployments of one launch that would share a host's GPUs or port."""
    by_host: dict[str, list[Plan]] = {}
    for plan in plans:
        by_host.setdefault(plan.host.name, []).append(plan)
    for same_host in by_host.values():
        for first, second in itertools.combinations(same_host, 2):
            pair = f"{first.host.label} and {second.host.label}"
            if shares_gpus(first.gpus, second.gpus):
                raise PreflightError(
                    f"{pair} would share GPUs ({describe_gpus(first.gpus)} and "
                    f"{describe_gpus(second.gpus)})",
                    hint="give deployments on one host disjoint `gpus`",
                )
            if first.port == second.port:
                raise PreflightError(
                    f"{pair} would share port {first.port}",
                    hint="give each deployment on a host its own `port`",
                )


def launch(
    fleet: Fleet,
    plans: Sequence[Plan],
    catalog: Catalog,
    *,
    wait: bool = True,
    timeout: float = 900,
    dry_run: bool = False,
    max_used_mib: int = DEFAULT_MAX_USED_MIB,
    progress: Callable[[str, float, str], None] | None = None,
    restart_of: Mapping[str, str] | None = None,
) -> LaunchReport:
    """Preflight all hosts; start on all only if every one passed; then wait for ready."""
    by_name = {p.host.label: p for p in plans}
    preflights = fleet.run(
        # The lock is held until the wait ends: a second launch must not slip in while
        # the first server has not yet bound its port.
        lambda host, conn: run_preflight(by_name[host.label], conn, max_used_mib, timeout + 120),
        [p.host for p in plans],
    )
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
            )
        except BaseException:
            with contextlib.suppress(DeployctlError):
                release_lock(plan, conn, token)
            raise

    # Every node starts before any waits: a multi-node server comes up only as a whole.
    starts = fleet.run(start, [p.host for p in plans])
    for started in starts:
        watch = groups.get(group_of(started.host))
        if started.failed and watch is not None:
            watch.settle("failed", started.name)
    if not wait:
        outcomes = FleetResult(
            HostResult(r.host, exception=r.exception)
            if r.value is None
            else HostResult(r.host, Outcome(r.value, "started", 0.0))
            for r in starts
        )
        return LaunchReport(preflights, outcomes, refused=False)
    runs = starts.succeeded

    def wait_for(host: Host, conn: Connection) -> Outcome:
        plan = by_name[host.label]
        try:
            return wait_ready(
                host, conn, runs[host.label], catalog, timeout, progress, groups.get(plan.group)
            )
        finally:
            # Every way out of a launch gives the lock back; a host that cannot be reached
            # now keeps it until it expires, and the error that got us here is the one shown.
            with contextlib.suppress(DeployctlError):
                release_lock(plan, conn, _token(preflights, host.label))

    # Rank 0s first: with fewer forks than nodes, a rank 0 must not queue behind the nodes
    # that wait for it.
    waiting = sorted((p.host for p in plans if p.host.label in runs), key=node_rank)
    waited = {r.name: r for r in fleet.run(wait_for, waiting)}
    outcomes = FleetResult(
        waited.get(r.name) or HostResult(r.host, exception=r.exception) for r in starts
    )
    # A multi-node server that failed on one node leaves no process on any other.
    failed = {key for key, watch in groups.items() if watch.state == "failed"}
    cleanup = fleet.run(end_run, [p.host for p in plans if p.group in failed])
    return LaunchReport(preflights, outcomes, refused=False, cleanup=cleanup)


def recorded_run(host: Host, conn: Connection, run_id: str | None = None) -> StatusReply:
    """The deployment's current (or named) run record and whether it lives and answers
    /health: no log tail, no GPU query, no metrics."""
    args: StatusArgs = {
        "state_dir": str(host.vars["state_dir"]),
        "deployment": host.deployment,
        "run": run_id,
        "tail_bytes": 0,
        "metrics_bytes": 0,
    }
    return agent.call(host, conn, agent.STATUS, args)


def end_run(host: Host, conn: Connection, timeout: float = 10) -> StopReply:
    """End the deployment's current run on one host: SIGTERM its group, SIGKILL leftovers."""
    args: StopArgs = {
        "state_dir": str(host.vars["state_dir"]),
        "deployment": host.deployment,
        "timeout": timeout,
    }
    # The agent waits `timeout` for SIGTERM, then up to 10 s after SIGKILL: the round trip
    # must outlast both, whatever the host's command timeout.
    limit = max(conn.command_timeout, timeout + 20)
    return agent.call(host, conn, agent.STOP, args, timeout=limit)


def _token(preflights: FleetResult[Preflight], name: str) -> str:
    for result in preflights:
        if result.name == name and result.value is not None and result.value.lock_token:
            return result.value.lock_token
    raise DeployctlError(f"{name}: no lock held")
