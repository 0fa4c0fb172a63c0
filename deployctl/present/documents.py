"""Every `--json` document, built from the typed results operations return.

A front end (the CLI now, the dashboard next) gets the same document for the same result:
`status_document(results)` is what `status --json` prints. Per-host results share one
shape: `{"hosts": {name: {"ok", "error", "code", "hint"?, **fields}}}`, one deployment's
under `hosts.<name>.deployments.<deployment>`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from deployctl.choices import CanaryMetric, SpeculationPolicy
from deployctl.errors import DeployctlError, ServerError, error_code, explain

if TYPE_CHECKING:
    from deployctl.canary_stats import BucketInterval
    from deployctl.events import Event
    from deployctl.facts import Gpu
    from deployctl.fanout import FleetResult, HostResult
    from deployctl.inventory import GroupNode, Host
    from deployctl.ops.bench import BenchResult, Comparison, Suggestion
    from deployctl.ops.canary import CanaryReport
    from deployctl.ops.flags import CheckedCommand, FlagReport
    from deployctl.ops.gpus import GpuReport
    from deployctl.ops.init import HostSurvey, InitReport
    from deployctl.ops.kept import Kept
    from deployctl.ops.logs import LocalCrashes, LogScan
    from deployctl.ops.patch import AuditReport, PatchAction, SetState
    from deployctl.ops.preflight import Preflight
    from deployctl.ops.restart import RestartReport
    from deployctl.ops.rollout import RolloutReport, UnitPlan, UnitResult
    from deployctl.ops.router import Registration, RouterState, SyncResult
    from deployctl.ops.runs import LaunchReport, Outcome, RunStatus, StopResult, Unit
    from deployctl.ops.tune import TunePlan, TuneReport, TuneResult
    from deployctl.ops.tune.live import LiveCrossover, LiveDecision, LiveReport
    from deployctl.ops.tune.race import RaceResult
    from deployctl.patchset import PatchSet
    from deployctl.present import shapes
    from deployctl.remote.measures import CanaryRecord, LiveRecord
    from deployctl.remote.protocol import Placement
    from deployctl.render import RenderedCommand

T = TypeVar("T")
F = TypeVar("F", bound=Mapping[str, object])  # the fields a per-host result's entry has


# ---- the per-host shape ------------------------------------------------------------------


def failure_document(exc: BaseException) -> shapes.Failure:
    """The document of a command that failed as a whole (a bad inventory, an unknown -d):
    what a failed host carries, for the command."""
    message, hint = explain(exc)
    return {"ok": False, "error": message, "code": error_code(exc), "hint": hint}


def host_entry(result: HostResult[T], to_json: Callable[[T], F]) -> shapes.Entry[F]:
    """One host in a JSON document: ok, error, its stable code and hint, and its fields
    `F` (a TypedDict: mypy checks them where `to_json` builds them)."""
    entry: dict[str, Any] = {"ok": not result.failed, "error": result.error, "code": result.code}
    if result.hint:
        entry["hint"] = result.hint
    if result.value is not None:
        entry.update(to_json(result.value))
    return cast("shapes.Entry[F]", entry)


def hosts_document(
    results: Iterable[HostResult[T]], to_json: Callable[[T], F]
) -> shapes.PerHost[F]:
    """Return {"hosts": {name: {"ok", "error", "code", **fields}}} for per-host results."""
    hosts: dict[str, shapes.HostEntry[F]] = {}
    for result in results:
        place(hosts, result.host, host_entry(result, to_json))
    return {"hosts": hosts}


def place(
    hosts: Mapping[str, shapes.HostEntry[F]], host: Host, entry: Mapping[str, object]
) -> None:
    """Put a result's entry under its host, or one deployment's under
    `<host>.deployments.<name>`; a host is ok when everything under it is."""
    slot: dict[str, Any] = cast(dict[str, Any], hosts).setdefault(host.name, {})
    ok = slot.get("ok", True) and entry["ok"]
    if host.deployment is None:
        slot.update(entry)  # a host's default run, beside any deployments it has now
    else:
        slot.setdefault("deployments", {})[host.deployment] = entry
    slot["ok"] = ok


def per_host(to_json: Callable[[T], F]) -> Callable[[FleetResult[T]], shapes.PerHost[F]]:
    """The JSON document of a fleet result whose values turn into `F` with `to_json`."""
    return lambda results: hosts_document(results, to_json)


# ---- hosts, render, flags ----------------------------------------------------------------


def hosts_listing(described: dict[str, dict[str, Any]]) -> shapes.Inventory:
    return {
        "hosts": {
            name: {
                "address": host["address"],
                "port": host["port"],
                "user": host["user"],
                "connection": host["connection"],
                "vars": host["vars"],
            }
            for name, host in described.items()
        }
    }


def graph_document(graph: tuple[list[str], dict[str, GroupNode]]) -> shapes.Graph:
    return {"groups": {n: {"children": g.children, "hosts": g.hosts} for n, g in graph[1].items()}}


def rendered_json(rendered: RenderedCommand) -> shapes.RenderedFields:
    return {
        "command": rendered.display,
        "env": rendered.env_shown,
        "threshold_mode": rendered.threshold_mode,
        "files": rendered.files,
        "batch_script": rendered.launcher_script or None,
    }


def flags_json(flags: FlagReport) -> shapes.Flags:
    return {
        "method": flags.method,
        "note": flags.note,
        "options": flags.options,
        "seconds": flags.seconds,
        "problems": flags.problems,
        "warnings": flags.warnings,
        "hints": flags.hints,
    }


def checked_json(checked: CheckedCommand) -> shapes.CheckedFields:
    return {**rendered_json(checked.rendered), "flags": flags_json(checked.flags)}


def note_document(text: str) -> shapes.Note:
    """One line of news (`dashboard --new-token`) as a document."""
    return {"note": text}


# ---- gpus and patches ----------------------------------------------------------------------


def gpus_json(report: GpuReport) -> shapes.GpusFields:
    return {
        "clean": report.clean,
        "gpus": [gpu_json(g) for g in report.gpus],
        "processes": [
            {
                "pid": p.pid,
                "name": p.name,
                "used_memory_mib": p.used_memory_mib,
                "gpu_uuid": p.gpu_uuid,
                "held_by": report.holders.get(p.pid),
            }
            for p in report.processes
        ],
    }


def gpu_json(gpu: Gpu) -> shapes.Gpu:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "memory_used_mib": gpu.memory_used_mib,
        "memory_total_mib": gpu.memory_total_mib,
        "utilization_pct": gpu.utilization_pct,
    }


def patch_list_document(sets: Iterable[PatchSet]) -> shapes.PatchList:
    return {"patches": [patch_set_json(s) for s in sets]}


def patch_set_json(patch_set: PatchSet) -> shapes.PatchSetEntry:
    return {
        "name": patch_set.name,
        "version": patch_set.version,
        "hash": patch_set.short_hash,
        "sglang_versions": sorted(patch_set.variants),
        "description": patch_set.description,
        "requires": list(patch_set.requires),
        "flags": [rule.flag for rule in patch_set.flags],
    }


def action_text(action: PatchAction) -> str:
    """What was done, as `--json` has always said it: `replaced 1.0.0` names the old version."""
    return f"{action.action} {action.replaced}" if action.replaced else action.action.value


def patch_action_json(action: PatchAction) -> shapes.Action:
    return {
        "set": action.set,
        "version": action.version,
        "action": action_text(action),
        "files": action.files,
        "detail": action.detail,
    }


def patch_actions_json(actions: list[PatchAction]) -> shapes.PatchesFields:
    return {"patches": [patch_action_json(a) for a in actions]}


def set_state_json(state: SetState) -> shapes.SetState:
    return {
        "state": state.state,
        "version": state.version,
        "expected_version": state.expected_version,
        "detail": state.detail,
        "recorded": state.recorded,
        "files": dict(state.files),
    }


def audit_json(report: AuditReport) -> shapes.AuditFields:
    return {
        "sglang_version": report.sglang_version,
        "patches": {name: set_state_json(state) for name, state in report.states.items()},
    }


# ---- crash and logs ------------------------------------------------------------------------


def local_crashes_document(result: LocalCrashes) -> shapes.LocalCrashes:
    return {"crashes": [c.to_json() for c in result.crashes]}


def log_scan_json(scan: LogScan) -> shapes.ScanFields:
    return {
        "log": scan.path,
        "size": scan.size,
        "scanned_bytes": scan.scanned_bytes,
        "crashes": [c.to_json() for c in scan.crashes],
        "healthy": scan.healthy,
        "warnings": [c.to_json() for c in scan.warnings],
    }


def crash_scans_document(results: FleetResult[LogScan]) -> shapes.Fleet:
    document = hosts_document(results, log_scan_json)
    for entry in document["hosts"].values():
        # A failed host keeps the shape, so readers need not test for the keys.
        kept = cast(dict[str, Any], entry)
        kept.setdefault("log", None)
        kept.setdefault("crashes", [])
    return document


# ---- runs: launch, stop, status, restart --------------------------------------------------


def preflight_json(preflight: Preflight) -> shapes.Preflight:
    return {
        "ready": preflight.ok,
        "problems": preflight.problems,
        "hints": preflight.hints,
        "warnings": preflight.warnings,
        "flags": None if preflight.flags is None else flags_json(preflight.flags),
        "command": preflight.plan.rendered.display,
        "env": preflight.plan.rendered.env_shown,
        "log": preflight.next_log,
    }


def outcome_json(outcome: Outcome) -> shapes.LaunchRun:
    run = outcome.run
    document: shapes.LaunchRun = {
        "run": run["id"],
        "log": run["log"],
        "pid": run["pid"],
        "state": outcome.state,
        "ready": outcome.state == "ready",
        "elapsed_s": round(outcome.elapsed, 2),
        "crashes": [c.to_json() for c in outcome.crashes],
        "warnings": [c.to_json() for c in outcome.warnings],
        "command": run["command"],
        "env": run.get("env", {}),
        "note": outcome.note,
        "connection_losses": outcome.connection_losses,
    }
    put_job(document, outcome.placement)
    return document


def launch_document(result: LaunchReport) -> shapes.Launch:
    outcomes = {r.name: r for r in result.outcomes}
    stops = {r.name: r for r in result.stops}
    hosts: dict[str, shapes.HostEntry[shapes.LaunchFields]] = {}
    for pre in result.preflights:
        entry: dict[str, Any] = {**host_entry(pre, preflight_fields)}
        if pre.value is not None and not pre.value.ok:
            entry.update(ok=False, **_refusal(pre.value))
        out = outcomes.get(pre.name)
        if out is not None:
            entry.update(host_entry(out, outcome_json))
            if out.value is not None and not out.value.ok:
                entry.update(ok=False, error=start_failure(out.value), code=ServerError.code)
        stop = stops.pop(pre.name, None)
        if stop is not None:
            entry["stopped"] = host_entry(stop, stop_json)
        place(hosts, pre.host, entry)
    for stop in stops.values():  # stopped (or not), then kept from starting
        error, code, hint = kept_out(stop)
        entry = {"ok": False, "error": error, "code": code, "stopped": host_entry(stop, stop_json)}
        place(hosts, stop.host, {**entry, **({"hint": hint} if hint else {})})
    ended = {r.name: r.value["ended"] for r in result.cleanup if r.value is not None}
    document: shapes.Launch = {
        "started": result.started,
        "dry_run": result.dry_run,
        "hosts": hosts,
    }
    if result.registrations:
        document["registrations"] = [registration_json(r) for r in result.registrations]
    if result.cleanup.results:
        document["group_failed_ended"] = ended
    return document


def preflight_fields(preflight: Preflight) -> shapes.LaunchFields:
    return {"preflight": preflight_json(preflight)}


def kept_out(stop: HostResult[StopResult]) -> tuple[str, str, str | None]:
    """Why a target of `launch --replace` was not started: its stop failed, or another
    node's of its multi-node server did (error, code, hint)."""
    if stop.failed:
        return f"could not stop its run: {stop.error}", stop.code or "error", stop.hint
    return "not started: another node of its server could not be stopped", "error", None


