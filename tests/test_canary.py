"""`deployctl canary`: the split's refusals and what one interval of a replica's /metrics says
(pure); the whole command over real sshd hosts and the real router is in test_canary_lab.py."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deployctl.deployments import deployment_targets
from deployctl.errors import UsageError
from deployctl.inventory import DEFAULT_VARS, Host, Inventory
from deployctl.metrics import Counts, Spans, interval, read_counts
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


def read_of(running: float, tokens: float, finished: float) -> Counts:
    return Counts(
        {"num_running_reqs": running},
        {"generation_tokens_total": tokens, "num_requests_total": finished},
        {},
    )


def steady(spans: Spans, reads: int, every: float, finish_every: float) -> list[Any]:
    """Two requests running all along at 50 tokens/s each; SGLang counts a request's tokens
    when it finishes, one every `finish_every` s (the first at 0.3 s). Read every `every` s
    from 0. Each read's span, or None."""
    out = []
    for i in range(reads):
        at = i * every
        done = math.floor((at - 0.3) / finish_every) + 1 if at >= 0.3 else 0
        out.append(spans.add("r1", 100.0 + at, read_of(2, 100 * finish_every * done, done)))
    return out


def test_a_span_keeps_the_time_of_the_reads_at_which_no_request_finished() -> None:
    # A finish every 0.5 s, a read every 0.25 s: every other read shows one. The old rule (an
    # interval between two reads, dropped without a finish) read 100 tokens/s a request.
    parts = steady(Spans(finishes=1), 11, 0.25, 0.5)
    taken = [p for p in parts if p is not None]
    assert [p is not None for p in parts] == [False] * 4 + [True, False] * 3 + [True]
    assert [p.throughput for p in taken] == pytest.approx([50.0] * 4)
    assert [p.seconds for p in taken] == [0.5] * 4  # from the first read with a finish on
    assert [p.requests for p in taken] == [1] * 4


def test_the_first_span_starts_at_a_read_with_a_finish() -> None:
    # Read at 0, 0.25, 0.5: the first finish (0.3) shows at 0.5. Starting at the first read
    # would give the span from 0 to 0.75 two finishes in 0.75 s: 66.7, not 50.
    parts = steady(Spans(finishes=2), 9, 0.25, 0.25)
    first = next(p for p in parts if p is not None)
    assert parts.index(first) == 4 and first.seconds == 0.5
    assert first.throughput == pytest.approx(50.0)


def test_a_span_holds_enough_finishes_that_a_read_of_rounding_does_not_swing_it() -> None:
    # A finish every 0.75 s read every 0.5 s: one-finish spans are 0.5 or 1 s long (a rate
    # of 75 or 37.5 for a true 50); three-finish spans are 2 or 2.5 s (56.25 or 45).
    one = [p.throughput for p in steady(Spans(finishes=1), 40, 0.5, 0.75) if p]
    three = [p.throughput for p in steady(Spans(finishes=3), 40, 0.5, 0.75) if p]
    assert sorted({round(v, 2) for v in one}) == [37.5, 75.0]
    assert sorted({round(v, 2) for v in three}) == [45.0, 56.25] and len(three) >= 7, three
    assert [p.requests for p in steady(Spans(), 40, 0.5, 0.75) if p][:3] == [3, 3, 3]


def test_a_spans_load_is_the_time_weighted_mean_of_its_reads() -> None:
    spans = Spans(finishes=1)
    assert spans.add("r1", 9.0, read_of(2, 0, 0)) is None  # the first read: nothing before
    assert spans.add("r1", 10.0, read_of(2, 40, 1)) is None  # a finish: the span starts
    assert spans.add("r1", 11.0, read_of(4, 40, 1)) is None  # none finished: it goes on
    part = spans.add("r1", 13.0, read_of(4, 160, 3))
    assert part is not None
    # 1 s between 2 and 4 running (mean 3), then 2 s at 4: 11 request-seconds over 3 s.
    assert part.running == pytest.approx(11 / 3)
    assert part.throughput == pytest.approx(120 / 11)
    # The next span starts at the read that ended this one; other servers have their own.
    assert spans.add("r2", 13.0, read_of(1, 500, 9)) is None
    later = spans.add("r1", 14.0, read_of(4, 200, 4))
    assert later is not None and later.seconds == 1.0 and later.throughput == 10.0


