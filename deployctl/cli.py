"""The deployctl command line: parse options, run one operation over the fleet, report."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from deployctl import __version__
from deployctl.errors import DeployctlError

if TYPE_CHECKING:  # the real imports are lazy, so `deployctl --help` starts fast
    from deployctl.connection import ConnectOptions
    from deployctl.crash import Catalog
    from deployctl.fanout import Fleet
    from deployctl.inventory import Host
    from deployctl.patchset import PatchSet
    from deployctl.project import Project

app = typer.Typer(
    name="deployctl",
    help="Deploy and operate SGLang inference servers on multi-GPU hosts over SSH.",
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
)

# Options shared by the commands; accepted after the subcommand, where users type them.
InventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "-i",
        "--inventory",
        help="Ansible YAML inventory (default: $DEPLOYCTL_INVENTORY, the project's, or localhost).",
    ),
]
HostsOpt = Annotated[
    str | None, typer.Option("-H", "--hosts", help="Hosts: names, groups, globs, comma lists, all.")
]
ForksOpt = Annotated[
    int, typer.Option("--forks", min=1, max=1024, help="Hosts worked on in parallel.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
AcceptKeysOpt = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys", help="Record unknown SSH host keys (never changed ones)."
    ),
]
KnownHostsOpt = Annotated[
    Path | None,
    typer.Option("--known-hosts", help="known_hosts file (default: ~/.ssh/known_hosts)."),
]
ProjectOpt = Annotated[
    Path | None, typer.Option("--project", help="Project folder (default: found by walking up).")
]
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


@dataclass
class Session:
    """What every command needs: the project, the selected hosts and how to reach them."""

    project: Project
    hosts: list[Host]
    options: ConnectOptions
    forks: int

    def fleet(self) -> Fleet:
        from deployctl.fanout import Fleet

        return Fleet(self.hosts, self.options, self.forks)


def _session(
    inventory: Path | None,
    hosts: str | None,
    forks: int = 16,
    accept_new_host_keys: bool = False,
    known_hosts: Path | None = None,
    project: Path | None = None,
) -> Session:
    from deployctl.connection import ConnectOptions
    from deployctl.inventory import resolve_inventory
    from deployctl.project import find_project

    found = find_project(Path.cwd(), project)
    selected = resolve_inventory(inventory, found.default_inventory()).select(hosts)
    options = ConnectOptions(accept_new_host_keys=accept_new_host_keys, known_hosts=known_hosts)
    return Session(found, selected, options, forks)


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


@app.command()
def hosts(
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    json: JsonOpt = False,
    project: ProjectOpt = None,
) -> int:
    """Show the selected hosts with their connection and merged variables."""
    from deployctl import report

    session = _session(inventory, hosts, project=project)
    described = {h.name: h.describe() for h in session.hosts}
    if json:
        report.print_json({"hosts": described})
    else:
        report.print_table(
            None, ["host", "connection", "address", "user", "vars"], report.hosts_rows(described)
        )
    return 0


@app.command()
def render(
    template: TemplateOpt = None,
    threshold: ThresholdOpt = None,
    set_: SetOpt = None,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    json: JsonOpt = False,
    project: ProjectOpt = None,
) -> int:
    """Print, per host, the exact shell command that `launch` will run."""
    from deployctl import report
    from deployctl.ops.launch import render_commands

    session = _session(inventory, hosts, project=project)
    results = render_commands(
        session.project, session.hosts, template, threshold, set_ or [], _patch_sets(session)
    )
    if json:
        report.print_json(report.hosts_document(results, lambda r: {"command": r.display}))
    else:
        report.print_rendered(results)
    return 1 if report.failed(results) else 0


@app.command()
def gpus(
    max_used_mib: Annotated[
        int, typer.Option("--max-used-mib", min=0, help="Memory a clean GPU may show.")
    ] = 16,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    json: JsonOpt = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Show each host's GPUs and compute processes; exit 1 unless all are clean."""
    from deployctl import report
    from deployctl.ops.gpus import check_gpus

    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    with session.fleet() as fleet:
        results = fleet.run(lambda host, conn: check_gpus(host, conn, max_used_mib))
    if json:
        report.print_json(report.hosts_document(results, lambda r: r.to_json()))
    else:
        report.print_gpus(results)
    return 0 if all(r.ok and r.value is not None and r.value.clean for r in results) else 1


