"""A run's life cycle: launch, stop, status."""

from __future__ import annotations

from typing import Annotated

import typer

from deployctl.cli.options import NoWaitOpt, RunOpt, SetOpt, TemplateOpt, ThresholdOpt, TimeoutOpt
from deployctl.cli.session import SERVERS, Reply, Session, app, fleet_command


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
        typer.Option(
            "--replace",
            help="Stop a host's running server first (else: refused); a plan its host "
            "refuses stops nothing.",
        ),
    ] = False,
) -> Reply:
    """Preflight every host, start the server detached with a versioned log, wait until ready."""
    from deployctl.ops import plan as ops
    from deployctl.ops import runs
    from deployctl.present import live, views

    catalog, patch_sets = session.catalog(), session.patch_sets()
    plans = ops.plan_launch(
        session.project, session.targets, template, threshold, set_ or [], patch_sets
    )
    # --replace is runs.replace's stop-then-start, checked before anything stops.
    start = runs.launch_replacing if replace else runs.launch
    with session.fleet() as fleet, live.Progress(enabled=not session.options.json) as progress:
        result = start(
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
        float,
        typer.Option(
            "--timeout",
            min=0,
            help="Seconds the server has to drain after SIGTERM to its main process (what it "
            "runs finishes); then its whole group gets SIGTERM, and SIGKILL up to 10 s later.",
        ),
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
    """End each deployment's run: SIGTERM to its main process (SGLang drains: its requests
    finish, then it ends its children), its whole group at --timeout; wait until its GPUs
    are clean.

    Without -d it also ends this inventory's own leftovers (a run it launched that it no
    longer names); runs another inventory launched are listed and left alone (--orphans)."""
    from deployctl.ops.runs import stop_in_rank_order, stop_serving
    from deployctl.ops.strays import stray_runs
    from deployctl.present import views

    with session.fleet() as fleet:
        targets = fleet.hosts
        if session.options.deployment is None:
            strays = stray_runs(fleet)
            views.print_strays(strays, ending_others=orphans)
            targets = [*targets, *(s.host for s in strays if s.ours or orphans)]
            views.print_stopping(targets)
        return views.STOP, stop_in_rank_order(
            fleet,
            targets,
            lambda host, conn, let_drain: stop_serving(
                fleet, host, conn, timeout, let_drain=let_drain
            ),
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
