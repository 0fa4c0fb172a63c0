"""Measure and tune: bench, tune."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from deployctl.choices import BenchTool, Keep, SpeculationPolicy, ThresholdMode, spelled
from deployctl.cli.options import (
    DrainTimeoutOpt,
    StopTimeoutOpt,
    TimeoutOpt,
    complete_templates,
    duration_of,
)
from deployctl.cli.session import SERVERS, Reply, Session, app, fleet_command
from deployctl.errors import UsageError

if TYPE_CHECKING:
    from deployctl.ops.plan import Plan
    from deployctl.ops.tune import TuneOptions
    from deployctl.ops.tune.live import LiveOptions
    from deployctl.remote.measures import TuneRecord

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
    ] = BenchTool.BUILTIN,
    warmup: Annotated[
        bool,
        typer.Option(
            "--warmup",
            help="Before each level, run it once uncounted (one request a stream, then every "
            "smaller batch size) and report how far that cold first sample was off.",
        ),
    ] = False,
    client_processes: Annotated[
        int,
        typer.Option(
            "--client-processes",
            min=0,
            help="Processes the builtin tool spreads each level's streams over; 0: one per 16 "
            "streams, at most half the host's CPUs.",
        ),
    ] = 0,
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
        plan = ops.BenchPlan(
            levels, input_len, output_len, per_stream, timeout, tool, warmup,
            client_processes=client_processes,
        )  # fmt: skip
        with live.Progress(enabled=not session.options.json) as progress:
            results = ops.bench_fleet(fleet, plan, progress)
        if plot is not None:
            swept = {r.name: r.value.document for r in results if r.value is not None}
            plots.plot_runs(swept, plot)
        return views.BENCH, results


class ObjectiveChoice(StrEnum):
    throughput = "throughput"


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
        Keep,
        typer.Option("--keep", help="What serves afterwards: tuned, baseline, or none (as found)."),
    ] = Keep.TUNED,
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
        int,
        typer.Option(
            "--repeats",
            min=1,
            max=9,
            help="Samples of a level inside the noise, or inside its rounds' spread.",
        ),
    ] = 3,
    warmup: Annotated[
        bool,
        typer.Option(
            "--warmup/--no-warmup",
            help="Warm each server up at each level before measuring it (uncounted).",
        ),
    ] = True,
    template: Annotated[
        str | None,
        typer.Option(
            "--template",
            "-t",
            help="Speculative template (default: the deployment's when it speculates, else eagle3).",
            autocompletion=complete_templates,
        ),
    ] = None,
    baseline_template: Annotated[
        str,
        typer.Option(
            "--baseline-template",
            help="Template without speculation.",
            autocompletion=complete_templates,
        ),
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
    live_traffic: Annotated[
        bool,
        typer.Option(
            "--live",
            help="Measure on the traffic two replicas behind one router serve: one with "
            "speculation, one without, compared per load bucket; then roll T out.",
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.2, help="With --live: seconds between samples.")
    ] = 2.0,
    max_duration: Annotated[
        str,
        typer.Option("--max-duration", help="With --live: the window at most (30m, 90s)."),
    ] = "30m",
    confidence: Annotated[
        float,
        typer.Option(
            "--confidence", min=0.5, max=0.999, help="With --live: each bucket's interval."
        ),
    ] = 0.95,
    min_samples: Annotated[
        int,
        typer.Option(
            "--min-samples", min=2, help="With --live: samples of each replica before it ends."
        ),
    ] = 20,
    precision: Annotated[
        int,
        typer.Option(
            "--precision",
            min=0,
            help="With --live: end the window once the crossover lies within this many "
            "CUDA-graph buckets (0: run --max-duration whole).",
        ),
    ] = 1,
    no_promote: Annotated[
        bool,
        typer.Option("--no-promote", help="With --live: report T only; put both replicas back."),
    ] = False,
    policies: Annotated[
        str | None,
        typer.Option(
            "--policies",
            help="With --live: after the crossover, race these on one replica each and keep "
            "the winner: threshold (T), adaptive (SGLang's own), off; e.g. threshold,adaptive,off.",
        ),
    ] = None,
    resume: Annotated[
        int | None,
        typer.Option(
            "--resume",
            min=1,
            help="With --live: start from kept window N's samples (--report lists them); "
            "the new window adds its own.",
        ),
    ] = None,
    race_threshold: Annotated[
        int | None,
        typer.Option(
            "--race-threshold",
            min=1,
            help="With --live --policies: race this T (no crossover window first).",
        ),
    ] = None,
) -> Reply:
    """Find where speculation stops paying, relaunch with that --threshold, check it holds
    at every level, and leave it serving (baseline, speculative, tuned; kept on the host).
    With --live, measure it on the traffic a router's replicas serve."""
    from deployctl.ops import bench as bench_ops
    from deployctl.ops import tune as ops
    from deployctl.present import live, views

    drawing = _drawing(session, plot, html)
    if number is not None and not report:
        raise UsageError(f"{number}: a tune number is given only with --report")
    if report and live_traffic:
        return _live_report(session, number)
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
        keep=keep, min_ratio=min_ratio, noise=noise, repeats=repeats, warmup=warmup,
        threshold_mode=threshold_mode,
        baseline_template=baseline_template, speculative_template=template,
        timeout=timeout, stop_timeout=stop_timeout, drain_timeout=drain_timeout,
        max_visits=max_launches, reconnect_window=reconnect_window,
    )  # fmt: skip
    if not live_traffic and (policies, race_threshold, resume) != (None, None, None):
        raise UsageError("--policies, --race-threshold and --resume are for --live: add it")
    if resume is not None and race_threshold is not None:
        raise UsageError("--resume adds to a crossover window; --race-threshold runs none")
    if live_traffic:
        raced = _policies(policies)
        if race_threshold is not None and not raced:
            raise UsageError(
                "--race-threshold is the T a race uses: give --policies",
                hint="e.g. --policies threshold,adaptive,off",
            )
        if dry_run:
            raise UsageError(
                "--dry-run shows a synthetic tune's plan; a live window has none to show",
                hint="deployctl rollout --dry-run shows what relaunching the replicas changes",
            )
        from deployctl.ops.rollout import RolloutOptions
        from deployctl.ops.tune.live import LiveOptions

        window = LiveOptions(
            interval, duration_of("--max-duration", max_duration, "30m"), confidence,
            min_samples, not no_promote,
            RolloutOptions(1, drain_timeout, stop_timeout, timeout, True, what="tune --live"),
            raced, race_threshold, precision,
        )  # fmt: skip
        return _tune_live(session, options, window, resume)
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
) -> Callable[[TuneRecord | None], None]:
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

    def draw(record: TuneRecord | None) -> None:
        if record is None:
            return
        if plot is not None:
            plots.plot_tune(record, plot)
        if html is not None:
            from deployctl.present.tune_report import write_tune_html

            write_tune_html(record, html)

    return draw


