"""How people see each command's result, paired with its JSON document.

Each kind of result has a `View`: a human form (tables and lines) and its document from
`documents`. `render_result` picks one of the two; nothing here decides an exit status.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from deployctl.choices import PdRole, ThresholdMode
from deployctl.errors import explain
from deployctl.launchers import launcher_of
from deployctl.localfiles import write_file
from deployctl.present import documents as docs
from deployctl.present.terminal import (
    console,
    crash_lines,
    duration_text,
    escaped,
    interval_text,
    print_command,
    print_error,
    print_host_errors,
    print_json,
    print_table,
    size_text,
    tagged,
)
from deployctl.schema import versioned
from deployctl.text import one_line

if TYPE_CHECKING:
    from rich.console import Console

    from deployctl.fanout import FleetResult, HostResult
    from deployctl.inventory import GroupNode, Host
    from deployctl.ops.bench import BenchResult, Comparison, Suggestion
    from deployctl.ops.canary import CanaryReport
    from deployctl.ops.flags import CheckedCommand
    from deployctl.ops.gpus import GpuReport
    from deployctl.ops.init import InitReport
    from deployctl.ops.kept import Kept
    from deployctl.ops.logs import CrashSearch, LocalCrashes, LogScan, LogsResult
    from deployctl.ops.patch import AuditReport, PatchAction
    from deployctl.ops.port import PortReport
    from deployctl.ops.preflight import Preflight
    from deployctl.ops.restart import RestartReport
    from deployctl.ops.rollout import RolloutReport, UnitPlan
    from deployctl.ops.router import ListedWorker, Registration, RouterState, SyncResult
    from deployctl.ops.runs import LaunchReport, Outcome, RunStatus, StopResult
    from deployctl.ops.strays import Stray
    from deployctl.ops.tune import TunePlan, TuneReport
    from deployctl.ops.tune.live import LiveReport
    from deployctl.patchset import PatchSet
    from deployctl.remote.measures import CanaryRecord, LevelFigures, LiveRecord, TuneRecord
    from deployctl.remote.protocol import Placement
    from deployctl.render import RenderedCommand

R = TypeVar("R")


@dataclass(frozen=True)
class View(Generic[R]):
    """How one kind of result is shown: to people, and as one JSON document."""

    human: Callable[[R], None]
    document: Callable[[R], Any]


def render_result(view: View[R], result: R, as_json: bool) -> None:
    """Show a command's result as JSON or for people."""
    if as_json:
        document = view.document(result)
        if document is not None:  # None: it streamed its JSON lines as it went
            print_json(versioned(document))
    else:
        view.human(result)


# ---- hosts and render ----------------------------------------------------------------------


def _hosts_table(described: dict[str, dict[str, Any]]) -> None:
    rows = []
    for name, info in described.items():
        port = f":{info['port']}" if info["port"] else ""
        own = {k: v for k, v in info["vars"].items() if not k.startswith("ansible_")}
        shown = " ".join(f"{k}={v}" for k, v in own.items())
        rows.append(
            [name, info["connection"], f"{info['address']}{port}", info["user"] or "", shown]
        )
    print_table(None, ["host", "connection", "address", "user", "vars"], rows)


HOSTS: View[dict[str, dict[str, Any]]] = View(_hosts_table, docs.hosts_listing)


GRAPH: View[tuple[list[str], dict[str, GroupNode]]] = View(
    lambda graph: print("\n".join(graph[0])), docs.graph_document
)


def _threshold_line(rendered: RenderedCommand) -> str | None:
    """Say how the command gets its --threshold (a shell comment)."""
    if rendered.threshold_mode == ThresholdMode.ADAPTIVE:
        [(path, text)] = rendered.files.items()
        return (
            f"# --threshold {rendered.threshold}: stock SGLang's adaptive speculation, no patch "
            f"(batches are padded to a CUDA-graph size first); launch writes {path}: "
            f"{text.strip()}"
        )
    if rendered.threshold_mode == ThresholdMode.PATCH:
        return f"# --threshold {rendered.threshold}: the spec-disable patch set's flag"
    return None


def _print_rendered(out: Console, name: str, rendered: RenderedCommand) -> None:
    out.print(f"# {name}", style="bold")
    line = _threshold_line(rendered)
    if line:
        out.print(line, style="dim", markup=False, highlight=False)
    print_command(out, rendered.display_lines)


def _rendered(results: FleetResult[RenderedCommand]) -> None:
    out = console()
    for result in results:
        if result.value is not None:
            _print_rendered(out, result.name, result.value)
    print_host_errors(results)


RENDERED: View[FleetResult[RenderedCommand]] = View(_rendered, docs.per_host(docs.rendered_json))


def _checked(results: FleetResult[CheckedCommand]) -> None:
    out = console()
    for result in results:
        if result.value is None:
            continue
        flags = result.value.flags
        _print_rendered(out, result.name, result.value.rendered)
        for problem in flags.problems:
            print_error(problem, host=result.name)
        for warning in flags.warnings:
            sys.stderr.write(tagged("warning", warning, result.name))
        for hint in flags.hints:
            sys.stderr.write(tagged("hint", hint, result.name))
        if flags.method in ("declarations", "parser") and not flags.problems:
            how = "its declarations" if flags.method == "declarations" else "its own parser"
            sys.stderr.write(
                tagged("checked", f"every flag is one of SGLang's {flags.options} "
                       f"(read from {how} in {flags.seconds * 1000:.0f} ms)", result.name)
            )  # fmt: skip
        elif flags.method not in ("declarations", "parser"):
            sys.stderr.write(tagged("not checked", flags.note, result.name))
    print_host_errors(results)


CHECKED: View[FleetResult[CheckedCommand]] = View(_checked, docs.per_host(docs.checked_json))


def _port(result: PortReport) -> None:
    rows = [
        [h.diff, h.file, str(h.hunk), h.outcome, (h.detail.splitlines() or [""])[0]]
        for h in result.hunks
    ]
    print_table(
        f"{result.set}: {result.from_version} → {result.to_version}",
        ["diff", "file", "hunk", "outcome", "detail"],
        rows,
    )
    for hunk in (h for h in result.hunks if h.outcome == "failed"):
        sys.stderr.write(f"{hunk.diff} hunk {hunk.hunk} of {hunk.file} failed; its context:\n")
        sys.stderr.write(hunk.detail if hunk.detail.endswith("\n") else hunk.detail + "\n")
    for script, outcome in result.verify.items():
        print(f"verify {script}: {outcome}")
    print(
        f"candidate written to {result.out} (report.json beside it); not added to patch.yml: "
        f'review it, then declare it under variants: "{result.to_version}"'
    )


# The port's report.json beside its candidate is the same document.
PORT: View[PortReport] = View(_port, lambda r: r.to_json())


# ---- metrics-targets -----------------------------------------------------------------------


@dataclass(frozen=True)
class TargetsFile:
    """Prometheus file_sd entries, to print or to write to `path`."""

    entries: list[dict[str, Any]]
    path: Path | None = None
    loopback: tuple[str, ...] = ()  # targets whose server binds to a loopback address


def _write_targets(result: TargetsFile) -> None:
    text = json.dumps(result.entries, indent=2) + "\n"
    if result.loopback:  # on stderr: the file stays what Prometheus reads
        sys.stderr.write(
            tagged(
                "warning",
                f"{', '.join(result.loopback)}: bound to a loopback address (bind_host), so "
                "Prometheus on another machine cannot scrape them; set bind_host: 0.0.0.0 "
                "(or the host's address) for those",
            )
        )
    if result.path is None:
        sys.stdout.write(text)
        return
    # Prometheus rereads the file when it changes: replace it whole, never half-written.
    write_file(result.path, text.encode())
    sys.stderr.write(f"{len(result.entries)} targets written to {result.path}\n")