def start_failure(outcome: Outcome) -> str:
    """Why a started run is not serving, in one line: its crash, its last words, its state."""
    if outcome.crashes:
        return f"the server crashed: {outcome.crashes[0].summary()}"
    if outcome.state == "timeout":
        return f"the server was not ready after {outcome.elapsed:.0f}s (left running)"
    said = outcome.note or outcome.last_line
    return f"the server {outcome.state.value}" + (f": {said}" if said else "")


def _refusal(preflight: Preflight) -> dict[str, Any]:
    """A refused preflight as a host's failure: its first problem, the code, the first hint."""
    more = len(preflight.problems) - 1
    error = preflight.problems[0] + (f" (and {more} more)" if more else "")
    hint = preflight.hints[0] if preflight.hints else None
    return {"error": error, "code": "preflight", **({"hint": hint} if hint else {})}


def registration_json(change: Registration) -> shapes.Registration:
    return {
        "worker": change.worker,
        "router": change.router,
        "url": change.url,
        "action": "add" if change.added else "remove",
        "ok": change.ok,
        "error": change.error,
    }


def router_state_json(state: RouterState) -> shapes.RouterState:
    return {
        "router": state.router,
        "api": cast(Literal["workers", "legacy"] | None, state.api),
        "error": state.error,
        "workers": [
            {
                "url": w.url, "healthy": w.healthy, "load": w.load, "deployment": w.worker,
                "role": None if w.kind is None else w.kind.role or "regular",
                "bootstrap_port": None if w.kind is None else w.kind.bootstrap_port,
            }
            for w in state.workers
        ],
        "unregistered": state.unregistered,
        "stray": state.stray,
        "unknown": state.unknown,
        "unread": state.unread,
        "not_ours": state.not_ours,
        "miscast": {url: worker for url, (worker, _) in state.miscast.items()},
        "drift": state.drift,
        "pd": state.pd,
        "missing_roles": state.missing_roles,
    }  # fmt: skip


