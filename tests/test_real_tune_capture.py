"""A whole `tune --json` document from real SGLang 0.5.17 on the H200 (adaptive mode, CUDA
graphs on, the 6.7 B accept-2 pair: tests/data/real-sglang-0.5.17/README.md), read back through
tune's own search and views: what the engine measured must still decide what tune decided.
The document keeps one sample per level whole (the median one; of a level measured again, the
others only as their throughputs), so the search here judges those."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deployctl.ops.tune.search import Levels, LevelVerdict, Phase, Search, level_figures
from deployctl.ops.tune.tuner import drafting_off
from deployctl.present.tune_report import gain_rows
from deployctl.present.views import _tune_record
from tests.json_contract import check_document

CAPTURE = Path(__file__).parent / "data" / "real-sglang-0.5.17" / "tune-adaptive.json"
GRAPH_SIZES = (1, 4, 16, 32, 64, 128)  # the servers' --cuda-graph-bs-decode


def tune_document() -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(CAPTURE.read_text(encoding="utf-8"))["hosts"]["localhost"]
    return entry


def test_the_real_document_meets_tunes_published_schema() -> None:
    check_document(["tune"], json.loads(CAPTURE.read_text(encoding="utf-8")))


def test_the_real_samples_decide_t_32_between_the_last_win_and_the_first_loss() -> None:
    doc = tune_document()
    search = Search(coarse=list(GRAPH_SIZES), levels=Levels(GRAPH_SIZES))
    search.add(Phase.BASELINE, doc["phases"]["baseline"]["levels"])
    search.add(Phase.SPECULATIVE, doc["phases"]["speculative"]["levels"])

    verdicts = {c: j.verdict for c, j in search.judged().items()}
    assert verdicts == {
        1: LevelVerdict.WIN, 4: LevelVerdict.WIN, 16: LevelVerdict.WIN, 32: LevelVerdict.WIN,
        64: LevelVerdict.LOSS, 128: LevelVerdict.LOSS,
    }  # fmt: skip
    assert search.bracket() == (32, 64) and search.narrowed
    assert search.threshold == doc["threshold"] == 32
    assert {str(c): v.value for c, v in verdicts.items()} == {
        c: v["verdict"] for c, v in doc["verdicts"].items()
    }


def test_the_real_tuned_run_holds_the_better_curve_up_to_t_and_falls_short_only_where_it_drafts_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = tune_document()
    rows = {row.concurrency: row for row in gain_rows(doc)}
    assert set(rows) == set(GRAPH_SIZES)
    for c, row in rows.items():
        assert row.envelope_ratio is not None
        if drafting_off(doc["threshold"], c):
            assert row.envelope_ratio < 0.6 and row.below_min, c  # 0.574 and 0.545
        else:
            assert abs(row.envelope_ratio - 1) <= 0.03, c  # 1.003, 1.012, 0.999, 1.022

    _tune_record(doc, "localhost")
    err = capsys.readouterr().err
    assert (
        "localhost: error: above its threshold 32 the tuned run fell below 0.95 of the better "
        "curve at concurrency 64, 128 (down to 0.55): with drafting off there"
    ) in err
    assert "tune --keep baseline" in err


def test_the_real_warm_up_figures_are_recomputed_from_the_real_samples() -> None:
    """Each level's warm-up, first sample's bias, spread and drift as tune reported them, from
    the level's own rounds (levels measured once: the document keeps only the median sample
    of the others)."""
    doc = tune_document()
    checked = 0
    for name, phase in doc["phases"].items():
        for level in phase["levels"]:
            c = str(level["concurrency"])
            if len(phase["samples"][c]) > 1:
                continue
            assert level_figures([level]) == pytest.approx(phase["per_level"][c]), (name, c)
            checked += 1
    assert checked >= 12