def main() -> None:
    """Run the CLI: one-line errors for user mistakes, never a traceback."""
    from deployctl.report import print_error  # light: the heavy parts of report load lazily

    try:
        result = app(standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except typer.TyperException as exc:  # usage errors: bad option, bad value, unknown command
        print_error(exc.format_message())
        code = 2
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        code = 130
    except typer.Exit as exc:
        code = exc.exit_code
    except DeployctlError as exc:
        print_error(exc.message, exc.hint)
        code = 1
    # Skip the interpreter's final garbage collection of everything paramiko and friends
    # allocated (~250 ms on a small machine): output is flushed and connections are closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


patch_app = typer.Typer(help="SGLang patch sets: list, apply, revert, audit.", no_args_is_help=True)
app.add_typer(patch_app, name="patch")
NamesArg = Annotated[
    list[str] | None, typer.Argument(help="Patch set names (default: each host's `patches`).")
]


def _patch_sets(session: Session) -> dict[str, PatchSet]:
    from deployctl.patchset import load_patch_sets

    return load_patch_sets(session.project.search_dirs("patches"))


@patch_app.command("list")
def patch_list(json: JsonOpt = False, project: ProjectOpt = None) -> int:
    """List the patch sets with version, content hash and supported SGLang versions."""
    from deployctl import report
    from deployctl.patchset import load_patch_sets
    from deployctl.project import find_project

    sets = load_patch_sets(find_project(Path.cwd(), project).search_dirs("patches"))
    if json:
        report.print_json({"patches": [s.to_json() for s in sets.values()]})
    else:
        report.print_patch_list(list(sets.values()))
    return 0


@patch_app.command("apply")
def patch_apply(
    names: NamesArg = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check every hunk; change nothing.")
    ] = False,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    json: JsonOpt = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Apply patch sets: every hunk checked first, backups kept, compiled and verified."""
    from deployctl import report
    from deployctl.ops.patch import apply_patches, sets_per_host

    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    chosen = sets_per_host(session.hosts, _patch_sets(session), names or [])
    with session.fleet() as fleet:
        results = fleet.run(
            lambda host, conn: apply_patches(host, conn, chosen[host.name], dry_run)
        )
    return report.print_patch_actions(results, json)


@patch_app.command("revert")
def patch_revert(
    names: NamesArg = None,
    force: Annotated[
        bool, typer.Option("--force", help="Restore even files that drifted.")
    ] = False,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    json: JsonOpt = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Restore the original SGLang files of patch sets and check their hashes."""
    from deployctl import report
    from deployctl.ops.patch import revert_patches, sets_per_host

    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    chosen = sets_per_host(session.hosts, _patch_sets(session), names or [])
    with session.fleet() as fleet:
        results = fleet.run(lambda host, conn: revert_patches(host, conn, chosen[host.name], force))
    return report.print_patch_actions(results, json)


@patch_app.command("audit")
def patch_audit(
    expect: Annotated[
        list[str] | None, typer.Option("--expect", help="Expected set (repeatable).")
    ] = None,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    json: JsonOpt = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Show which patch set versions each host has; exit 1 unless all expected are applied."""
    from deployctl import report
    from deployctl.ops.patch import audit_host
    from deployctl.patchset import select_sets

    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    available = _patch_sets(session)
    select_sets(available, expect or [])  # unknown names fail before any host is contacted
    with session.fleet() as fleet:
        results = fleet.run(lambda host, conn: audit_host(host, conn, available, expect or []))
    if json:
        report.print_json(report.hosts_document(results, lambda r: r.to_json()))
    else:
        report.print_audit(results)
    return 0 if all(r.value is not None and r.value.good for r in results) else 1


RunOpt = Annotated[
    str | None,
    typer.Option("--run", help="A run id, e.g. eagle3_t5_v3 (default: the current run)."),
]
PathOpt = Annotated[str | None, typer.Option("--path", help="A log file on the host.")]


@app.command()
def crash(
    run: RunOpt = None,
    path: PathOpt = None,
    file: Annotated[Path | None, typer.Option("--file", help="A log file on this machine.")] = None,
    scan_all: Annotated[
        bool, typer.Option("--all", help="Scan the whole log, not only its last 64 MiB.")
    ] = False,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    json: JsonOpt = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Find crash traces in a run's log, a log on a host, or a local file; exit 1 if any."""
    from deployctl import report
    from deployctl.ops.logs import load_user_catalog, scan_local_file, scan_log

    if sum(x is not None for x in (run, path, file)) > 1:
        raise typer.BadParameter("give only one of --run, --path and --file")
    if file is not None:
        crashes = scan_local_file(file, load_user_catalog(project), scan_all)
        report.print_crashes_local(crashes, json)
        return 1 if crashes else 0
    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    catalog = load_user_catalog(project)
    with session.fleet() as fleet:
        results = fleet.run(lambda host, conn: scan_log(host, conn, catalog, run, path, scan_all))
    report.print_crashes(results, json)
    return 1 if report.failed(results) or any(r.value and r.value.crashes for r in results) else 0


@app.command()
def logs(
    run: RunOpt = None,
    path: PathOpt = None,
    lines: Annotated[int, typer.Option("-n", "--lines", min=0, help="Lines from the end.")] = 40,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Stream new lines until Ctrl-C.")
    ] = False,
    crash_only: Annotated[bool, typer.Option("--crash", help="Print only crash reports.")] = False,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Print the tail of each host's log; --follow streams it and marks crash lines."""
    from deployctl.ops.logs import load_user_catalog, show_logs

    if run is not None and path is not None:
        raise typer.BadParameter("give only one of --run and --path")
    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    with session.fleet() as fleet:
        return show_logs(fleet, load_user_catalog(project), run, path, lines, follow, crash_only)


TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1, help="Seconds to wait until ready.")]


