"""watch's supervision policies (ops/supervision.py), each driven alone with the statuses of
made-up rounds: what it decides, and the case that would break it. Pure: no host, no clock."""

from __future__ import annotations

from typing import Any, cast

import pytest

from deployctl import events as ev
from deployctl.choices import PdRole
from deployctl.crash.model import CrashReport
from deployctl.disaggregation import PrefillLoss, TransferWatch
from deployctl.errors import UsageError
from deployctl.fanout import HostResult
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.ops.runs import RunRecord, RunStatus, Unit
from deployctl.ops.supervision import (
    MAX_BACKOFF,
    CrashRestarts,
    Hold,
    PdPairs,
    PdSide,
    RenewBeforeLimit,
    check_renew_window,
)
from deployctl.remote.protocol import Placement


def trace(signature: str) -> CrashReport:
    return CrashReport(
        "RuntimeError", "boom", None, None, None, ("TP0",), 1, signature, signature, "",
    )  # fmt: skip


def status(
    run: str = "r_v1",
    *,
    alive: bool = True,
    health: int | None = 200,
    crash: str | None = None,
    metrics: dict[str, Any] | None = None,
    job: Placement | None = None,
) -> RunStatus:
    """A running run as one look saw it: alive and healthy unless told."""
    record: dict[str, Any] = {"id": run, "status": "running"}
    if job is not None:
        record["job"] = job
    crashes = [] if crash is None else [trace(crash)]
    return RunStatus(
        cast(RunRecord, record), alive=alive, health=health, crashes=crashes, metrics=metrics,
        placement=job,
    )  # fmt: skip


def unit(name: str, *statuses: RunStatus | None) -> Unit:
    """A unit of one node per status (None: a node that could not be read)."""
    nodes = [
        HostResult(Host(f"{name}-{rank}", dict(DEFAULT_VARS)), value)
        for rank, value in enumerate(statuses)
    ]
    return Unit(name, nodes)


DIED = status(alive=False, health=None)


def crashed(signature: str) -> RunStatus:
    return status(health=503, crash=signature)


# ---- CrashRestarts -------------------------------------------------------------------------


def test_a_crashed_unit_is_restarted_then_waits_out_a_doubling_backoff() -> None:
    restarts = CrashRestarts(max_restarts=5, window=600, interval=5)
    dead = unit("a", DIED)
    assert restarts.due(dead, 0.0) and not restarts.due(unit("a", status()), 0.0)
    first = restarts.decide(dead, 0.0)
    assert isinstance(first, ev.Restarting)
    assert (first.target, first.run, first.signature, first.attempt) == ("a", "r_v1", "died", 1)
    assert first.down == []  # a single server names no node
    restarts.relaunched(first, 10.0)
    assert not restarts.due(dead, 14.9) and restarts.due(dead, 15.0)  # 5 s after the relaunch
    second = restarts.decide(dead, 15.0)
    assert isinstance(second, ev.Restarting) and second.attempt == 2
    restarts.relaunched(second, 20.0)
    assert not restarts.due(dead, 29.9) and restarts.due(dead, 30.0)  # 10 s: doubled


def test_the_backoff_stops_growing_at_its_cap() -> None:
    restarts = CrashRestarts(max_restarts=100, window=1e9, interval=60)
    dead = unit("a", DIED)
    for attempt in range(1, 9):
        decision = restarts.decide(dead, float(attempt))
        assert isinstance(decision, ev.Restarting) and decision.attempt == attempt
    restarts.relaunched(decision, 1000.0)
    assert restarts.next_try["a"] == 1000.0 + MAX_BACKOFF


def test_a_crashed_unit_past_its_restart_limit_is_given_up_not_restarted() -> None:
    restarts = CrashRestarts(max_restarts=2, window=600, interval=5)
    dead = unit("a", DIED)
    assert isinstance(restarts.decide(dead, 0.0), ev.Restarting)
    assert isinstance(restarts.decide(dead, 100.0), ev.Restarting)
    loop = restarts.decide(dead, 200.0)  # the third crash within the window
    assert isinstance(loop, ev.CrashLoop)
    assert (loop.crashes, loop.repeated, loop.window_s) == (3, False, 600)
    assert not restarts.due(dead, 1e6)  # never restarted again
    assert restarts.gave_up_on_all([dead])
    assert not restarts.gave_up_on_all([dead, unit("b", status())])  # b is still watched
    assert not restarts.gave_up_on_all([])