def sync_json(result: SyncResult) -> shapes.SyncFields:
    document: shapes.SyncFields = {
        "ok": result.ok,
        "dry_run": result.dry_run,
        "force": result.force,
        "before": router_state_json(result.before),
        "changes": [registration_json(c) for c in result.changes],
        "kept": result.kept,
    }
    why = "" if result.ok else sync_problem(result)
    if why:
        document["error"], document["code"] = why, "error"
    return document


def sync_problem(result: SyncResult) -> str:
    """Why a sync did not finish, in one line."""
    state = result.before
    if state.api is None:
        return f"router not read: {state.error}"
    failed = [c for c in result.changes if not c.ok]
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return f"{failed[0].url} not changed: {failed[0].error}{more}"
    kept = [url for url in result.kept if url in state.unknown]
    more = f" (and {len(kept) - 1} more)" if len(kept) > 1 else ""
    return f"{kept[0]} kept: {unknown_text(state, kept[0])}{more}"


def unknown_text(state: RouterState, url: str) -> str:
    """Why a listed URL's owner is unknown: its worker's host that cannot be read."""
    worker = state.unknown[url]
    return f"its worker {worker} cannot be read: {state.unread.get(worker, '')}"


def stop_json(stop: StopResult) -> shapes.StopFields:
    document: shapes.StopFields = {
        "run": stop.run,
        "ended": stop.ended,
        "killed": stop.killed,
        "gpus_clean": stop.gpus_clean,
        "note": stop.note,
        # The host's SHUTDOWN_DRAINED or SHUTDOWN_CUT (remote/wire.py).
        "shutdown": cast(Literal["drained", "cut"] | None, stop.shutdown),
        "shutdown_s": stop.shutdown_s,
    }
    if stop.router:
        document["router"] = registration_json(stop.router)
    put_job(document, stop.placement)
    return document


