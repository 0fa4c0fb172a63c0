"""The deployctl command line: parse options, run one operation over the fleet, report.

Each command body builds one result from the library and returns it with the `View` that
shows it; `fleet_command` declares the shared options, hands the body a ready `Session`,
shows the result and turns it into the exit status (`exit_status`, the one place that
decides it). `main` maps exceptions to exit codes.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from deployctl import DEFAULT_FORKS, __version__
from deployctl.errors import DeployctlError, UsageError

if TYPE_CHECKING:  # the real imports are lazy, so `deployctl --help` starts fast
    from deployctl.connection import Connection
    from deployctl.crash import Catalog
    from deployctl.events import EventSink
    from deployctl.fanout import Fleet, FleetResult
    from deployctl.inventory import Host, Inventory
    from deployctl.ops.rollout import RolloutOptions
    from deployctl.patchset import PatchSet
    from deployctl.present.views import View
    from deployctl.project import Project

T = TypeVar("T")

app = typer.Typer(
    name="deployctl",
    help="Deploy and operate SGLang inference servers on multi-GPU hosts over SSH.",
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
)
patch_app = typer.Typer(help="SGLang patch sets: list, apply, revert, audit.", no_args_is_help=True)
app.add_typer(patch_app, name="patch")
router_app = typer.Typer(
    help="SGLang's router: keep its list of workers true.", no_args_is_help=True
)
app.add_typer(router_app, name="router")


# ---- the options every fleet command shares, declared once ---------------------------------


@dataclass(frozen=True)
class SessionOptions:
    """The shared options' values; a command that does not take one gets its default."""

    inventory: tuple[Path, ...] = ()
    vault_password_file: tuple[Path, ...] = ()
    vault_id: tuple[str, ...] = ()
    hosts: str | None = None
    deployment: str | None = None
    project: Path | None = None
    forks: int = DEFAULT_FORKS
    accept_new_host_keys: bool = False
    known_hosts: Path | None = None
    json: bool = False


def _shared(
    name: str, annotation: Any, default: Any, *decls: str, **option: Any
) -> inspect.Parameter:
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[annotation, typer.Option(*decls, **option)],
    )


# Grouped by what a command needs: hosts to select, connections to open, a JSON document.
SHARED_OPTIONS: dict[str, list[inspect.Parameter]] = {
    "select": [
        _shared(
            "inventory", list[Path] | None, None, "-i", "--inventory",
            help="Ansible inventory: YAML, INI, JSON, a folder or a dynamic source; repeat to merge "
            "(default: $DEPLOYCTL_INVENTORY, the project's, or localhost).",
        ),
        _shared(
            "vault_password_file", list[Path] | None, None, "--vault-password-file",
            help="Passed to Ansible to decrypt vaulted inventory values.",
        ),
        _shared(
            "vault_id", list[str] | None, None, "--vault-id",
            help="Passed to Ansible to decrypt vaulted inventory values (ID@SOURCE).",
        ),
        _shared(
            "hosts", str | None, None, "-H", "--hosts",
            help="Hosts: names, groups, globs, comma lists, all.",
        ),
    ],
    "deployment": [
        _shared(
            "deployment", str | None, None, "-d", "--deployment",
            help="One deployment of each host (default: every deployment).",
        ),
    ],
    "connect": [
        _shared(
            "forks", int, DEFAULT_FORKS, "--forks", min=1, max=1024,
            help="Hosts worked on in parallel.",
        ),
        _shared(
            "accept_new_host_keys", bool, False, "--accept-new-host-keys",
            help="Record unknown SSH host keys (never changed ones).",
        ),
        _shared(
            "known_hosts", Path | None, None, "--known-hosts",
            help="known_hosts file (default: ~/.ssh/known_hosts).",
        ),
    ],
    "json": [_shared("json", bool, False, "--json", help="Print one JSON document.")],
    "project": [
        _shared(
            "project", Path | None, None, "--project",
            help="Project folder (default: found by walking up).",
        )
    ],
}  # fmt: skip
FLEET = ("select", "connect", "json", "project")
# Commands on servers: they work per deployment, and -d picks one.
SERVERS = ("select", "deployment", "connect", "json", "project")


class Session:
    """What a command needs: the project, the selected hosts and how to reach them.

    The project and the hosts are found on first use, so a command that needs neither
    (`crash --file`) never reads an inventory.
    """

    def __init__(self, options: SessionOptions, per_deployment: bool = False) -> None:
        self.options = options
        self.per_deployment = per_deployment

    @cached_property
    def project(self) -> Project:
        from deployctl.project import find_project

        return find_project(Path.cwd(), self.options.project)

    @cached_property
    def inventory(self) -> Inventory:
        from deployctl.inventory import VaultOptions, resolve_inventory

        vault = VaultOptions(
            tuple(str(p) for p in self.options.vault_password_file), self.options.vault_id
        )
        inventory = resolve_inventory(
            self.options.inventory, self.project.default_inventory(), vault
        )
        if inventory.warnings:  # stderr, so --json on stdout stays one document
            from deployctl.present.terminal import tagged

            sys.stderr.writelines(tagged("warning", w.text, w.host) for w in inventory.warnings)
        return inventory

    @cached_property
    def hosts(self) -> list[Host]:
        return self.inventory.select(self.options.hosts)

    @cached_property
    def targets(self) -> list[Host]:
        """What the command works on: the hosts, or for server commands their deployments."""
        if not self.per_deployment:
            return self.hosts
        from deployctl.deployments import deployment_targets
        from deployctl.ops.router import check_worker_urls

        targets = deployment_targets(self.hosts, self.options.deployment, self.inventory.select)
        check_worker_urls(self.inventory.select)
        return targets

    @contextmanager
    def fleet(self) -> Iterator[Fleet]:
        """The selected hosts with one connection each, closed at the end."""
        from deployctl.connection import ConnectOptions
        from deployctl.fanout import Fleet

        options = ConnectOptions(
            accept_new_host_keys=self.options.accept_new_host_keys,
            known_hosts=self.options.known_hosts,
        )
        inventory = self.inventory
        with Fleet(
            self.targets, options, self.options.forks, inventory.origin, inventory.select
        ) as fleet:
            yield fleet

    def run(self, operation: Callable[[Host, Connection], T]) -> FleetResult[T]:
        """Run one operation on every target."""
        with self.fleet() as fleet:
            return fleet.run(operation)

    def patch_sets(self) -> dict[str, PatchSet]:
        from deployctl.patchset import load_patch_sets

        return load_patch_sets(self.project.search_dirs("patches"))

    def catalog(self) -> Catalog:
        from deployctl.ops.logs import load_user_catalog

        return load_user_catalog(self.project)