def _catalog_and_sets(session: Session) -> tuple[Catalog, dict[str, PatchSet]]:
    from deployctl.ops.logs import load_user_catalog

    return load_user_catalog(session.project.root), _patch_sets(session)


@app.command()
def launch(
    template: TemplateOpt = None,
    threshold: ThresholdOpt = None,
    set_: SetOpt = None,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Return once started.")] = False,
    timeout: TimeoutOpt = 900,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Preflight and show the commands only.")
    ] = False,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    json: JsonOpt = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Preflight every host, start the server detached with a versioned log, wait until ready."""
    from deployctl import report
    from deployctl.ops import launch as ops

    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    catalog, patch_sets = _catalog_and_sets(session)
    plans = ops.plan_launch(
        session.project, session.hosts, template, threshold, set_ or [], patch_sets
    )
    with session.fleet() as fleet, report.Progress(enabled=not json) as progress:
        result = ops.launch(
            fleet,
            plans,
            catalog,
            wait=not no_wait,
            timeout=timeout,
            dry_run=dry_run,
            progress=progress.update,
        )
    return report.print_launch(result, json, dry_run)


@app.command()
def stop(
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Seconds between SIGTERM and SIGKILL.")
    ] = 30,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    json: JsonOpt = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """End each host's run (its whole process group) and wait until the GPUs are clean."""
    from deployctl import report
    from deployctl.ops.server import stop_run

    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    with session.fleet() as fleet:
        results = fleet.run(lambda host, conn: stop_run(host, conn, timeout))
    return report.print_stop(results, json)


@app.command()
def status(
    run: RunOpt = None,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    json: JsonOpt = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Show each host's current run: alive, ready, uptime, log, crash, GPU memory."""
    from deployctl import report
    from deployctl.ops.logs import load_user_catalog
    from deployctl.ops.server import run_status

    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    catalog = load_user_catalog(session.project.root)
    with session.fleet() as fleet:
        results = fleet.run(lambda host, conn: run_status(host, conn, catalog, run))
    return report.print_status(results, json)


@app.command()
def restart(
    crashed: Annotated[
        bool, typer.Option("--crashed", help="Only runs that died or crashed.")
    ] = False,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Return once started.")] = False,
    timeout: TimeoutOpt = 900,
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    json: JsonOpt = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Stop and relaunch each host's recorded run (same command, next log version)."""
    from deployctl import report
    from deployctl.ops.server import restart as restart_runs

    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    catalog, patch_sets = _catalog_and_sets(session)
    with session.fleet() as fleet, report.Progress(enabled=not json) as progress:
        statuses, result = restart_runs(
            fleet,
            catalog,
            patch_sets,
            crashed_only=crashed,
            timeout=timeout,
            wait=not no_wait,
            progress=progress.update,
        )
    return report.print_restart(statuses, result, json)


@app.command()
def watch(
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
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    forks: ForksOpt = 16,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    project: ProjectOpt = None,
) -> int:
    """Supervise runs: restart crashed ones with backoff, stop at a crash loop; Ctrl-C ends."""
    from deployctl import report
    from deployctl.ops.server import watch as watch_runs

    session = _session(inventory, hosts, forks, accept_new_host_keys, known_hosts, project)
    catalog, patch_sets = _catalog_and_sets(session)
    with session.fleet() as fleet:
        try:
            watch_runs(
                fleet, catalog, patch_sets, interval=interval, max_restarts=max_restarts,
                window=window, timeout=timeout, emit=report.print_event,
            )  # fmt: skip
        except KeyboardInterrupt:
            report.print_event_text("watch ended; servers left running")
    return 0