# No --json: file_sd is JSON already, and Prometheus reads a bare list (no `schema` key).
TARGETS: View[TargetsFile] = View(_write_targets, lambda r: r.entries)


# ---- init ----------------------------------------------------------------------------------


def _init(report: InitReport) -> None:
    """Each host as read (or why not) on stderr; the inventory on stdout for a dry run, else
    where it went and the next step."""
    for result in report.results:
        survey = result.value
        if survey is None:
            print_error(result.error or "", result.hint, result.name)
            continue
        chosen = survey.chosen
        found = f"SGLang {chosen.version} ({chosen.python})" if chosen else "no SGLang found"
        gpus = f"{len(survey.gpus)} x {survey.gpu_model}" if survey.gpus else "no GPUs read"
        servers = len(survey.deployments())
        sys.stderr.write(escaped(f"{result.name}: {gpus}, {found}, {servers} server(s)") + "\n")
    if not report.written:
        if report.surveys:
            sys.stdout.write(report.text)
        else:
            print_error("no host could be read: nothing written")
        return
    kept = f" (the earlier file kept as {report.backup})" if report.backup else ""
    added = f"added {len(report.surveys)} host(s) to" if report.extended else "wrote"
    sys.stderr.write(escaped(f"{added} {report.path}{kept}") + "\n")
    sys.stderr.write(escaped(f"next: deployctl launch -i {report.path} --dry-run") + "\n")


INIT: View[InitReport] = View(_init, docs.init_document)


# ---- gpus ----------------------------------------------------------------------------------


def _gpus_table(results: FleetResult[GpuReport]) -> None:
    rows = []
    for result in results:
        gpu_report = result.value
        if gpu_report is None:
            rows.append([result.name, "-", "", "", "", "error: " + one_line(result.error or "")])
            continue
        by_gpu: dict[str, list[str]] = {}
        for proc in gpu_report.processes:
            holder = gpu_report.holders.get(proc.pid)
            by_gpu.setdefault(proc.gpu_uuid, []).append(
                f"{proc.pid} {proc.name} {proc.used_memory_mib or '?'} MiB"
                + (f" [{holder}]" if holder else "")
            )
        for gpu in gpu_report.gpus:
            rows.append(
                [
                    result.name,
                    str(gpu.index),
                    gpu.name,
                    f"{gpu.memory_used_mib}/{gpu.memory_total_mib} MiB",
                    f"{gpu.utilization_pct}%" if gpu.utilization_pct is not None else "n/a",
                    "; ".join(by_gpu.get(gpu.uuid, [])),
                ]
            )
        rows.append([result.name, "", "", "", "", gpu_report.verdict()])
    print_table(None, ["host", "gpu", "name", "memory", "util", "processes / verdict"], rows)


GPUS: View[FleetResult[GpuReport]] = View(_gpus_table, docs.per_host(docs.gpus_json))


# ---- patches -------------------------------------------------------------------------------


def _patch_list(sets: Sequence[PatchSet]) -> None:
    rows = [
        [s.name, s.version, s.short_hash, ", ".join(sorted(s.variants)), s.description]
        for s in sets
    ]
    print_table(None, ["set", "version", "hash", "SGLang", "description"], rows)


PATCH_LIST: View[Sequence[PatchSet]] = View(_patch_list, docs.patch_list_document)


def _patch_actions(results: FleetResult[list[PatchAction]]) -> None:
    rows = [
        [r.name, a.set, a.version, docs.action_text(a), str(len(a.files)), a.detail]
        for r in results
        for a in r.value or []
    ]
    print_table(None, ["host", "set", "version", "result", "files", "detail"], rows)
    print_host_errors(results)


PATCH_ACTIONS: View[FleetResult[list[PatchAction]]] = View(
    _patch_actions, docs.per_host(docs.patch_actions_json)
)


def _audit_table(results: FleetResult[AuditReport]) -> None:
    """A hosts × sets matrix with each host's SGLang version."""
    names: list[str] = []
    for result in results:
        for name in result.value.states if result.value else []:
            if name not in names:
                names.append(name)
    rows = []
    for result in results:
        if result.value is None:
            rows.append([result.name, "-", *["?" for _ in names]])
            continue
        cells = []
        for name in names:
            state = result.value.states.get(name)
            if state is None:
                cells.append("")
            elif state.state == "applied":
                cells.append(
                    f"applied {state.version}" + (f" ({state.detail})" if state.detail else "")
                )
            elif state.state == "outdated":
                cells.append(f"outdated {state.version} (want {state.expected_version})")
            else:
                cells.append(state.state + (f": {state.detail}" if state.detail else ""))
        rows.append([result.name, result.value.sglang_version or "?", *cells])
    print_table(None, ["host", "SGLang", *names], rows)
    print_host_errors(results)


AUDIT: View[FleetResult[AuditReport]] = View(_audit_table, docs.per_host(docs.audit_json))


# ---- crash and logs ------------------------------------------------------------------------


def _local_crashes(result: LocalCrashes) -> None:
    if not result.crashes:
        sys.stdout.write("no crash found\n")
    for crash in result.crashes:
        sys.stdout.write("\n".join(crash_lines(crash)) + "\n")


LOCAL_CRASHES: View[LocalCrashes] = View(_local_crashes, docs.local_crashes_document)


def _crash_scans(results: FleetResult[LogScan]) -> None:
    """Each host's crashes (each once, with its ranks), or what was scanned."""
    for result in results:
        scan = result.value
        if scan is None:
            continue
        label = f"{result.name}: " if len(results) > 1 else ""
        scanned = f"scanned {size_text(scan.scanned_bytes)} of {size_text(scan.size)}"
        if scan.warnings:
            count = len(scan.warnings)
            sys.stdout.write(
                f"{label}no crash: the server is alive and healthy; {count} "
                f"trace{'s' if count > 1 else ''} in {scan.path} ({scanned}) "
                f"{'are' if count > 1 else 'is'} a warning (a failed request)\n"
            )
            for trace in scan.warnings:
                sys.stdout.write(escaped(f"  warning: {trace.summary()}") + "\n")
            continue
        if not scan.crashes:
            sys.stdout.write(f"{label}no crash found in {scan.path} ({scanned})\n")
            continue
        count = len(scan.crashes)
        sys.stdout.write(
            f"{label}{count} crash{'es' if count > 1 else ''} in {scan.path} ({scanned})\n"
        )
        whole = scan.scanned_bytes >= scan.size
        for crash in scan.crashes:
            sys.stdout.write("".join(f"  {line}\n" for line in crash_lines(crash, whole)))
    sys.stdout.flush()
    print_host_errors(results)


CRASHES: View[CrashSearch] = View(
    lambda r: _crash_scans(r.scans), lambda r: docs.crash_scans_document(r.scans)
)


def _logs(result: LogsResult) -> None:
    # Lines and errors were streamed as they came; only `--crash` scans are left to show.
    if result.scans is not None:
        _crash_scans(result.scans)


def _logs_document(result: LogsResult) -> Any:
    # Streamed events were their own JSON lines; `--crash` without -f is one document.
    return None if result.scans is None else docs.crash_scans_document(result.scans)


LOGS: View[LogsResult] = View(_logs, _logs_document)


# ---- launch, stop, status, restart --------------------------------------------------------


