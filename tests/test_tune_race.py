"""`tune --live --policies`: the race's statistics (pure): per-bucket winners, and the
overall winner weighted by where the traffic is."""

from __future__ import annotations

import random

import pytest

from deployctl.canary_stats import MIN_CELL, Judge, Sample
from deployctl.ops.tune.race import PolicyRace

# Output tok/s per running request of each policy in each bucket (plain serves 100): the
# threshold speculates up to 6, SGLang's own adaptive up to 32, where speculating loses.
CURVES = {
    "threshold": {2: 140.0, 4: 130.0, 16: 100.0, 32: 100.0},
    "adaptive": {2: 140.0, 4: 130.0, 16: 80.0, 32: 75.0},
    "off": {2: 100.0, 4: 100.0, 16: 100.0, 32: 100.0},
}


def raced(
    curves: dict[str, dict[int, float]], per_bucket: dict[int, int], seed: int, noise: float = 0.05
) -> PolicyRace:
    """A race fed `per_bucket[b]` samples of each policy in bucket b, with multiplicative noise."""
    rng = random.Random(seed)
    race = PolicyRace(list(curves), 0.95, 20)
    for bucket, n in per_bucket.items():
        for _ in range(n):
            for policy, curve in curves.items():
                if bucket in curve:
                    value = curve[bucket] * (1 + rng.gauss(0, noise))
                    race.add(policy, Sample(bucket - 0.5, value, 3, policy))
    return race


def test_the_policy_best_where_the_traffic_is_wins_and_each_bucket_names_its_own() -> None:
    result = raced(CURVES, {2: 40, 4: 40, 16: 40, 32: 40}, seed=1).result()
    overall = result.overall
    assert overall.winner == "threshold" and overall.decided, overall
    # Ahead of adaptive by its high buckets, of off by its low ones: both beyond the interval.
    assert set(overall.versus) == {"adaptive", "off"}
    for gain in overall.versus.values():
        assert gain.low is not None and gain.low > 1 and gain.ratio > 1
    rows = {r.bucket: r for r in result.buckets}
    # Where two policies serve alike, the bucket's winner is not decided.
    assert rows[2].winner in ("threshold", "adaptive") and not rows[2].decided
    assert rows[32].winner in ("threshold", "off") and not rows[32].decided
    assert rows[2].values["off"] == pytest.approx(100, rel=0.05)
    assert rows[32].values["adaptive"] == pytest.approx(75, rel=0.05)
    assert rows[16].samples == {"threshold": 40, "adaptive": 40, "off": 40}
    assert sum(overall.shares.values()) == pytest.approx(1.0)


def test_a_clear_bucket_winner_is_decided() -> None:
    curves = {"a": {8: 150.0}, "b": {8: 100.0}}
    [row] = raced(curves, {8: 60}, seed=2).result().buckets
    assert row.winner == "a" and row.decided


def test_the_overall_winner_follows_the_traffics_share_not_the_largest_gain() -> None:
    # a wins by 20 % at batch 2, b by 5 % at 32; nine tenths of the traffic runs at 32.
    curves = {"a": {2: 120.0, 32: 100.0}, "b": {2: 100.0, 32: 105.0}}
    overall = raced(curves, {2: 30, 32: 270}, seed=3, noise=0.03).result().overall
    assert overall.winner == "b", overall
    assert overall.shares == pytest.approx({2: 0.1, 32: 0.9})
    # With the traffic the other way round, a wins.
    flipped = raced(curves, {2: 270, 32: 30}, seed=3, noise=0.03).result().overall
    assert flipped.winner == "a" and flipped.decided, flipped


def test_equal_policies_leave_the_race_undecided() -> None:
    same = {2: 100.0, 16: 100.0}
    overall = raced({"a": same, "b": same, "c": same}, {2: 60, 16: 60}, seed=4).result().overall
    assert overall.winner is not None and not overall.decided, overall


def test_a_bucket_one_policy_never_served_names_no_winner_and_weighs_nothing() -> None:
    curves = {"a": {2: 150.0, 16: 90.0}, "b": {2: 100.0}}
    result = raced(curves, {2: 40, 16: 40}, seed=5).result()
    rows = {r.bucket: r for r in result.buckets}
    assert rows[16].winner is None and not rows[16].decided and rows[16].samples["b"] == 0
    assert result.overall.shares == {2: 1.0} and result.overall.winner == "a"


