"""All presentation: human tables, streamed lines and --json documents for command results.

Each command's result has a `View`: how people see it and its JSON document.
`render_result` picks one of the two; nothing here decides an exit status.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from deployctl.errors import DeployctlError, explain
from deployctl.schema import versioned
from deployctl.text import one_line

if TYPE_CHECKING:
    from rich.console import Console

    from deployctl.crash.model import CrashReport
    from deployctl.fanout import FleetResult, HostResult
    from deployctl.inventory import GroupNode, Host
    from deployctl.ops.bench import BenchResult, Comparison, Suggestion
    from deployctl.ops.flags import CheckedCommand
    from deployctl.ops.gpus import GpuReport
    from deployctl.ops.launch import LaunchReport, Preflight
    from deployctl.ops.logs import CrashSearch, LocalCrashes, LogScan, LogsResult
    from deployctl.ops.patch import AuditReport, PatchAction
    from deployctl.ops.port import PortReport
    from deployctl.ops.server import RestartReport, RunStatus, StopResult, WatchEvent
    from deployctl.patchset import PatchSet
    from deployctl.render import RenderedCommand

R = TypeVar("R")
T = TypeVar("T")
CRASH_MARK = "!! "
_RED, _RESET = "\033[31m", "\033[0m"


@dataclass(frozen=True)
class View(Generic[R]):
    """How one kind of result is shown: to people, and as one JSON document."""

    human: Callable[[R], None]
    document: Callable[[R], Any]


def render_result(view: View[R], result: R, as_json: bool) -> None:
    """Show a command's result as JSON or for people."""
    if as_json:
        print_json(versioned(view.document(result)))
    else:
        view.human(result)


# ---- building blocks -----------------------------------------------------------------------


def console(stderr: bool = False) -> Console:
    """Return a rich console; wide when not a terminal so lines are not wrapped."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(file=stream, width=width, highlight=False, soft_wrap=not stream.isatty())


def print_json(document: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def error_text(message: str, hint: str | None = None, host: str | None = None) -> str:
    """`[host: ]error: …` and `[host: ]hint: …`, one line each: the one error format."""
    return tagged("error", message, host) + (tagged("hint", hint, host) if hint else "")


def tagged(tag: str, text: str, host: str | None = None) -> str:
    """One `[host: ]tag: text` line."""
    prefix = f"{host}: " if host else ""
    return f"{prefix}{tag}: {one_line(text)}\n"


def print_error(message: str, hint: str | None = None, host: str | None = None) -> None:
    """Print an error (and its hint) on stderr."""
    sys.stderr.write(error_text(message, hint, host))
    sys.stderr.flush()


def print_bug(failures: Sequence[tuple[str | None, BaseException]], message: str = "") -> None:
    """Keep the tracebacks of bugs (per host, or None for the command) in a new debug file,
    and name it in one error line."""
    from deployctl.debug import write_debug_file

    path = write_debug_file(failures)
    hosts = [host for host, _ in failures if host]
    where = f" on {', '.join(hosts)}" if hosts else ""
    print_error(
        message or f"internal error{where}",
        f"a bug in deployctl; the traceback is in {path}; please report it",
    )


def print_host_errors(results: Iterable[HostResult[Any]]) -> None:
    """Print each failed host's error (and hint) on stderr."""
    for result in results:
        if result.failed:
            print_error(result.error or "", result.hint, result.name)


