"""Commands on logs: their tails, followed, and the crashes in them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deployctl.cli.options import RunOpt
from deployctl.cli.session import SERVERS, Reply, Session, app, event_sink, fleet_command

PathOpt = Annotated[str | None, typer.Option("--path", help="A log file on the host.")]


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
    sink = event_sink(session) or live.LogPrinter(prefixed=len(session.targets) > 1)
    with session.fleet() as fleet:
        result = show_logs(fleet, catalog, run, path, lines, follow, crash_only, sink)
    return views.LOGS, result