def put_job(
    document: shapes.LaunchRun | shapes.StopFields | shapes.StatusFields, job: Placement | None
) -> None:
    """The document's `job` key: a placed run's placement (a Slurm job's), only where the run
    has one (the contract's optional `job` object)."""
    if job is not None:
        document["job"] = job_json(job)


def job_json(job: Placement) -> shapes.Job:
    """A placement (a Slurm job): its id, state, why it waits, its nodes, the time it has left."""
    return {
        "id": job["id"],
        "state": job["state"],
        "reason": job["reason"],
        "nodes": job["nodes"],
        "head": job["head"],
        "time_left_s": job["time_left"],
        "exit_code": job["exit_code"],
    }


def run_status_json(status: RunStatus) -> shapes.StatusFields:
    run = status.run
    document: shapes.StatusFields = {
        "run": run["id"] if run else None,
        "pid": run["pid"] if run else None,
        "state": status.state,
        "alive": status.alive,
        "ready": status.ready,
        "crashed": status.crashed,
        "status": run["status"] if run else None,
        "uptime_s": None if status.up_since is None else round(time.time() - status.up_since),
        "log": run["log"] if run else None,
        "gpus": run.get("gpus") if run else None,
        "mem_fraction_static": run.get("mem_fraction_static") if run else None,
        "last_line": status.last_line,
        "crash": status.crashes[0].summary() if status.crashes and status.crashed else None,
        "warning": status.warnings[0].summary() if status.warnings else None,
        "gpu_memory_used_mib": status.gpus.memory_of(status.members) if status.gpus else None,
    }
    if status.metrics_note is not None:  # asked for: the metrics, or why there are none
        document["metrics"] = cast("shapes.Metrics | None", status.metrics)
        document["metrics_note"] = status.metrics_note
    if status.router:
        document["router"] = router_state_json(status.router)
    put_job(document, status.placement)
    return document