def outcome_text(outcome: Outcome) -> str:
    """How a run's wait ended, in a few words; a state without words of its own is named."""
    elapsed = outcome.elapsed
    special = {
        "ready": f"ready in {elapsed:.1f}s",
        "started": "started (not waiting)",
        "timeout": f"not ready after {elapsed:.0f}s; left running",
        "crashed": f"CRASHED after {elapsed:.1f}s",
        "died": f"DIED after {elapsed:.1f}s",
        "stopped": f"stopped after {elapsed:.1f}s (by deployctl stop)",
        "aborted": f"stopped after {elapsed:.1f}s: {outcome.note}",
    }
    text = special.get(outcome.state.value, f"{outcome.state.value} after {elapsed:.1f}s")
    said = launcher_of(outcome.run).words(outcome.placement)  # what its launcher says of it
    if said and outcome.state.value != "aborted":
        text += f" ({said})"
    return text


def _launch(result: LaunchReport) -> None:
    """Preflight problems (and, for a dry run, the commands), or each host's run."""
    out_console = console()
    _stop_lines(result)
    if result.refused or result.dry_run:
        for pre in result.preflights:
            if pre.value is None:
                print_error(pre.error or "", pre.hint, pre.name)
                continue
            if result.dry_run:
                out_console.print(f"# {pre.name} → {pre.value.next_log}", style="bold")
                print_command(out_console, pre.value.plan.rendered.display_lines)
            for problem in pre.value.problems:
                print_error(problem, host=pre.name)
            _preflight_warnings(pre)
            for hint in pre.value.hints:
                sys.stderr.write(tagged("hint", hint, pre.name))
        if result.refused:
            # Refused after --replace's stops held (GPUs not clean after them): they stay stopped.
            stopped = " (the runs stopped above stay stopped)" if result.stops.succeeded else ""
            sys.stderr.write(f"nothing was started on any host{stopped}\n")
        return
    for pre in result.preflights:
        _preflight_warnings(pre)
    for out in result.outcomes:
        if out.value is None:
            print_error(out.error or "", out.hint, out.name)
            continue
        outcome = out.value
        run = outcome.run
        out_console.print(
            f"{out.name}: {run['id']} {launcher_of(run).handle(run)} — {outcome_text(outcome)}",
            markup=False,
        )
        out_console.print(f"  log: {run['log']}", markup=False)
        for crash in outcome.crashes:
            for line in crash_lines(crash):
                out_console.print("  " + line, markup=False)
        for trace in outcome.warnings:
            out_console.print(
                escaped(f"  warning: a trace in the log, server healthy: {trace.summary()}"),
                markup=False,
            )
        if outcome.state == "died" and outcome.last_line:
            out_console.print(f"  last line: {escaped(outcome.last_line)}", markup=False)
    _cleanup_lines(result)
    for change in result.registrations:
        print_registration(change)


def registration_text(change: Registration) -> str:
    """`added to edge/router as http://…`, or why not."""
    if change.added:
        done, failed = f"added to {change.router}", f"not added to {change.router}"
    else:
        done, failed = f"removed from {change.router}", f"not removed from {change.router}"
    at = f" as {change.url}" if change.url else ""
    return f"{done}{at}" if change.ok else f"{failed}{at}: {change.error}"


def print_registration(change: Registration) -> None:
    """A change to a router's list, on stdout; one that failed as an error on stderr."""
    who = change.worker or change.router  # a URL of no worker of ours: its router's line
    if change.ok:
        console().print(f"{who}: {registration_text(change)}", markup=False)
    else:
        print_error(registration_text(change), host=who)


def _preflight_warnings(pre: HostResult[Preflight]) -> None:
    for warning in pre.value.warnings if pre.value is not None else []:
        sys.stderr.write(tagged("warning", warning, pre.name))


def _stop_lines(result: LaunchReport) -> None:
    """launch --replace: each live run stopped first, and each target a stop kept from
    starting, with why."""
    checked = {pre.name for pre in result.preflights}
    for stop in result.stops:
        if stop.value is not None:
            pids = ", ".join(map(str, stop.value.ended))
            ended = f"pids {pids}" if pids else "nothing left running"
            if stop.value.shutdown is not None:
                ended += f"; {shutdown_text(stop.value)}"
            console().print(f"{stop.name}: stopped {stop.value.run} ({ended})", markup=False)
            if stop.value.router is not None:
                print_registration(stop.value.router)
        if stop.name not in checked:
            error, _, hint = docs.kept_out(stop)
            print_error(error, hint, stop.name)


def _cleanup_lines(result: LaunchReport) -> None:
    """Say which nodes of a failed multi-node server were ended, and which could not be."""
    for stop in result.cleanup:
        if stop.value is not None:
            ended = ", ".join(map(str, stop.value["ended"])) or "nothing left running"
            sys.stderr.write(f"{stop.name}: the group failed; ended its run ({ended})\n")
    print_host_errors(result.cleanup)


LAUNCH: View[LaunchReport] = View(_launch, docs.launch_document)


def _stop_table(results: FleetResult[StopResult]) -> None:
    rows = []
    for r in results:
        if r.value is None:
            continue
        v = r.value
        gpus = {True: "clean", False: "NOT clean", None: "not checked"}[v.gpus_clean]
        ended = ", ".join(map(str, v.ended)) or "-"
        note = "; ".join(filter(None, [v.note, registration_text(v.router) if v.router else ""]))
        killed = ", ".join(map(str, v.killed)) or "-"
        rows.append([r.name, v.run or "-", shutdown_text(v), ended, killed, gpus, note])
    columns = ["host", "run", "shutdown", "ended pids", "needed SIGKILL", "GPUs", "note"]
    print_table(None, columns, rows)
    print_host_errors(results)


def shutdown_text(stop: StopResult) -> str:
    """How the run ended: `drained in 6.2s` (its requests finished), `cut after 30.0s`."""
    if stop.shutdown is None:
        return "-"
    took = f"{stop.shutdown_s:.1f}s" if stop.shutdown_s is not None else "?"
    return f"drained in {took}" if stop.shutdown == "drained" else f"cut after {took}"


def print_stopping(targets: Sequence[Host]) -> None:
    """Say which deployments a stop without -d ends on hosts that have several."""
    by_host: dict[str, list[str]] = {}
    for target in targets:
        by_host.setdefault(target.name, []).append(target.deployment or "(default)")
    for host, names in by_host.items():
        if len(names) > 1:
            sys.stderr.write(f"{host}: stopping every deployment: {', '.join(names)}\n")
    sys.stderr.flush()


def print_strays(strays: Sequence[Stray], ending_others: bool) -> None:
    """Say which runs the inventory does not name another inventory launched: left running,
    or (--orphans) ended too."""
    for stray in strays:
        if stray.ours:
            continue
        what = f"run {stray.run}" + (f" ({stray.host.deployment})" if stray.host.deployment else "")
        origin = f"launched from {stray.origin}" if stray.origin else "its inventory not recorded"
        if ending_others:
            sys.stderr.write(f"{stray.host.name}: also stopping {what}, {origin} (--orphans)\n")
        else:
            sys.stderr.write(
                f"{stray.host.name}: leaving {what} running: this inventory does not name it "
                f"({origin}); stop it from there, or with --orphans\n"
            )
    sys.stderr.flush()


STOP: View[FleetResult[StopResult]] = View(_stop_table, docs.per_host(docs.stop_json))


def unit_text(unit_state: str, down: Sequence[str], nnodes: int) -> str:
    """A multi-node server's state, naming the nodes down."""
    return f"{unit_state}: {', '.join(down)} down" if down and nnodes > 1 else unit_state


