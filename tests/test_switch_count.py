"""scripts/switch_count.py: the speculation switches a real server logged, per TP rank, with the
lines the patch's once-a-minute logging folded into the next one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("switch_count", ROOT / "scripts" / "switch_count.py")
assert spec is not None and spec.loader is not None
switch_count = importlib.util.module_from_spec(spec)
spec.loader.exec_module(switch_count)

REAL_LOG = ROOT / "tests" / "data" / "real-sglang-0.5.17" / "spec-threshold-switches.log"


def test_the_real_logs_two_lines_stand_for_its_24_switches() -> None:
    lines = REAL_LOG.read_text(encoding="utf-8", errors="replace").splitlines()
    assert switch_count.count(lines) == {0: (24, 2)}


def test_each_tp_rank_is_counted_apart_and_other_lines_not_at_all() -> None:
    lines = [
        "[2026-12-05 04:34:24 TP0] Switch adaptive runtime state: steps 3 -> 0, draft_tokens 4 -> 1",
        "[2026-12-05 04:34:24 TP1] Switch adaptive runtime state: steps 3 -> 0, draft_tokens 4 -> 1",
        "[2026-12-05 04:34:25 TP1] Decode batch, #running-req: 64, accept len: 1.00",
        "[2026-12-05 04:35:24 DP0 TP1 EP1] Switch adaptive runtime state: steps 0 -> 3, "
        "draft_tokens 1 -> 4 (5 more since the last line)",
        "[2026-12-05 04:35:25 TP12] Switch adaptive runtime state: steps 0 -> 3, draft_tokens 1 -> 4",
    ]
    assert switch_count.count(lines) == {0: (1, 1), 1: (7, 2), 12: (1, 1)}


def test_the_cross_phases_real_log_counts_its_21_switches_in_2_lines() -> None:
    log = ROOT / "benchmarks" / "h200-threshold" / "cross-switches.log"
    lines = [f"{line}  \n" for line in log.read_text(encoding="utf-8").splitlines()]
    assert switch_count.count(lines) == {0: (21, 2)}  # trailing blanks do not hide a count
