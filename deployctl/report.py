"""Human tables and --json documents for per-host results."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from deployctl.fanout import HostResult

if TYPE_CHECKING:
    from rich.console import Console

    from deployctl.ops.gpus import GpuReport
    from deployctl.ops.patch import AuditReport, PatchAction
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
            out.print(result.value.display, markup=False)
    print_host_errors(results)


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
