"""Metrics of what serves: Prometheus targets, top."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deployctl.cli.session import SERVERS, Reply, Session, app, fleet_command


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
    from deployctl import agent
    from deployctl.ops.rounds import WatchEnded, metrics_rounds
    from deployctl.present import live, views

    catalog = session.catalog()
    with session.fleet() as fleet:
        if once:
            return views.STATUS, next(metrics_rounds(fleet, catalog, interval, 1))
        with agent.notes_held(), live.TopScreen(session.options.json) as screen:
            try:
                for results in metrics_rounds(fleet, catalog, interval, sleep=screen.wait):
                    screen.show(results)
            except KeyboardInterrupt:  # Ctrl-C, or q
                pass
    return views.STREAMED, WatchEnded()