def unit_json(unit: Unit) -> shapes.MultiNodeUnit:
    nodes: list[shapes.NodeStatus] = []
    for rank, node in enumerate(unit.nodes):
        found: shapes.NodeStatus = {
            "host": node.host.name,
            "node_rank": rank,
            "ok": node.value is not None and not node.value.crashed,
            "error": node.error,
        }
        # Each node is also one look at its run (the contract's `allOf` runStatus).
        look: Mapping[str, object] = run_status_json(node.value) if node.value else {}
        nodes.append(cast("shapes.NodeStatus", {**found, **look}))
    return {
        "state": unit.state,
        "down": unit.down,
        "ok": not unit.down,
        "nnodes": len(unit.nodes),
        "nodes": nodes,
    }


def status_document(results: FleetResult[RunStatus]) -> shapes.Status:
    """Per host as always; multi-node servers also whole, under `deployments`."""
    from deployctl.ops.runs import units

    document: shapes.Status = {"hosts": hosts_document(results, run_status_json)["hosts"]}
    groups = [u for u in units(results) if len(u.nodes) > 1]
    if groups:
        # A multi-node server is a deployment: its nodes' hosts name it.
        document["deployments"] = {str(u.nodes[0].host.deployment): unit_json(u) for u in groups}
    return document


def restart_document(result: RestartReport) -> shapes.Launch | shapes.NothingRestarted:
    if result.launch is None:
        statuses = hosts_document(result.statuses, run_status_json)["hosts"]
        return {"restarted": [], "hosts": statuses}
    return launch_document(result.launch)


# ---- bench ---------------------------------------------------------------------------------


def bench_json(result: BenchResult) -> shapes.BenchFields:
    doc = result.document
    return {
        "deployment": doc["deployment"],
        "run": doc["run"],
        "levels": result.levels,
        "saved": result.saved,
    }


def bench_document(results: FleetResult[BenchResult | None]) -> shapes.Sweep:
    """Per deployment; the nodes of a multi-node server other than rank 0 serve no API."""
    # A failed host has no value: bench_json reads only the sweeps there are.
    benched = [
        cast("HostResult[BenchResult]", r) for r in results if r.value is not None or r.failed
    ]
    return hosts_document(benched, bench_json)


def comparison_document(result: Comparison) -> shapes.Comparison:
    return {
        "runs": cast("dict[str, shapes.KeptSweep]", result.runs),  # as kept on their hosts
        "missing": result.missing,
        "errors": {n: explain(e)[0] for n, e in result.failed.items()},
        "unreadable": result.unreadable,
    }


def suggestion_document(result: Suggestion) -> shapes.Suggestion:
    return {
        "baseline": result.baseline,
        "speculative": result.speculative,
        "threshold": result.threshold,
        "between": list(result.between),
        "crossover_unresolved": result.crossover_unresolved,
        "wins_after_loss": result.wins_after_loss,
        "speculative_threshold": result.speculative_threshold,
        "baseline_speculates": result.baseline_speculates,
        "levels": [
            {
                "concurrency": c,
                "baseline_tokens_per_s": b,
                "speculative_tokens_per_s": s,
                "wins": s > b if result.measured(c) else None,
            }
            for c, b, s in result.rows
        ],
    }


# ---- tune ----------------------------------------------------------------------------------


def tune_document(report: TuneReport) -> dict[str, Any]:
    """Per deployment: its tune record (as kept on the host)."""
    from deployctl.ops.tune import tune_record

    def entry(result: TuneResult) -> dict[str, Any]:
        document = {**tune_record(result), "ok": result.ok}  # one that did not hold is not ok
        if not result.ok:
            document.update(tune_failure(result))
        return document

    return {**hosts_document(report.results, entry), "interrupted": report.interrupted}


