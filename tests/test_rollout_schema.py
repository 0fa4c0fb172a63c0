"""`rollout --json` against its shipped schema: every key an outcome always has is required,
so a test run notices when one goes missing (as `gpus_clean` once could)."""

from __future__ import annotations

from typing import Any

import pytest

from deployctl.ops.rollout import RolloutReport, UnitOutcome, UnitPlan, UnitResult
from deployctl.ops.runs import DrainSignal
from deployctl.present.documents import rollout_document as unversioned
from deployctl.schema import versioned
from tests.json_contract import problem, validator


def rollout_document(done: RolloutReport) -> dict[str, Any]:
    return versioned(unversioned(done))


def report(dry_run: bool = False) -> RolloutReport:
    plan = UnitPlan("alpha/w1", [], [], ["--restart"], [], [], {}, None)
    done = UnitResult(
        "alpha/w1", UnitOutcome.REPLACED, "w1_baseline_v1", "w1_baseline_v2", "ready",
        drained=True, drain_signal=DrainSignal.TIMEOUT, gpus_clean=True, timings={"total": 1.0},
    )  # fmt: skip
    return RolloutReport([] if dry_run else [done], [plan], dry_run=dry_run)


def test_a_rollout_document_and_a_dry_run_one_validate() -> None:
    check = validator(["rollout", "--json"])
    assert problem(rollout_document(report()), check) is None
    assert problem(rollout_document(report(dry_run=True)), check) is None


@pytest.mark.parametrize(
    "key",
    ["ok", "old_run", "new_run", "state", "error", "crash", "warnings", "drained",
     "drain_signal", "gpus_clean", "timings_s", "overhead_s", "patches_done"],
)  # fmt: skip
def test_a_unit_with_an_outcome_missing_a_key_breaks_the_schema(key: str) -> None:
    document = rollout_document(report())
    del document["units"][0][key]
    assert problem(document, validator(["rollout", "--json"])) is not None, key