def _status_table(results: FleetResult[RunStatus]) -> None:
    from deployctl.ops.runs import units

    groups = {id(u.nodes[0]): u for u in units(results) if len(u.nodes) > 1}
    rows = []
    for r in results:
        unit = groups.get(id(r))
        if unit is not None:  # a multi-node server: one line for the group, then its nodes
            first = unit.nodes[0].value
            run = first.run["id"] if first is not None and first.run else "-"
            state = unit_text(unit.state.value, unit.down, len(unit.nodes))
            rows.append([unit.name, run, "", state, "", "", "", ""])
        if r.value is None:
            continue
        d = docs.run_status_json(r.value)
        uptime = f"{d['uptime_s']}s" if d["uptime_s"] is not None else "-"
        mem = f"{d['gpu_memory_used_mib']} MiB" if d["gpu_memory_used_mib"] is not None else "-"
        if d["mem_fraction_static"] is not None:  # its cap: on a shared GPU, its share
            mem += f" (cap {d['mem_fraction_static']:g})"
        warning = f"warning: {d['warning']}" if d["warning"] else ""
        detail = d["crash"] or warning or d["last_line"] or ""
        launcher, placed = launcher_of(r.value.run), r.value.placement
        pid = str(d["pid"] or "-")
        said = launcher.words(placed)
        if said and r.value.run is not None:
            pid = launcher.handle(r.value.run)
            if r.value.crashed or launcher.waiting_line(placed):  # its launcher's word first
                detail = said + (f": {detail}" if detail else "")
        row = [r.name, d["run"] or "-", pid, d["state"] or "-", uptime, mem]
        rows.append([*row, d["log"] or "-", detail[:160]])
    columns = ["host", "run", "pid", "state", "uptime", "GPU mem", "log", "crash / last line"]
    print_table(None, columns, rows)
    # Each launcher's placements in a table of its own ("Slurm jobs").
    tables: dict[tuple[str, str], list[list[str]]] = {}
    for r in results:
        if r.value is not None:
            launcher = launcher_of(r.value.run)
            table = tables.setdefault((launcher.placements_title, launcher.placement_word), [])
            table += [placement_row(r.name, p) for p in launcher.placements(r.value.placement)]
    for (title, word), rows in tables.items():
        if rows:
            print_table(title, ["host", word, *PLACEMENT_COLUMNS], rows)
    if any(r.value is not None and r.value.metrics_note is not None for r in results):
        print_table(None, METRIC_COLUMNS, metric_rows(results))
    for r in results:
        if r.value is not None and r.value.router is not None:
            print_router(r.value.router)
    print_host_errors(results)


PLACEMENT_COLUMNS = ["state", "reason", "nodes", "time left"]


def placement_row(name: str, placed: Placement) -> list[str]:
    left = placed["time_left"]
    return [
        name,
        placed["id"],
        placed["state"] + (f" ({placed['exit_code']})" if placed["exit_code"] else ""),
        placed["reason"] or "-",
        ",".join(placed["nodes"]) or "-",
        "-" if left is None else duration_text(left),
    ]


def print_router(state: RouterState) -> None:
    """A router's workers with health and load, then its drift from the inventory."""
    api = {"workers": "", "legacy": " (legacy API)"}.get(state.api or "", "")
    rows = [
        [
            w.url,
            _listed_as(w, state),
            _health_word(w.healthy),
            "-" if w.load is None else str(w.load),
        ]
        for w in state.workers
    ]
    columns = ["worker URL", "deployment", "health", "load"]
    counted = ""
    if state.pd:  # a router in PD mode: each worker's role, as the router lists it
        columns.insert(1, "role")
        for row, w in zip(rows, state.workers, strict=True):
            row.insert(1, _role_word(w))
        roles = [w.kind.role for w in state.workers if w.kind]
        counted = " (" + ", ".join(f"{roles.count(r)} {r}" for r in PdRole) + ")"
    title = (
        f"{state.router}: {len(state.workers)} workers{counted}, "
        f"{state.healthy} of ours healthy{api}"
    )
    if state.api is None:
        print_error(f"router not read: {state.error}", host=state.router)
        return
    print_table(title, columns, rows)
    if state.missing_roles:
        missing = " and no healthy ".join(str(r) for r in state.missing_roles)
        sys.stderr.write(
            tagged("warning", f"serves nothing: it lists no healthy {missing}", state.router)
        )
    for url, (worker, kind) in state.miscast.items():
        sys.stderr.write(
            tagged(
                "drift", f"{worker} at {url} serves as {kind} but is listed otherwise", state.router
            )
        )
    for worker, url in state.unregistered.items():
        sys.stderr.write(
            tagged("drift", f"{worker} serves at {url} but is not registered", state.router)
        )
    for url in state.stray:
        sys.stderr.write(
            tagged("drift", f"{url} is registered but no worker of ours serves there", state.router)
        )
    for url in state.unknown:
        why = docs.unknown_text(state, url)
        sys.stderr.write(tagged("unknown", f"{url} is registered: {why}", state.router))
    for url in state.not_ours:
        sys.stderr.write(tagged("note", f"{url} is registered: {NOT_OURS}", state.router))
    if state.drift:
        host, _, deployment = state.router.partition("/")
        which = f" -d {deployment}" if deployment else ""
        sys.stderr.write(
            tagged("hint", f"mend it: deployctl router sync -H {host}{which}", state.router)
        )


# Why a listed URL no worker of the inventory has is left in its router.
NOT_OURS = "no worker of this inventory is there"


def _listed_as(worker: ListedWorker, state: RouterState) -> str:
    """Whose a listed URL is: the worker of ours serving there, else why it is none."""
    if worker.worker:
        return worker.worker
    if worker.url in state.unknown:
        return "(unknown: not read)"
    return f"({worker.owner} not serving)" if worker.owner else "(not ours)"


def _role_word(worker: ListedWorker) -> str:
    if worker.kind is None:
        return "-"
    if worker.kind.bootstrap_port:
        return f"{worker.kind.role} :{worker.kind.bootstrap_port}"
    return str(worker.kind.role or "regular")


def _health_word(healthy: bool | None) -> str:
    return {True: "healthy", False: "UNHEALTHY", None: "-"}[healthy]


def _sync_table(results: FleetResult[SyncResult]) -> None:
    for r in results:
        if r.value is None:
            continue
        result = r.value
        if result.before.api is None:
            print_error(f"router not read: {result.before.error}", host=r.name)
            continue
        if not result.changes and not result.kept:
            console().print(
                f"{r.name}: in sync ({len(result.before.workers)} workers)", markup=False
            )
        for change in result.changes:
            if result.dry_run:
                verb = "would add" if change.added else "would remove"
                who = f" ({change.worker})" if change.worker else ""
                console().print(f"{r.name}: {verb} {change.url}{who}", markup=False)
            else:
                print_registration(change)
        for url in result.kept:
            state = result.before
            if url in state.unknown:  # its owner not checked: the sync is not done
                why = docs.unknown_text(state, url)
                print_error(f"kept {url}: {why} (--force removes it)", host=r.name)
            else:
                line = f"kept {url}: {NOT_OURS} (--force removes it)"
                console().print(f"{r.name}: {line}", markup=False)
    print_host_errors(results)


ROUTER_SYNC: View[FleetResult[SyncResult]] = View(_sync_table, docs.per_host(docs.sync_json))


METRIC_COLUMNS = [
    "deployment", "running", "queued", "gen tok/s", "KV usage", "cache hit", "accept len",
    "TTFT p50", "ITL p50", "note",
]  # fmt: skip


