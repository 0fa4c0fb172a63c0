"""`deployctl canary`: the split's refusals and what one interval of a replica's /metrics says
(pure); the whole command over real sshd hosts and the real router is in test_canary_lab.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from deployctl.deployments import deployment_targets
from deployctl.errors import UsageError
from deployctl.inventory import DEFAULT_VARS, Host, Inventory
from deployctl.metrics import Counts, interval, read_counts
from deployctl.ops.canary import CanaryReport, Decision, canary_record, plan_canary
from deployctl.ops.plan import plan_launch
from deployctl.ops.rollout import UnitOutcome, UnitPlan, UnitResult
from deployctl.project import Project
from deployctl.remote.files import CallFailed
from deployctl.remote.measures import CanaryRecord
from deployctl.remote.records import cmd_canary_keep, cmd_canary_records
from deployctl.remote.shapes import shape_problems

DATA = Path(__file__).parent / "data"


def page(
    running: float, itl: dict[float, float], tokens: float, done: float, aborted: float = 0
) -> str:
    """SGLang's /metrics with these cumulative values (two label sets for the counters)."""
    lines = [
        "# TYPE sglang:num_running_reqs gauge",
        f'sglang:num_running_reqs{{tp_rank="0"}} {running}',
        "# TYPE sglang:inter_token_latency_seconds histogram",
    ]
    lines += [
        f'sglang:inter_token_latency_seconds_bucket{{le="{b}"}} {c}' for b, c in sorted(itl.items())
    ]
    lines += [
        f"sglang:inter_token_latency_seconds_count {max(itl.values())}",
        "sglang:inter_token_latency_seconds_sum 1.0",
        "# TYPE sglang:generation_tokens_total counter",
        f'sglang:generation_tokens_total{{model_name="m",stream="a"}} {tokens / 2}',
        f'sglang:generation_tokens_total{{model_name="m",stream="b"}} {tokens / 2}',
        "# TYPE sglang:num_requests_total counter",
        f"sglang:num_requests_total {done}",
        "# TYPE sglang:num_aborted_requests_total counter",
        f"sglang:num_aborted_requests_total {aborted}",
    ]
    return "\n".join(lines) + "\n"


INF = float("inf")


def test_an_interval_is_read_from_the_deltas_of_its_counters_and_histograms() -> None:
    # Before: 100 gaps all under 10 ms. Then 100 more, all between 20 and 40 ms.
    before = read_counts(page(8, {0.01: 100, 0.02: 100, 0.04: 100, INF: 100}, 1000, 10))
    after = read_counts(page(12, {0.01: 100, 0.02: 100, 0.04: 200, INF: 200}, 1400, 14, 1))
    part = interval(before, after, 2.0)
    assert part.running == 10  # the mean of the two reads
    assert (part.requests, part.aborted) == (4, 1)
    # The interval's median gap is in (0.02, 0.04]: the cumulative one would be 0.01.
    assert part.itl == pytest.approx(0.03)
    assert part.throughput == pytest.approx(400 / 2.0 / 10)
    assert part.value("itl") == part.itl and part.value("throughput") == part.throughput
    assert part.ttft is None  # not exported: no value, never a zero


def test_a_restarted_server_counts_from_zero_not_negative() -> None:
    before = read_counts(page(8, {0.01: 500, INF: 500}, 5000, 50))
    after = read_counts(page(8, {0.01: 0, 0.04: 20, INF: 20}, 200, 2))
    part = interval(before, after, 2.0)
    assert (part.requests, part.aborted) == (2, 0)
    assert part.itl is not None and 0.01 < part.itl <= 0.04
    assert part.throughput == pytest.approx(200 / 2.0 / 8)


def test_an_idle_interval_has_no_throughput() -> None:
    counts = read_counts(page(0, {0.01: 5, INF: 5}, 100, 1))
    part = interval(counts, counts, 2.0)
    assert part.throughput is None and part.itl is None and part.requests == 0


# ---- the split ---------------------------------------------------------------------------


