"""Human tables and --json documents for per-host results."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from rich.console import Console

    from deployctl.fanout import HostResult
    from deployctl.ops.gpus import GpuReport
    from deployctl.ops.launch import LaunchReport
    from deployctl.ops.patch import AuditReport, PatchAction
    from deployctl.ops.server import RunStatus, StopResult, WatchEvent
    from deployctl.patchset import PatchSet
    from deployctl.render import RenderedCommand

T = TypeVar("T")


def console(stderr: bool = False) -> Console:
    """Return a rich console; wide when not a terminal so lines are not wrapped."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(file=stream, width=width, highlight=False, soft_wrap=not stream.isatty())


def print_json(document: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def print_error(message: str, hint: str | None = None) -> None:
    """Print `error: …` and `hint: …` on stderr, one line each."""
    sys.stderr.write(f"error: {_one_line(message)}\n")
    if hint:
        sys.stderr.write(f"hint: {_one_line(hint)}\n")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def hosts_document(
    results: Iterable[HostResult[T]], to_json: Callable[[T], dict[str, Any]]
) -> dict[str, Any]:
    """Return {"hosts": {name: {"ok", "error", **fields}}} for per-host results."""
    hosts: dict[str, Any] = {}
    for result in results:
        entry: dict[str, Any] = {"ok": result.ok, "error": result.error}
        if result.hint:
            entry["hint"] = result.hint
        if result.value is not None:
            entry.update(to_json(result.value))
        hosts[result.name] = entry
    return {"hosts": hosts}


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print a table of plain strings."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    console().print(table)


def print_host_errors(results: Iterable[HostResult[Any]]) -> None:
    """Print each failed host's error (and hint) on stderr."""
    for result in results:
        if not result.ok:
            sys.stderr.write(f"{result.name}: error: {_one_line(result.error or '')}\n")
            if result.hint:
                sys.stderr.write(f"{result.name}: hint: {_one_line(result.hint)}\n")


def failed(results: Iterable[HostResult[Any]]) -> bool:
    """Tell whether any host failed."""
    return any(not r.ok for r in results)


def hosts_rows(described: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Rows for `deployctl hosts`: connection facts and deployctl's own variables."""
    rows = []
    for name, info in described.items():
        port = f":{info['port']}" if info["port"] else ""
        own = {k: v for k, v in info["vars"].items() if not k.startswith("ansible_")}
        shown = " ".join(f"{k}={v}" for k, v in own.items())
        rows.append(
            [name, info["connection"], f"{info['address']}{port}", info["user"] or "", shown]
        )
    return rows


def print_rendered(results: Sequence[HostResult[RenderedCommand]]) -> None:
    """Print each host's rendered command (secrets masked), or its error."""
    out = console()
    for result in results:
        if result.value is not None:
            out.print(f"# {result.name}", style="bold")
            print_command(out, result.value.display)
    print_host_errors(results)


def print_command(out: Console, command: str) -> None:
    """Print a shell command byte for byte: rich would expand tabs and turn :name: into emoji."""
    out.file.write(command + "\n")
    out.file.flush()


def print_gpus(results: Sequence[HostResult[GpuReport]]) -> None:
    """Print one row per GPU and a verdict per host."""
    rows = []
    for result in results:
        gpu_report = result.value
        if gpu_report is None:
            rows.append([result.name, "-", "", "", "", "error: " + _one_line(result.error or "")])
            continue
        by_gpu: dict[str, list[str]] = {}
        for proc in gpu_report.processes:
            by_gpu.setdefault(proc.gpu_uuid, []).append(
                f"{proc.pid} {proc.name} {proc.used_memory_mib or '?'} MiB"
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


def print_patch_list(sets: Sequence[PatchSet]) -> None:
    rows = [
        [s.name, s.version, s.short_hash, ", ".join(sorted(s.variants)), s.description]
        for s in sets
    ]
    print_table(None, ["set", "version", "hash", "SGLang", "description"], rows)


def print_patch_actions(results: Sequence[HostResult[list[PatchAction]]], as_json: bool) -> int:
    """Print what apply/revert did per host; return the exit code."""
    if as_json:
        print_json(hosts_document(results, lambda acts: {"patches": [a.to_json() for a in acts]}))
    else:
        rows = [
            [r.name, a.set, a.version, a.action, str(len(a.files))]
            for r in results
            for a in (r.value or [])
        ]
        print_table(None, ["host", "set", "version", "result", "files"], rows)
        print_host_errors(results)
    return 1 if failed(results) else 0


def print_audit(results: Sequence[HostResult[AuditReport]]) -> None:
    """Print a hosts × sets matrix with each host's SGLang version."""
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


def print_launch(result: LaunchReport, as_json: bool, dry_run: bool) -> int:
    """Print preflight problems, or each host's run and how it came up; return the exit code."""
    preflights = {r.name: r for r in result.preflights}
    outcomes = {r.name: r for r in result.outcomes}
    if as_json:
        hosts: dict[str, Any] = {}
        for name, pre in preflights.items():
            entry: dict[str, Any] = {
                "ok": pre.ok and bool(pre.value and pre.value.ok),
                "error": pre.error,
            }
            if pre.value is not None:
                entry["preflight"] = pre.value.to_json()
            out = outcomes.get(name)
            if out is not None:
                entry["ok"] = out.ok and bool(out.value and out.value.ok)
                entry["error"] = out.error
                if out.value is not None:
                    entry.update(out.value.to_json())
            hosts[name] = entry
        print_json({"started": bool(result.outcomes), "dry_run": dry_run, "hosts": hosts})
        return (
            0
            if (dry_run and not result.refused and not failed(result.preflights)) or result.ok
            else 1
        )
    out_console = console()
    if result.refused or dry_run:
        for name, pre in preflights.items():
            if pre.value is None:
                sys.stderr.write(f"{name}: error: {_one_line(pre.error or '')}\n")
                continue
            if dry_run:
                out_console.print(f"# {name} → {pre.value.next_log}", style="bold")
                print_command(out_console, pre.value.plan.rendered.display)
            for problem in pre.value.problems:
                sys.stderr.write(f"{name}: error: {_one_line(problem)}\n")
            for hint in pre.value.hints:
                sys.stderr.write(f"{name}: hint: {_one_line(hint)}\n")
        if result.refused:
            sys.stderr.write("nothing was started on any host\n")
            return 1
        return 0
    for name, out in outcomes.items():
        if out.value is None:
            sys.stderr.write(f"{name}: error: {_one_line(out.error or '')}\n")
            continue
        outcome = out.value
        run = outcome.run
        state = {
            "ready": f"ready in {outcome.elapsed:.1f}s",
            "started": "started (not waiting)",
            "timeout": f"not ready after {outcome.elapsed:.0f}s; left running",
            "crashed": f"CRASHED after {outcome.elapsed:.1f}s",
            "died": f"DIED after {outcome.elapsed:.1f}s",
        }[outcome.state]
        out_console.print(f"{name}: {run['id']} pid {run['pid']} — {state}", markup=False)
        out_console.print(f"  log: {run['log']}", markup=False)
        for crash in outcome.crashes:
            for line in crash_lines(crash):
                out_console.print("  " + line, markup=False)
        if outcome.state == "died" and outcome.last_line:
            out_console.print(f"  last line: {outcome.last_line}", markup=False)
    return 0 if result.ok else 1


def print_stop(results: Sequence[HostResult[StopResult]], as_json: bool) -> int:
    if as_json:
        print_json(hosts_document(results, lambda r: r.to_json()))
    else:
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
    bad = failed(results) or any(r.value and r.value.gpus_clean is False for r in results)
    return 1 if bad else 0


def print_status(results: Sequence[HostResult[RunStatus]], as_json: bool) -> int:
    if as_json:
        print_json(hosts_document(results, lambda r: r.to_json()))
    else:
        rows = []
        for r in results:
            if r.value is None:
                continue
            d = r.value.to_json()
            state = (
                "crashed"
                if d["crashed"]
                else "ready"
                if d["ready"]
                else "alive"
                if d["alive"]
                else d["status"] or "-"
            )
            uptime = f"{d['uptime_s']}s" if d["uptime_s"] is not None else "-"
            mem = f"{d['gpu_memory_used_mib']} MiB" if d["gpu_memory_used_mib"] is not None else "-"
            detail = d["crash"] or d["last_line"] or ""
            rows.append(
                [
                    r.name,
                    d["run"] or "-",
                    str(d["pid"] or "-"),
                    state,
                    uptime,
                    mem,
                    d["log"] or "-",
                    detail[:160],
                ]
            )
        print_table(
            None,
            ["host", "run", "pid", "state", "uptime", "GPU mem", "log", "crash / last line"],
            rows,
        )
        print_host_errors(results)
    bad = failed(results) or any(r.value and r.value.crashed for r in results)
    return 1 if bad else 0


def print_restart(
    statuses: Sequence[HostResult[RunStatus]], result: LaunchReport | None, as_json: bool
) -> int:
    if result is None:
        if as_json:
            print_json(
                {"restarted": [], "hosts": hosts_document(statuses, lambda r: r.to_json())["hosts"]}
            )
        else:
            console().print("nothing to restart", markup=False)
            print_host_errors(statuses)
        return 1 if failed(statuses) else 0
    code = print_launch(result, as_json, dry_run=False)
    if not as_json:
        print_host_errors(statuses)
    return 1 if code or failed(statuses) else 0


def print_event(event: WatchEvent) -> None:
    print_event_text(f"{event.host}: {event.message}")


def print_event_text(text: str) -> None:
    sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
    sys.stdout.flush()


# ---- crash reports (deployctl crash, deployctl logs --crash) ------------------------------

if TYPE_CHECKING:
    from deployctl.crash import CrashReport
    from deployctl.ops.logs import LogScan

_MESSAGE_CAP = 500


def print_crashes_local(crashes: Sequence[CrashReport], as_json: bool) -> None:
    """Print the crashes found in a local log file, or say that there are none."""
    if as_json:
        print_json({"crashes": [c.to_json() for c in crashes]})
        return
    if not crashes:
        sys.stdout.write("no crash found\n")
    for crash in crashes:
        sys.stdout.write("\n".join(crash_lines(crash)) + "\n")


def print_crashes(results: Sequence[HostResult[LogScan]], as_json: bool) -> None:
    """Print each host's crashes (each once, with its ranks), or what was scanned."""
    if as_json:
        document = hosts_document(results, lambda scan: scan.to_json())
        for entry in document["hosts"].values():
            # A failed host keeps the shape, so readers need not test for the keys.
            entry.setdefault("log", None)
            entry.setdefault("crashes", [])
        print_json(document)
        return
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
            lines = crash_lines(crash, whole)
            sys.stdout.write("".join(f"  {line}\n" for line in lines))
    sys.stdout.flush()
    print_host_errors(results)


def crash_lines(crash: CrashReport, whole_log: bool = True) -> list[str]:
    """Return the human lines for one crash: title, exception, frame, ranks, hint."""
    lines = [f"crash: {crash.title} [{crash.signature}]"]
    message = _one_line(crash.message)
    if len(message) > _MESSAGE_CAP:
        message = message[: _MESSAGE_CAP - 1] + "…"
    lines.append(f"  {crash.exception}: {message}" if crash.exception else f"  {message}")
    if crash.file:
        where = f"{crash.file}:{crash.line}" if crash.line is not None else crash.file
        lines.append(f"  at {where}" + (f" in {crash.function}" if crash.function else ""))
    if crash.ranks:
        lines.append(f"  ranks: {format_ranks(crash.ranks)}")
    # A partial scan starts mid-log, so its line numbers count from where it started.
    lines.append(
        f"  log line {crash.log_line}"
        if whole_log
        else f"  line {crash.log_line} of the scanned tail"
    )
    lines.append(f"  hint: {_one_line(crash.hint)}")
    return lines


def format_ranks(ranks: Sequence[str]) -> str:
    """Return ranks compactly: `TP0-TP7 (8)` for a run of one kind, else a list."""
    kinds = {r.rstrip("0123456789") for r in ranks}
    digits = [r[len(r.rstrip("0123456789")) :] for r in ranks]
    if len(ranks) > 2 and len(kinds) == 1 and all(d.isdigit() for d in digits):
        numbers = [int(d) for d in digits]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{ranks[0]}-{ranks[-1]} ({len(ranks)})"
    return ", ".join(ranks) + (f" ({len(ranks)})" if len(ranks) > 1 else "")


def _size(n: int) -> str:
    """Return a byte count for people: 512 B, 21.0 KiB, 64.0 MiB, 1.0 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