def tune_failure(result: TuneResult) -> dict[str, str]:
    """Why a tune is not ok, in one line, with its code: a phase's crash is the server's."""
    from deployctl.ops.tune import Outcome

    if result.outcome is Outcome.TUNED:
        why = "the tuned server did not hold: below --min-ratio at a level"
    else:
        why = result.note or result.outcome.value
    code = ServerError.code if result.outcome is Outcome.CRASHED else DeployctlError.code
    return {"error": f"tune {result.outcome.value}: {why}", "code": code}


def tune_plan_json(plan: TunePlan) -> shapes.TunePlanShape:
    estimate = plan.estimate()
    return {
        "deployment": plan.host.deployment,
        "phases": {
            str(phase): {
                "template": p.rendered.template,
                "command": p.rendered.display,
            }
            for phase, p in plan.plans.items()
        },
        "params": {**plan.options.describe()},
        "launches": estimate["launches"],
        "levels": estimate["levels"],
        "estimated_s": estimate["estimated_s"],
        "assumed": estimate["assumed"],
    }


def tune_plan_document(plans: Sequence[TunePlan]) -> shapes.PerHost[shapes.TunePlanShape]:
    from deployctl.fanout import HostResult

    return hosts_document((HostResult(p.host, p) for p in plans), tune_plan_json)


def kept_json(kept: Kept[Any]) -> dict[str, Any]:
    """A kept tune or canary as a lookup found it."""
    found: dict[str, Any] = {
        "record": kept.record,
        "numbers": kept.numbers,
        "unreadable": kept.unreadable,
    }
    if kept.record is None:  # exit 1: the document says so, as a failed host's does
        found |= {"ok": False, "error": kept.missing, "code": "error", "hint": kept.hint}
    return found


# ---- events --------------------------------------------------------------------------------


def event_json(event: Event) -> dict[str, Any]:
    """One event as a JSON object: its kind, then its fields; an exception becomes its
    message, stable code and hint, a crash report its usual document."""
    document: dict[str, Any] = {"event": event.kind}
    for item in dataclasses.fields(event):
        value = getattr(event, item.name)
        if isinstance(value, BaseException):
            message, hint = explain(value)
            document.update(error=message, code=error_code(value), hint=hint)
        elif isinstance(value, Enum):
            document[item.name] = value.value
        elif hasattr(value, "to_json"):
            document[item.name] = value.to_json()
        else:
            document[item.name] = value
    return document


# ---- rollout ------------------------------------------------------------------------------


def unit_plan_json(unit: UnitPlan) -> shapes.RolloutUnit:
    """A unit's plan: the keys every unit has (--dry-run's)."""
    return {
        "unit": unit.name,
        "changes": unit.changes,
        "reasons": unit.reasons,
        "command_diff": unit.command_diff,
        "env_diff": unit.env_diff,
        "patches": {label: change.words() for label, change in unit.patches.items()},
        "router": unit.router.label if unit.router else None,
        "blocked": unit.blocked,
    }


def unit_result_json(result: UnitResult) -> shapes.UnitResultFields:
    return {
        "outcome": result.outcome,
        "ok": result.ok,
        "old_run": result.old_run,
        "new_run": result.new_run,
        "state": result.state,
        "error": result.error,
        "crash": result.crash.to_json() if result.crash else None,
        "warnings": result.warnings,
        "drained": result.drained,
        "drain_signal": result.drain_signal,
        "gpus_clean": result.gpus_clean,
        "timings_s": {step: round(s, 3) for step, s in result.timings.items()},
        "overhead_s": None if result.overhead_s is None else round(result.overhead_s, 3),
        "patches_done": [
            {"set": a.set, "version": a.version, "action": a.action.value} for a in result.patches
        ],
    }


def rollout_unit(plan: UnitPlan, done: Mapping[str, UnitResult]) -> shapes.RolloutUnit:
    """A unit's plan and, once acted on, what was done with it."""
    unit = unit_plan_json(plan)
    if plan.name not in done:
        return unit
    return {**unit, **unit_result_json(done[plan.name])}


def canary_document(report: CanaryReport) -> shapes.Canary:
    """The canary's record (as kept on the router's host), its units' plans and results."""
    from deployctl.ops.canary import canary_record

    done = {u.name: u for u in [*report.split, *report.actions]}
    plans = [*report.plan.candidates, *report.plan.controls]
    return {
        "ok": report.ok,
        "dry_run": report.dry_run,
        **canary_fields(canary_record(report, done=True)),
        "already_current": report.plan.already_current,
        "not_judged": report.plan.not_judged,
        "units": [rollout_unit(p, done) for p in plans],
        "keep_error": report.keep_error or None,
    }