def metric_rows(results: FleetResult[RunStatus]) -> list[list[str]]:
    """One row per deployment whose metrics were asked for (rank 0 of a multi-node one)."""
    rows = []
    for r in results:
        status = r.value
        if status is None:
            rows.append([r.name, *["" for _ in METRIC_COLUMNS[1:-1]], one_line(r.error or "")])
            continue
        if status.metrics_note is None:
            continue
        m = status.metrics or {}
        rows.append(
            [
                r.name, _num(m, "num_running_reqs", ".0f"), _num(m, "num_queue_reqs", ".0f"),
                _num(m, "gen_throughput", ".1f"), _num(m, "token_usage", ".0%"),
                _num(m, "cache_hit_rate", ".0%"), _num(m, "spec_accept_length", ".2f"),
                _p50_ms(m, "time_to_first_token_seconds"),
                _p50_ms(m, "inter_token_latency_seconds"), status.metrics_note,
            ]
        )  # fmt: skip
    return rows


def _num(metrics: dict[str, Any], name: str, fmt: str) -> str:
    value = metrics.get(name)
    return "-" if value is None else format(value, fmt)


def _p50_ms(metrics: dict[str, Any], name: str) -> str:
    value = (metrics.get(name) or {}).get("p50")
    return "-" if value is None else f"{value * 1000:.1f} ms"


STATUS: View[FleetResult[RunStatus]] = View(_status_table, docs.status_document)


def _restart(result: RestartReport) -> None:
    if result.launch is None:
        console().print("nothing to restart", markup=False)
    else:
        _launch(result.launch)
    print_host_errors(result.statuses)


RESTART: View[RestartReport] = View(_restart, docs.restart_document)


# ---- bench ---------------------------------------------------------------------------------


def _level_row(level: dict[str, Any]) -> list[str]:
    def ms(spread: dict[str, Any]) -> str:
        p50, p99 = spread.get("p50"), spread.get("p99")
        return "-" if p50 is None else f"{p50:.1f} / {p99:.1f}"

    failed = f" ({level['failed']} failed)" if level["failed"] else ""
    return [
        str(level["concurrency"]),
        f"{level['output_tokens_per_s']:.1f}",
        f"{level['requests_per_s']:.2f}",
        ms(level["ttft_ms"]),
        ms(level["itl_ms"]),
        ms(level["e2e_ms"]) + failed,
    ]


LEVEL_COLUMNS = ["concurrency", "out tok/s", "req/s", "TTFT p50/p99 ms", "ITL p50/p99 ms",
                 "e2e p50/p99 ms", "spread (95 %)"]  # fmt: skip


# A client process busy this share of a level's wall time could not have read faster.
CLIENT_BUSY = 0.9


def percent(fraction: float | None, sign: str = "+") -> str:
    """0.052 → `+5.2 %`, or with `±` as the sign `±5.2 %` (`-` for None)."""
    if fraction is None:
        return "-"
    if sign == "±":
        return f"±{abs(fraction) * 100:.1f} %"
    return f"{fraction * 100:{sign}.1f} %"


def warmup_cell(warmup_s: float | None, bias: float | None) -> str:
    """A warm-up's seconds and how far its first sample was from the measured throughput."""
    if warmup_s is None:
        return "-"
    return f"{warmup_s:.1f} s" + ("" if bias is None else f", first {percent(bias)}")


def _bench(results: FleetResult[BenchResult | None]) -> None:
    for r in results:
        if r.value is None:
            continue
        doc = r.value.document
        params = doc["params"]
        by = ", SGLang's serving benchmark" if params["tool"] == "sglang" else ""
        title = f"{r.name}: {doc['run']} (input {params['input_len']}, output {params['output_len']}{by})"
        levels = r.value.levels
        warmed = params.get("warmup", False)
        columns = LEVEL_COLUMNS + (["warm-up, first sample"] if warmed else [])
        rows = [
            _level_row(dict(lv))
            + [percent(lv.get("spread"), "±")]
            + ([warmup_cell(lv.get("warmup_s"), lv.get("first_sample_bias"))] if warmed else [])
            for lv in levels
        ]
        print_table(title, columns, rows)
        sys.stderr.write(f"{r.name}: kept as {r.value.saved}\n")
        for level in levels:
            for error in level["errors"]:
                print_error(f"concurrency {level['concurrency']}: {error}", host=r.name)
            if level.get("drifting"):
                sys.stderr.write(
                    tagged(
                        "note",
                        f"concurrency {level['concurrency']}: its rounds still drift "
                        f"({percent(level.get('drift'))} from the first half to the second, "
                        f"beyond their spread {percent(level.get('spread'), '±')})",
                        r.name,
                    )
                )
        if any(lv.get("drifting") for lv in levels):
            hint = "" if warmed else "bench with --warmup, or "
            sys.stderr.write(tagged("hint", f"{hint}more --requests-per-stream", r.name))
        busy = [lv for lv in levels if lv.get("client_busy", 0.0) >= CLIENT_BUSY]
        if busy:
            worst = max(busy, key=lambda lv: lv["client_busy"])
            sys.stderr.write(
                tagged(
                    "warning",
                    f"concurrency {', '.join(str(lv['concurrency']) for lv in busy)}: the bench "
                    f"client was busy {worst['client_busy'] * 100:.0f} % of the level (at "
                    f"{worst['concurrency']}, over {worst.get('client_processes', 1)} "
                    "process(es)): these figures may be the client's limit, not the server's",
                    r.name,
                )
            )
    print_host_errors(results)


BENCH: View[FleetResult[BenchResult | None]] = View(_bench, docs.bench_document)


def _comparison(result: Comparison) -> None:
    for name, paths in result.unreadable.items():
        for path in paths:
            sys.stderr.write(
                tagged("warning", f"{path} is not a readable bench result; skipped", name)
            )
    runs = list(result.runs)
    levels = sorted({lv["concurrency"] for doc in result.runs.values() for lv in doc["levels"]})
    columns = ["concurrency"] + [f"{run} {what}" for run in runs for what in ("tok/s", "ITL p50")]
    rows = []
    for c in levels:
        row = [str(c)]
        for run in runs:
            level = next((lv for lv in result.runs[run]["levels"] if lv["concurrency"] == c), None)
            itl = level["itl_ms"]["p50"] if level else None
            row += [f"{level['output_tokens_per_s']:.1f}" if level else "-",
                    "-" if itl is None else f"{itl:.1f} ms"]  # fmt: skip
        rows.append(row)
    print_table(None, columns, rows)
    tools = {run: doc.get("params", {}).get("tool", "builtin") for run, doc in result.runs.items()}
    if len(set(tools.values())) > 1:
        sys.stderr.write(
            "note: these runs used different load generators ("
            + ", ".join(f"{run}: {tool}" for run, tool in tools.items())
            + "); tok/s compares, but sglang's ITL is per token and the builtin's per chunk\n"
        )
    for run in result.missing:
        print_error(f"no kept bench results for {run} on the selected hosts")
    for name, exc in result.failed.items():
        print_error(explain(exc)[0], host=name)


COMPARISON: View[Comparison] = View(_comparison, docs.comparison_document)


def _suggestion(result: Suggestion) -> None:
    rows = [[str(c), f"{b:.1f}", f"{s:.1f}", _verdict(result, c, b, s)] for c, b, s in result.rows]
    print_table(
        None, ["concurrency", result.baseline, result.speculative, "speculation wins"], rows
    )
    if result.threshold is None:
        sys.stdout.write("speculation never beats the baseline here: run without it\n")
    else:
        sys.stdout.write(
            f"speculation wins up to concurrency {result.threshold}: "
            f"deployctl launch --threshold {result.threshold}\n"
        )
    for line in _suggestion_caveats(result):
        sys.stderr.write(line)