def test_a_restart_ends_the_open_span_and_the_next_starts_at_a_finish_after_it() -> None:
    spans = Spans(finishes=1)
    spans.add("r1", 0.0, read_of(2, 5000, 50))
    assert spans.add("r1", 1.0, read_of(2, 5100, 51)) is None  # a finish: a span starts
    assert spans.add("r1", 2.0, read_of(2, 0, 0)) is None  # the counters went back
    assert spans.add("r1", 3.0, read_of(2, 100, 1)) is None  # the first finish since
    part = spans.add("r1", 5.0, read_of(2, 300, 3))
    # Only the time since that finish: the old span's 1 s and the restart are not in it.
    assert part is not None and part.seconds == 2.0
    assert part.throughput == pytest.approx(200 / 2.0 / 2)


# ---- the split ---------------------------------------------------------------------------


def units(
    count: int,
    router: bool = True,
    changed: int | None = None,
    router_unit: bool = False,
    roles: Sequence[str | None] = (),
    **more: Any,
) -> list[UnitPlan]:
    """`count` replicas of one deployment, on hosts r0…, behind edge/router (or none);
    `router_unit`: the router's own unit first, as a rollout of all of them plans it;
    `roles`: each replica's `role` in turn (prefill, decode; None: whole requests)."""
    variables = {**DEFAULT_VARS, "model_path": "/m", "tp": 1, **more}
    if router:
        variables["router"] = "edge/router"
    hosts = [
        Host(f"r{i}", {**variables, **({"role": roles[i]} if i < len(roles) else {})})
        for i in range(count)
    ]
    edge = Host("edge", {**DEFAULT_VARS, "deployments": {"router": {"template": "router"}}})
    inv = Inventory(
        {h.name: h for h in [*hosts, edge]}, {"all": [*(h.name for h in hosts), "edge"]}, "t"
    )
    targets = deployment_targets([*hosts, edge], resolve=inv.select)
    plans = plan_launch(Project(None), targets, None, None, [], {})
    router = next(t for t in targets if t.name == "edge") if router else None
    changed = count if changed is None else changed
    edge_units = [
        UnitPlan(p.host.label, [p], [], ["template"], [], [], {}, None)
        for p in plans
        if p.host.name == "edge" and router_unit
    ]
    return edge_units + [
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


def test_the_router_among_the_selected_units_is_neither_canary_nor_control() -> None:
    split = plan_canary(units(3, router_unit=True), replicas=1, restart=False)
    assert [u.name for u in split.candidates] == ["r0"]
    assert [u.name for u in split.controls] == ["r1", "r2"]


def test_the_canaries_are_replicas_that_differ_not_merely_the_first() -> None:
    plans = units(4, changed=0)
    plans[2].reasons = plans[3].reasons = ["template"]  # r2 and r3 differ from the inventory
    split = plan_canary(plans, replicas=1, restart=False)
    assert [u.name for u in split.candidates] == ["r2"]
    # r0 and r1 already run the inventory's configuration: no control for it.
    assert [u.name for u in split.controls] == ["r3"] and split.already_current == ["r0", "r1"]


def test_replicas_already_on_the_new_configuration_leave_no_control_and_are_refused() -> None:
    plans = units(3, changed=0)
    plans[1].reasons = ["template"]  # only r1 still runs the old configuration
    with pytest.raises(UsageError, match=r"leaves no control: r0, r2 already run") as refused:
        plan_canary(plans, replicas=1, restart=False)
    assert refused.value.hint is not None and "--restart" in refused.value.hint
    plans[2].reasons = ["template"]
    with pytest.raises(UsageError) as refused:
        plan_canary(plans, replicas=2, restart=False)
    assert refused.value.hint == "at most --replicas 1"
    split = plan_canary(plans, replicas=1, restart=True)  # the same configuration compared
    assert [u.name for u in split.controls] == ["r1", "r2"]


def test_replicas_of_several_routers_are_refused() -> None:
    import dataclasses

    plans = units(3)
    other = Host("edge2", dict(DEFAULT_VARS), deployment="router")
    plans[2] = dataclasses.replace(plans[2], router=other)
    with pytest.raises(UsageError, match=r"several routers \(edge/router, edge2/router\)"):
        plan_canary(plans, replicas=1, restart=False)


def test_no_replica_or_every_replica_as_canary_is_refused_with_the_most_allowed() -> None:
    with pytest.raises(UsageError, match="--replicas must be 1 or more"):
        plan_canary(units(3), replicas=0, restart=False)
    with pytest.raises(UsageError) as refused:
        plan_canary(units(3), replicas=3, restart=False)
    assert refused.value.hint == "at most --replicas 2"
    assert len(plan_canary(units(3), replicas=2, restart=False).controls) == 1


def running_as(unit: UnitPlan, mode: str | None) -> None:
    """The replica's current run: started with `--disaggregation-mode mode` (None: none)."""
    flags = "" if mode is None else f" --disaggregation-mode {mode}"
    run = {"command": f"python -m sglang.launch_server --port 30000{flags}"}
    unit.statuses = [SimpleNamespace(run=run)]  # type: ignore[list-item]


def test_a_canary_compares_one_role_and_leaves_prefills_out() -> None:
    """Prefills p, decodes d behind one PD router: the canary judges decodes against
    decodes; a prefill yields no time to first token or inter-token latency in SGLang, so
    the prefills that differ are neither canary nor control (and no promotion touches them)."""
    split = plan_canary(units(4, roles=["prefill", "decode", "prefill", "decode"]), 1, False)
    assert [u.name for u in split.candidates] == ["r1"]
    assert [u.name for u in split.controls] == ["r3"]
    assert list(split.not_judged) == ["r0", "r2"] and split.already_current == []
    assert "a prefill records no time to first token" in split.not_judged["r0"]
    # A prefill that matches the inventory is only already on it.
    plans = units(3, changed=2, roles=["decode", "decode", "prefill"])
    split = plan_canary(plans, 1, False)
    assert split.not_judged == {} and split.already_current == ["r2"]
    # Two prefills and one decode: one replica to judge, refused, the prefills named.
    with pytest.raises(UsageError) as refused:
        plan_canary(units(3, roles=["prefill", "prefill", "decode"]), 1, False)
    assert refused.value.message.startswith(
        "a canary needs at least 2 replicas behind one router; 1 selected to judge "
        "(not judged: r0: a prefill records no time to first token or inter-token latency; r1:"
    ), refused.value.message


def test_a_replica_whose_role_changes_or_runs_as_a_prefill_is_not_judged() -> None:
    """The run's own command says as what it serves now, whatever the inventory says next."""
    plans = units(4, roles=["decode"] * 4)
    running_as(plans[0], "prefill")  # runs as a prefill, to become a decode
    running_as(plans[1], None)  # serves whole requests, to become a decode
    running_as(plans[2], "decode")
    split = plan_canary(plans, 1, False)
    assert [u.name for u in [*split.candidates, *split.controls]] == ["r2", "r3"]
    assert split.not_judged["r1"] == "its role changes (whole requests → decode)"
    assert split.not_judged["r0"].startswith("a prefill records")


def test_replicas_of_two_roles_are_refused() -> None:
    with pytest.raises(UsageError, match=r"different roles: r0 \(decode\), r1 \(whole requests\)"):
        plan_canary(units(3, roles=["decode", None, "decode"]), 1, False)


def test_restart_tries_the_configuration_the_replicas_run_already() -> None:
    split = plan_canary(units(2, changed=0), replicas=1, restart=True)
    assert [u.name for u in split.candidates] == ["r0"]


def scripted_canary(
    candidate_rate: float, finish_every: int, noise: float, max_duration: float = 20
) -> tuple[Any, str, CanaryReport, int]:
    """A canary judging throughput over scripted reads, one round every 0.25 s of its own
    clock (`--interval 0`: no round waits): both replicas run 4 requests, the control at 50
    tokens/s each with a finish at every read, the candidate at `candidate_rate` with a finish
    every `finish_every` reads (SGLang counts a request's tokens when it finishes), each
    finish's tokens off by up to `noise` (a fraction, at random). Its verdict, why it ended,
    its report and its rounds."""
    import random
    import threading
    from functools import partial

    from deployctl.events import DISCARD
    from deployctl.ops.canary import Canary, CanaryOptions
    from tests.scripted_reads import ScriptedFleet

    plan = plan_canary(units(2), replicas=1, restart=False)
    router = plan.candidates[0].router
    assert router is not None
    tokens = {"candidate": 0.0, "control": 0.0}
    finished = {"candidate": 0, "control": 0}
    jitter = random.Random(7)

    def replica(who: str, per_request: float, every: int, i: int) -> Counts:
        if i > 0 and i % every == 0:  # a finish: the tokens since the last one
            finished[who] += 1
            tokens[who] += per_request * 4 * 0.25 * every * (1 + jitter.uniform(-noise, noise))
        return read_of(4, tokens[who], finished[who])

    fleet = ScriptedFleet(0.25, [
        (plan.candidates[0].rank0, partial(replica, "candidate", candidate_rate, finish_every)),
        (plan.controls[0].rank0, partial(replica, "control", 50, 1)),
    ], router, start=100.0)  # fmt: skip
    canary: Any = Canary.__new__(Canary)
    canary.fleet, canary.plan, canary.events, canary.clock = fleet, plan, DISCARD, fleet.clock
    canary.options = CanaryOptions(
        metric="throughput", min_samples=5, interval=0, max_duration=max_duration
    )
    canary.cancel = threading.Event()
    canary.keeper = SimpleNamespace(router=router, keep=lambda *a: None, number=None, error="")
    report = CanaryReport(plan, canary.options)
    verdict, why, _ = canary._judge(report)
    assert fleet.keeps_agents  # a read a round: one kept agent per host, not a process a read
    return verdict, why, report, fleet.rounds


def test_a_throughput_canary_keeps_the_time_of_reads_at_which_no_request_finished() -> None:
    # Read by intervals with a finish, a candidate whose requests finish every 4th read would
    # show 4 reads' tokens in one: 140 tokens/s a request against the control's 50.
    for every in (1, 4):
        verdict, why, _, _ = scripted_canary(35, every, noise=0.04)
        assert verdict.state == "regression", (every, why, verdict)
        # The estimate is control ÷ candidate.
        assert verdict.estimate == pytest.approx(50 / 35, rel=0.03), (every, verdict)


def test_a_canary_that_cannot_decide_ends_at_max_duration_by_its_own_clock() -> None:
    # 2 % slower with ±40 % noise: no verdict either way in 30 s of the canary's clock (121
    # rounds of 0.25 s), however fast the rounds run on this machine.
    verdict, why, report, rounds = scripted_canary(49, 1, noise=0.4, max_duration=30)
    assert verdict.state not in ("regression", "no_regression"), (why, verdict)
    assert why == "inconclusive after 30s", why
    assert report.elapsed_s == 30.0 and rounds == 121, (report.elapsed_s, rounds)


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
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deployctl.fanout import FleetResult, HostResult
    from deployctl.ops.canary import KeptCanary
    from deployctl.present.views import KEPT_CANARIES

    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now)  # the view's "ago" read on a busy machine
    running = record(canary=3, updated_at=now - 4)
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