def units(
    count: int, router: bool = True, changed: int | None = None, **more: Any
) -> list[UnitPlan]:
    """`count` replicas of one deployment, on hosts r0…, behind edge/router (or none)."""
    variables = {**DEFAULT_VARS, "model_path": "/m", "tp": 1, **more}
    if router:
        variables["router"] = "edge/router"
    hosts = [Host(f"r{i}", dict(variables)) for i in range(count)]
    edge = Host("edge", {**DEFAULT_VARS, "deployments": {"router": {"template": "router"}}})
    inv = Inventory(
        {h.name: h for h in [*hosts, edge]}, {"all": [*(h.name for h in hosts), "edge"]}, "t"
    )
    targets = deployment_targets([*hosts, edge], resolve=inv.select)
    plans = plan_launch(Project(None), targets, None, None, [], {})
    router = next(t for t in targets if t.name == "edge") if router else None
    changed = count if changed is None else changed
    return [
        UnitPlan(p.host.label, [p], [], ["template"] if i < changed else [], [], [], {}, router)
        for i, p in enumerate(p for p in plans if p.host.name != "edge")
    ]


def test_the_first_replicas_that_differ_are_the_canaries_and_the_rest_the_control() -> None:
    split = plan_canary(units(3, changed=3), replicas=1, restart=False)
    assert [u.name for u in split.candidates] == ["r0"]
    assert [u.name for u in split.controls] == ["r1", "r2"]
    assert split.router == "edge/router"
    two = plan_canary(units(4), replicas=2, restart=False)
    assert [u.name for u in two.candidates] == ["r0", "r1"]


