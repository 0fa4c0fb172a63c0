"""A tune record as a page: one self-contained HTML file (inline CSS and SVG, nothing fetched)
to attach to a ticket, and the gain table's rows that the terminal view shares."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployctl.localfiles import write_file
from deployctl.plot import TUNE_PHASES, crossover_ends, tune_svg, tune_title
from deployctl.present.terminal import duration_text

if TYPE_CHECKING:
    from deployctl.remote.measures import CrashRecord, ObjectiveShown, TuneRecord

_NONE = "—"

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 2em auto; max-width: 72em;
       padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: .3em; }
h2 { font-size: 1.15em; margin-top: 1.6em; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: .15em 1.2em; }
dl.facts dt { color: #666; }
dl.facts dd { margin: 0; }
code, pre { font-family: ui-monospace, monospace; background: #f4f4f4; padding: .1em .3em; }
pre { padding: .6em; white-space: pre-wrap; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
table { border-collapse: collapse; }
th, td { padding: .25em .8em; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f4f4f4; }
tr.refined td:first-child { font-weight: bold; }
.tag { font-size: .8em; color: #555; border: 1px solid #aaa; border-radius: 3px;
       padding: 0 .3em; margin-left: .4em; font-weight: normal; }
td.below { color: #b00020; font-weight: bold; }
.outcome-tuned { color: #1b5e20; }
.outcome-crashed, .outcome-failed, .outcome-interrupted { color: #b00020; font-weight: bold; }
section.crash { border-left: 4px solid #b00020; padding-left: 1em; }
"""


@dataclass(frozen=True)
class GainRow:
    """One concurrency level of a tune: each phase's output tok/s and the tuned one's ratios."""

    concurrency: int
    baseline: float | None
    speculative: float | None
    tuned: float | None
    tuned_vs_baseline: float | None
    tuned_vs_speculative: float | None
    envelope_ratio: float | None  # as the tune judged it: tuned / max(baseline, speculative)
    below_min: bool
    refined: bool  # measured to find the crossover, not one of the requested levels


def gain_rows(record: TuneRecord) -> list[GainRow]:
    """Return the gain table of a tune record: one row per level any phase measured."""
    tokens = {phase: _tokens_per_level(record, phase) for phase in TUNE_PHASES}
    ratios = {int(c): float(r) for c, r in record["envelope_ratio"].items()}
    minimum = record["min_ratio"]
    refined = set(record["refined_levels"])
    rows = []
    for level in sorted(set().union(*tokens.values())):
        baseline, speculative, tuned = (tokens[phase].get(level) for phase in TUNE_PHASES)
        envelope = ratios.get(level)
        rows.append(
            GainRow(
                concurrency=level,
                baseline=baseline,
                speculative=speculative,
                tuned=tuned,
                tuned_vs_baseline=_ratio(tuned, baseline),
                tuned_vs_speculative=_ratio(tuned, speculative),
                envelope_ratio=envelope,
                below_min=envelope is not None and envelope < minimum,
                refined=level in refined,
            )
        )
    return rows


def tune_html(record: TuneRecord) -> str:
    """Return a tune record as one self-contained HTML page."""
    title = escape(tune_title(record))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>deployctl {title}</title>",
        f"<style>{_STYLE}</style>",
        "</head><body>",
        f"<h1>deployctl {title}</h1>",
        _facts(record),
        _crash(record),  # first thing a ticket's reader needs, when there is one
        _threshold(record),
        f"<figure>{_inline(tune_svg(record))}</figure>",
        _phases(record),
        _gain_table(record),
        "</body></html>",
        "",
    ]
    return "\n".join(part for part in parts if part is not None)


def write_tune_html(record: TuneRecord, path: Path) -> None:
    """Write a tune record's page into `path`, replacing it whole (as --plot does)."""
    write_file(path, tune_html(record).encode("utf-8"))


def _tokens_per_level(record: TuneRecord, phase: str) -> dict[int, float | None]:
    found = record["phases"].get(phase)
    # One level per concurrency (a level measured again is its median sample).
    return {lv["concurrency"]: lv["output_tokens_per_s"] for lv in found["levels"]} if found else {}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _inline(svg: str) -> str:
    # Inside HTML the parser puts <svg> and xlink:href in their namespaces itself, so the
    # prolog and the namespace declarations (the figure's only URLs) are left out.
    element = svg[svg.index("<svg") :]
    for declaration in (
        ' xmlns="http://www.w3.org/2000/svg"',
        ' xmlns:xlink="http://www.w3.org/1999/xlink"',
    ):
        element = element.replace(declaration, "", 1)
    return element


def _text(value: Any) -> str:
    return _NONE if value is None else escape(str(value))


def _objective(objective: ObjectiveShown | None) -> str:
    if not objective:
        return _NONE
    kind, bound = objective["kind"], objective["bound"]
    if kind == "max_itl_ms":
        return f"highest concurrency with time per output token ≤ {_text(bound)} ms"
    if kind == "max_ttft_ms":
        return f"highest concurrency with time to first token ≤ {_text(bound)} ms"
    return _text(kind)