Reply = tuple["View[Any]", Any]


def _event_sink(session: Session) -> EventSink | None:
    """JSON lines for a streaming command given --json; None: the command's own printer."""
    if not session.options.json:
        return None
    from deployctl.present.live import JsonLines

    return JsonLines()


class _CleanedUp(Exception):
    """Ctrl-C ended a command that cleaned up after itself and said so (exit 130)."""


def _option_value(value: Any) -> Any:
    """A repeatable option's values as a tuple (none given: empty), others as they are."""
    if isinstance(value, list):
        return tuple(value)
    return value


def fleet_command(
    group: typer.Typer, name: str | None = None, *, options: tuple[str, ...] = FLEET
) -> Callable[[Callable[..., Reply]], Callable[..., Reply]]:
    """Register `func(session, **own_options) -> (view, result)` with the shared options added."""

    def decorate(func: Callable[..., Reply]) -> Callable[..., Reply]:
        own = list(inspect.signature(func, eval_str=True).parameters.values())[1:]
        shared = [p for group_name in options for p in SHARED_OPTIONS[group_name]]

        def command(**values: Any) -> int:
            given = {p.name: _option_value(values.pop(p.name)) for p in shared}
            chosen = {k: v for k, v in given.items() if v is not None}  # else the default
            session = Session(SessionOptions(**chosen), "deployment" in options)
            try:
                view, result = func(session, **values)
            except Exception as exc:
                if session.options.json:  # a script still reads one document; main says why
                    _print_failure_document(exc)
                raise
            code = finish(view, result, session.options.json)
            if code == 130:
                raise _CleanedUp

            return code

        command.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]
        command.__doc__ = func.__doc__
        group.command(name or func.__name__.replace("_", "-"))(command)
        return func

    return decorate


def _print_failure_document(exc: Exception) -> None:
    from deployctl.present.documents import failure_document
    from deployctl.present.terminal import print_json
    from deployctl.schema import versioned

    if isinstance(exc, typer.TyperException):
        exc = UsageError(exc.format_message())
    print_json(versioned(failure_document(exc)))


def finish(view: View[Any], result: Any, as_json: bool) -> int:
    """Show the result and return the exit status; keep the tracebacks of any bug."""
    from deployctl.present.terminal import print_bug
    from deployctl.present.views import render_result

    bugs = list(_bugs(result))
    render_result(view, result, as_json)
    if bugs:
        print_bug(bugs)
    return exit_status(result, bool(bugs))


def exit_status(result: Any, bug: bool = False) -> int:
    """0 when the result is good, 1 when it is not, 2 when deployctl itself failed, 130 when
    Ctrl-C ended it (and it cleaned up)."""
    if bug:
        return 2
    if getattr(result, "interrupted", False):
        return 130
    # Results that judge themselves say so in `ok`; plain listings (hosts, patch list) are good.
    return 0 if getattr(result, "ok", True) else 1


def _bugs(result: Any) -> Iterator[tuple[str, BaseException]]:
    """(host, exception) for every host that failed by a bug, anywhere in a command's result.

    Failed hosts are kept as `{name: exception}` (FleetResult.failed, LogsResult.failed);
    results that hold others (a launch holds two fleet results) are dataclasses.
    """
    from deployctl.fanout import FleetResult

    if isinstance(result, FleetResult):
        result = result.failed
    if isinstance(result, dict):
        for name, exc in result.items():
            if isinstance(exc, Exception) and not isinstance(exc, DeployctlError):
                yield name, exc
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        for field in dataclasses.fields(result):
            yield from _bugs(getattr(result, field.name))


# ---- commands ------------------------------------------------------------------------------

TemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--template",
        "-t",
        help="Launch template (default: host var, or eagle3 with --threshold, else baseline).",
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
PathOpt = Annotated[str | None, typer.Option("--path", help="A log file on the host.")]


class BenchTool(StrEnum):
    builtin = "builtin"
    sglang = "sglang"


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
        "--stop-timeout", min=0, help="Seconds between SIGTERM and SIGKILL of the old run."
    ),
]
NoWaitOpt = Annotated[bool, typer.Option("--no-wait", help="Return once started.")]
RollingPatchOpt = Annotated[
    bool,
    typer.Option(
        "--rolling",
        help="Change each deployment's host while it is out of its router, one unit at a time, "
        "and relaunch it on the change (as rollout does).",
    ),
]


NamesArg = Annotated[
    list[str] | None, typer.Argument(help="Patch set names (default: each host's `patches`).")
]