def host_entry(result: HostResult[T], to_json: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    """One host in a JSON document: ok, error, its stable code and hint, and its fields."""
    entry: dict[str, Any] = {"ok": not result.failed, "error": result.error, "code": result.code}
    if result.hint:
        entry["hint"] = result.hint
    if result.value is not None:
        entry.update(to_json(result.value))
    return entry


def hosts_document(
    results: Iterable[HostResult[T]], to_json: Callable[[T], dict[str, Any]]
) -> dict[str, Any]:
    """Return {"hosts": {name: {"ok", "error", "code", **fields}}} for per-host results."""
    hosts: dict[str, Any] = {}
    for result in results:
        place(hosts, result.host, host_entry(result, to_json))
    return {"hosts": hosts}


def place(hosts: dict[str, Any], host: Host, entry: dict[str, Any]) -> None:
    """Put a result's entry under its host, or one deployment's under
    `<host>.deployments.<name>`; a host is ok when everything under it is."""
    slot = hosts.setdefault(host.name, {})
    ok = slot.get("ok", True) and entry["ok"]
    if host.deployment is None:
        slot.update(entry)  # a host's default run, beside any deployments it has now
    else:
        slot.setdefault("deployments", {})[host.deployment] = entry
    slot["ok"] = ok


def per_host(to_json: Callable[[T], dict[str, Any]]) -> Callable[[FleetResult[T]], Any]:
    """The JSON document of a fleet result whose values turn into dicts with `to_json`."""
    return lambda results: hosts_document(results, to_json)


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print a table of plain strings."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # cells are data, never rich markup
    console().print(table)


def print_command(out: Console, command: str) -> None:
    """Print a shell command byte for byte: rich would expand tabs and turn :name: into emoji."""
    out.file.write(command + "\n")
    out.file.flush()


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


HOSTS: View[dict[str, dict[str, Any]]] = View(_hosts_table, lambda d: {"hosts": d})


GRAPH: View[tuple[list[str], dict[str, GroupNode]]] = View(
    lambda graph: print("\n".join(graph[0])),
    lambda graph: {"groups": {n: dataclasses.asdict(g) for n, g in graph[1].items()}},
)


def _threshold_line(rendered: RenderedCommand) -> str | None:
    """Say how the command gets its --threshold (a shell comment)."""
    if rendered.threshold_mode == "adaptive":
        [(path, text)] = rendered.files.items()
        return (
            f"# --threshold {rendered.threshold}: stock SGLang's adaptive speculation, no patch "
            f"(batches are padded to a CUDA-graph size first); launch writes {path}: "
            f"{text.strip()}"
        )
    if rendered.threshold_mode == "patch":
        return f"# --threshold {rendered.threshold}: the spec-disable patch set's flag"
    return None


def _print_rendered(out: Console, name: str, rendered: RenderedCommand) -> None:
    out.print(f"# {name}", style="bold")
    line = _threshold_line(rendered)
    if line:
        out.print(line, style="dim", markup=False, highlight=False)
    print_command(out, rendered.display_lines)


def _rendered_json(rendered: RenderedCommand) -> dict[str, Any]:
    return {
        "command": rendered.display,
        "env": rendered.env_shown,
        "threshold_mode": rendered.threshold_mode,
        "files": rendered.files,
    }


def _rendered(results: FleetResult[RenderedCommand]) -> None:
    out = console()
    for result in results:
        if result.value is not None:
            _print_rendered(out, result.name, result.value)
    print_host_errors(results)


RENDERED: View[FleetResult[RenderedCommand]] = View(_rendered, per_host(_rendered_json))


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


CHECKED: View[FleetResult[CheckedCommand]] = View(
    _checked,
    per_host(lambda c: {**_rendered_json(c.rendered), "flags": c.flags.to_json()}),
)


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


PORT: View[PortReport] = View(_port, lambda r: r.to_json())


# ---- metrics-targets -----------------------------------------------------------------------


@dataclass(frozen=True)
class TargetsFile:
    """Prometheus file_sd entries, to print or to write to `path`."""

    entries: list[dict[str, Any]]
    path: Path | None = None


def _write_targets(result: TargetsFile) -> None:
    text = json.dumps(result.entries, indent=2) + "\n"
    if result.path is None:
        sys.stdout.write(text)
        return
    # Prometheus rereads the file when it changes: replace it whole, never half-written.
    tmp = result.path.with_name(f".{result.path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, result.path)
    sys.stderr.write(f"{len(result.entries)} targets written to {result.path}\n")


# No --json: file_sd is JSON already, and Prometheus reads a bare list (no `schema` key).
TARGETS: View[TargetsFile] = View(_write_targets, lambda r: r.entries)


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


GPUS: View[FleetResult[GpuReport]] = View(_gpus_table, per_host(lambda r: r.to_json()))


# ---- patches -------------------------------------------------------------------------------


def _patch_list(sets: Sequence[PatchSet]) -> None:
    rows = [
        [s.name, s.version, s.short_hash, ", ".join(sorted(s.variants)), s.description]
        for s in sets
    ]
    print_table(None, ["set", "version", "hash", "SGLang", "description"], rows)


PATCH_LIST: View[Sequence[PatchSet]] = View(
    _patch_list, lambda sets: {"patches": [s.to_json() for s in sets]}
)


def _patch_actions(results: FleetResult[list[PatchAction]]) -> None:
    rows = [
        [r.name, a.set, a.version, a.action, str(len(a.files))]
        for r in results
        for a in r.value or []
    ]
    print_table(None, ["host", "set", "version", "result", "files"], rows)
    print_host_errors(results)


PATCH_ACTIONS: View[FleetResult[list[PatchAction]]] = View(
    _patch_actions, per_host(lambda acts: {"patches": [a.to_json() for a in acts]})
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
                cells.append(f"applied {state.version}")
            elif state.state == "outdated":
                cells.append(f"outdated {state.version} (want {state.expected_version})")
            else:
                cells.append(state.state + (f": {state.detail}" if state.detail else ""))
        rows.append([result.name, result.value.sglang_version or "?", *cells])
    print_table(None, ["host", "SGLang", *names], rows)
    print_host_errors(results)


AUDIT: View[FleetResult[AuditReport]] = View(_audit_table, per_host(lambda r: r.to_json()))


# ---- crash and logs ------------------------------------------------------------------------


def _local_crashes(result: LocalCrashes) -> None:
    if not result.crashes:
        sys.stdout.write("no crash found\n")
    for crash in result.crashes:
        sys.stdout.write("\n".join(_crash_lines(crash)) + "\n")


LOCAL_CRASHES: View[LocalCrashes] = View(
    _local_crashes, lambda r: {"crashes": [c.to_json() for c in r.crashes]}
)


def _crash_scans(results: FleetResult[LogScan]) -> None:
    """Each host's crashes (each once, with its ranks), or what was scanned."""
    for result in results:
        scan = result.value
        if scan is None:
            continue
        label = f"{result.name}: " if len(results) > 1 else ""
        scanned = f"scanned {_size(scan.scanned_bytes)} of {_size(scan.size)}"
        if not scan.crashes:
            sys.stdout.write(f"{label}no crash found in {scan.path} ({scanned})\n")
            continue
        count = len(scan.crashes)
        sys.stdout.write(
            f"{label}{count} crash{'es' if count > 1 else ''} in {scan.path} ({scanned})\n"
        )
        whole = scan.scanned_bytes >= scan.size
        for crash in scan.crashes:
            sys.stdout.write("".join(f"  {line}\n" for line in _crash_lines(crash, whole)))
    sys.stdout.flush()
    print_host_errors(results)


def _crash_scans_document(results: FleetResult[LogScan]) -> dict[str, Any]:
    document = hosts_document(results, lambda scan: scan.to_json())
    for entry in document["hosts"].values():
        # A failed host keeps the shape, so readers need not test for the keys.
        entry.setdefault("log", None)
        entry.setdefault("crashes", [])
    return document


CRASHES: View[CrashSearch] = View(
    lambda r: _crash_scans(r.scans), lambda r: _crash_scans_document(r.scans)
)


def _logs(result: LogsResult) -> None:
    # Lines and errors were streamed as they came; only `--crash` scans are left to show.
    if result.scans is not None:
        _crash_scans(result.scans)


LOGS: View[LogsResult] = View(_logs, lambda _: {})  # `logs` has no --json


class LogPrinter:
    """Write whole log lines to stdout from many threads, flushed, crash lines marked."""

    def __init__(self, prefixed: bool) -> None:
        self.prefixed = prefixed
        self.color = sys.stdout.isatty() and use_color()
        self.lock = threading.Lock()
        self.closed = False

    def line(self, host: str, text: str, crash: bool = False) -> None:
        prefix = f"{host} | " if self.prefixed else ""
        if crash:
            # The mark stays in piped output too, so scripts (and grep) can find crash lines.
            text = f"{_RED}{CRASH_MARK}{text}{_RESET}" if self.color else CRASH_MARK + text
        self._write(prefix + text + "\n")

    def crash(self, host: str, report: CrashReport) -> None:
        prefix = f"{host} | " if self.prefixed else ""
        where = f" at {report.file}:{report.line}" if report.file else ""
        from deployctl.crash.model import format_ranks

        ranks = f" (ranks {format_ranks(report.ranks)})" if report.ranks else ""
        text = f"{prefix}{CRASH_MARK}CRASH: {report.summary()}{where}{ranks}\n"
        text += f"{prefix}{CRASH_MARK}hint: {report.hint}\n"
        self._write(f"{_RED}{text}{_RESET}" if self.color else text)

    def error(self, host: str, exc: BaseException) -> None:
        print_error(*explain(exc), host=host)  # a bug's traceback is kept when `logs` ends

    def notice(self, host: str, text: str) -> None:
        with self.lock:  # on stderr, so piped log lines stay the log's own
            print(f"{host}: {text}", file=sys.stderr, flush=True)

    def _write(self, text: str) -> None:
        with self.lock:
            if self.closed:
                return
            try:
                sys.stdout.write(text)
                sys.stdout.flush()  # the output may be piped: each line must leave at once
            except BrokenPipeError:
                # The reader left (`| head`): stop following, and keep exit from complaining.
                self.closed = True
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())


def _crash_lines(crash: CrashReport, whole_log: bool = True) -> list[str]:
    # Loaded when a crash is shown: the crash package (and yaml) cost ~30 ms to import.
    from deployctl.crash.model import crash_lines

    return crash_lines(crash, whole_log)


def use_color() -> bool:
    """Colour unless the user or the terminal says no (NO_COLOR, TERM=dumb)."""
    return "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _size(n: int) -> str:
    """Return a byte count for people: 512 B, 21.0 KiB, 64.0 MiB, 1.0 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


# ---- launch, stop, status, restart, watch --------------------------------------------------


class Progress:
    """A live line per host on stderr while waiting (only on a terminal)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.lines: dict[str, str] = {}
        self._live: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.live import Live

            self._live = Live(console=console(stderr=True), refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def update(self, host: str, elapsed: float, last_line: str) -> None:
        """Show a host's elapsed wait and the latest log line."""
        if self._live is None:
            return
        from rich.text import Text

        self.lines[host] = f"{host}  {elapsed:6.1f}s  {last_line[-120:]}"
        self._live.update(Text("\n".join(self.lines.values())))

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)


def _launch_document(result: LaunchReport) -> dict[str, Any]:
    outcomes = {r.name: r for r in result.outcomes}
    hosts: dict[str, Any] = {}
    for pre in result.preflights:
        entry = host_entry(pre, lambda p: {"preflight": p.to_json()})
        entry["ok"] = pre.ok
        out = outcomes.get(pre.name)
        if out is not None:
            entry.update(host_entry(out, lambda o: o.to_json()))
            entry["ok"] = out.ok
        place(hosts, pre.host, entry)
    ended = {r.name: r.value["ended"] for r in result.cleanup if r.value is not None}
    document = {"started": result.started, "dry_run": result.dry_run, "hosts": hosts}
    return {**document, "group_failed_ended": ended} if result.cleanup.results else document


def _launch(result: LaunchReport) -> None:
    """Preflight problems (and, for a dry run, the commands), or each host's run."""
    out_console = console()
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
            sys.stderr.write("nothing was started on any host\n")
        return
    for pre in result.preflights:
        _preflight_warnings(pre)
    for out in result.outcomes:
        if out.value is None:
            print_error(out.error or "", out.hint, out.name)
            continue
        outcome = out.value
        run = outcome.run
        state = {
            "ready": f"ready in {outcome.elapsed:.1f}s",
            "started": "started (not waiting)",
            "timeout": f"not ready after {outcome.elapsed:.0f}s; left running",
            "crashed": f"CRASHED after {outcome.elapsed:.1f}s",
            "died": f"DIED after {outcome.elapsed:.1f}s",
            "aborted": f"stopped after {outcome.elapsed:.1f}s: {outcome.note}",
        }[outcome.state]
        out_console.print(f"{out.name}: {run['id']} pid {run['pid']} — {state}", markup=False)
        out_console.print(f"  log: {run['log']}", markup=False)
        for crash in outcome.crashes:
            for line in _crash_lines(crash):
                out_console.print("  " + line, markup=False)
        for trace in outcome.warnings:
            out_console.print(
                f"  warning: a trace in the log, server healthy: {trace.summary()}", markup=False
            )
        if outcome.state == "died" and outcome.last_line:
            out_console.print(f"  last line: {outcome.last_line}", markup=False)
    _cleanup_lines(result)


def _preflight_warnings(pre: HostResult[Preflight]) -> None:
    for warning in pre.value.warnings if pre.value is not None else []:
        sys.stderr.write(tagged("warning", warning, pre.name))


def _cleanup_lines(result: LaunchReport) -> None:
    """Say which nodes of a failed multi-node server were ended, and which could not be."""
    for stop in result.cleanup:
        if stop.value is not None:
            ended = ", ".join(map(str, stop.value["ended"])) or "nothing left running"
            sys.stderr.write(f"{stop.name}: the group failed; ended its run ({ended})\n")
    print_host_errors(result.cleanup)


LAUNCH: View[LaunchReport] = View(_launch, _launch_document)


def _stop_table(results: FleetResult[StopResult]) -> None:
    rows = []
    for r in results:
        if r.value is None:
            continue
        v = r.value
        gpus = {True: "clean", False: "NOT clean", None: "not checked"}[v.gpus_clean]
        ended = ", ".join(map(str, v.ended)) or "-"
        rows.append(
            [r.name, v.run or "-", ended, ", ".join(map(str, v.killed)) or "-", gpus, v.note]
        )
    print_table(None, ["host", "run", "ended pids", "needed SIGKILL", "GPUs", "note"], rows)
    print_host_errors(results)


def print_stopping(targets: Sequence[Host]) -> None:
    """Say which deployments a stop without -d ends on hosts that have several."""
    by_host: dict[str, list[str]] = {}
    for target in targets:
        by_host.setdefault(target.name, []).append(target.deployment or "(default)")
    for host, names in by_host.items():
        if len(names) > 1:
            sys.stderr.write(f"{host}: stopping every deployment: {', '.join(names)}\n")
    sys.stderr.flush()


STOP: View[FleetResult[StopResult]] = View(_stop_table, per_host(lambda r: r.to_json()))


def _status_table(results: FleetResult[RunStatus]) -> None:
    from deployctl.ops.server import units

    groups = {id(u.nodes[0]): u for u in units(results) if len(u.nodes) > 1}
    rows = []
    for r in results:
        unit = groups.get(id(r))
        if unit is not None:  # a multi-node server: one line for the group, then its nodes
            first = unit.nodes[0].value
            run = first.run["id"] if first is not None and first.run else "-"
            rows.append([unit.name, run, "", unit.state, "", "", "", ""])
        if r.value is None:
            continue
        d = r.value.to_json()
        if d["crashed"]:
            state = "crashed"
        elif d["ready"]:
            state = "ready"
        else:
            state = "alive" if d["alive"] else d["status"] or "-"
        uptime = f"{d['uptime_s']}s" if d["uptime_s"] is not None else "-"
        mem = f"{d['gpu_memory_used_mib']} MiB" if d["gpu_memory_used_mib"] is not None else "-"
        warning = f"warning: {d['warning']}" if d["warning"] else ""
        detail = d["crash"] or warning or d["last_line"] or ""
        row = [r.name, d["run"] or "-", str(d["pid"] or "-"), state, uptime, mem, d["log"] or "-"]
        rows.append([*row, detail[:160]])
    columns = ["host", "run", "pid", "state", "uptime", "GPU mem", "log", "crash / last line"]
    print_table(None, columns, rows)
    if any(r.value is not None and r.value.metrics_note is not None for r in results):
        print_table(None, METRIC_COLUMNS, metric_rows(results))
    print_host_errors(results)


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


class TopScreen:
    """`top`'s display: a table redrawn in place (or a JSON document per refresh), and the
    wait between refreshes, which ends the command when q is pressed."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._live: Any = None
        self._saved: Any = None

    def __enter__(self) -> TopScreen:
        if not self.as_json:
            from rich.live import Live

            self._live = Live(console=console(), auto_refresh=False)
            self._live.__enter__()
        if sys.stdin.isatty():
            import termios
            import tty

            self._saved = termios.tcgetattr(sys.stdin)
            tty.setcbreak(sys.stdin)  # one key at a time, no echo
        return self

    def show(self, results: FleetResult[RunStatus]) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps(versioned(_status_document(results)), default=str) + "\n")
            sys.stdout.flush()
            return
        from rich import box
        from rich.table import Table
        from rich.text import Text

        table = Table(
            title=f"deployctl top  {time.strftime('%H:%M:%S')}  (q to quit)",
            box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
        )  # fmt: skip
        for column in METRIC_COLUMNS:
            table.add_column(column, overflow="fold")
        for row in metric_rows(results):
            table.add_row(*(Text(cell) for cell in row))
        self._live.update(table, refresh=True)

    def wait(self, seconds: float) -> None:
        """Sleep until the next refresh; q ends `top` as Ctrl-C does."""
        import select

        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._saved is None:
                time.sleep(left)
                return
            ready, _, _ = select.select([sys.stdin], [], [], left)
            if ready and sys.stdin.read(1) in ("q", "Q"):
                raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            import termios

            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, self._saved)
        if self._live is not None:
            self._live.__exit__(None, None, None)


def _status_document(results: FleetResult[RunStatus]) -> dict[str, Any]:
    """Per host as always; multi-node servers also whole, under `deployments`."""
    from deployctl.ops.server import units

    document = hosts_document(results, lambda r: r.to_json())
    groups = [u for u in units(results) if len(u.nodes) > 1]
    if groups:
        document["deployments"] = {u.nodes[0].host.deployment: u.to_json() for u in groups}
    return document


STATUS: View[FleetResult[RunStatus]] = View(_status_table, _status_document)


def _restart(result: RestartReport) -> None:
    if result.launch is None:
        console().print("nothing to restart", markup=False)
    else:
        _launch(result.launch)
    print_host_errors(result.statuses)


def _restart_document(result: RestartReport) -> dict[str, Any]:
    if result.launch is None:
        statuses = hosts_document(result.statuses, lambda r: r.to_json())["hosts"]
        return {"restarted": [], "hosts": statuses}
    return _launch_document(result.launch)


RESTART: View[RestartReport] = View(_restart, _restart_document)


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
                 "e2e p50/p99 ms"]  # fmt: skip


def _bench(results: FleetResult[BenchResult | None]) -> None:
    for r in results:
        if r.value is None:
            continue
        doc = r.value.document
        params = doc["params"]
        by = ", SGLang's serving benchmark" if params["tool"] == "sglang" else ""
        title = f"{r.name}: {doc['run']} (input {params['input_len']}, output {params['output_len']}{by})"
        print_table(title, LEVEL_COLUMNS, [_level_row(dict(lv)) for lv in r.value.levels])
        sys.stderr.write(f"{r.name}: kept as {r.value.saved}\n")
        for level in r.value.levels:
            for error in level["errors"]:
                print_error(f"concurrency {level['concurrency']}: {error}", host=r.name)
    print_host_errors(results)


def _bench_document(results: FleetResult[BenchResult | None]) -> dict[str, Any]:
    """Per deployment; the nodes of a multi-node server other than rank 0 serve no API."""
    benched = [r for r in results if r.value is not None or r.failed]
    return hosts_document(benched, lambda b: b.to_json() if b is not None else {})


BENCH: View[FleetResult[BenchResult | None]] = View(_bench, _bench_document)


def _comparison(result: Comparison) -> None:
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


COMPARISON: View[Comparison] = View(
    _comparison,
    lambda r: {
        "runs": r.runs,
        "missing": r.missing,
        "errors": {n: explain(e)[0] for n, e in r.failed.items()},
    },
)


def _suggestion(result: Suggestion) -> None:
    rows = [[str(c), f"{b:.1f}", f"{s:.1f}", "yes" if s > b else "no"] for c, b, s in result.rows]
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


SUGGESTION: View[Suggestion] = View(_suggestion, lambda r: r.to_json())


class EventPrinter:
    """`watch` events as timestamped lines; a bug's traceback is kept once per host and kind."""

    def __init__(self) -> None:
        self.kept: set[tuple[str, type[BaseException]]] = set()

    def __call__(self, event: WatchEvent) -> None:
        print_event_text(f"{event.host}: {event.message}")
        exc = event.exception
        if exc is None or isinstance(exc, DeployctlError) or (event.host, type(exc)) in self.kept:
            return
        self.kept.add((event.host, type(exc)))
        print_bug([(event.host, exc)])


def print_event_text(text: str) -> None:
    sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
    sys.stdout.flush()


# `watch`: its events were shown as they happened; it has no --json.
STREAMED: View[Any] = View(lambda _: None, lambda _: {})