def _verdict(result: Suggestion, concurrency: int, base: float, spec: float) -> str:
    if not result.measured(concurrency):
        return "not measured"
    return "yes" if spec > base else "no (tie)" if spec == base else "no"


def _suggestion_caveats(result: Suggestion) -> list[str]:
    """What the two sweeps cannot show, as `warning:`/`note:` lines with their hints."""
    lines = []
    spec_threshold = result.speculative_threshold
    if spec_threshold is not None:
        hidden = f" (not measured: {_levels(result.unmeasured)})" if result.unmeasured else ""
        lines += [
            tagged(
                "warning",
                f"{result.speculative} ran with --threshold {spec_threshold}: above concurrency "
                f"{spec_threshold} its curve is the baseline's, not speculation's{hidden}; "
                f"the suggestion cannot exceed {spec_threshold}",
            ),
            tagged("hint", "bench a speculative run launched without --threshold to see past it"),
        ]
    if result.baseline_speculates:
        lines += [
            tagged(
                "warning",
                f"{result.baseline} is not a baseline: its command has --speculative-algorithm",
            ),
            tagged("hint", "bench a run of the baseline template (deployctl launch -t baseline)"),
        ]
    last_win, first_loss = result.between
    if result.crossover_unresolved:
        where = (
            f"between concurrency {last_win} and {first_loss}"
            if last_win is not None
            else f"below concurrency {first_loss}, where speculation was not measured"
        )
        lines += [
            tagged("note", f"the crossover lies somewhere {where}"),
            tagged("hint", "deployctl tune narrows it down"),
        ]
    if result.wins_after_loss:
        lines.append(
            tagged(
                "note",
                f"speculation wins again at {_levels(result.wins_after_loss)} after losing at "
                f"{first_loss}: a threshold cannot use them",
            )
        )
    return lines


def _levels(levels: list[int]) -> str:
    return ", ".join(map(str, levels))


SUGGESTION: View[Suggestion] = View(_suggestion, docs.suggestion_document)


def _tune_shortfall(record: TuneRecord, label: str) -> None:
    """Where the tuned run fell below the better curve. Above T its drafting was off (in
    either threshold mode): a shortfall there is the engine's off path (on SGLang 0.5.17 it
    still verifies through the speculative worker and extends the draft every step), which
    more samples do not cure; at or below T it can be noise."""
    from deployctl.ops.tune.tuner import drafting_off

    ratios, bound, threshold = record["envelope_ratio"], record["min_ratio"], record["threshold"]
    low = [c for c, r in ratios.items() if r < bound]
    above = [c for c in low if drafting_off(threshold, int(c))]
    rest = [c for c in low if c not in above]
    if above:
        worst = min(ratios[c] for c in above)
        print_error(
            f"above its threshold {threshold} the tuned run fell below {bound} of the better "
            f"curve at concurrency {', '.join(above)} (down to {worst:.2f}): with drafting "
            "off there, this is the cost of speculation's off state on this engine, not noise",
            "where the load stays above T, a server without speculation serves faster "
            "(tune --keep baseline)",
            host=label,
        )
    if rest:
        print_error(
            f"the tuned run fell below {bound} of the better curve at "
            f"concurrency {', '.join(rest)}",
            "measure again with more --requests-per-stream, or lower --min-ratio",
            host=label,
        )