def _version(value: bool) -> None:
    if value:
        print(f"deployctl {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """Deploy and operate SGLang inference servers on multi-GPU hosts over SSH."""
    if ctx.invoked_subcommand is None:
        print(ctx.get_help())
        raise typer.Exit(2)


@fleet_command(app, options=("select", "json", "project"))
def hosts(
    session: Session,
    graph: Annotated[
        bool, typer.Option("--graph", help="Show the group tree (of the -H group, else all).")
    ] = False,
) -> Reply:
    """Show the selected hosts with their connection and merged variables."""
    from deployctl.present import views

    if graph:
        top = session.options.hosts or "all"
        return views.GRAPH, (session.inventory.graph(top), session.inventory.subtree(top))
    return views.HOSTS, {h.name: h.describe() for h in session.hosts}


@fleet_command(app, options=SERVERS)
def render(
    session: Session,
    template: TemplateOpt = None,
    threshold: ThresholdOpt = None,
    set_: SetOpt = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Ask each host's SGLang whether it accepts the command (starts nothing).",
        ),
    ] = False,
) -> Reply:
    """Print, per host, the exact shell command that `launch` will run."""
    from deployctl.ops.plan import render_commands
    from deployctl.present import views

    patch_sets = session.patch_sets()
    rendered = render_commands(
        session.project, session.targets, template, threshold, set_ or [], patch_sets
    )
    if not check:
        # A dirty GPU does not matter here: only hosts that failed to render count.
        return views.RENDERED, rendered
    from deployctl.ops.flags import check_commands

    with session.fleet() as fleet:
        return views.CHECKED, check_commands(fleet, rendered, patch_sets)


@fleet_command(app)
def gpus(
    session: Session,
    max_used_mib: Annotated[
        int, typer.Option("--max-used-mib", min=0, help="Memory a clean GPU may show.")
    ] = 16,
) -> Reply:
    """Show each host's GPUs and compute processes; exit 1 unless all are clean."""
    from deployctl.ops.gpus import check_gpus, find_holders
    from deployctl.present import views

    return views.GPUS, session.run(
        lambda host, conn: find_holders(host, conn, check_gpus(host, conn, max_used_mib))
    )


@fleet_command(patch_app, "list", options=("json", "project"))
def patch_list(session: Session) -> Reply:
    """List the patch sets with version, content hash and supported SGLang versions."""
    from deployctl.present import views

    return views.PATCH_LIST, list(session.patch_sets().values())


@fleet_command(patch_app, "apply", options=SERVERS)
def patch_apply(
    session: Session,
    names: NamesArg = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check every hunk; change nothing.")
    ] = False,
    rolling: RollingPatchOpt = False,
) -> Reply:
    """Apply patch sets: every hunk checked first, backups kept, compiled and verified."""
    from deployctl.ops.patch import apply_patches
    from deployctl.present import views

    if rolling:
        return _rolling(session, _rolling_patch(names, "apply"), dry_run, (names or [], True))

    return views.PATCH_ACTIONS, _per_installation(
        session, names, lambda host, conn, sets: apply_patches(host, conn, sets, dry_run)
    )


@fleet_command(patch_app, "revert", options=SERVERS)
def patch_revert(
    session: Session,
    names: NamesArg = None,
    force: Annotated[
        bool, typer.Option("--force", help="Restore even files that drifted.")
    ] = False,
    rolling: RollingPatchOpt = False,
) -> Reply:
    """Restore the original SGLang files of patch sets and check their hashes."""
    from deployctl.ops.patch import revert_patches
    from deployctl.present import views

    if rolling:
        return _rolling(
            session, _rolling_patch(names, "revert", force), False, (names or [], False)
        )

    return views.PATCH_ACTIONS, _per_installation(
        session, names, lambda host, conn, sets: revert_patches(host, conn, sets, force)
    )


def _rolling_patch(names: list[str] | None, verb: str, force: bool = False) -> RolloutOptions:
    """The rollout a `--rolling` patch change is: every unit replaced, through its router."""
    from deployctl.ops.rollout import RolloutOptions

    if not names:
        raise UsageError(
            "--rolling needs the patch sets to change",
            hint="deployctl rollout applies each host's `patches` as they are now",
        )
    if force:
        raise UsageError("--rolling does not take --force")
    return RolloutOptions(restart=True, what=f"patch {verb} --rolling")


def _per_installation(
    session: Session,
    names: list[str] | None,
    action: Callable[[Host, Connection, list[PatchSet]], T],
) -> FleetResult[T]:
    """Run a patch action once per SGLang installation of the targets, with the sets named
    (else each deployment's `patches`)."""
    from deployctl.ops.patch import per_installation, sets_per_host

    wanted = sets_per_host(session.targets, session.patch_sets(), names or [])
    with session.fleet() as fleet:
        return per_installation(fleet, session.targets, wanted, action)


@fleet_command(patch_app, "port")
def patch_port(
    session: Session,
    name: Annotated[str, typer.Argument(help="The patch set to port.")],
    to: Annotated[str, typer.Option("--to", help="The SGLang release to port to, e.g. 0.5.22.")],
    source: Annotated[
        Path | None,
        typer.Option("--from", help="That release's wheel or site-packages (else -H: a host's)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Candidate folder (default: ./<set>-<release>-candidate)."
        ),
    ] = None,
) -> Reply:
    """Port a set to another SGLang release: a candidate variant and a per-hunk report."""
    from deployctl.ops.port import port_from_host, port_set
    from deployctl.patchset import select_sets
    from deployctl.present import views

    [patch_set] = select_sets(session.patch_sets(), [name])[-1:]
    target = out if out is not None else Path.cwd() / f"{name}-{to}-candidate"
    if source is not None:
        return views.PORT, port_set(patch_set, to, source, target)
    if session.options.hosts is None or len(session.hosts) != 1:
        raise UsageError(
            "patch port needs --from WHEEL|SITE, or -H naming one host that has the release",
        )
    [host] = session.hosts
    with session.fleet() as fleet:
        result = fleet.run(lambda h, conn: port_from_host(h, conn, patch_set, to, target), [host])
    if result[0].exception is not None:
        raise result[0].exception
    assert result[0].value is not None
    return views.PORT, result[0].value