def _facts(record: TuneRecord) -> str:
    started = record.get("started_at")
    wall = record.get("wall_s")
    outcome = record["outcome"]
    outcome_text = _text(outcome)
    if record["outcome_note"]:
        outcome_text += f": {_text(record['outcome_note'])}"
    params = record.get("params")
    facts = [
        ("host", _text(record["host"])),
        ("deployment", _text(record["deployment"] or "(the host's default)")),
        (
            "started",
            _NONE
            if started is None
            else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
        ),
        ("wall time", _NONE if wall is None else duration_text(wall)),
        ("outcome", f'<span class="outcome-{_text(outcome)}">{outcome_text}</span>'),
        ("objective", _objective(params["objective"] if params else None)),
        ("threshold mode", _text(record["threshold_mode"])),
        ("serving now", _text(record["serving"])),
        ("launches", _text(record["launches"])),
        ("levels measured", _text(record["levels_measured"])),
    ]
    return _definitions(facts)


def _threshold(record: TuneRecord) -> str:
    threshold = record["threshold"]
    last_win, first_loss = crossover_ends(record)
    lines = []
    if threshold is None:
        lines.append("<p><strong>No threshold</strong>.</p>")
    else:
        lines.append(f"<p><strong>T = {_text(threshold)}</strong></p>")
    if last_win is not None or first_loss is not None:
        lines.append(
            f"<p>Speculation last wins at concurrency {_text(last_win)}"
            f" and first loses at {_text(first_loss)}.</p>"
        )
    keep = keep_variables(record)
    if keep:
        where = "deployment's" if record["deployment"] is not None else "host's"
        code = "</code> and <code>".join(_text(v) for v in keep)
        lines.append(f"<p>Kept by the {where} inventory variables <code>{code}</code></p>")
    return "<h2>Threshold</h2>\n" + "\n".join(lines)


def keep_variables(record: TuneRecord) -> list[str]:
    """The inventory lines that keep a tune's T, when it found one that held (else none).
    In adaptive mode T is a CUDA-graph size, and means that only there."""
    threshold = record["threshold"]
    if record["outcome"] != "tuned" or not record["held"] or threshold is None:
        return []
    lines = [f"threshold: {threshold}"]
    if record["threshold_mode"] == "adaptive":
        lines.append("threshold_mode: adaptive")
    return lines


def _phases(record: TuneRecord) -> str:
    phases = record["phases"]
    rows = []
    for phase in TUNE_PHASES:
        if phase in phases:
            run = phases[phase]
            fields = [run["run"], run["template"], run["threshold"], run["state"]]
            cells = [phase, *map(_text, fields), str(len(run["levels"]))]
            rows.append(_row(cells))
    head = ("phase", "run", "template", "threshold", "state", "levels")
    return "<h2>Runs</h2>\n" + _table(head, rows)


def _gain_table(record: TuneRecord) -> str:
    minimum = record["min_ratio"]
    rows = []
    for row in gain_rows(record):
        level = str(row.concurrency)
        if row.refined:
            level += '<span class="tag">refined</span>'
        envelope = _number(row.envelope_ratio, ".3f")
        if row.below_min:
            envelope = f'<td class="below">{envelope} below {minimum:g}</td>'
        cells = [
            level,
            _number(row.baseline, ".1f"),
            _number(row.speculative, ".1f"),
            _number(row.tuned, ".1f"),
            _number(row.tuned_vs_baseline, ".3f"),
            _number(row.tuned_vs_speculative, ".3f"),
            envelope,
        ]
        rows.append(_row(cells, "refined" if row.refined else None))
    head = ["concurrency", "baseline tok/s", "speculative tok/s", "tuned tok/s"]
    head += ["tuned ÷ baseline", "tuned ÷ speculative", "tuned ÷ envelope"]
    note = (
        "<p>The envelope is the better of baseline and speculative at each level;"
        f" the tune's check wants tuned at least {minimum:g} of it.</p>"
    )
    return f"<h2>Gain per level</h2>\n{note}\n" + _table(head, rows)


def _table(head: Sequence[str], rows: Iterable[str]) -> str:
    header = "".join(f"<th>{name}</th>" for name in head)
    return f"<table><tr>{header}</tr>\n" + "\n".join(rows) + "\n</table>"


def _row(cells: Iterable[str], css_class: str | None = None) -> str:
    """A table row of trusted HTML cells; a cell that is already a `<td>` is kept as it is."""
    tds = "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in cells)
    return f'<tr class="{css_class}">{tds}</tr>' if css_class else f"<tr>{tds}</tr>"


def _definitions(pairs: Iterable[tuple[str, str]]) -> str:
    items = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in pairs)
    return f'<dl class="facts">{items}</dl>'


def _number(value: float | None, fmt: str) -> str:
    return _NONE if value is None else format(value, fmt)


def _crash(record: TuneRecord) -> str | None:
    crash: CrashRecord | None = record.get("crash")
    if not crash:
        return None
    first = ("title", "exception", "message", "hint")
    lines = ['<section class="crash"><h2>Crash</h2>']
    if crash["title"]:
        lines.append(f"<p><strong>{_text(crash['title'])}</strong></p>")
    if crash["exception"] or crash["message"]:
        said = ": ".join(_text(text) for text in (crash["exception"], crash["message"]) if text)
        lines.append(f"<pre>{said}</pre>")
    if crash["hint"]:
        lines.append(f"<p>hint: {_text(crash['hint'])}</p>")
    rest = [(key, value) for key, value in crash.items() if key not in first]
    if rest:
        lines.append(_definitions((_text(key), _crash_value(value)) for key, value in rest))
    lines.append("</section>")
    return "\n".join(lines)


def _crash_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value) or _NONE
    return _text(value)