def _policies(text: str | None) -> tuple[SpeculationPolicy, ...]:
    """--policies threshold,adaptive,off: two or more distinct policies, in race order."""
    if text is None:
        return ()
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = next((n for n in names if n not in set(SpeculationPolicy)), None)
    if bad is not None:
        raise UsageError(
            f"--policies: {bad!r} is not a policy", hint=f"each of {spelled(SpeculationPolicy)}"
        )
    if len(names) < 2 or len(set(names)) != len(names):
        raise UsageError(f"--policies {text!r}: a race needs two or more distinct policies")
    return tuple(SpeculationPolicy(n) for n in names)


def _live_report(session: Session, number: int | None) -> Reply:
    """tune --live --report: each selected router's kept window N (the newest), judged
    again from its samples."""
    from deployctl.ops.canary import keeping_routers
    from deployctl.ops.plan import plan_launch
    from deployctl.ops.tune.live import find_live
    from deployctl.present import views

    patch_sets = session.patch_sets()
    plans = plan_launch(session.project, session.targets, None, None, [], patch_sets)
    with session.fleet() as fleet:
        routers = keeping_routers(fleet, plans, "a live window")
        return views.KEPT_LIVE, find_live(fleet, routers, number)


def _tune_live(
    session: Session, options: TuneOptions, window: LiveOptions, resume: int | None
) -> Reply:
    """tune --live: the two replicas' plans (speculation always on, and none), the window,
    the policies raced, then the winner rolled out or every replica touched put back."""
    from deployctl.ops import tune as ops
    from deployctl.ops.rollout import plan_rollout
    from deployctl.ops.tune.live import LivePlan, choose_pair, kept_window, policy_plan, tune_live
    from deployctl.present import live, views

    catalog, patch_sets = session.catalog(), session.patch_sets()
    progress = live.Progress(enabled=not session.options.json, steps_when_piped=True)
    with session.fleet() as fleet, progress:
        router, replicas = choose_pair(session.targets, fleet.select)
        if len(window.policies) > len(replicas):
            raise UsageError(
                f"--policies races each of {len(window.policies)} policies on a replica of its "
                f"own: {len(replicas)} selected",
                hint="select more of the router's replicas, or race fewer policies",
            )
        if resume is not None:
            window.resume = kept_window(fleet, router, resume, replicas[0], replicas[1])
        tunes = {
            t.host.label: t for t in ops.plan_tune(session.project, replicas, patch_sets, options)
        }

        def serving(policy: SpeculationPolicy, threshold: int) -> list[Plan]:
            return [policy_plan(tunes[h.label], policy, threshold) for h in replicas]

        speculative = plain = None
        if window.threshold is None:
            first, second = replicas[0].label, replicas[1].label
            split = plan_rollout(
                fleet,
                [tunes[first].plans[ops.Phase.SPECULATIVE],
                 tunes[second].plans[ops.Phase.BASELINE]],
                catalog, patch_sets, restart=True,
            )  # fmt: skip
            by_host = {u.rank0.label: u for u in split}
            speculative, plain = by_host[first], by_host[second]
        used = max(2, len(window.policies))
        plan = LivePlan(
            router, speculative, plain, serving, [h.label for h in replicas[used:]], replicas
        )
        report = tune_live(fleet, plan, catalog, patch_sets, window, progress)
    return views.TUNE_LIVE, report