@fleet_command(patch_app, "audit", options=SERVERS)
def patch_audit(
    session: Session,
    expect: Annotated[
        list[str] | None, typer.Option("--expect", help="Expected set (repeatable).")
    ] = None,
) -> Reply:
    """Show which patch set versions each host has; exit 1 unless all expected are applied."""
    from deployctl.ops.patch import audit_host
    from deployctl.patchset import select_sets
    from deployctl.present import views

    available = session.patch_sets()
    select_sets(available, expect or [])  # unknown names fail before any host is contacted
    results = session.run(lambda host, conn: audit_host(host, conn, available, expect or []))
    return views.AUDIT, results


@fleet_command(app, options=SERVERS)
def crash(
    session: Session,
    run: RunOpt = None,
    path: PathOpt = None,
    file: Annotated[Path | None, typer.Option("--file", help="A log file on this machine.")] = None,
    scan_all: Annotated[
        bool, typer.Option("--all", help="Scan the whole log, not only its last 64 MiB.")
    ] = False,
) -> Reply:
    """Find crash traces in a run's log, a log on a host, or a local file; exit 1 if any."""
    from deployctl.ops.logs import CrashSearch, LocalCrashes, scan_local_file, scan_log
    from deployctl.present import views

    if sum(x is not None for x in (run, path, file)) > 1:
        raise typer.BadParameter("give only one of --run, --path and --file")
    catalog = session.catalog()
    if file is not None:
        return views.LOCAL_CRASHES, LocalCrashes(scan_local_file(file, catalog, scan_all))
    scans = session.run(lambda host, conn: scan_log(host, conn, catalog, run, path, scan_all))
    return views.CRASHES, CrashSearch(scans)


@fleet_command(app, options=SERVERS)
def logs(
    session: Session,
    run: RunOpt = None,
    path: PathOpt = None,
    lines: Annotated[int, typer.Option("-n", "--lines", min=0, help="Lines from the end.")] = 40,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Stream new lines until Ctrl-C.")
    ] = False,
    crash_only: Annotated[bool, typer.Option("--crash", help="Print only crash reports.")] = False,
) -> Reply:
    """Print the tail of each host's log; --follow streams it and marks crash lines
    (--json: one JSON object per line and event)."""
    from deployctl.ops.logs import show_logs
    from deployctl.present import live, views

    if run is not None and path is not None:
        raise typer.BadParameter("give only one of --run and --path")
    catalog = session.catalog()
    sink = _event_sink(session) or live.LogPrinter(prefixed=len(session.targets) > 1)
    with session.fleet() as fleet:
        result = show_logs(fleet, catalog, run, path, lines, follow, crash_only, sink)
    return views.LOGS, result


@fleet_command(app, options=SERVERS)
def launch(
    session: Session,
    template: TemplateOpt = None,
    threshold: ThresholdOpt = None,
    set_: SetOpt = None,
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = 900,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Preflight and show the commands only.")
    ] = False,
    replace: Annotated[
        bool,
        typer.Option("--replace", help="Stop a host's running server first (else: refused)."),
    ] = False,
) -> Reply:
    """Preflight every host, start the server detached with a versioned log, wait until ready."""
    from deployctl.ops import plan as ops
    from deployctl.ops.runs import launch as launch_runs
    from deployctl.ops.runs import stop_live_runs
    from deployctl.present import live, views

    catalog, patch_sets = session.catalog(), session.patch_sets()
    plans = ops.plan_launch(
        session.project, session.targets, template, threshold, set_ or [], patch_sets
    )
    with session.fleet() as fleet, live.Progress(enabled=not session.options.json) as progress:
        if replace and not dry_run:
            # A stop that fails leaves its run alive, and the preflight then refuses that host.
            stop_live_runs(fleet, [p.host for p in plans])
        result = launch_runs(
            fleet,
            plans,
            catalog,
            wait=not no_wait,
            timeout=timeout,
            dry_run=dry_run,
            events=progress,
        )
    return views.LAUNCH, result


@fleet_command(app, options=SERVERS)
def stop(
    session: Session,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Seconds between SIGTERM and SIGKILL.")
    ] = 30,
    orphans: Annotated[
        bool,
        typer.Option(
            "--orphans",
            help="Also end runs on these hosts that the inventory does not name, whoever "
            "launched them (listed first).",
        ),
    ] = False,
) -> Reply:
    """End each deployment's run (its whole process group); wait until its GPUs are clean.

    Without -d it also ends this inventory's own leftovers (a run it launched that it no
    longer names); runs another inventory launched are listed and left alone (--orphans)."""
    from deployctl.ops.runs import stop_serving
    from deployctl.ops.server import stray_runs
    from deployctl.present import views

    with session.fleet() as fleet:
        targets = fleet.hosts
        if session.options.deployment is None:
            strays = stray_runs(fleet)
            views.print_strays(strays, ending_others=orphans)
            targets = [*targets, *(s.host for s in strays if s.ours or orphans)]
            views.print_stopping(targets)
        return views.STOP, fleet.run(
            lambda host, conn: stop_serving(fleet, host, conn, timeout), targets
        )