# ---- the record's and the report's fields, the views -----------------------------------------


def judged(decision: Decision | None = None, **more: Any) -> CanaryReport:
    """A canary of r0 against r1, r2 that judged a 10 % regression at bucket 8."""
    from deployctl.canary_stats import BucketStat, Verdict
    from deployctl.ops.canary import CanaryOptions

    bucket = BucketStat(8, 20, 20, 0.010, 0.011, 1.1)
    empty = BucketStat(16, 3, 0, 0.012, None, None)
    return CanaryReport(
        plan_canary(units(3), replicas=1, restart=False),
        CanaryOptions(metric="ttft", max_regression=0.08, confidence=0.9),
        verdict=Verdict("regression", 1.1, 1.06, 1.14, [bucket, empty], 40),
        decision=decision,
        reason="ttft regressed",
        **more,
    )


def test_the_record_says_what_was_tried_against_what_and_what_came_of_it() -> None:
    record = canary_record(judged(Decision.ROLLED_BACK), done=True)
    assert (record["candidates"], record["controls"]) == (["r0"], ["r1", "r2"])
    assert (record["metric"], record["max_regression"], record["confidence"]) == ("ttft", 0.08, 0.9)
    assert (record["verdict"], record["estimate"], record["low"], record["high"]) == (
        "regression", 1.1, 1.06, 1.14,
    )  # fmt: skip
    assert record["samples"] == 40 and record["decision"] == "rolled back"
    assert record["buckets"][1] == {
        "bucket": 16, "control_n": 3, "candidate_n": 0, "control": 0.012, "candidate": None,
        "ratio": None,
    }  # fmt: skip
    assert not shape_problems(record, CanaryRecord, "record")