@pytest.mark.parametrize(
    ("replicas", "kwargs", "refusal"),
    [
        (1, {"count": 2, "router": False}, "r0, r1 has no router"),
        (1, {"count": 1}, "a canary needs at least 2 replicas behind one router; 1 selected"),
        (1, {"count": 3, "changed": 0}, "no replica differs from the inventory"),
        (3, {"count": 3}, "--replicas 3 leaves no control among 3 replicas"),
    ],
)
def test_a_split_that_cannot_judge_is_refused_naming_why(
    replicas: int, kwargs: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(UsageError, match=refusal):
        plan_canary(units(**kwargs), replicas=replicas, restart=False)


def test_restart_tries_the_configuration_the_replicas_run_already() -> None:
    split = plan_canary(units(2, changed=0), replicas=1, restart=True)
    assert [u.name for u in split.candidates] == ["r0"]


def test_the_progress_line_shows_each_buckets_samples_and_the_estimate() -> None:
    from deployctl.events import CanaryProgress
    from deployctl.present.live import canary_progress_text

    event = CanaryProgress(
        target="edge/router", samples=12, buckets={"16": [4, 4], "8": [6, 5]},
        estimate=1.0312, low=0.99, high=1.07, elapsed_s=20.0,
    )  # fmt: skip
    assert canary_progress_text(event) == (
        "12 matched samples (bucket 8: 6/5, 16: 4/4) · candidate/control 1.031 [0.990, 1.070]"
    )
    bare = CanaryProgress(
        target="edge/router", samples=0, buckets={}, estimate=None, low=None, high=None,
        elapsed_s=2.0,
    )  # fmt: skip
    assert canary_progress_text(bare) == "0 matched samples"
    # Judging's first rounds on the H200: [0.000, 84447492608131090376916124479391113674752.000].
    early = CanaryProgress(
        target="edge/router", samples=3, buckets={"16": [1, 3]}, estimate=1.601, low=1e-12,
        high=8.4e40, elapsed_s=12.0,
    )  # fmt: skip
    assert canary_progress_text(early).endswith("candidate/control 1.601 [still wide]")
    edge = CanaryProgress(
        target="edge/router", samples=9, buckets={"16": [4, 5]}, estimate=1.0, low=0.1,
        high=10.0, elapsed_s=12.0,
    )  # fmt: skip
    assert canary_progress_text(edge).endswith("[0.100, 10.000]")  # 100 times apart: shown


# ---- the record kept on the router's host ------------------------------------------------


def record(router: str = "edge/router", **more: Any) -> CanaryRecord:
    split = plan_canary(units(2), replicas=1, restart=False)
    report = CanaryReport(split, started_at=1_700_000_000.0)
    return {**canary_record(report, done=False), "router": router, **more}  # type: ignore[typeddict-item]


def keep(state_dir: Path, number: int | None, kept: CanaryRecord) -> int:
    return cmd_canary_keep({"state_dir": str(state_dir), "number": number, "record": kept})[
        "number"
    ]


def test_a_running_record_is_kept_under_a_new_number_then_brought_up_to_date(
    tmp_path: Path,
) -> None:
    first = keep(tmp_path, None, record())
    other = keep(tmp_path, None, record("other/router"))
    assert (first, other) == (1, 2)
    assert keep(tmp_path, first, record(samples=40, state="done", decision="kept")) == first
    found = cmd_canary_records(
        {"state_dir": str(tmp_path), "router": "edge/router", "number": None}
    )
    assert found["numbers"] == [1] and found["unreadable"] == []
    assert found["record"] is not None
    assert (found["record"]["canary"], found["record"]["samples"]) == (1, 40)
    assert found["record"]["state"] == "done"


def test_a_finished_record_is_never_rewritten(tmp_path: Path) -> None:
    number = keep(tmp_path, None, record(state="done", decision="rolled back"))
    before = (tmp_path / "canaries" / f"{number}.json").read_bytes()
    with pytest.raises(CallFailed, match="not this canary's running record"):
        keep(tmp_path, number, record(state="done", decision="promoted"))
    assert (tmp_path / "canaries" / f"{number}.json").read_bytes() == before


def test_another_routers_record_is_never_rewritten(tmp_path: Path) -> None:
    number = keep(tmp_path, None, record())
    with pytest.raises(CallFailed):
        keep(tmp_path, number, record("other/router"))
    with pytest.raises(CallFailed):  # nor a number never kept
        keep(tmp_path, number + 1, record())


def test_records_are_read_by_router_and_number_and_a_broken_one_is_named(
    tmp_path: Path,
) -> None:
    for samples in (10, 20, 30):
        keep(tmp_path, None, record(samples=samples, state="done"))
    keep(tmp_path, None, record("other/router"))
    (tmp_path / "canaries" / "5.json").write_text('{"canary": 5, "router": "edge/router"}')
    args = {"state_dir": str(tmp_path), "router": "edge/router"}
    newest = cmd_canary_records({**args, "number": None})  # type: ignore[typeddict-item]
    assert newest["numbers"] == [1, 2, 3] and newest["record"] is not None
    assert newest["record"]["samples"] == 30
    assert newest["unreadable"] == [str(tmp_path / "canaries" / "5.json")]
    second = cmd_canary_records({**args, "number": 2})  # type: ignore[typeddict-item]
    assert second["record"] is not None and second["record"]["samples"] == 20
    assert cmd_canary_records({**args, "number": 4})["record"] is None  # type: ignore[typeddict-item]


def test_the_record_names_the_split_and_rollback_steps_with_their_runs() -> None:
    split = plan_canary(units(2), replicas=1, restart=False)
    report = CanaryReport(split, decision=Decision.ROLLED_BACK)
    report.split = [UnitResult("r0", UnitOutcome.REPLACED, old_run="a", new_run="b")]
    report.actions = [UnitResult("r0", UnitOutcome.FAILED, old_run="b", error="no GPU")]
    steps = canary_record(report, done=True)["steps"]
    assert [(s["step"], s["old_run"], s["new_run"], s["error"]) for s in steps] == [
        ("split", "a", "b", None),
        ("rollback", "b", None, "no GPU"),
    ]
    assert not shape_problems(canary_record(report, done=True), CanaryRecord, "record")


def test_a_running_kept_canary_is_shown_as_running_not_decided(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployctl.fanout import FleetResult, HostResult
    from deployctl.ops.canary import KeptCanary
    from deployctl.present.views import KEPT_CANARIES

    running = record(canary=3, updated_at=time.time() - 4)
    edge = Host("edge", dict(DEFAULT_VARS))
    KEPT_CANARIES.human(FleetResult([HostResult(edge, KeptCanary("canary", running, [3], []))]))
    out = capsys.readouterr().out
    assert "canary 3 of edge" in out and "running (last written 4 s ago)" in out
    assert "decision" not in out


def test_a_real_sglang_page_gives_the_interval_a_canary_judges() -> None:
    """SGLang 0.5.17 under load on the H200 (tests/data/real-sglang-0.5.17): counters and
    histograms come in several label sets (streaming or not) and are summed; TP rank 0's
    running requests; an interval from an empty read counts everything on the page."""
    page = (DATA / "real-sglang-0.5.17" / "metrics-under-load.txt").read_text()
    counts = read_counts(page)
    assert counts.running == 32
    part = interval(Counts({}, {}, {}), counts, 60.0)
    assert (part.requests, part.aborted) == (1 + 220, 0)  # no abort counted: none exported
    assert part.throughput == pytest.approx((8 + 14080) / 60.0 / 16)  # mean of 0 and 32 running
    # 14,468 gaps, their median in the (0.002, 0.004] bucket; 253 TTFTs, their median near 50 ms.
    assert part.itl is not None and 0.002 < part.itl <= 0.004
    assert part.ttft is not None and 0.04 < part.ttft <= 0.06