@fleet_command(app, options=SERVERS)
def status(
    session: Session,
    run: RunOpt = None,
    metrics: Annotated[
        bool, typer.Option("--metrics", help="Also read each server's /metrics.")
    ] = False,
) -> Reply:
    """Show each host's current run: alive, ready, uptime, log, crash, GPU memory."""
    from deployctl.ops.runs import run_status, with_router_states
    from deployctl.present import views

    catalog = session.catalog()
    with session.fleet() as fleet:
        results = fleet.run(lambda host, conn: run_status(host, conn, catalog, run, metrics))
        return views.STATUS, with_router_states(fleet, results)


@fleet_command(router_app, "sync", options=SERVERS)
def router_sync(
    session: Session,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be added and removed only.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Also remove listed URLs whose worker's host cannot be read, and URLs no "
            "worker of this inventory has.",
        ),
    ] = False,
) -> Reply:
    """Mend each selected router's list: add the workers of ours that serve and are missing,
    remove what it lists where a worker of ours is known not to serve."""
    from deployctl.ops.plan import routers_among
    from deployctl.ops.router import sync_router
    from deployctl.present import views

    routers = routers_among(session.project, session.targets)
    with session.fleet() as fleet:
        synced = fleet.run(lambda host, conn: sync_router(fleet, host, dry_run, force), routers)
    return views.ROUTER_SYNC, synced


# The load of one level, as bench and tune take it.
ConcurrencyOpt = Annotated[
    str, typer.Option("--concurrency", help="Load levels: concurrent streams, e.g. 1,4,16,64.")
]
InputLenOpt = Annotated[int, typer.Option("--input-len", min=1, help="Prompt words.")]
OutputLenOpt = Annotated[
    int, typer.Option("--output-len", min=1, help="Output tokens (EOS ignored).")
]
PerStreamOpt = Annotated[
    int, typer.Option("--requests-per-stream", min=1, help="Requests per level per stream.")
]


@fleet_command(app, options=SERVERS)
def bench(
    session: Session,
    concurrency: ConcurrencyOpt = "1,4,16,64",
    input_len: InputLenOpt = 512,
    output_len: OutputLenOpt = 128,
    per_stream: PerStreamOpt = 4,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds per level.")] = 900,
    tool: Annotated[
        BenchTool,
        typer.Option(
            "--tool",
            help="Load generator: builtin (standard library only) or sglang (SGLang's own "
            "serving benchmark on the host: numbers comparable with upstream reports).",
        ),
    ] = BenchTool.builtin,
    compare: Annotated[
        list[str] | None,
        typer.Option("--compare", help="Show kept results of these runs side by side."),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Also draw tok/s and ITL against concurrency (.png, .svg)."),
    ] = None,
    suggest: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--suggest-threshold", help="BASELINE_RUN SPEC_RUN: the --threshold their numbers give."
        ),
    ] = None,
) -> Reply:
    """Load-test each deployment from its own host (results kept on the host), or compare
    kept results, or suggest a --threshold from a baseline and a speculative run."""
    from deployctl import plot as plots
    from deployctl.ops import bench as ops
    from deployctl.present import live, views

    if plot is not None:
        plots.check_plot_path(plot)
    runs = [r.strip() for item in compare or [] for r in item.split(",") if r.strip()]
    if compare is not None and not runs:
        raise UsageError(
            f"--compare {','.join(compare)!r} names no run",
            hint="give run ids, e.g. --compare RUN1,RUN2 (deployctl status shows them)",
        )
    with session.fleet() as fleet:
        if suggest is not None:
            found = ops.find_results(fleet, list(suggest))
            return views.SUGGESTION, ops.suggest_threshold(found, *suggest)
        if runs:
            comparison = ops.find_results(fleet, runs)
            if plot is not None and comparison.runs:
                plots.plot_runs(comparison.runs, plot)
            return views.COMPARISON, comparison
        levels = ops.parse_levels(concurrency)
        plan = ops.BenchPlan(levels, input_len, output_len, per_stream, timeout, tool.value)
        with live.Progress(enabled=not session.options.json) as progress:
            results = ops.bench_fleet(fleet, plan, progress)
        if plot is not None:
            swept = {r.name: r.value.document for r in results if r.value is not None}
            plots.plot_runs(swept, plot)
        return views.BENCH, results


class ThresholdMode(StrEnum):
    patch = "patch"
    adaptive = "adaptive"


class ObjectiveChoice(StrEnum):
    throughput = "throughput"


class KeepChoice(StrEnum):
    tuned = "tuned"
    baseline = "baseline"
    none = "none"


