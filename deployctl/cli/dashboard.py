"""`deployctl dashboard`: the fleet as a live web page."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from deployctl.cli.session import SERVERS, Reply, Session, app, fleet_command
from deployctl.errors import UsageError


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
    from deployctl.ops.rounds import WatchEnded

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