def canary_fields(record: CanaryRecord) -> shapes.CanaryFields:
    """A canary's record as its document types it: its states, verdict and steps are the
    words canary_record writes (the protocol keeps them as strings)."""
    from deployctl.ops.canary import Decision

    decision = record["decision"]
    return {
        "canary": record["canary"],
        "router": record["router"],
        "state": cast("shapes.CanaryState", record["state"]),
        "started_at": record["started_at"],
        "updated_at": record["updated_at"],
        "candidates": record["candidates"],
        "controls": record["controls"],
        "metric": CanaryMetric(record["metric"]),
        "max_regression": record["max_regression"],
        "confidence": record["confidence"],
        "verdict": cast("shapes.CanaryVerdict | None", record["verdict"]),
        "estimate": record["estimate"],
        "low": record["low"],
        "high": record["high"],
        "samples": record["samples"],
        "buckets": [{**b} for b in record["buckets"]],
        "reason": record["reason"],
        "decision": None if decision is None else Decision(decision),
        "elapsed_s": record["elapsed_s"],
        "interrupted": record["interrupted"],
        "steps": [
            {**step, "step": cast("shapes.CanaryStepKind", step["step"])}
            for step in record["steps"]
        ],
    }


def tune_live_document(report: LiveReport) -> shapes.TuneLive:
    """A live window: the two replicas, each bucket's speculative ÷ plain gain with its
    interval, the live crossover, the policies raced, and what was done after."""
    crossover = report.crossover
    done = {u.name: u for u in [*report.split, *report.race_split, *report.actions]}
    plan = report.plan
    inventory = plan.inventory_threshold

    def units(plans: Sequence[UnitPlan | None]) -> list[shapes.RolloutUnit]:
        return [rollout_unit(u, done) for u in plans if u is not None]

    return {
        "ok": report.ok,
        "interrupted": report.interrupted,
        "router": plan.router.label,
        "speculative": plan.speculative.name if plan.speculative else None,
        "plain": plan.plain.name if plan.plain else None,
        "others": plan.others,
        "decision": cast("LiveDecision", report.decision),  # set once the window ended
        "reason": report.reason,
        "elapsed_s": round(report.elapsed_s, 1),
        "precision": {"buckets": report.options.precision, "reached": report.precise},
        "samples": {"speculative": report.samples["speculative"], "plain": report.samples["plain"]},
        "buckets": live_buckets_json(report.intervals, crossover),
        "crossover": None if crossover is None else crossover_json(crossover),
        "threshold": report.threshold,
        "inventory_threshold": inventory,
        "inventory_verdict": None
        if inventory is None or crossover is None
        else crossover.judge(inventory),
        "race": None if report.race is None else race_json(report.race, report),
        "kept": report.kept,
        "units": units([plan.speculative, plan.plain]),
        "actions": [{**unit_result_json(a), "unit": a.name} for a in report.actions],
        "window": report.window,
        "keep_error": report.keep_error or None,
    }


def live_buckets_json(
    intervals: Sequence[BucketInterval], crossover: LiveCrossover | None
) -> list[shapes.LiveBucket]:
    """Each bucket's speculative ÷ plain gain (the intervals hold worse-ratios, plain ÷
    speculative), its interval, the smallest gain it could tell, and its verdict."""

    def gain(worse: float | None) -> float | None:
        return None if worse is None else round(1 / worse, 4)

    def verdict(bucket: int) -> shapes.BucketVerdict:
        if crossover is not None and bucket in crossover.wins:
            return "win"
        return "loss" if crossover is not None and bucket in crossover.losses else "undecided"

    return [
        {
            "bucket": i.bucket,
            "samples": i.samples,
            "gain": round(1 / i.ratio, 4),
            "low": gain(i.high),
            "high": gain(i.low),
            # The interval's half-width as a ratio: the smallest gain it can tell from 1.
            "detectable": None if i.low is None else round(i.ratio / i.low - 1, 4),
            "verdict": verdict(i.bucket),
        }
        for i in intervals
    ]