@fleet_command(app, options=SERVERS)
def tune(
    session: Session,
    concurrency: ConcurrencyOpt = "1,4,16,64",
    input_len: InputLenOpt = 512,
    output_len: OutputLenOpt = 128,
    per_stream: PerStreamOpt = 4,
    threshold_mode: Annotated[
        ThresholdMode | None,
        typer.Option("--threshold-mode", help="How T reaches SGLang (default: the host's)."),
    ] = None,
    objective: Annotated[
        ObjectiveChoice | None,
        typer.Option(
            "--objective", help="throughput (the default): the higher output tok/s is better."
        ),
    ] = None,
    max_itl_ms: Annotated[
        float | None,
        typer.Option(
            "--max-itl-ms", min=0.001, help="Better: within this per-token latency (p50)."
        ),
    ] = None,
    max_ttft_ms: Annotated[
        float | None,
        typer.Option("--max-ttft-ms", min=0.001, help="Better: within this TTFT (p50)."),
    ] = None,
    keep: Annotated[
        KeepChoice,
        typer.Option("--keep", help="What serves afterwards: tuned, baseline, or none (as found)."),
    ] = KeepChoice.tuned,
    min_ratio: Annotated[
        float,
        typer.Option(
            "--min-ratio",
            min=0.0,
            max=1.0,
            help="The tuned run must reach this share of the better curve at every level.",
        ),
    ] = 0.95,
    noise: Annotated[
        float,
        typer.Option(
            "--noise",
            min=0.0,
            max=1.0,
            help="Throughputs closer than this fraction are measured again (--repeats).",
        ),
    ] = 0.03,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, max=9, help="Samples of a level inside the noise.")
    ] = 3,
    template: Annotated[
        str | None,
        typer.Option(
            "--template",
            "-t",
            help="Speculative template (default: the deployment's when it speculates, else eagle3).",
        ),
    ] = None,
    baseline_template: Annotated[
        str, typer.Option("--baseline-template", help="Template without speculation.")
    ] = "baseline",
    timeout: TimeoutOpt = 900,
    level_timeout: Annotated[
        float, typer.Option("--level-timeout", min=1, help="Seconds per level.")
    ] = 900,
    stop_timeout: StopTimeoutOpt = 30,
    drain_timeout: DrainTimeoutOpt = 60,
    max_launches: Annotated[
        int,
        typer.Option(
            "--max-launches", min=2, help="Launches the crossover search may take at most."
        ),
    ] = 12,
    reconnect_window: Annotated[
        float,
        typer.Option(
            "--reconnect-window",
            min=0,
            help="Seconds a host that stopped answering is tried again before tune gives up.",
        ),
    ] = 31,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan and an estimate; start nothing.")
    ] = False,
    report: Annotated[
        bool, typer.Option("--report", help="Show a kept tune (N, default: the newest).")
    ] = False,
    number: Annotated[
        int | None, typer.Argument(min=1, metavar="[N]", help="With --report: which tune.")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Also draw the curves, T and the crossover (.png, .svg)."),
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write a self-contained HTML report.")
    ] = None,
) -> Reply:
    """Find where speculation stops paying, relaunch with that --threshold, check it holds
    at every level, and leave it serving (baseline, speculative, tuned; kept on the host)."""
    from deployctl.ops import bench as bench_ops
    from deployctl.ops import tune as ops
    from deployctl.present import live, views

    drawing = _drawing(session, plot, html)
    if number is not None and not report:
        raise UsageError(f"{number}: a tune number is given only with --report")
    if report:
        with session.fleet() as fleet:
            found = ops.find_tunes(fleet, number)
        drawing(next((r.value.record for r in found if r.value and r.value.record), None))
        return views.KEPT_TUNES, found
    if max_itl_ms is not None and max_ttft_ms is not None:
        raise UsageError("give one of --max-itl-ms and --max-ttft-ms")
    if objective is not None and (max_itl_ms is not None or max_ttft_ms is not None):
        raise UsageError("--objective throughput and a latency bound are two objectives: give one")
    goal = ops.Objective()
    if max_itl_ms is not None:
        goal = ops.Objective("max_itl_ms", max_itl_ms)
    elif max_ttft_ms is not None:
        goal = ops.Objective("max_ttft_ms", max_ttft_ms)
    options = ops.TuneOptions(
        levels=bench_ops.parse_levels(concurrency), input_len=input_len, output_len=output_len,
        per_stream=per_stream, level_timeout=level_timeout, objective=goal,
        keep=ops.Keep(keep.value), min_ratio=min_ratio, noise=noise, repeats=repeats,
        threshold_mode=threshold_mode.value if threshold_mode else None,
        baseline_template=baseline_template, speculative_template=template,
        timeout=timeout, stop_timeout=stop_timeout, drain_timeout=drain_timeout,
        max_visits=max_launches, reconnect_window=reconnect_window,
    )  # fmt: skip
    plans = ops.plan_tune(session.project, session.targets, session.patch_sets(), options)
    if dry_run:
        return views.TUNE_PLAN, plans
    progress = live.Progress(enabled=not session.options.json, steps_when_piped=True)
    with session.fleet() as fleet, progress:
        results = ops.tune_fleet(fleet, plans, session.catalog(), progress)
    drawing(next((ops.tune_record(r.value) for r in results.results if r.value), None))
    return views.TUNE, results


def _drawing(
    session: Session, plot: Path | None, html: Path | None
) -> Callable[[dict[str, Any] | None], None]:
    """Check --plot and --html before any host is touched; return what draws a record."""
    from deployctl import plot as plots

    if plot is not None:
        plots.check_plot_path(plot)
    if html is not None:
        from deployctl.localfiles import check_folder

        check_folder(html)
    if (plot or html) and len(session.targets) != 1:
        raise UsageError(
            "--plot and --html draw one tune", hint="select one deployment with -H (and -d)"
        )

    def draw(record: dict[str, Any] | None) -> None:
        if record is None:
            return
        if plot is not None:
            plots.plot_tune(record, plot)
        if html is not None:
            from deployctl.present.tune_report import write_tune_html

            write_tune_html(record, html)

    return draw


@fleet_command(app, "metrics-targets", options=("select", "deployment", "project"))
def metrics_targets(
    session: Session,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (default: print).")
    ] = None,
) -> Reply:
    """Prometheus file_sd JSON for every deployment's /metrics (labels: host, deployment,
    group, template)."""
    from deployctl.deployments import loopback_bound, prometheus_targets
    from deployctl.present import views

    groups = {g: n for g, n in session.inventory.groups.items() if g not in ("all", "ungrouped")}
    entries = prometheus_targets(session.targets, groups)
    loopback = tuple(loopback_bound(session.targets))
    return views.TARGETS, views.TargetsFile(entries, output, loopback)


