"""`tune --report`'s drawing: the figure (PNG, SVG) and the one-file HTML page of a tune
record, from records built on the stand-in's batched decode model."""

from __future__ import annotations

import functools
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from deployctl.plot import plot_tune, tune_svg
from deployctl.present.tune_report import gain_rows, tune_html, write_tune_html
from tests.conftest import CLI

# Plain decode: a step of 10 ms + 1 ms per request; speculative: 20 ms + 3 ms per request for
# 2.4 tokens. Speculation wins while b < 6.67: last win 6, first loss 7.
STEP_MS, PER_REQ_MS = 10.0, 1.0
SPEC_STEP_MS, SPEC_PER_REQ_MS, ACCEPT_LEN = 20.0, 3.0, 2.4
LEVELS = [1, 2, 4, 8, 16, 32]
REFINED = [5, 6, 7]
T = 6
SHORT_LEVEL = 32  # where the tuned sweep falls short of the envelope


def stream_tokens_per_s(b: int, speculative: bool) -> float:
    if speculative:
        return ACCEPT_LEN * 1000 / (SPEC_STEP_MS + SPEC_PER_REQ_MS * b)
    return 1000 / (STEP_MS + PER_REQ_MS * b)


def level(b: int, per_stream: float) -> dict[str, Any]:
    itl = 1000 / per_stream
    return {
        "concurrency": b, "prompts": 4 * b, "completed": 4 * b, "failed": 0, "errors": [],
        "duration_s": 10.0, "output_tokens": int(per_stream * b * 10),
        "output_tokens_per_s": per_stream * b, "requests_per_s": b / 10,
        "ttft_ms": {"p50": 2 * itl, "p99": 3 * itl}, "itl_ms": {"p50": itl, "p99": 1.5 * itl},
        "e2e_ms": {"p50": 100 * itl, "p99": 120 * itl},
    }  # fmt: skip


def phase(run: str, template: str, threshold: int | None, levels: list[dict[str, Any]]) -> Any:
    return {"run": run, "runs": [run], "template": template, "threshold": threshold,
            "state": "ready", "levels": levels, "samples": {}, "sweeps": []}  # fmt: skip


PARAMS = {
    "concurrency": LEVELS, "input_len": 512, "output_len": 128, "requests_per_stream": 4,
    "objective": {"kind": "max_itl_ms", "bound": 25.0}, "keep": "tuned", "min_ratio": 0.95,
    "noise": 0.03, "repeats": 3,
}  # fmt: skip


def tuned_record(deployment: str | None = "chat") -> dict[str, Any]:
    measured = sorted({*LEVELS, *REFINED})
    baseline = [level(b, stream_tokens_per_s(b, False)) for b in measured]
    speculative = [level(b, stream_tokens_per_s(b, True)) for b in measured]
    tuned = []
    for b in LEVELS:  # the tuned phase sweeps the requested levels: plain above T
        factor = 0.9 if b == SHORT_LEVEL else 0.99
        tuned.append(level(b, factor * stream_tokens_per_s(b, b <= T)))
    envelope = {
        str(t["concurrency"]): t["output_tokens_per_s"]
        / max(lv["output_tokens_per_s"] for lv in (*baseline, *speculative)
              if lv["concurrency"] == t["concurrency"])
        for t in tuned
    }  # fmt: skip
    return {
        "tune": 3, "deployment": deployment, "host": "alpha", "params": PARAMS,
        "threshold_mode": "patch", "threshold": T,
        "crossover": {"last_win": 6, "first_loss": 7},
        "phases": {
            "baseline": phase("baseline_v3", "baseline", None, baseline),
            "speculative": phase("eagle3_v3", "eagle3", None, speculative),
            "tuned": phase("eagle3_t6_v4", "eagle3", T, tuned),
        },
        "refined_levels": REFINED, "envelope_ratio": envelope, "min_ratio": 0.95,
        "outcome": "tuned", "outcome_note": "speculation wins up to concurrency 6", "held": False,
        "serving": "eagle3_t6_v4", "crash": None,
        "started_at": 1764590000.0, "wall_s": 312.4, "launches": 3, "levels_measured": 24,
    }  # fmt: skip


