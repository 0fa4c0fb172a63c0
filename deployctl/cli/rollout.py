"""Keep what serves serving: restart, rollout (unit by unit through each router), watch, router sync."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from deployctl.choices import CanaryMetric
from deployctl.cli.options import (
    DrainTimeoutOpt,
    NoWaitOpt,
    StopTimeoutOpt,
    TimeoutOpt,
    duration_of,
)
from deployctl.cli.session import (
    SERVERS,
    Reply,
    Session,
    app,
    event_sink,
    fleet_command,
    router_app,
)
from deployctl.errors import UsageError

if TYPE_CHECKING:
    from deployctl.ops.rollout import RolloutOptions


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
    from deployctl.ops.restart import restart as restart_runs
    from deployctl.present import live, views

    if rolling:
        from deployctl.ops.rollout import RolloutOptions

        if crashed or no_wait:
            raise UsageError("--rolling takes neither --crashed nor --no-wait")
        return roll_out(
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
    return roll_out(session, options, dry_run)


@fleet_command(app, options=SERVERS)
def canary(
    session: Session,
    replicas: Annotated[
        int, typer.Option("--replicas", min=1, help="Replicas that try the new configuration.")
    ] = 1,
    metric: Annotated[
        CanaryMetric, typer.Option("--metric", help="What is compared at matched load.")
    ] = CanaryMetric.ITL,
    max_regression: Annotated[
        float,
        typer.Option(
            "--max-regression", min=0.1, max=100, help="Percent worse that counts as a regression."
        ),
    ] = 5.0,
    confidence: Annotated[
        float,
        typer.Option("--confidence", min=0.5, max=0.999, help="1 - the false-alarm rate."),
    ] = 0.95,
    min_samples: Annotated[
        int, typer.Option("--min-samples", min=2, help="Matched samples before any verdict.")
    ] = 20,
    max_duration: Annotated[
        str,
        typer.Option(
            "--max-duration", help="Judge at most this long (30m, 90s): then inconclusive."
        ),
    ] = "30m",
    interval: Annotated[
        float, typer.Option("--interval", min=0.2, help="Seconds between samples.")
    ] = 2.0,
    no_promote: Annotated[
        bool, typer.Option("--no-promote", help="Judge and report only: never roll the rest out.")
    ] = False,
    restart: Annotated[
        bool, typer.Option("--restart", help="Try the configuration the replicas run already.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the canaries, the control and what changes.")
    ] = False,
    report: Annotated[
        bool,
        typer.Option(
            "--report", help="Show a kept canary of the routers (N, default: the newest)."
        ),
    ] = False,
    number: Annotated[
        int | None, typer.Argument(min=1, metavar="[N]", help="With --report: which canary.")
    ] = None,
    drain_timeout: DrainTimeoutOpt = 60,
    timeout: TimeoutOpt = 900,
    stop_timeout: StopTimeoutOpt = 30,
) -> Reply:
    """Try the inventory's configuration on K replicas behind their router, judge it against
    the others at matched load from their /metrics, then promote it (the rest rolled out) or
    roll it back; Ctrl-C puts the canaries back."""
    from deployctl.ops import plan as ops
    from deployctl.ops.canary import (
        CanaryOptions,
        CanaryReport,
        find_canaries,
        keeping_routers,
        plan_canary,
    )
    from deployctl.ops.canary import canary as run_canary
    from deployctl.ops.rollout import RolloutOptions, plan_rollout
    from deployctl.present import live, views

    if number is not None and not report:
        raise UsageError(f"{number}: a canary number is given only with --report")
    duration = duration_of("--max-duration", max_duration, "30m")
    catalog, patch_sets = session.catalog(), session.patch_sets()
    plans = ops.plan_launch(session.project, session.targets, None, None, [], patch_sets)
    if report:
        with session.fleet() as fleet:
            routers = keeping_routers(fleet, plans, "a canary")
            return views.KEPT_CANARIES, find_canaries(fleet, routers, number)
    options = CanaryOptions(
        replicas, metric.value, max_regression / 100, confidence, min_samples, duration,
        interval, not no_promote,
        RolloutOptions(1, drain_timeout, stop_timeout, timeout, restart, what="canary"),
    )  # fmt: skip
    enabled = not session.options.json
    with session.fleet() as fleet, live.Progress(enabled, steps_when_piped=True) as progress:
        unit_plans = plan_rollout(fleet, plans, catalog, patch_sets, restart)
        split = plan_canary(unit_plans, replicas, restart)
        if dry_run:
            return views.CANARY, CanaryReport(split, dry_run=True)
        return views.CANARY, run_canary(fleet, split, catalog, patch_sets, options, progress)


def roll_out(
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
    pd_window: Annotated[
        float,
        typer.Option(
            "--pd-window",
            min=0,
            help="Seconds after a prefill was seen down during which a decode of its router "
            "failing its health is held, not restarted.",
        ),
    ] = 60,
    stuck_after: Annotated[
        float,
        typer.Option(
            "--stuck-after",
            min=1,
            help="Seconds a decode's requests may wait for KV with no token out before "
            "watch reports a stuck transfer.",
        ),
    ] = 60,
) -> Reply:
    """Supervise runs: restart crashed ones with backoff, stop at a crash loop; Ctrl-C ends
    (--json: one JSON object per line and event)."""
    from deployctl.events import WatchStopped
    from deployctl.ops.rounds import WatchEnded
    from deployctl.ops.watch import watch as watch_runs
    from deployctl.present import live, views

    renew = None if renew_before is None else duration_of("--renew-before", renew_before, "10m")
    catalog, patch_sets = session.catalog(), session.patch_sets()
    sink = event_sink(session) or live.WatchPrinter()
    with session.fleet() as fleet:
        try:
            ended = watch_runs(
                fleet, catalog, patch_sets, interval=interval, max_restarts=max_restarts,
                window=window, timeout=timeout, stop_timeout=stop_timeout, events=sink,
                renew_before=renew, pd_window=pd_window, stuck_after=stuck_after,
            )  # fmt: skip
        except KeyboardInterrupt:
            sink.emit(WatchStopped(target=""))
            ended = WatchEnded()
    return views.STREAMED, ended