def test_the_record_is_planned_for_a_dry_run_running_while_judged_then_done() -> None:
    assert canary_record(judged(), done=False)["state"] == "running"
    assert canary_record(judged(), done=True)["state"] == "done"
    assert canary_record(judged(dry_run=True), done=True)["state"] == "planned"


def test_a_promotions_steps_are_named_promotion() -> None:
    report = judged(Decision.PROMOTED)
    report.actions = [UnitResult("r1", UnitOutcome.REPLACED, old_run="c", new_run="d")]
    [step] = canary_record(report, done=True)["steps"]
    assert (step["step"], step["unit"], step["error"]) == ("promotion", "r1", None)


@pytest.mark.parametrize(
    ("decision", "action", "more", "ok"),
    [
        (Decision.PROMOTED, UnitOutcome.REPLACED, {}, True),
        (Decision.KEPT, None, {}, True),
        (None, None, {"dry_run": True}, True),
        (Decision.PROMOTED, UnitOutcome.FAILED, {}, False),
        (Decision.ROLLED_BACK, UnitOutcome.REPLACED, {}, False),
        (Decision.FAILED, None, {}, False),
        (Decision.KEPT, None, {"interrupted": True}, False),
        (None, None, {}, False),
    ],
)
def test_a_canary_is_ok_only_when_a_clear_verdict_was_acted_on(
    decision: Decision | None, action: UnitOutcome | None, more: dict[str, Any], ok: bool
) -> None:
    from deployctl.present.documents import canary_document

    report = judged(decision, **more)
    report.actions = [] if action is None else [UnitResult("r1", action)]
    assert report.ok is ok
    assert canary_document(report)["ok"] is ok