def test_crashes_older_than_the_window_do_not_count_toward_the_limit() -> None:
    restarts = CrashRestarts(max_restarts=1, window=60, interval=5)
    dead = unit("a", DIED)
    for now in (0.0, 100.0, 200.0):  # one crash in any window: never a loop
        assert isinstance(restarts.decide(dead, now), ev.Restarting)


def test_the_same_crash_twice_in_a_row_is_a_loop_but_two_deaths_are_not() -> None:
    restarts = CrashRestarts(max_restarts=10, window=600, interval=5)
    oom = unit("a", crashed("cuda-oom"))
    assert isinstance(restarts.decide(oom, 0.0), ev.Restarting)
    loop = restarts.decide(oom, 10.0)
    assert isinstance(loop, ev.CrashLoop) and loop.repeated and loop.signature == "cuda-oom"
    other = CrashRestarts(max_restarts=10, window=600, interval=5)
    for now in (0.0, 10.0, 20.0):  # a death says nothing of why
        assert isinstance(other.decide(unit("b", DIED), now), ev.Restarting)
    assert isinstance(other.decide(unit("b", crashed("nccl")), 30.0), ev.Restarting)


def test_a_unit_with_a_node_that_could_not_be_read_is_not_restarted() -> None:
    restarts = CrashRestarts(max_restarts=1, window=600, interval=5)
    group = unit("g", DIED, None)
    assert restarts.due(group, 0.0) and restarts.decide(group, 0.0) is None
    assert restarts.crashes == {}  # nothing counted toward its limit


def test_a_group_restarts_whole_naming_the_nodes_that_went_down() -> None:
    restarts = CrashRestarts(max_restarts=3, window=600, interval=5)
    decision = restarts.decide(unit("g", status(), DIED), 0.0)
    assert isinstance(decision, ev.Restarting) and decision.down == ["g-1"]


# ---- PdPairs -------------------------------------------------------------------------------

ROUTER = "edge/router"
PREFILL: PdSide = (PdRole.PREFILL, ROUTER)
DECODE: PdSide = (PdRole.DECODE, ROUTER)
NO_PAIR: PdSide = (None, None)


def pairs(window: float = 60, stuck_after: float = 30) -> PdPairs:
    return PdPairs(PrefillLoss(window), TransferWatch(stuck_after))


def failing_decode() -> Unit:
    """A decode alive but failing its health, a failed transfer's trace in its log: as it is
    after its prefill died (sglang#12779)."""
    return unit("gpu0/d0", crashed("kv-transfer"))


def test_a_decode_whose_prefill_died_is_held_not_restarted_and_said_once() -> None:
    pd = pairs()
    assert pd.observe(unit("gpu1/p0", DIED), PREFILL, 100.0) is None
    decode = failing_decode()
    assert decode.crashed  # as any other unit, CrashRestarts would restart it
    first = pd.hold(decode, DECODE, 110.0)
    assert isinstance(first, Hold) and first.first
    assert (first.event.prefill, first.event.down_s, first.event.window_s) == ("gpu1/p0", 10, 60)
    again = pd.hold(decode, DECODE, 120.0)
    assert again is not None and not again.first  # still held, not said again


def test_a_decode_whose_own_process_died_is_restarted_whatever_its_prefill_did() -> None:
    pd = pairs()
    pd.observe(unit("gpu1/p0", DIED), PREFILL, 100.0)
    assert pd.hold(unit("gpu0/d0", DIED), DECODE, 110.0) is None
    assert pd.hold(unit("gpu0/d0", status(), DIED), DECODE, 110.0) is None  # one node of it


def test_a_decode_still_failing_a_window_after_its_prefill_came_back_is_restarted() -> None:
    pd = pairs(window=60)
    pd.observe(unit("gpu1/p0", DIED), PREFILL, 100.0)
    pd.observe(unit("gpu1/p0", status()), PREFILL, 105.0)  # back: not seen down again
    decode = failing_decode()
    assert pd.hold(decode, DECODE, 110.0) is not None
    assert pd.hold(decode, DECODE, 160.0) is None
    pd.observe(unit("gpu1/p0", DIED), PREFILL, 200.0)  # down again: a new hold, said anew
    hold = pd.hold(decode, DECODE, 201.0)
    assert hold is not None and hold.first