CRASH = {
    "exception": "RuntimeError",
    "message": "The size of tensor a (160) must match the size of tensor b (2)",
    "hint": "the speculative server crashed on a batch <over> the threshold",
    "title": "speculative batch mismatch", "signature": "spec-batch-mismatch",
    "ranks": ["TP0", "TP1"], "log_line": 812,
}  # fmt: skip


def crashed_record() -> dict[str, Any]:
    """A tune whose speculative server crashed before it measured a level."""
    record = tuned_record()
    record["phases"] = {
        "baseline": record["phases"]["baseline"],
        "speculative": {**record["phases"]["speculative"], "state": "crashed", "levels": []},
    }
    record.update(
        threshold=None, crossover=None, refined_levels=[], envelope_ratio={}, outcome="crashed",
        outcome_note="speculative crashed; baseline_v4 serving", serving="baseline_v4",
        crash=CRASH,
    )  # fmt: skip
    return record


class Tables(HTMLParser):
    """Every table of a page as rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def gain_table(page: str) -> list[list[str]]:
    parser = Tables()
    parser.feed(page)
    (table,) = [t for t in parser.tables if t[0][0] == "concurrency"]
    return table[1:]


def test_the_rows_carry_each_phase_and_the_tuned_ratios() -> None:
    rows = gain_rows(tuned_record())
    assert [r.concurrency for r in rows] == sorted({*LEVELS, *REFINED})
    by_level = {r.concurrency: r for r in rows}
    eight = by_level[8]
    assert eight.baseline == pytest.approx(8000 / 18)
    assert eight.tuned == pytest.approx(0.99 * 8000 / 18)
    assert eight.tuned_vs_baseline == pytest.approx(0.99)
    assert eight.tuned_vs_speculative == pytest.approx((0.99 * 8000 / 18) / (2400 * 8 / 44))
    assert eight.envelope_ratio == pytest.approx(0.99)
    one = by_level[1]
    assert one.tuned_vs_speculative == pytest.approx(0.99)
    assert one.tuned_vs_baseline == pytest.approx(0.99 * (2400 / 23) / (1000 / 11))
    assert [r.concurrency for r in rows if r.below_min] == [SHORT_LEVEL]
    assert by_level[SHORT_LEVEL].envelope_ratio == pytest.approx(0.9)
    assert [r.concurrency for r in rows if r.refined] == REFINED
    # The refined levels were not swept by the tuned phase: nothing to compare there.
    assert all(by_level[b].tuned is None and by_level[b].envelope_ratio is None for b in REFINED)


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")])
@pytest.mark.heavy
def test_the_tune_figure_is_written_as_its_format(
    tmp_path: Path, suffix: str, magic: bytes
) -> None:
    picture = tmp_path / f"tune{suffix}"
    picture.write_bytes(b"old")
    plot_tune(tuned_record(), picture)
    assert picture.read_bytes().startswith(magic)
    assert [p.name for p in tmp_path.iterdir()] == [picture.name]


@pytest.mark.heavy
def test_the_svg_marks_t_and_the_crossover() -> None:
    svg = tune_svg(tuned_record())
    assert "<svg" in svg
    # matplotlib draws text as paths and keeps each string beside them in a comment.
    for text in ("T = 6", "crossover 6–7", "baseline", "speculative", "tuned", "tune 3"):
        assert f"<!-- {text}" in svg, text


@functools.cache
def tuned_page() -> str:
    """The page of `tuned_record()`, drawn once: drawing its figure is ~0.5 s of CPU."""
    return tune_html(tuned_record())


@pytest.mark.heavy
def test_the_page_is_one_file_that_fetches_nothing() -> None:
    page = tuned_page()
    assert "<svg" in page
    for outside in ("http://", "https://", "src=", "<link", "@import", "<script"):
        assert outside not in page.lower(), outside
    # The figure's references point into itself (its defs and clip paths) only.
    references = re.findall(r'href="(.)', page) + re.findall(r"url\((.)", page)
    assert references and set(references) == {"#"}


@pytest.mark.heavy
def test_the_page_shows_t_its_inventory_line_and_a_row_per_level() -> None:
    page = tuned_page()
    assert "T = 6" in page
    # The inventory line only for a tune that held (this one falls below 0.95 at 32).
    assert "<code>threshold: 6</code>" in tune_html({**tuned_record(), "held": True})
    assert "<code>threshold: 6</code>" not in page
    adaptive = tune_html({**tuned_record(), "held": True, "threshold_mode": "adaptive"})
    assert "<code>threshold: 6</code> and <code>threshold_mode: adaptive</code>" in adaptive
    assert "2025-12-01 11:53:20 UTC" in page and "5 min 12 s" in page
    rows = gain_table(page)
    assert [int(r[0].removesuffix("refined")) for r in rows] == sorted({*LEVELS, *REFINED})
    by_level = {int(r[0].removesuffix("refined")): r for r in rows}
    assert by_level[8][1:] == ["444.4", "436.4", "440.0", "0.990", "1.008", "0.990"]
    assert by_level[5][0] == "5refined" and by_level[5][3] == "—"
    assert by_level[SHORT_LEVEL][6] == "0.900 below 0.95"
    assert '<td class="below">0.900 below 0.95</td>' in page
    assert [r[6] for r in rows].count("0.900 below 0.95") == 1


@pytest.mark.heavy
def test_the_page_says_the_objective_the_tune_was_asked_for() -> None:
    # It is kept under `params`, as `tune --json` prints it.
    page = tuned_page()
    assert "highest concurrency with time per output token ≤ 25.0 ms" in page
    throughput = {**PARAMS, "objective": {"kind": "throughput", "bound": None}}
    assert "<dd>throughput</dd>" in tune_html({**tuned_record(), "params": throughput})


def test_the_records_drawn_here_are_whole_records() -> None:
    # As the host checks a kept one: the drawings are tested on what tune really keeps.
    from deployctl.remote.records import is_tune_record

    assert is_tune_record(tuned_record()) and is_tune_record(kept(1))


@pytest.mark.heavy
def test_every_string_from_the_record_is_escaped() -> None:
    page = tune_html(tuned_record(deployment="<script>alert(1)</script>"))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower()


@pytest.mark.heavy
def test_a_tune_that_crashed_after_its_baseline_still_renders_with_the_crash() -> None:
    record = crashed_record()
    page = tune_html(record)
    assert "<svg" in page and "No threshold" in page and "threshold:" not in page
    assert "RuntimeError: The size of tensor a (160) must match the size of tensor b (2)" in page
    assert "hint: the speculative server crashed on a batch &lt;over&gt; the threshold" in page
    assert "TP0, TP1" in page
    rows = gain_table(page)
    assert len(rows) == len({*LEVELS, *REFINED})
    assert all(r[1] != "—" and r[2:] == ["—"] * 5 for r in rows)
    assert "speculative (crashed)" in tune_svg(record)


@pytest.mark.heavy
def test_the_page_is_written_whole_in_place_of_the_old(tmp_path: Path) -> None:
    page = tmp_path / "tune.html"
    page.write_text("old")
    write_tune_html(tuned_record(), page)
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["tune.html"]


# ---- kept records, read back by `tune --report` (a local host: no sshd needed) ----------------


def kept(number: int) -> dict[str, Any]:
    """A whole record as tune keeps it."""
    return {**tuned_record(None), "tune": number, "held": True}


def local_inventory(tmp_path: Path, records: dict[int, Any]) -> Path:
    """This machine as the host, its state folder holding `records` (number -> document)."""
    state = tmp_path / "state"
    (state / "tunes").mkdir(parents=True)
    for number, record in records.items():
        (state / "tunes" / f"{number}.json").write_text(json.dumps(record))
    inv = tmp_path / "inv.yml"
    inv.write_text(
        f"all:\n  hosts:\n    localhost:\n      ansible_connection: local\n      state_dir: {state}\n"
    )
    return inv


@pytest.mark.heavy
def test_a_missing_tune_record_fails_in_json_as_its_exit_status_says(
    cli: CLI, tmp_path: Path
) -> None:
    inv = str(local_inventory(tmp_path, {1: kept(1)}))
    missing = cli("tune", "-i", inv, "--report", "5", "--json")  # the schema check runs too
    entry = json.loads(missing.stdout)["hosts"]["localhost"]
    assert missing.returncode == 1, missing.stderr
    assert entry["ok"] is False and entry["code"] == "error"
    assert entry["error"] == "no tune 5 is kept here (kept: 1)" and entry["record"] is None
    found = cli("tune", "-i", inv, "--report", "1", "--json")
    entry = json.loads(found.stdout)["hosts"]["localhost"]
    assert found.returncode == 0 and entry["ok"] and entry["error"] is None
    assert entry["record"]["tune"] == 1


@pytest.mark.heavy
def test_a_tune_record_of_the_wrong_shape_is_named_and_skipped(cli: CLI, tmp_path: Path) -> None:
    good = kept(1)
    bad = {k: v for k, v in good.items() if k != "held"} | {"tune": 2}  # valid JSON, a key short
    # Checked as declared, nested parts and the keys a record may lack included: a phase
    # without its levels, a crash that is a string.
    phases = {**good["phases"], "tuned": {**good["phases"]["tuned"]}}
    del phases["tuned"]["levels"]
    records = {1: good, 2: bad, 3: {**good, "phases": []}, 4: {**good, "phases": phases}}
    records[5] = {**good, "crash": "RuntimeError"}
    inv = str(local_inventory(tmp_path, records))
    shown = cli("tune", "-i", inv, "--report")
    assert shown.returncode == 0, shown.stderr
    assert "internal error" not in shown.stderr and "Traceback" not in shown.stderr
    for number in (2, 3, 4, 5):
        assert f"tunes/{number}.json is not a readable tune record" in shown.stderr
    assert "localhost: tune 1 (tuned)" in shown.stdout  # the newest good one
    doc = json.loads(cli("tune", "-i", inv, "--report", "--json").stdout)["hosts"]["localhost"]
    assert doc["record"]["tune"] == 1 and doc["numbers"] == [1] and len(doc["unreadable"]) == 4
    asked = cli("tune", "-i", inv, "--report", "2")
    assert asked.returncode == 1 and "no tune 2 is kept here (kept: 1)" in asked.stderr


# ---- the record's keys: declared once (remote/measures.py), read by name ---------------------

PACKAGE = Path(__file__).resolve().parent.parent / "deployctl"
# Where the tune record is read: the functions, or (None) every function of the file.
READERS: dict[str, set[str] | None] = {
    "present/views.py": {"_tune_record"},
    "present/tune_report.py": None,
    "plot.py": {"tune_title", "_draw_tune", "crossover_ends"},
}


def declared_keys() -> set[str]:
    """Every key the tune record and the parts nested in it declare."""
    import typing

    from deployctl.remote import measures

    found: set[str] = set()
    seen: set[type] = set()

    def visit(hint: Any) -> None:
        if typing.is_typeddict(hint) and hint not in seen:
            seen.add(hint)
            found.update(hint.__required_keys__ | hint.__optional_keys__)
            for item in typing.get_type_hints(hint).values():
                visit(item)
        for arg in typing.get_args(hint):
            visit(arg)

    visit(measures.TuneRecord)
    return found


def keys_read(source: str, functions: set[str] | None) -> dict[str, set[str]]:
    """The string keys a module reads in `functions` (`x["key"]`, `x.get("key")`), by what
    they are read from: `record` itself, or anything else ("")."""
    import ast

    found: dict[str, set[str]] = {"record": set(), "": set()}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef) or (functions and node.name not in functions):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Subscript):
                owner, key = inner.value, inner.slice
            elif (
                isinstance(inner, ast.Call)
                and isinstance(inner.func, ast.Attribute)
                and inner.func.attr == "get"
                and inner.args
            ):
                owner, key = inner.func.value, inner.args[0]
            else:
                continue
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                of = "record" if isinstance(owner, ast.Name) and owner.id == "record" else ""
                found[of].add(key.value)
    return found


def test_every_key_a_reader_of_the_record_reads_is_declared() -> None:
    from deployctl.remote.measures import TuneRecord

    declared = declared_keys()
    top = TuneRecord.__required_keys__ | TuneRecord.__optional_keys__
    assert {"host", "phases", "levels", "output_tokens_per_s", "last_win", "kind"} <= declared
    for name, functions in READERS.items():
        read = keys_read((PACKAGE / name).read_text(encoding="utf-8"), functions)
        assert read["record"], name
        assert read["record"] <= top, f"{name}: not keys of a record: {read['record'] - top}"
        assert read[""] <= declared, f"{name} reads undeclared keys: {read[''] - declared}"
    # The dashboard's page draws a deployment's newest record.
    script = (PACKAGE / "dashboard" / "static" / "app.js").read_text(encoding="utf-8")
    body = script[script.index("function curves(") :]
    body = body[: body.index("\n}\n")]
    tune = set(re.findall(r"\btune\.(\w+)", body))
    read = set(re.findall(r"\b[pl]\.(\w+)", body)) | set(re.findall(r"\bl\.\w+\.(\w+)", body))
    assert {"phases", "crossover", "threshold", "tune"} <= tune and {"levels", "p50"} <= read
    assert tune <= top, f"app.js: not keys of a record: {tune - top}"
    assert read <= declared, f"app.js reads undeclared keys: {read - declared}"


def test_a_shortfall_above_t_is_named_the_off_states_cost_and_one_below_it_noise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As on SGLang 0.5.17 on the H200 (benchmarks/h200-threshold/): T = 32 and the tuned
    run at 0.59 and 0.55 of the baseline at 64 and 128, where its drafting was off."""
    from deployctl.present.views import _tune_record

    record = tuned_record()
    above = [c for c in record["envelope_ratio"] if int(c) > T]
    record["envelope_ratio"] = {c: 1.0 for c in record["envelope_ratio"]}
    record["envelope_ratio"][above[-1]] = 0.55
    record["envelope_ratio"][above[0]] = 0.59
    record["envelope_ratio"]["1"] = 0.9  # at or below T: drafting was on
    _tune_record(record, "alpha")
    err = capsys.readouterr().err
    assert (
        f"alpha: error: above its threshold {T} the tuned run fell below 0.95 of the better "
        f"curve at concurrency {above[0]}, {above[-1]} (down to 0.55): with drafting off there"
    ) in err
    assert "tune --keep baseline" in err
    assert "fell below 0.95 of the better curve at concurrency 1\n" in err

    # deployctl's adaptive mode drafts 0 steps above T: the same off path (the H200's
    # own-adaptive run: accept len 1.00 at 16 and 64 streams with T = 4).
    record["threshold_mode"] = "adaptive"
    _tune_record(record, "alpha")
    assert "above its threshold" in capsys.readouterr().err

    record["threshold"] = int(above[-1])  # now both are at or below T: drafting was on
    _tune_record(record, "alpha")
    err = capsys.readouterr().err
    assert "above its threshold" not in err
    assert f"fell below 0.95 of the better curve at concurrency 1, {above[0]}, {above[-1]}" in err


def test_the_tuned_run_drafts_nothing_above_t_in_either_mode() -> None:
    """tune measures the tuned run once above T (its off path, which more samples do not
    cure), and names a shortfall there the off state's cost."""
    from deployctl.ops.tune.tuner import drafting_off

    assert drafting_off(32, 64) and drafting_off(0, 1)
    assert not drafting_off(32, 32) and not drafting_off(32, 1)
    assert not drafting_off(None, 256)  # no T: speculation always on, or never