def test_a_kept_canary_not_found_says_which_and_what_is_kept() -> None:
    from deployctl.ops.kept import Kept

    assert Kept("canary", None, [], []).missing == "no canary is kept here (kept: none)"
    wanted = Kept("canary", None, [1, 3], [], 2)
    assert wanted.missing == "no canary 2 is kept here (kept: 1, 3)" and not wanted.ok
    assert wanted.hint == "deployctl canary"
    found = Kept("canary", record(), [1], [], 1)
    assert found.ok and found.missing == ""
    from deployctl.present.documents import kept_json

    assert kept_json(wanted)["error"] == wanted.missing and "error" not in kept_json(found)


def test_a_new_record_carries_its_number_and_follows_the_highest_kept(tmp_path: Path) -> None:
    folder = tmp_path / "canaries"
    folder.mkdir()
    (folder / "5.json").write_text("{}")  # the older ones removed: numbers are never reused
    (folder / "notes.txt").write_text("")
    assert keep(tmp_path, None, record()) == 6
    assert json.loads((folder / "6.json").read_text())["canary"] == 6


def test_the_human_view_says_where_the_canary_is_kept_or_why_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployctl.present.views import CANARY

    report = judged(Decision.ROLLED_BACK, kept=4)
    report.actions = [UnitResult("r0", UnitOutcome.FAILED, error="no GPU")]
    CANARY.human(report)
    out = capsys.readouterr()
    assert "kept as canary 4 on edge/router: deployctl canary --report 4" in out.out
    assert "verdict: regression · candidate/control 1.100 [1.060, 1.140]" in out.out
    assert "decision: rolled back (ttft regressed)" in out.out
    rows = [line.split() for line in out.out.splitlines()]
    assert ["16", "0.012", "-", "-", "3/0"] in rows  # bucket 16: the candidate never there
    CANARY.human(judged(keep_error="no space left on device"))
    out = capsys.readouterr()
    assert "not kept: no space left on device" in out.err
    assert "decision: none (ttft regressed)" in out.out