def test_a_prefill_or_a_unit_of_no_pair_is_never_held() -> None:
    pd = pairs()
    pd.observe(unit("gpu1/p0", DIED), PREFILL, 100.0)
    assert pd.hold(unit("gpu1/p0", crashed("oom")), PREFILL, 110.0) is None
    assert pd.hold(failing_decode(), NO_PAIR, 110.0) is None
    assert pd.hold(failing_decode(), (PdRole.DECODE, "other/router"), 110.0) is None
    lone = pairs()
    assert lone.observe(unit("solo", DIED), NO_PAIR, 100.0) is None
    assert lone.losses.seen_down == {}  # a unit of no pair is not noted


def test_a_decode_whose_requests_wait_with_no_token_out_is_reported_stuck_once() -> None:
    pd = pairs(stuck_after=30)
    waiting = {"num_running_reqs": 1, "num_decode_transfer_queue_reqs": 2,
               "generation_tokens_total": 500.0, "gen_throughput": 0.0}  # fmt: skip
    decode = unit("gpu0/d0", status(metrics=waiting))
    assert pd.observe(decode, DECODE, 0.0) is None
    stuck = pd.observe(decode, DECODE, 30.0)
    assert isinstance(stuck, ev.StuckTransfer)
    assert (stuck.target, stuck.run, stuck.waiting, stuck.stuck_s) == ("gpu0/d0", "r_v1", 3, 30)
    assert pd.observe(decode, DECODE, 40.0) is None
    moving = unit("gpu0/d0", status(metrics={**waiting, "generation_tokens_total": 900.0}))
    assert pd.observe(moving, DECODE, 50.0) is None  # tokens came out: not stuck
    assert pd.observe(decode, NO_PAIR, 100.0) is None  # not a decode: not its business


# ---- RenewBeforeLimit ----------------------------------------------------------------------


def job(left: float | None, state: str = "RUNNING", id: str = "41") -> Placement:
    return {"id": id, "state": state, "reason": "", "nodes": ["n1"], "head": "10.0.0.7",
            "time_left": left, "exit_code": ""}  # fmt: skip


def test_a_job_near_its_limit_is_renewed_once_and_one_far_from_it_is_not() -> None:
    renewals = RenewBeforeLimit(window=120)
    assert renewals.look("login", status(job=job(3600)), renewing=True) is None
    near = renewals.look("login", status(job=job(100)), renewing=True)
    assert isinstance(near, ev.TimeLimitNear)
    assert (near.run, near.job, near.time_left_s, near.renewing) == ("r_v1", "41", 100, True)
    assert renewals.look("login", status(job=job(90)), renewing=True) is None  # dealt with


def test_a_job_near_its_limit_without_a_router_is_announced_not_renewed() -> None:
    near = RenewBeforeLimit(window=120).look("login", status(job=job(60)), renewing=False)
    assert isinstance(near, ev.TimeLimitNear) and not near.renewing


def test_a_job_not_yet_serving_is_renewed_once_it_serves() -> None:
    renewals = RenewBeforeLimit(window=120)
    starting = status(health=503, job=job(100))
    assert renewals.look("login", starting, renewing=True) is None
    assert isinstance(renewals.look("login", status(job=job(90)), True), ev.TimeLimitNear)


def test_a_run_without_a_time_limit_is_never_renewed() -> None:
    renewals = RenewBeforeLimit(window=120)
    assert renewals.look("gpu0", status(), renewing=True) is None  # a process: no lease
    assert renewals.look("login", status(job=job(None)), renewing=True) is None  # no limit
    assert renewals.look("login", status(job=job(10, "PENDING")), renewing=True) is None


def test_a_successor_within_the_window_as_soon_as_it_serves_is_not_renewed_again() -> None:
    renewals = RenewBeforeLimit(window=120)
    renewals.submitted("r_v2")
    refused = renewals.look("login", status("r_v2", job=job(100, id="42")), renewing=True)
    assert isinstance(refused, ev.Renewed) and refused.state == "refused"
    assert refused.new_run is None and "not renewed again" in refused.error
    # One first seen far from its limit is renewed as any job.
    later = RenewBeforeLimit(window=120)
    later.submitted("r_v2")
    assert later.look("login", status("r_v2", job=job(3600, id="42")), True) is None
    assert isinstance(later.look("login", status("r_v2", job=job(100, id="42")), True),
                      ev.TimeLimitNear)  # fmt: skip


def test_a_window_not_shorter_than_a_jobs_time_limit_is_refused() -> None:
    login = Host("login", {**DEFAULT_VARS, "launcher": "slurm", "slurm_time": "1"})
    with pytest.raises(UsageError, match="not shorter than login's time limit"):
        check_renew_window([login, Host("gpu0", dict(DEFAULT_VARS))], 60)
    check_renew_window([login], 59)