@fleet_command(app, options=SERVERS)
def top(
    session: Session,
    interval: Annotated[
        float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")
    ] = 2,
    once: Annotated[bool, typer.Option("--once", help="Show one refresh and exit.")] = False,
) -> Reply:
    """Live metrics of every deployment: requests, tok/s, KV usage, latencies; q or Ctrl-C ends."""
    from deployctl.ops.server import WatchEnded, metrics_rounds
    from deployctl.present import live, views

    catalog = session.catalog()
    with session.fleet() as fleet:
        if once:
            return views.STATUS, next(metrics_rounds(fleet, catalog, interval, 1))
        with live.TopScreen(session.options.json) as screen:
            try:
                for results in metrics_rounds(fleet, catalog, interval, sleep=screen.wait):
                    screen.show(results)
            except KeyboardInterrupt:  # Ctrl-C, or q
                pass
    return views.STREAMED, WatchEnded()


@fleet_command(app, options=SERVERS)
def dashboard(
    session: Session,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="HTTP port.")] = 8470,
    bind: Annotated[
        str, typer.Option("--bind", help="Address to serve on; any but loopback needs a token.")
    ] = "127.0.0.1",
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help="A private file holding the token every request needs."),
    ] = None,
    new_token: Annotated[
        Path | None,
        typer.Option(
            "--new-token", help="Write a fresh token to this new file (mode 600) and exit."
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.5, help="Seconds between refreshes of each host.")
    ] = 2,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="A name the page may be opened by besides the address and localhost (repeatable).",
        ),
    ] = None,
) -> Reply:
    """Serve the fleet as a live web page: deployments, health, metrics, crashes, patch
    drift, bench and tune curves (read-only; needs `pip install 'deployctl[dashboard]'`)."""
    from deployctl.dashboard import access
    from deployctl.present import views

    if new_token is not None:
        access.new_token(new_token)
        return (
            views.NOTE,
            f"wrote a new token to {new_token} (mode 600): use --token-file {new_token}",
        )
    token = None if token_file is None else access.read_token(token_file)
    access.check_bind(bind, token)
    try:
        from deployctl.dashboard.server import build_app, listen, serve
    except ImportError as exc:
        raise UsageError(
            f"the dashboard needs its web server ({exc.name} is not installed)",
            hint="pip install 'deployctl[dashboard]'",
        ) from None
    from deployctl.dashboard.collector import Collector
    from deployctl.ops.server import WatchEnded

    groups = {g: n for g, n in session.inventory.groups.items() if g not in ("all", "ungrouped")}
    sock = listen(bind, port)  # a taken port is refused before anything starts
    with sock, session.fleet() as fleet:
        collector = Collector(fleet, session.catalog(), session.patch_sets(), interval, groups)
        collector.start()
        address = bind.strip("[]")
        shown = f"[{address}]" if ":" in address else address
        where = f"http://{shown}:{port}/" + ("?token=…" if token else "")
        sys.stderr.write(f"dashboard on {where} (Ctrl-C ends)\n")
        try:
            serve(build_app(collector, token, bind, allow_host or ()), sock, collector)
        except KeyboardInterrupt:  # uvicorn raises the Ctrl-C it caught once it has closed
            pass
        finally:
            collector.stop(timeout=2)  # a round in flight is abandoned: nothing to undo
    return views.STREAMED, WatchEnded()


@fleet_command(app, options=SERVERS)
def restart(
    session: Session,
    crashed: Annotated[
        bool, typer.Option("--crashed", help="Only runs that died or crashed.")
    ] = False,
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = 900,
    stop_timeout: StopTimeoutOpt = 30,
    rolling: Annotated[
        bool,
        typer.Option(
            "--rolling",
            help="One unit at a time through its router, as the inventory says now "
            "(rollout --restart).",
        ),
    ] = False,
) -> Reply:
    """Stop and relaunch each host's recorded run (same command, next log version)."""
    from deployctl.ops.server import restart as restart_runs
    from deployctl.present import live, views

    if rolling:
        from deployctl.ops.rollout import RolloutOptions

        if crashed or no_wait:
            raise UsageError("--rolling takes neither --crashed nor --no-wait")
        return _rolling(
            session,
            RolloutOptions(
                stop_timeout=stop_timeout, timeout=timeout, restart=True, what="restart --rolling"
            ),
            False,
        )

    catalog, patch_sets = session.catalog(), session.patch_sets()
    with session.fleet() as fleet, live.Progress(enabled=not session.options.json) as progress:
        result = restart_runs(
            fleet,
            catalog,
            patch_sets,
            crashed_only=crashed,
            timeout=timeout,
            stop_timeout=stop_timeout,
            wait=not no_wait,
            events=progress,
        )
    return views.RESTART, result