def test_the_dry_run_view_names_the_canaries_and_the_control(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployctl.present.views import CANARY

    CANARY.human(judged(dry_run=True))
    assert "edge/router: canary r0; control r1, r2\n" in capsys.readouterr().out
    plans = units(4, changed=0)
    plans[1].reasons = plans[3].reasons = ["template"]
    report = CanaryReport(plan_canary(plans, replicas=1, restart=False), dry_run=True)
    CANARY.human(report)
    assert "edge/router: canary r1; control r3; already on it: r0, r2" in capsys.readouterr().out
    assert CANARY.document(report)["already_current"] == ["r0", "r2"]


def test_a_kept_canarys_steps_show_their_runs_and_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployctl.fanout import FleetResult, HostResult
    from deployctl.ops.canary import KeptCanary
    from deployctl.present.views import KEPT_CANARIES

    report = judged(Decision.ROLLED_BACK, kept=2)
    report.split = [UnitResult("r0", UnitOutcome.REPLACED, old_run="a", new_run="b")]
    report.actions = [UnitResult("r0", UnitOutcome.FAILED, old_run="b", error="no GPU")]
    kept = canary_record(report, done=True)
    edge = Host("edge", dict(DEFAULT_VARS))
    KEPT_CANARIES.human(FleetResult([HostResult(edge, KeptCanary("canary", kept, [2], []))]))
    out = capsys.readouterr().out
    assert "canary 2 of edge" in out and "(max regression 8%, confidence 0.9)" in out
    assert "split r0 replaced (a → b)" in out
    assert "rollback r0 failed (b → -): no GPU" in out


def test_the_json_document_says_why_the_record_was_not_kept() -> None:
    from deployctl.present.documents import canary_document

    assert canary_document(judged(keep_error="disk full"))["keep_error"] == "disk full"
    assert canary_document(judged())["keep_error"] is None


# ---- the command's refusals, before any host is asked -----------------------------------------


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    """Two replicas of an unreachable host, no router."""
    import yaml

    path = tmp_path / "inv.yml"
    deployments = {"a": {"gpus": [0], "port": 30000}, "b": {"gpus": [1], "port": 30001}}
    hosts = {"h1": {"ansible_host": "127.0.0.9", "model_path": "/m", "deployments": deployments}}
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


@pytest.mark.parametrize(
    ("args", "refusal", "code"),
    [
        (["3"], "a canary number is given only with --report", 1),
        (["--report"], "no selected deployment is a router or behind one", 1),
        (["--report", "0"], "Invalid value for '[N]'", 2),
        (["--replicas", "0"], "Invalid value for '--replicas'", 2),
        (["--min-samples", "1"], "Invalid value for '--min-samples'", 2),
        (["--max-regression", "0"], "Invalid value for '--max-regression'", 2),
        (["--confidence", "1"], "Invalid value for '--confidence'", 2),
        (["--interval", "0.1"], "Invalid value for '--interval'", 2),
    ],
)
def test_the_command_refuses_bad_input_naming_it(
    cli: Any, inventory: Path, args: list[str], refusal: str, code: int
) -> None:
    result = cli("canary", "-i", str(inventory), *args)
    assert result.returncode == code, result.stderr
    assert refusal in " ".join(result.stderr.split()), result.stderr


@pytest.fixture
def faked_canary(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The command run in this process up to its canary: the rollout's plan of three
    replicas of edge/router (changed unless --restart), the canary itself recorded."""
    from deployctl.ops import canary as canary_module
    from deployctl.ops import rollout as rollout_module

    seen: dict[str, Any] = {}

    def plan_rollout(fleet: Any, plans: Any, catalog: Any, sets: Any, restart: bool) -> Any:
        seen["restart"] = restart
        return units(3, changed=0 if restart else 3)

    def canary(fleet: Any, split: Any, catalog: Any, sets: Any, options: Any, events: Any) -> Any:
        seen["options"], seen["split"] = options, split
        return CanaryReport(split, options, decision=Decision.KEPT)

    monkeypatch.setattr(rollout_module, "plan_rollout", plan_rollout)
    monkeypatch.setattr(canary_module, "canary", canary)
    return seen


def test_the_commands_options_reach_the_canary(
    faked_canary: dict[str, Any], inventory: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deployctl.cli import run

    argv = ["canary", "-i", str(inventory), "--json"]
    assert run(argv) == 0
    options = faked_canary["options"]
    assert (options.metric, options.max_regression, options.confidence) == ("itl", 0.05, 0.95)
    assert (options.min_samples, options.max_duration, options.interval) == (20, 1800.0, 2.0)
    assert options.promote and not options.rollout.restart and not faked_canary["restart"]
    capsys.readouterr()
    run([*argv, "--metric", "ttft", "--max-regression", "8", "--confidence", "0.9",
         "--min-samples", "30", "--max-duration", "90s", "--interval", "5", "--no-promote",
         "--restart", "--replicas", "2"])  # fmt: skip
    options = faked_canary["options"]
    assert (options.metric, options.max_regression, options.confidence) == ("ttft", 0.08, 0.9)
    assert (options.min_samples, options.max_duration, options.interval) == (30, 90.0, 5.0)
    assert not options.promote and options.rollout.restart and faked_canary["restart"]
    # --restart tries the configuration the replicas run already (none differs here).
    assert [u.name for u in faked_canary["split"].candidates] == ["r0", "r1"]
    assert json.loads(capsys.readouterr().out)["decision"] == "kept"


def test_a_dry_run_shows_the_split_and_runs_no_canary(
    faked_canary: dict[str, Any], inventory: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deployctl.cli import run

    assert run(["canary", "-i", str(inventory), "--dry-run"]) == 0
    assert "edge/router: canary r0; control r1, r2" in capsys.readouterr().out
    assert "options" not in faked_canary
    run(["canary", "-i", str(inventory), "--dry-run", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert (document["dry_run"], document["state"], document["ok"]) == (True, "planned", True)
