"""Bench curves as a picture: output throughput and time per output token against concurrency,
one line per run or per tune phase. Needs matplotlib (the `plot` extra)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployctl.errors import DeployctlError, UsageError
from deployctl.localfiles import write_file
from deployctl.remote.measures import BenchLevel

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from deployctl.remote.measures import TuneRecord

FORMATS = (".png", ".svg")
TUNE_PHASES = ("baseline", "speculative", "tuned")
# No date and no URLs: the same record draws the same file, and an inlined SVG names nothing
# outside the page.
_SVG_METADATA = {"Creator": None, "Date": None, "Format": None, "Type": None}
_PHASE_STYLE: dict[str, dict[str, Any]] = {
    "baseline": {"color": "tab:blue"},
    "speculative": {"color": "tab:orange"},
    "tuned": {"color": "black", "linewidth": 2.5, "marker": "s", "zorder": 3},
}

# A line: its legend label, its bench levels and how it is drawn (matplotlib line keywords).
Curve = tuple[str, Sequence[BenchLevel], Mapping[str, Any]]


def check_plot_path(path: Path) -> None:
    """Refuse a bad --plot before any host is touched."""
    if path.suffix.lower() not in FORMATS:
        raise UsageError(f"--plot {str(path)!r} must end in .png or .svg")
    if not path.parent.is_dir():
        raise UsageError(f"--plot: folder {str(path.parent)!r} does not exist")
    if path.is_dir():
        raise UsageError(f"--plot {str(path)!r} is a folder; give a file name")


def plot_runs(runs: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """Draw each run's kept sweep (its `levels`) into `path`, replacing it whole."""
    curves: list[Curve] = [(run, document["levels"], {}) for run, document in runs.items()]
    write_file(path, _draw(curves, _format(path)))


def plot_tune(record: TuneRecord, path: Path) -> None:
    """Draw a tune record's phases, T and crossover into `path`, replacing it whole."""
    write_file(path, _draw_tune(record, _format(path)))


def tune_svg(record: TuneRecord) -> str:
    """Return the figure `plot_tune` draws, as SVG text."""
    return _draw_tune(record, "svg").decode("utf-8")


def tune_title(record: TuneRecord) -> str:
    """Return `tune N · host / deployment`, the name of a tune record's figure and page."""
    where = record["host"]
    if record["deployment"] is not None:
        where += f" / {record['deployment']}"
    return f"tune {record['tune']} · {where}"


def crossover_ends(record: TuneRecord) -> tuple[int | None, int | None]:
    """The crossover's last win and first loss (both None when nothing was compared)."""
    crossover = record.get("crossover")
    return (crossover["last_win"], crossover["first_loss"]) if crossover else (None, None)


def _format(path: Path) -> str:
    return path.suffix.lower()[1:]


def _draw_tune(record: TuneRecord, fmt: str) -> bytes:
    phases = record["phases"]
    curves: list[Curve] = []
    for phase in TUNE_PHASES:
        if phase in phases:
            label = phase if phases[phase]["state"] != "crashed" else f"{phase} (crashed)"
            curves.append((label, phases[phase]["levels"], _PHASE_STYLE[phase]))
    title = tune_title(record)
    if record["outcome"] != "tuned":
        title += f" — {record['outcome']}"

    def mark(axes: Axes) -> None:
        last_win, first_loss = crossover_ends(record)
        if last_win is not None and first_loss is not None:
            label = f"crossover {last_win}–{first_loss}"
            axes.axvspan(last_win, first_loss, color="tab:green", alpha=0.15, label=label)
        elif last_win is not None:
            axes.axvline(last_win, color="tab:green", linestyle="--", label=f"last win {last_win}")
        elif first_loss is not None:
            label = f"first loss {first_loss}"
            axes.axvline(first_loss, color="tab:red", linestyle="--", label=label)
        threshold = record["threshold"]
        if threshold is not None:
            axes.axvline(threshold, color="black", linestyle=":", label=f"T = {threshold}")

    return _draw(curves, fmt, title=title, mark=mark)


def _draw(
    curves: Iterable[Curve],
    fmt: str,
    title: str | None = None,
    mark: Callable[[Axes], None] | None = None,
) -> bytes:
    """Draw two panels (output tok/s, ITL p50) against concurrency, one line per curve;
    `mark` adds its markers to each panel."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: files only
        import matplotlib.pyplot as plt
    except ImportError:
        raise DeployctlError(
            "drawing curves (--plot, --html) needs matplotlib",
            hint="pip install 'deployctl[plot]'",
        ) from None
    from deployctl.ops.bench import per_token_ms

    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, levels, style in curves:
        ordered = sorted(levels, key=lambda lv: lv["concurrency"])
        x = [lv["concurrency"] for lv in ordered]
        tokens = [lv["output_tokens_per_s"] for lv in ordered]
        itl = [per_token_ms(lv) for lv in ordered]
        line = {"marker": "o", **style, "label": label}
        throughput.plot(x, [_nan_for_none(v) for v in tokens], **line)
        latency.plot(x, [_nan_for_none(v) for v in itl], **line)
    for axes, name in ((throughput, "output tokens/s"), (latency, LATENCY_TITLE)):
        if mark is not None:
            mark(axes)
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter("{x:g}")  # 8, not 2³: concurrency as bench takes it
        axes.set_xlabel("concurrency")
        axes.set_title(name)
        axes.grid(True, alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend()
    if title is not None:
        figure.suptitle(title, parse_math=False)  # a `$` in a name is not mathtext
    figure.tight_layout()
    picture = io.BytesIO()
    figure.savefig(picture, format=fmt, metadata=_SVG_METADATA if fmt == "svg" else None)
    plt.close(figure)
    return picture.getvalue()


# Per token, not per streamed chunk: a speculative server streams several tokens a chunk.
LATENCY_TITLE = "time per output token p50 (ms)"


def _nan_for_none(value: float | None) -> float:
    return float("nan") if value is None else value
