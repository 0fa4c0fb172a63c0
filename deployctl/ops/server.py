"""A host's current run: status, stop, restart of crashed runs, and watch."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployctl import agent
from deployctl.connection import Connection
from deployctl.crash import Catalog, CrashReport, scan_text
from deployctl.deployments import GroupKey, gpu_set, group_of, node_rank
from deployctl.errors import DeployctlError, MetricsError
from deployctl.facts import GPUS_COMMAND, parse_gpus_command
from deployctl.fanout import Fleet, FleetResult, HostResult
from deployctl.host_agent import (
    MetricsPage,
    RunRecord,
    RunsArgs,
    StatusArgs,
)
from deployctl.inventory import MASK, Host
from deployctl.metrics import METRICS_LIMIT_BYTES, parse_metrics
from deployctl.ops.gpus import DEFAULT_MAX_USED_MIB, GpuReport, check_gpus, gpu_report
from deployctl.ops.launch import LaunchReport, Plan, end_run, launch, recorded_run
from deployctl.patchset import PatchSet, sets_for_flags
from deployctl.render import RenderedCommand, command_secrets
from deployctl.shell import split

STATUS_TAIL_BYTES = 256 * 1024


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

    @property
    def running(self) -> bool:
        """Deployctl started it and has not stopped it."""
        return self.run is not None and self.run.get("status") == "running"

    @property
    def crashed(self) -> bool:
        """Dead, or failing its health check with a fatal trace in its log.

        SGLang logs a traceback for a failed request and goes on serving: a trace in a live,
        healthy server is a warning, never a reason to restart it.
        """
        return self.running and (not self.alive or (bool(self.crashes) and not self.ready))

    @property
    def warnings(self) -> list[CrashReport]:
        """Traces in the log of a server that is alive and healthy."""
        return [] if self.crashed else self.crashes

    @property
    def ready(self) -> bool:
        return self.alive and self.health == 200

    @property
    def ok(self) -> bool:
        return not self.crashed

    def to_json(self) -> dict[str, Any]:
        run = self.run
        return {
            "run": run["id"] if run else None,
            "pid": run["pid"] if run else None,
            "alive": self.alive,
            "ready": self.ready,
            "crashed": self.crashed,
            "status": run["status"] if run else None,
            "uptime_s": round(time.time() - run["started_at"]) if self.alive and run else None,
            "log": run["log"] if run else None,
            "gpus": run.get("gpus") if run else None,
            "last_line": self.last_line,
            "crash": self.crashes[0].summary() if self.crashes and self.crashed else None,
            "warning": self.warnings[0].summary() if self.warnings else None,
            "gpu_memory_used_mib": sum(g.memory_used_mib for g in self.gpus.gpus)
            if self.gpus
            else None,
            **(
                {}
                if self.metrics_note is None
                else {"metrics": self.metrics, "metrics_note": self.metrics_note}
            ),
        }


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
        "state_dir": str(host.vars["state_dir"]),
        "deployment": host.deployment,
        "run": run_id,
        "tail_bytes": tail_bytes,
        "metrics_bytes": METRICS_LIMIT_BYTES if with_metrics else 0,
    }
    probes = {"gpus": GPUS_COMMAND}
    outputs, doc = agent.call_beside(host, conn, probes, agent.STATUS, args)
    run = doc["run"]
    try:  # a host without working GPUs still has a status
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
    tail = base64.b64decode(doc["data"]).decode("utf-8", errors="replace")
    lines = [line for line in tail.splitlines() if line.strip()]
    crashes = scan_text(tail, catalog) if run["status"] == "running" else []
    status = RunStatus(
        run,
        alive=doc["alive"],
        health=doc["health"],
        last_line=lines[-1] if lines else "",
        crashes=crashes,
        gpus=gpus,
        command=doc["command"],
        env=doc["env"],
    )
    if with_metrics:
        status.metrics, status.metrics_note = read_metrics(doc["metrics"])
    return status


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

    @property
    def ok(self) -> bool:
        """False only when the GPUs were checked and are still not clean."""
        return self.gpus_clean is not False

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "ended": self.ended,
            "killed": self.killed,
            "gpus_clean": self.gpus_clean,
            "note": self.note,
        }


def stop_run(host: Host, conn: Connection, timeout: float, gpu_timeout: float = 120) -> StopResult:
    """SIGTERM the run's process group, SIGKILL leftovers, then wait until the GPUs it was
    given (the deployment's, or the host's) are clean."""
    doc = end_run(host, conn, timeout)
    run = doc["run"]
    if run is None:
        return StopResult(None, [], [], None, "no run recorded")
    if doc["left"]:
        raise DeployctlError(f"{host.label}: processes {doc['left']} survived SIGKILL")
    note = "" if doc["ended"] else "was not running"
    deadline = time.monotonic() + gpu_timeout
    while True:
        try:
            gpus = check_gpus(host, conn, only=run.get("gpus"))
        except DeployctlError as exc:
            return StopResult(
                run["id"], doc["ended"], doc["killed"], None, f"GPUs not checked: {exc.message}"
            )
        if gpus.clean or time.monotonic() > deadline:
            return StopResult(run["id"], doc["ended"], doc["killed"], gpus.clean, note)
        time.sleep(0.5)


def stray_runs(fleet: Fleet) -> list[Host]:
    """Runs of ours still alive on the fleet's hosts that no selected deployment names: one
    whose deployment left the inventory, or the host's single server from before it had
    `deployments`. A stop of every deployment ends them too. A host that cannot be asked
    adds none (its own stop reports why)."""
    known = {(h.name, h.deployment) for h in fleet.hosts}
    hosts = list({h.name: h for h in fleet.hosts}.values())

    def strays(host: Host, conn: Connection) -> list[Host]:
        args: RunsArgs = {"state_dir": str(host.vars["state_dir"])}
        runs = agent.call(host, conn, agent.RUNS, args)["live_runs"]
        return [
            Host(host.name, host.vars, run["deployment"])
            for run in runs
            if (host.name, run["deployment"]) not in known
        ]

    return [stray for result in fleet.run(strays, hosts) for stray in result.value or []]


def stop_live_runs(
    fleet: Fleet, hosts: Sequence[Host], timeout: float = 30
) -> FleetResult[StopResult | None]:
    """Stop the runs still alive on `hosts` (launch --replace); None where none was."""

    def stop_if_alive(host: Host, conn: Connection) -> StopResult | None:
        # Only whether it lives: no log tail to scan, no GPU query (stop_run checks those).
        alive = recorded_run(host, conn)["alive"]
        return stop_run(host, conn, timeout) if alive else None

    return fleet.run(stop_if_alive, hosts)


def recorded_plan(host: Host, status: RunStatus, patch_sets: Mapping[str, PatchSet]) -> Plan:
    """The plan to relaunch a recorded run with the same rendered command."""
    if status.run is None or not status.command:
        raise DeployctlError(
            f"{host.label}: no recorded run to restart", hint="deployctl launch first"
        )
    argv = split(status.command)
    # Secrets given with --set at launch are not in the inventory: find them where the
    # recorded (masked) command hides them.
    hidden = masked_values(status.run["command"], argv)
    secrets = tuple(
        sorted({*command_secrets(host.vars, argv), *hidden}, key=lambda v: (-len(v), v))
    )
    env = status.env or {}
    secrets = tuple(
        sorted({*secrets, *masked_env_values(status.run, env)}, key=lambda v: (-len(v), v))
    )
    rendered = RenderedCommand(
        status.run["template"], status.run["threshold"], argv, secrets, env, host.deployment
    )
    # The run's own GPUs, which its recorded environment pins it to, whatever the inventory
    # says now.
    recorded = Host(host.name, {**host.vars, "gpus": status.run.get("gpus")}, host.deployment)
    return Plan(recorded, rendered, sets_for_flags(argv, patch_sets))


def masked_env_values(run: RunRecord, env: Mapping[str, str]) -> list[str]:
    """The real values of the environment variables the run record shows masked."""
    shown = run.get("env", {})
    return [value for name, value in env.items() if MASK in shown.get(name, "") and value]


def masked_values(shown: str, argv: Sequence[str]) -> list[str]:
    """Return the parts of `argv` that the masked command line `shown` replaced by the mask."""
    try:
        words = split(shown)
    except ValueError:
        return []
    if len(words) != len(argv):
        return []
    found: list[str] = []
    for word, real in zip(words, argv, strict=True):
        if MASK in word:
            pattern = "(.+?)".join(re.escape(part) for part in word.split(MASK))
            match = re.fullmatch(pattern, real, re.DOTALL)
            found += list(match.groups()) if match else [real]
    return found


TOP_TAIL_BYTES = 16 * 1024


def metrics_rounds(
    fleet: Fleet,
    catalog: Catalog,
    interval: float,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[FleetResult[RunStatus]]:
    """Every deployment's status with metrics, every `interval` seconds, over the fleet's
    open connections (a host that dropped its connection is reconnected with backoff:
    Fleet.poll)."""
    done = 0
    while rounds is None or done < rounds:
        started = time.monotonic()
        results = fleet.poll(
            lambda host, conn: run_status(
                host, conn, catalog, metrics=True, tail_bytes=TOP_TAIL_BYTES
            )
        )
        done += 1
        yield results
        if rounds is None or done < rounds:
            sleep(max(0.0, interval - (time.monotonic() - started)))


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
    def state(self) -> str:
        """ready, starting, stopped, or for a group degraded / crashed, naming the nodes down."""
        statuses = [n.value for n in self.nodes]
        down = self.down
        if down:
            # Without rank 0 there is no API: the group is down whatever the others do.
            word = "crashed" if self.nodes[0].host.name in down else "degraded"
            return f"{word}: {', '.join(down)} down" if len(self.nodes) > 1 else word
        if not any(s and s.running for s in statuses):
            return "stopped"
        first = statuses[0]
        ready = first is not None and first.ready and all(s and s.alive for s in statuses)
        return "ready" if ready else "starting"

    def crash_signature(self) -> str:
        for node in self.nodes:
            status = node.value
            if status is not None and status.crashed and status.crashes:
                return status.crashes[0].signature
        return "died"

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "ok": not self.down,
            "nnodes": len(self.nodes),
            "nodes": [
                {"host": n.host.name, "node_rank": i, "ok": n.value is not None and not n.value.crashed,
                 "error": n.error, **(n.value.to_json() if n.value else {})}
                for i, n in enumerate(self.nodes)
            ],
        }  # fmt: skip


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


def restart(
    fleet: Fleet,
    catalog: Catalog,
    patch_sets: Mapping[str, PatchSet],
    *,
    crashed_only: bool,
    timeout: float,
    stop_timeout: float = 30,
    wait: bool = True,
    progress: Callable[[str, float, str], None] | None = None,
) -> RestartReport:
    """Stop and relaunch each recorded run with the next log version; a multi-node server's
    nodes all together when any of them crashed (a lone rank never rejoins its group)."""
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
    # Failed stops are not judged by the GPUs (`ok`): only a stop that raised keeps a host out.
    stops = fleet.run(
        lambda host, conn: stop_run(host, conn, stop_timeout), [p.host for p in plans]
    )
    # A group relaunches whole or not at all.
    broken = {group_of(hosts[name]) for name in stops.failed}
    plans = [p for p in plans if p.host.label not in stops.failed and p.group not in broken]
    restart_of = {name: status.run["id"] for name, status in chosen.items() if status.run}
    report = launch(
        fleet, plans, catalog, wait=wait, timeout=timeout, progress=progress, restart_of=restart_of
    )
    failed_stops: list[HostResult[RunStatus]] = [
        HostResult(r.host, exception=r.exception) for r in stops if r.failed
    ]
    return RestartReport(FleetResult([*failed_stops, *statuses]), report)


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


@dataclass
class WatchEnded:
    """Watch ends only when told to; its events were shown as they happened."""

    ok: bool = True


@dataclass
class WatchEvent:
    host: str
    message: str
    exception: BaseException | None = None  # what stopped a check, kept for its traceback


def watch(
    fleet: Fleet,
    catalog: Catalog,
    patch_sets: Mapping[str, PatchSet],
    *,
    interval: float,
    max_restarts: int,
    window: float,
    timeout: float,
    emit: Callable[[WatchEvent], None],
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Restart crashed runs with exponential backoff; give up on a crash loop."""
    history: dict[str, list[tuple[float, str]]] = {}
    next_try: dict[str, float] = {}
    given_up: set[str] = set()
    done = 0
    while rounds is None or done < rounds:
        done += 1
        statuses = fleet.poll(lambda host, conn: run_status(host, conn, catalog))
        for result in statuses:
            if result.value is None:
                emit(WatchEvent(result.name, f"error: {result.error}", result.exception))
        for unit in units(statuses):
            name = unit.name
            if name in given_up or not unit.crashed or time.monotonic() < next_try.get(name, 0):
                continue
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
            where = f" on {', '.join(unit.down)}" if len(unit.nodes) > 1 else ""
            repeated = len(recent) >= 2 and recent[-2][1] == signature and signature != "died"
            if len(recent) > max_restarts or repeated:
                why = (
                    f"same crash twice ({signature})"
                    if repeated
                    else f"{len(recent)} crashes within {window:g}s"
                )
                emit(
                    WatchEvent(
                        name, f"crash loop: {why}; not restarting {run_id}; last crash: {signature}"
                    )
                )
                given_up.add(name)
                continue
            emit(
                WatchEvent(
                    name,
                    f"{run_id} crashed{where} ({signature}); restarting (attempt {len(recent)})",
                )
            )
            plans = [recorded_plan(n.host, n.value, patch_sets) for n in unit.nodes if n.value]
            stops = fleet.run(lambda host, conn: stop_run(host, conn, 30), [p.host for p in plans])
            if stops.failed:
                first = next(r for r in stops if r.failed)
                emit(WatchEvent(name, f"stop failed: {first.error}", first.exception))
                continue
            report = launch(fleet, plans, catalog, timeout=timeout, restart_of=runs)
            outcome = report.outcomes[0].value if report.outcomes else None
            state = outcome.state if outcome else "refused"
            new_run = outcome.run["id"] if outcome else "-"
            emit(WatchEvent(name, f"restarted as {new_run}: {state}"))
            next_try[name] = time.monotonic() + min(300.0, interval * 2 ** (len(recent) - 1))
        if rounds is None or done < rounds:
            sleep(interval)