@fleet_command(app, options=SERVERS)
def rollout(
    session: Session,
    max_unavailable: Annotated[
        int, typer.Option("--max-unavailable", min=1, help="Units replaced at once.")
    ] = 1,
    drain_timeout: DrainTimeoutOpt = 60,
    restart: Annotated[
        bool, typer.Option("--restart", help="Replace units that already match too.")
    ] = False,
    allow_downtime: Annotated[
        bool,
        typer.Option("--allow-downtime", help="Take out a router's last healthy worker too."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show each unit, whether and how it changes.")
    ] = False,
    timeout: TimeoutOpt = 900,
    stop_timeout: StopTimeoutOpt = 30,
) -> Reply:
    """Bring each deployment to what the inventory says now, one unit at a time: out of its
    router, drained, stopped, patched, relaunched, back in; a failed unit goes back to its
    previous configuration and stops the rollout."""
    from deployctl.ops.rollout import RolloutOptions

    options = RolloutOptions(
        max_unavailable, drain_timeout, stop_timeout, timeout, restart, allow_downtime
    )
    return _rolling(session, options, dry_run)


def _rolling(
    session: Session,
    options: RolloutOptions,
    dry_run: bool,
    forced: tuple[list[str], bool] | None = None,
) -> Reply:
    """rollout, restart --rolling and patch apply|revert --rolling: plan every unit, then
    replace them unit by unit. `forced`: the patch sets every unit applies (or reverts)."""
    from deployctl.ops import plan as ops
    from deployctl.ops.rollout import PatchChange, RolloutReport, plan_rollout, rollout
    from deployctl.patchset import select_sets
    from deployctl.present import live, views

    catalog, patch_sets = session.catalog(), session.patch_sets()
    change = None
    if forced is not None:
        names, apply = forced
        sets = select_sets(patch_sets, names)
        change = PatchChange(apply=sets) if apply else PatchChange(revert=sets)
    plans = ops.plan_launch(session.project, session.targets, None, None, [], patch_sets)
    enabled = not session.options.json
    with session.fleet() as fleet, live.Progress(enabled, steps_when_piped=True) as progress:
        unit_plans = plan_rollout(fleet, plans, catalog, patch_sets, options.restart, change)
        if dry_run:
            return views.ROLLOUT, RolloutReport([], unit_plans, dry_run=True)
        return views.ROLLOUT, rollout(fleet, unit_plans, catalog, patch_sets, options, progress)


@fleet_command(app, options=SERVERS)
def watch(
    session: Session,
    interval: Annotated[
        float, typer.Option("--interval", min=0.2, help="Seconds between checks.")
    ] = 10,
    max_restarts: Annotated[
        int, typer.Option("--max-restarts", min=0, help="Restarts allowed within the window.")
    ] = 3,
    window: Annotated[
        float, typer.Option("--window", min=1, help="Crash-loop window in seconds.")
    ] = 600,
    timeout: TimeoutOpt = 900,
    stop_timeout: StopTimeoutOpt = 30,
    renew_before: Annotated[
        str | None,
        typer.Option(
            "--renew-before",
            help="Renew a Slurm job this long before its time limit (10m, 90s): its "
            "successor is swapped in at its router.",
        ),
    ] = None,
) -> Reply:
    """Supervise runs: restart crashed ones with backoff, stop at a crash loop; Ctrl-C ends
    (--json: one JSON object per line and event)."""
    from deployctl.events import WatchStopped
    from deployctl.ops.server import WatchEnded
    from deployctl.ops.server import watch as watch_runs
    from deployctl.present import live, views
    from deployctl.text import parse_duration

    renew = None if renew_before is None else parse_duration(renew_before)
    if renew_before is not None and not renew:
        raise UsageError(
            f"--renew-before {renew_before!r} is not a time", hint="e.g. --renew-before 10m"
        )
    catalog, patch_sets = session.catalog(), session.patch_sets()
    sink = _event_sink(session) or live.WatchPrinter()
    with session.fleet() as fleet:
        try:
            ended = watch_runs(
                fleet, catalog, patch_sets, interval=interval, max_restarts=max_restarts,
                window=window, timeout=timeout, stop_timeout=stop_timeout, events=sink,
                renew_before=renew,
            )  # fmt: skip
        except KeyboardInterrupt:
            sink.emit(WatchStopped(target=""))
            ended = WatchEnded()
    return views.STREAMED, ended


# ---- entry point ---------------------------------------------------------------------------


def raise_open_files_limit() -> None:
    """Lift the soft limit on open files to the hard one: a fleet command keeps about one
    descriptor per host open until it ends, plus a few per fork (measured: 296 at 256 hosts
    with the default --forks), so the usual 1,024 would fail a fleet of a thousand hosts."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 16 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main() -> None:
    """Run the CLI: one-line errors for user mistakes, a debug file for bugs, never a traceback."""
    raise_open_files_limit()
    code = run()
    # Skip the interpreter's final garbage collection of everything paramiko and friends
    # allocated (~250 ms on a small machine): output is flushed and connections are closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command line (default: this process's) and return its exit status."""
    try:
        result = app(args=None if argv is None else list(argv), standalone_mode=False)
        code = result if isinstance(result, int) else 0
        if code == 130:  # typer's answer when Ctrl-C ended the command
            _interrupted()
    except typer.TyperException as exc:  # usage errors: bad option, bad value, unknown command
        _print_error(exc.format_message())
        code = 2
    except (typer.Abort, KeyboardInterrupt):
        code = _interrupted()
    except _CleanedUp:
        code = 130
    except typer.Exit as exc:
        code = exc.exit_code
    except DeployctlError as exc:
        _print_error(exc.message, exc.hint)
        code = 1
    except Exception as exc:  # a bug: one line for the user, the traceback kept in a file
        from deployctl.errors import explain
        from deployctl.present.terminal import print_bug

        print_bug([(None, exc)], explain(exc)[0])
        code = 2
    return code


def _interrupted() -> int:
    sys.stderr.write(
        "interrupted: what was already started on hosts keeps running (deployctl status shows it)\n"
    )
    return 130


def _print_error(message: str, hint: str | None = None) -> None:
    from deployctl.present.terminal import print_error  # loaded only when an error is printed

    print_error(message, hint)