def _tune_record(record: TuneRecord, label: str) -> None:
    """A tune record as people read it: T, the gain table, what serves now."""
    from deployctl.plot import crossover_ends
    from deployctl.present.tune_report import gain_rows, keep_variables

    threshold, speculation = record["threshold"], record.get("speculation")
    last_win, first_loss = crossover_ends(record)
    title = f"{label}: tune {record['tune'] or '-'} ({record['outcome']})"
    if threshold is not None:
        title += (
            f": T = {threshold} ({record['threshold_mode']}): speculation wins up to "
            f"concurrency {last_win}, not at {first_loss}"
        )
    elif speculation == "never":
        title += ": speculation never beats the baseline here"
    elif speculation == "always":
        title += ": speculation wins at every level measured (no threshold needed)"

    def num(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rows = [
        [
            f"{row.concurrency}{'*' if row.refined else ''}",
            num(row.baseline),
            num(row.speculative),
            num(row.tuned),
            num(row.tuned_vs_baseline, 2),
            num(row.tuned_vs_speculative, 2),
            num(row.envelope_ratio, 3) + (" low" if row.below_min else ""),
        ]
        for row in gain_rows(record)
    ]
    columns = ["concurrency", "baseline tok/s", "speculative tok/s", "tuned tok/s",
               "÷ baseline", "÷ speculative", "÷ better"]  # fmt: skip
    print_table(title, columns, rows)
    _tune_figures(record)
    write = sys.stdout.write
    if record["refined_levels"]:
        write(
            f"* measured to find the crossover: {', '.join(map(str, record['refined_levels']))}\n"
        )
    if record.get("wins_again"):
        again = ", ".join(map(str, record["wins_again"]))
        write(
            f"note: speculation wins again at {again}, measured again: a threshold cannot use it\n"
        )
    capacity = record.get("capacity")
    if capacity is not None:
        write(f"the tuned run meets the latency bound up to concurrency {capacity}\n")
    crash = record.get("crash")
    if crash:
        print_error(
            f"{crash['exception']}: {one_line(crash['message'])}", crash["hint"], host=label
        )
    if record["outcome"] != "tuned" and record["outcome_note"]:
        print_error(record["outcome_note"], host=label)
    elif record["envelope_ratio"] and not record["held"]:
        _tune_shortfall(record, label)
    serving = record["serving"]
    if record.get("serving_known") is False:
        write("serving: unknown (the host did not answer)\n")
    else:
        write(f"serving: {serving}\n" if serving else "serving: nothing\n")
    keep = keep_variables(record)
    if keep:
        where = f"deployment {record['deployment']} of " if record["deployment"] else ""
        lines = " and ".join(f"`{line}`" for line in keep)
        write(
            f"keep it: add {lines} to {where}{record['host']} in the inventory "
            "(launch uses it when --threshold is not given)\n"
        )
    if record.get("narrowed") is False:
        print_error(
            f"the crossover was not narrowed down to adjacent levels ({record['outcome_note']})",
            "tune again with --max-launches raised, or with --concurrency nearer the crossover",
            host=label,
        )


def _tune_figures(record: TuneRecord) -> None:
    """Per level and phase, how warm and how steady it was measured; then the levels whose
    samples do not decide the comparison, and those whose rounds still drift."""
    phases = {
        name: figures
        for name, phase in record["phases"].items()
        if (figures := phase.get("per_level"))
    }
    if not phases:
        return  # a record from before these figures
    levels = sorted({int(c) for figures in phases.values() for c in figures})

    def cell(figures: LevelFigures | None) -> str:
        if figures is None:
            return "-"
        warm = warmup_cell(figures["warmup_s"], figures["first_sample_bias"])
        return f"{warm}; {percent(figures['spread'], '±')}"

    print_table(
        "warm-up, its first sample against the level, and the spread (95 %) of the level's rounds",
        ["concurrency", *phases],
        [[str(c), *(cell(f.get(str(c))) for f in phases.values())] for c in levels],
    )
    write = sys.stdout.write
    for c, verdict in sorted(record.get("verdicts", {}).items(), key=lambda item: int(item[0])):
        if verdict.get("within_spread"):
            ratio = verdict["speculative"] / verdict["baseline"] if verdict["baseline"] else 0.0
            spreads = ", ".join(
                f"{phase} {percent(v, '±')}" for phase, v in verdict.get("level_spread", {}).items()
            )
            write(
                f"note: at {c} speculative ÷ baseline is {ratio:.3f}, inside the spread of "
                f"their rounds ({spreads}): the samples do not decide it; measure with more "
                "--requests-per-stream\n"
            )
    for phase, figures in phases.items():
        for c, f in sorted(figures.items(), key=lambda item: int(item[0])):
            if f["drifting"]:
                write(
                    f"note: {phase} at {c}: its rounds still drift ({percent(f['drift'])} from "
                    f"the first half to the second, beyond their spread {percent(f['spread'], '±')})\n"
                )


def _tunes(report: TuneReport) -> None:
    from deployctl.ops.tune import tune_record

    results = report.results
    if report.interrupted:
        sys.stderr.write(
            "interrupted: each deployment stopped at its next step (below: what serves now)\n"
        )
    for r in results:
        if r.value is not None:
            _tune_record(tune_record(r.value), r.name)
            if r.value.saved:
                sys.stderr.write(f"{r.name}: kept as {r.value.saved}\n")
    print_host_errors(results)


TUNE: View[TuneReport] = View(_tunes, docs.tune_document)


def _tune_live(report: LiveReport) -> None:
    doc = docs.tune_live_document(report)
    router = doc["router"]
    write = sys.stdout.write
    if doc["speculative"] is not None:
        _live_crossover(doc)
    if doc["race"] is not None:
        _live_race(doc)
    if doc["kept"] is not None:
        policy = {
            "threshold": f"threshold T = {doc['threshold']}",
            "adaptive": "SGLang's own adaptive speculation",
            "off": "speculation off",
        }[doc["kept"]]
        done = (
            "rolled out to" if doc["decision"] == "promoted" else "not rolled out (--no-promote):"
        )
        write(f"kept: {policy}; {done} the router's replicas\n")
        if doc["kept"] == "threshold":  # a later launch takes it from the inventory
            write(f"keep it: `threshold: {doc['threshold']}` for the router's replicas\n")
    elif doc["reason"] and report.ok:
        write(doc["reason"] + "\n")
    for action in report.actions:
        if not action.ok:
            print_error(f"{action.name}: {action.outcome}: {action.error}", host=router)
    if not report.ok and doc["reason"]:
        print_error(doc["reason"], host=router)


def _live_crossover(doc: Mapping[str, Any]) -> None:
    title = (
        f"{doc['router']}: tune --live ({doc['decision']}): {doc['speculative']} with "
        f"speculation, {doc['plain']} without, {doc['elapsed_s']:g}s, "
        f"{doc['samples']['speculative']} + {doc['samples']['plain']} samples"
    )
    if doc["precision"]["reached"]:
        title += f" (ended early: the crossover within {doc['precision']['buckets']} bucket)"
    crossover = _live_buckets(title, doc["buckets"], doc["crossover"])
    inventory, verdict = doc["inventory_threshold"], doc["inventory_verdict"]
    if crossover is not None and verdict is not None:
        why = {
            "too high": f"speculation loses from bucket {crossover['first_loss']}",
            "too low": f"speculation still wins at bucket {crossover['last_win']}",
            "agrees": "it lies within the live crossover",
        }[verdict]
        sys.stdout.write(
            f"the inventory's threshold {inventory} (a synthetic bench's) is "
            f"{'right' if verdict == 'agrees' else verdict} for this traffic: {why}\n"
        )


def _live_buckets(
    title: str, buckets: Sequence[Mapping[str, Any]], crossover: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """Each bucket's gain and verdict, then what the crossover says; the crossover."""
    rows = [
        [
            str(b["bucket"]), str(b["samples"]), f"{b['gain']:.3f}",
            "-" if b["low"] is None or b["high"] is None else f"{b['low']:.3f} – {b['high']:.3f}",
            "-" if b["detectable"] is None else f"{b['detectable']:.1%}",
            b["verdict"],
        ]
        for b in buckets
    ]  # fmt: skip
    header = ["bucket", "samples", "speculative ÷ plain", "interval", "detectable", "verdict"]
    print_table(title, header, rows)
    if crossover is None:
        return None
    above = f"; the traffic never reached a bucket above {crossover['reached']}"
    said = {
        "threshold": f"live crossover: speculation wins up to bucket {crossover['last_win']}"
        f", loses from {crossover['first_loss']}: T = {crossover['threshold']}",
        "never": f"speculation loses from bucket {crossover['first_loss']} and wins at no "
        "bucket below it: run without it",
        "always": f"speculation wins at every bucket decided, up to {crossover['last_win']}: "
        "no threshold needed on this traffic",
        "undecided": "no bucket decided yet: the window was too short for this traffic",
    }[crossover["speculation"]]
    sys.stdout.write(said + above + "\n")
    return crossover


def _kept_live(kept: LiveRecord, router: str) -> None:
    """A router's kept window judged from its samples (one that ended: as it ended)."""
    record = docs.live_record_json(kept)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["started_at"]))
    resumed = f", resuming {', '.join(map(str, record['resumed']))}" if record["resumed"] else ""
    title = (
        f"{router}: live window {record['window']} ({record['state']}{resumed}), started "
        f"{started}: {record['speculative']} with speculation, {record['plain']} without, "
        f"{record['elapsed_s']:g}s, {record['samples']['speculative']} + "
        f"{record['samples']['plain']} samples"
    )
    _live_buckets(title, record["buckets"], record["crossover"])
    if record["state"] == "running":
        ago = duration_text(max(0.0, time.time() - record["updated_at"]))
        sys.stdout.write(f"running (last written {ago} ago)\n")
    else:
        sys.stdout.write(f"decision: {record['decision']}\n")


KEPT_LIVE: View[FleetResult[Kept[LiveRecord]]] = View(
    lambda results: _kept(results, _kept_live), docs.per_host(docs.kept_live_json)
)


def _live_race(doc: Mapping[str, Any]) -> None:
    race = doc["race"]
    policies = race["policies"]
    title = (
        f"{doc['router']}: policies raced at T = {doc['threshold']} ({', '.join(race['replicas'])})"
    )
    rows = [
        [
            str(b["bucket"]),
            *(
                "-" if p not in b["values"] else f"{b['values'][p]:.1f} ({b['samples'][p]})"
                for p in policies
            ),
            "-"
            if b["winner"] is None
            else b["winner"] + ("" if b["decided"] else " (within noise)"),
        ]
        for b in race["buckets"]
    ]
    header = ["bucket", *(f"{p} tok/s (n)" for p in policies), "best"]
    print_table(title, header, rows)
    if race["winner"] is None:
        sys.stdout.write("no load bucket every policy served at: no overall winner\n")
        return
    versus = ", ".join(
        f"{p} by {g['gain']:.3f}{interval_text(g['low'], g['high'])}"
        for p, g in race["versus"].items()
    )
    state = "" if race["decided"] else " (within noise)"
    sys.stdout.write(
        f"overall, weighted by the traffic's buckets: {race['winner']}{state}, ahead of {versus}\n"
    )


TUNE_LIVE: View[LiveReport] = View(_tune_live, docs.tune_live_document)


