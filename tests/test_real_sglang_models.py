"""scripts/real_sglang_models.py's check: the pattern a greedy output must follow, and the
accept length read from a real SGLang 0.5.17 /metrics page."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "real-sglang-0.5.17"
spec = importlib.util.spec_from_file_location("models", ROOT / "scripts" / "real_sglang_models.py")
assert spec and spec.loader
models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(models)

K, J = 353, 342


@pytest.mark.parametrize(
    ("pattern", "ids", "follows"),
    [
        ("alternate", [K, J, K, J], True),
        ("alternate", [J, K, J], True),
        ("alternate", [K, J, J, K], False),  # a repeat breaks it
        ("alternate", [K, J, 7], False),  # a third token
        ("constant", [K, K, K], True),
        ("constant", [K, K, J], False),
        ("constant", [], False),  # nothing streamed follows nothing
    ],
)
def test_the_output_follows_the_constructed_pattern_only_as_built(
    pattern: str, ids: list[int], follows: bool
) -> None:
    assert models.follows(pattern, K, J, ids) is follows


def test_the_accept_length_is_read_from_a_real_eagle3_metrics_page() -> None:
    page = (DATA / "metrics-under-load-eagle3.txt").read_text()
    assert models.accept_length(page) == 1.0  # random weights: every draft wrong
    assert models.accept_length("sglang:spec_accept_length_x 3.0\n") is None


@pytest.mark.parametrize(("accept", "length"), [("1", 1.0), ("2", 2.0), ("all", 4.0)])
def test_the_expected_accept_length_follows_the_construction(accept: str, length: float) -> None:
    assert models.expected_accept_length(accept, 3) == length
