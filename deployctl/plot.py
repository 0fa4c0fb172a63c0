"""Bench curves as a picture: output throughput and inter-token latency against concurrency,
one line per run. Needs matplotlib (the `plot` extra)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deployctl.errors import DeployctlError, UsageError
from deployctl.localfiles import write_file

FORMATS = (".png", ".svg")


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
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: files only
        import matplotlib.pyplot as plt
    except ImportError:
        raise DeployctlError(
            "--plot needs matplotlib", hint="pip install 'deployctl[plot]'"
        ) from None
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run, document in runs.items():
        levels = sorted(document["levels"], key=lambda lv: lv["concurrency"])
        x = [lv["concurrency"] for lv in levels]
        throughput.plot(x, [lv["output_tokens_per_s"] for lv in levels], marker="o", label=run)
        itl = [lv["itl_ms"]["p50"] for lv in levels]
        latency.plot(x, [v if v is not None else float("nan") for v in itl], marker="o", label=run)
    for axes, title in ((throughput, "output tokens/s"), (latency, "inter-token latency p50 (ms)")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrency")
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend()
    figure.tight_layout()
    picture = io.BytesIO()
    figure.savefig(picture, format=path.suffix.lower()[1:])
    plt.close(figure)
    write_file(path, picture.getvalue())