def crossover_json(crossover: LiveCrossover) -> shapes.LiveCrossover:
    return {
        "last_win": crossover.last_win,
        "first_loss": crossover.first_loss,
        "threshold": crossover.threshold,
        "speculation": crossover.speculation,
        "reached": crossover.reached,
        "sizes": list(crossover.sizes),
    }


def live_record_json(record: LiveRecord) -> shapes.LiveRecord:
    """A kept live window without its raw samples (their count per side instead), its
    buckets judged from them (one that ended: as its end look judged them), and its
    crossover."""
    from deployctl.ops.tune.live import live_crossover, record_sizes, rejudge

    intervals = rejudge(record)
    crossover = live_crossover(intervals, record_sizes(record))
    counted = {side: sum(s["side"] == side for s in record["samples"]) for side in ("speculative", "plain")}  # fmt: skip
    document: shapes.LiveRecord = {
        "window": record["window"],
        "router": record["router"],
        "state": cast("Literal['running', 'done']", record["state"]),
        "started_at": record["started_at"],
        "updated_at": record["updated_at"],
        "speculative": record["speculative"],
        "plain": record["plain"],
        "confidence": record["confidence"],
        "resumed": record["resumed"],
        "samples": {"speculative": counted["speculative"], "plain": counted["plain"]},
        "decision": record["decision"],
        "threshold": record["threshold"],
        "elapsed_s": record["elapsed_s"],
        "buckets": live_buckets_json(intervals, crossover),
        "crossover": crossover_json(crossover),
    }
    if "sizes" in record:
        document["sizes"] = record["sizes"]
    if "end_look" in record:
        document["end_look"] = {**record["end_look"]}
    return document


def kept_live_json(kept: Kept[LiveRecord]) -> dict[str, Any]:
    found = kept_json(kept)  # the record as the kept document shows it
    if kept.record is not None:
        found["record"] = live_record_json(kept.record)
    return found


def race_json(race: RaceResult, report: LiveReport) -> shapes.PolicyRace:
    """The policies raced: each bucket's values and winner, the traffic-weighted winner."""
    overall = race.overall
    return {
        "policies": [SpeculationPolicy(p) for p in race.policies],
        "replicas": [r.name for r in report.race_split],
        "buckets": [
            {
                "bucket": row.bucket,
                "samples": row.samples,
                "values": {p: round(v, 3) for p, v in row.values.items()},
                "winner": row.winner,
                "decided": row.decided,
            }
            for row in race.buckets
        ],
        "winner": overall.winner,
        "decided": overall.decided,
        "versus": {
            policy: {
                "gain": round(g.ratio, 4),
                "low": None if g.low is None else round(g.low, 4),
                "high": None if g.high is None else round(g.high, 4),
            }
            for policy, g in overall.versus.items()
        },
        "shares": {str(b): round(share, 4) for b, share in overall.shares.items()},
    }


def rollout_document(report: RolloutReport) -> shapes.Rollout:
    done = {u.name: u for u in report.units}
    return {
        "ok": report.ok,
        "dry_run": report.dry_run,
        "interrupted": report.interrupted,
        "units": [rollout_unit(p, done) for p in report.plans],
    }


# ---- init ----------------------------------------------------------------------------------


def survey_json(survey: HostSurvey) -> shapes.SurveyFields:
    return {
        "hostname": survey.hostname,
        "user": survey.user,
        "gpus": [gpu_json(g) for g in survey.gpus],
        "gpu_error": survey.gpu_error,
        "islands": survey.topology.islands() if survey.topology else None,
        "topology_error": survey.topology_error,
        "sglang": [
            {
                "python": found.python,
                "python_version": found.python_version,
                "version": found.version,
                "site": found.site,
                "patches": found.patches,
            }
            for found in survey.sglang
        ],
        "pythons": [{"python": p, "version": v} for p, v in survey.pythons],
        "deployments": [
            {"name": d.name, "gpus": d.gpus, "tp": d.tp, "port": d.port, "why": d.why}
            for d in survey.deployments()
        ],
        "ports": survey.ports,
        "models": survey.models,
        "sbatch": survey.sbatch,
    }


def init_document(report: InitReport) -> shapes.Init:
    hosts = hosts_document(report.results, survey_json)["hosts"]
    return {
        "hosts": dict(hosts),  # init's hosts have no deployments: the entries as they are
        "path": str(report.path),
        "written": report.written,
        "backup": None if report.backup is None else str(report.backup),
        "extended": None if report.extended is None else str(report.extended),
        "inventory": report.text,
    }
