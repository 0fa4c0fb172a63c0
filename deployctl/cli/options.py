"""Options that commands of several families take, each declared once, and the completers of
their values in the shell: host patterns, deployments, templates, patch sets.

Completers read files only: the inventory the command line selects (`-i` already typed,
else $DEPLOYCTL_INVENTORY, else the project's default, as `Session` does) as static YAML,
INI or JSON, or folders of them. A script or plugin config is never run (it adds no names)
and nothing is decrypted; no host is reached. A completer that fails answers no names:
an error never reaches the user's shell. Each imports what it reads when called, so
`deployctl --help` imports none of it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from deployctl.errors import UsageError

if TYPE_CHECKING:
    from deployctl.inventory_sources import InventoryData

# ---- completion of values --------------------------------------------------------------------

# What a completer answers: (value, help) pairs; typer keeps those starting with the word.
Candidates = list[tuple[str, str]]
Completer = Callable[[typer.Context, str], Candidates]
# The variable that holds a host's deployments, in either spelling (settings.PREFIX).
_DEPLOYMENTS = ("deployments", "deployctl_deployments")


def _quiet(completer: Completer) -> Completer:
    """No names, never a traceback, when a completer fails (a broken inventory, a bug)."""

    @functools.wraps(completer)
    def complete(ctx: typer.Context, incomplete: str) -> Candidates:
        import warnings

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return completer(ctx, incomplete)
        except Exception:
            return []

    return complete


def _project_root(ctx: typer.Context) -> Path | None:
    from deployctl.project import project_root

    given = ctx.params.get("project")  # as typed: resilient parsing converts no value
    return project_root(Path.cwd(), None if given is None else Path(given))


def _search_dirs(ctx: typer.Context, part: str) -> list[Path]:
    from deployctl.project import Project

    return Project(_project_root(ctx)).search_dirs(part)


def _inventory_paths(ctx: typer.Context) -> list[Path] | None:
    """The inventory sources the command would read; None: the built-in localhost."""
    from deployctl.project import Project

    given = ctx.params.get("inventory")
    if given:
        return [Path(p) for p in given]
    env = os.environ.get("DEPLOYCTL_INVENTORY")
    if env:
        return [Path(p) for p in env.split(",") if p]
    default = Project(_project_root(ctx)).default_inventory()
    return None if default is None else [default]


def _inventory(ctx: typer.Context) -> InventoryData | None:
    """The selected inventory's groups and hosts as its files declare them (None: the
    built-in one); scripts and plugin configs are skipped, not run."""
    from deployctl.inventory_sources import VaultOptions, read_sources

    paths = _inventory_paths(ctx)
    return None if paths is None else read_sources(paths, VaultOptions(), dynamic=False)


def _last_term(incomplete: str) -> tuple[str, str, set[str]]:
    """Split a comma list being typed: what stays (`web,!`), the term being completed and
    the terms given already."""
    head, comma, last = incomplete.rpartition(",")
    term = last.lstrip("!&")
    given = {t.strip().lstrip("!&") for t in head.split(",")} if comma else set()
    return head + comma + last[: len(last) - len(term)], term, given


@_quiet
def complete_hosts(ctx: typer.Context, incomplete: str) -> Candidates:
    """-H: the inventory's groups and hosts; in a comma list, the term after the last comma."""
    data = _inventory(ctx)
    if data is None:
        groups, hosts = ["all", "ungrouped"], ["localhost"]
    elif not data.host_vars:  # a script's or plugin's hosts are not known until it runs
        return []
    else:
        groups, hosts = list(data.groups), list(data.host_vars)
    prefix, term, given = _last_term(incomplete)
    named = {h: "host" for h in hosts} | {g: "group" for g in groups}
    return [
        (prefix + n, what) for n, what in named.items() if n.startswith(term) and n not in given
    ]


@_quiet
def complete_deployments(ctx: typer.Context, incomplete: str) -> Candidates:
    """-d: the names in any host's or group's `deployments`, inline or in a plain
    group_vars/ or host_vars/ file."""
    from deployctl.inventory_sources import VarsFolder

    data = _inventory(ctx)
    if data is None:
        return []
    layers: list[Any] = [g.vars for g in data.groups.values()]
    layers += data.host_vars.values()
    for folder in data.vars_dirs:
        for kind, names in (("group_vars", data.groups), ("host_vars", data.host_vars)):
            found = VarsFolder(folder / kind)
            layers += (v for name in names for v in found.plain(name))
    return [(n, "deployment") for n in _deployment_names(layers)]


def _deployment_names(layers: Iterable[Any]) -> list[str]:
    names: dict[str, None] = {}
    for layer in layers:
        if not isinstance(layer, dict):
            continue
        for key in _DEPLOYMENTS:
            table = layer.get(key)
            if isinstance(table, dict):
                names.update((n, None) for n in table if isinstance(n, str))
    return list(names)


@_quiet
def complete_ssh_names(ctx: typer.Context, incomplete: str) -> Candidates:
    """The host names ~/.ssh/config gives (`Host` lines; patterns such as `*` left out)."""
    text = (Path.home() / ".ssh" / "config").read_text(encoding="utf-8", errors="replace")
    names: dict[str, None] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) > 1 and words[0].lower() == "host":
            names.update((w, None) for w in words[1:] if not set(w) & set("*?!"))
    return [(name, "in ~/.ssh/config") for name in names]


@_quiet
def complete_templates(ctx: typer.Context, incomplete: str) -> Candidates:
    """--template: the project's templates, then the shipped ones."""
    from deployctl.project import template_names

    return [(n, "template") for n in template_names(_search_dirs(ctx, "templates"))]


@_quiet
def complete_patch_sets(ctx: typer.Context, incomplete: str) -> Candidates:
    """A patch set argument or option: the project's sets, then the shipped ones."""
    from deployctl.project import patch_set_folders

    return [(n, "patch set") for n in patch_set_folders(_search_dirs(ctx, "patches"))]


# ---- options --------------------------------------------------------------------------------

TemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--template",
        "-t",
        help="Launch template (default: host var, or eagle3 with --threshold, else baseline).",
        autocompletion=complete_templates,
    ),
]
ThresholdOpt = Annotated[
    int | None,
    typer.Option(
        "--threshold", min=1, help="Turn speculation off while the batch is larger than N."
    ),
]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="Override a variable: KEY=VALUE (repeatable).")
]
RunOpt = Annotated[
    str | None,
    typer.Option("--run", help="A run id, e.g. eagle3_t5_v3 (default: the current run)."),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1, help="Seconds to wait until ready.")]
DrainTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--drain-timeout",
        min=0,
        help="Seconds a worker taken out of its router has to finish its requests.",
    ),
]
StopTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--stop-timeout",
        min=0,
        help="Seconds the old run has to drain after SIGTERM to its main process; then its "
        "whole group gets SIGTERM, and SIGKILL up to 10 s later.",
    ),
]
NoWaitOpt = Annotated[bool, typer.Option("--no-wait", help="Return once started.")]


def duration_of(flag: str, text: str, example: str) -> float:
    """A duration option's seconds (`10m`, `90s`); a one-line error when it is none."""
    from deployctl.text import parse_duration

    seconds = parse_duration(text)
    if not seconds:
        raise UsageError(f"{flag} {text!r} is not a time", hint=f"e.g. {flag} {example}")
    return seconds