def test_a_bucket_a_policy_passed_through_a_few_times_is_not_compared() -> None:
    race = raced({"a": {2: 150.0}, "b": {2: 100.0}}, {2: 40}, seed=8)
    for _ in range(MIN_CELL - 1):  # b's few samples at 16, where a serves alone
        race.add("a", Sample(15.5, 50.0, 3, "a"))
        race.add("b", Sample(15.5, 500.0, 3, "b"))
    for _ in range(40):
        race.add("a", Sample(15.5, 50.0, 3, "a"))
    result = race.result()
    rows = {r.bucket: r for r in result.buckets}
    assert rows[16].winner is None and rows[16].samples == {
        "a": 40 + MIN_CELL - 1,
        "b": MIN_CELL - 1,
    }
    assert result.overall.shares == {2: 1.0} and result.overall.winner == "a"


def test_few_samples_decide_nothing() -> None:
    result = raced(CURVES, {2: 3, 32: 3}, seed=6).result()
    assert not result.overall.decided and not any(r.decided for r in result.buckets)


def test_a_race_needs_two_distinct_policies() -> None:
    with pytest.raises(ValueError, match="two or more distinct"):
        PolicyRace(["off", "off"], 0.95, 20)
    with pytest.raises(ValueError, match="two or more distinct"):
        PolicyRace(["off"], 0.95, 20)


def test_the_traffic_weighted_interval_holds_the_weighted_truth() -> None:
    rng = random.Random(7)
    judge = Judge("throughput", 0.03, 0.95, 20)
    for _ in range(80):
        for bucket, gain in ((2, 1.3), (16, 0.9)):
            judge.add("control", Sample(bucket - 0.5, 100 * (1 + rng.gauss(0, 0.04)), 3, "c"))
            judge.add(
                "candidate", Sample(bucket - 0.5, 100 * gain * (1 + rng.gauss(0, 0.04)), 3, "k")
            )
    weighted = judge.weighted_interval({2: 0.25, 16: 0.75})
    assert weighted is not None and weighted.low is not None and weighted.high is not None
    # worse-ratio: (1/1.3)^0.25 (1/0.9)^0.75
    truth = (1 / 1.3) ** 0.25 * (1 / 0.9) ** 0.75
    assert weighted.low < truth < weighted.high
    assert weighted.ratio == pytest.approx(truth, rel=0.02)
    assert judge.weighted_interval({64: 1.0}) is None


def test_the_race_is_shown_per_bucket_with_the_overall_winner_and_what_was_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployctl.choices import SpeculationPolicy
    from deployctl.inventory import Host
    from deployctl.ops.rollout import UnitOutcome, UnitResult
    from deployctl.ops.tune.live import LiveOptions, LivePlan, LiveReport
    from deployctl.present import views
    from deployctl.present.documents import tune_live_document
    from deployctl.schema import versioned
    from deployctl.settings import DEFAULT_VARS
    from tests.json_contract import check_document

    router = Host("alpha", dict(DEFAULT_VARS), "router")
    plan = LivePlan(router, None, None, lambda policy, t: [])
    options = LiveOptions(policies=tuple(SpeculationPolicy), threshold=4)
    report = LiveReport(plan, options, threshold=4, decision="promoted")
    report.race_split = [
        UnitResult(f"alpha/r{i}", UnitOutcome.REPLACED, new_run=f"r{i}_v2") for i in (1, 2, 3)
    ]
    report.race = raced(CURVES, {2: 40, 4: 40, 16: 40, 32: 40}, seed=1).result()
    report.kept = SpeculationPolicy.THRESHOLD
    views.TUNE_LIVE.human(report)
    out = capsys.readouterr().out
    assert "policies raced at T = 4 (alpha/r1, alpha/r2, alpha/r3)" in out, out
    assert "threshold tok/s (n)" in out and "(within noise)" in out, out
    assert "overall, weighted by the traffic's buckets: threshold, ahead of adaptive by" in out
    assert "kept: threshold T = 4; rolled out to the router's replicas" in out, out
    assert "keep it: `threshold: 4` for the router's replicas" in out, out
    document = tune_live_document(report)
    check_document(["tune", "--live"], versioned(document))
    assert document["kept"] == "threshold" and document["race"]["winner"] == "threshold"
    assert document["race"]["buckets"][0]["samples"] == {"threshold": 40, "adaptive": 40, "off": 40}