def _tune_plans(plans: list[TunePlan]) -> None:
    for plan in plans:
        estimate = plan.estimate()
        label = plan.host.label
        for phase, phase_plan in plan.plans.items():
            sys.stdout.write(f"{label}: {phase}: {phase_plan.rendered.template}\n")
            print_command(console(), phase_plan.rendered.display_lines)
        sys.stdout.write(
            f"{label}: then tuned: the speculative template with --threshold T\n"
            f"{label}: levels {', '.join(map(str, plan.options.levels))}; about "
            f"{estimate['launches']} launches and {estimate['levels']} level measurements, "
            f"~{estimate['estimated_s'] / 60:.0f} min (assuming "
            f"{estimate['assumed']['launch_s']:.0f} s a launch and "
            f"{estimate['assumed']['token_s'] * 1000:.0f} ms a token)\n"
        )


TUNE_PLAN: View[list[TunePlan]] = View(_tune_plans, docs.tune_plan_document)


def _kept(results: FleetResult[Kept[Any]], show: Callable[[Any, str], None]) -> None:
    """Each kept record found (`show`n), or why there is none; files that are not records."""
    for r in results:
        kept = r.value
        if kept is None:
            continue
        for path in kept.unreadable:
            sys.stderr.write(
                tagged("warning", f"{path} is not a readable {kept.kind} record", r.name)
            )
        if kept.record is not None:
            show(kept.record, r.name)
        else:
            print_error(kept.missing, kept.hint, host=r.name)
    print_host_errors(results)


KEPT_TUNES: View[FleetResult[Kept[TuneRecord]]] = View(
    lambda results: _kept(results, _tune_record), docs.per_host(docs.kept_json)
)


# A command whose output streamed as it happened (`top`, `watch`, `logs -f`): nothing is left.
STREAMED: View[Any] = View(lambda _: None, lambda _: None)

# One line of news (`dashboard --new-token`): printed, or `{"note": …}`.
NOTE: View[str] = View(print, docs.note_document)


# ---- rollout ------------------------------------------------------------------------------


def _unit_plan_lines(unit: UnitPlan) -> None:
    out = console()
    if not unit.changes:
        out.print(f"{unit.name}: matches the inventory; skipped", markup=False)
        return
    via = f" via {unit.router.label}" if unit.router else ", no router: down while replaced"
    out.print(f"{unit.name}: changes ({'; '.join(unit.reasons)}){via}", markup=False)
    for line in [*unit.command_diff, *unit.env_diff]:
        out.print(f"  {line}", markup=False)
    if unit.blocked:
        print_error(unit.blocked, host=unit.name)


def _rollout(report: RolloutReport) -> None:
    if report.dry_run:
        for unit in report.plans:
            _unit_plan_lines(unit)
        return
    rows = []
    for r in report.units:
        ours = "-" if r.overhead_s is None else f"{r.overhead_s:.1f}s"
        drained = {True: "yes", False: "timed out", None: "-"}[r.drained]
        if r.drained is not None and r.drain_signal:
            drained += f" ({r.drain_signal})"
        runs = f"{r.old_run or '-'} → {r.new_run or '-'}" if r.new_run else (r.old_run or "-")
        note = "; ".join(filter(None, [r.error, *r.warnings]))
        rows.append([r.name, r.outcome.value, runs, drained, ours, note[:200]])
    print_table(None, ["unit", "outcome", "run", "drained", "deployctl time", "note"], rows)
    for r in report.units:
        if r.crash is not None:
            for line in crash_lines(r.crash):
                sys.stderr.write(f"{r.name}: {line}\n")
    stopped = next((r for r in report.units if not r.ok), None)
    if stopped is not None:
        sys.stderr.write(
            f"rollout stopped at {stopped.name}; the units after it were not touched "
            "(fix it, then run deployctl rollout again to go on)\n"
        )
    elif report.interrupted:
        sys.stderr.write("rollout interrupted; run deployctl rollout again to go on\n")


ROLLOUT: View[RolloutReport] = View(_rollout, docs.rollout_document)


def _canary(report: CanaryReport) -> None:
    from deployctl.ops.canary import canary_record
    from deployctl.ops.rollout import RolloutReport

    plan = report.plan
    if report.dry_run:
        canaries = ", ".join(u.name for u in plan.candidates)
        controls = ", ".join(u.name for u in plan.controls)
        on_it = plan.already_current
        current = f"; already on it: {', '.join(on_it)}" if on_it else ""
        console().print(
            f"{plan.router}: canary {canaries}; control {controls}{current}", markup=False
        )
        _not_judged_lines(plan.not_judged)
        for unit in plan.candidates:
            _unit_plan_lines(unit)
        return
    _not_judged_lines(plan.not_judged)
    _canary_record(canary_record(report, done=True))
    units = [*report.split, *report.actions]
    if units:
        _rollout(RolloutReport(units, []))
    if report.kept is not None:
        console().print(
            f"kept as canary {report.kept} on {plan.router}: deployctl canary --report "
            f"{report.kept}",
            markup=False,
        )
    elif report.keep_error:
        sys.stderr.write(tagged("warning", f"not kept: {report.keep_error}", plan.router))


def _not_judged_lines(not_judged: Mapping[str, str]) -> None:
    """The replicas that differ but are neither canary nor control: left as they run."""
    for name, why in not_judged.items():
        console().print(
            f"  {name}: not judged, left as it runs ({why}): deployctl rollout rolls it out",
            markup=False,
        )


def _canary_record(record: CanaryRecord) -> None:
    """The per-bucket table, the verdict with its interval, and the decision."""
    out = console()
    canaries, controls = ", ".join(record["candidates"]), ", ".join(record["controls"])
    if record["buckets"]:
        rows = [
            [
                str(b["bucket"]),
                "-" if b["control"] is None else f"{b['control']:.4g}",
                "-" if b["candidate"] is None else f"{b['candidate']:.4g}",
                "-" if b["ratio"] is None else f"{b['ratio']:.3f}",
                f"{b['control_n']}/{b['candidate_n']}",
            ]
            for b in record["buckets"]
        ]
        print_table(
            f"{record['router']}: {canaries} against {controls} ({record['metric']})",
            ["load bucket", "control", "candidate", "ratio (>1 worse)", "samples"],
            rows,
        )
    if record["estimate"] is not None:
        interval = interval_text(record["low"], record["high"])
        out.print(
            f"verdict: {record['verdict']} · candidate/control {record['estimate']:.3f}{interval} "
            f"over {record['samples']} matched samples in {duration_text(record['elapsed_s'])}",
            markup=False,
        )
    if record["state"] == "running":
        ago = duration_text(max(0.0, time.time() - record["updated_at"]))
        out.print(f"running (last written {ago} ago)", markup=False)
    else:
        out.print(f"decision: {record['decision'] or 'none'} ({record['reason']})", markup=False)


def _kept_canary(record: CanaryRecord, router: str) -> None:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["started_at"]))
    console().print(
        f"canary {record['canary']} of {router}, started {started} "
        f"(max regression {record['max_regression']:.0%}, confidence {record['confidence']:g})",
        markup=False,
    )
    _canary_record(record)
    for step in record["steps"]:
        runs = f"{step['old_run'] or '-'} → {step['new_run'] or '-'}"
        note = f": {step['error']}" if step["error"] else ""
        console().print(
            f"  {step['step']} {step['unit']} {step['outcome']} ({runs}){note}", markup=False
        )


KEPT_CANARIES: View[FleetResult[Kept[CanaryRecord]]] = View(
    lambda results: _kept(results, _kept_canary), docs.per_host(docs.kept_json)
)


CANARY: View[CanaryReport] = View(_canary, docs.canary_document)
