"""The suite's own tiers (tests/conftest.py): what the fast tier, `-m "not lab"`, leaves out."""

from __future__ import annotations

import pytest


@pytest.mark.heavy
def test_a_heavy_test_is_a_lab_test_so_the_fast_tier_leaves_it(
    request: pytest.FixtureRequest,
) -> None:
    assert request.node.get_closest_marker("lab") is not None


def test_a_plain_test_stays_in_the_fast_tier(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("lab") is None
