"""Options that commands of several families take, each declared once."""

from __future__ import annotations

from typing import Annotated

import typer

from deployctl.errors import UsageError

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
