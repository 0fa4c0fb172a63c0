"""Prefill/decode pairs: roles render SGLang's flags, and what SGLang would refuse (or break on
under load) is refused or warned about before anything starts. Pure: no host is touched."""

from __future__ import annotations

from typing import Any, cast

import pytest

from deployctl.choices import PdRole
from deployctl.crash.model import CrashReport
from deployctl.deployments import deployment_targets
from deployctl.disaggregation import (
    PdRouter,
    PdServer,
    PrefillLoss,
    TransferWatch,
    check_router,
    check_server,
    unreachable_from,
)
from deployctl.errors import InventoryError, PreflightError
from deployctl.fanout import HostResult
from deployctl.inventory import DEFAULT_VARS, Host, Inventory
from deployctl.metrics import parse_metrics
from deployctl.ops.plan import Plan, ib_device_paths, plan_launch, routing_check
from deployctl.ops.rollout import UnitPlan, lacking_roles, rollout_order
from deployctl.ops.router import ListedWorker, RouterState, WorkerKind
from deployctl.ops.runs import RunRecord, RunStatus, Unit
from deployctl.ops.supervision import held_decode
from deployctl.patchset import command_flags
from deployctl.project import Project

ROUTER = {"template": "router", "pd": True, "port": 8000, "bind_host": "0.0.0.0"}


def fleet(
    gpu1: dict[str, dict[str, Any]],
    gpu2: dict[str, dict[str, Any]] | None = None,
    only: str | None = None,
    **shared: Any,
) -> tuple[Inventory, list[Plan]]:
    """Plan every deployment of `gpu1` (and `gpu2`) with a PD router on `edge`; `only`: plan
    only the deployment of that label, as a launch of it alone does."""
    base = {**DEFAULT_VARS, "model_path": "/models/m", "tp": 4, "bind_host": "0.0.0.0", **shared}
    hosts = [
        Host("gpu1", {**base, "ansible_host": "10.0.0.5", "deployments": gpu1}),
        Host("edge", {**DEFAULT_VARS, "ansible_host": "10.0.0.9",
                      "deployments": {"router": dict(ROUTER)}}),
    ]  # fmt: skip
    if gpu2 is not None:
        hosts.append(Host("gpu2", {**base, "ansible_host": "10.0.0.6", "deployments": gpu2}))
    inv = Inventory({h.name: h for h in hosts}, {"all": [h.name for h in hosts]}, "test")
    targets = deployment_targets(hosts, resolve=inv.select)
    targets = [t for t in targets if only is None or t.label == only]
    return inv, plan_launch(Project(None), targets, None, None, [], {})


def pair(**decode: Any) -> dict[str, dict[str, Any]]:
    return {
        "p0": {"role": "prefill", "port": 30001, "gpus": [0, 1, 2, 3], "router": "edge/router"},
        "d0": {"role": "decode", "port": 30002, "gpus": [4, 5, 6, 7], "router": "edge/router",
               **decode},
    }  # fmt: skip


def plan_of(plans: list[Plan], label: str) -> Plan:
    return next(p for p in plans if p.host.label == label)


def test_roles_render_sglangs_disaggregation_flags_and_a_pd_router_its_mode() -> None:
    _, plans = fleet(pair(ib_device="mlx5_0,mlx5_1"), bootstrap_port=9100)
    prefill = command_flags(plan_of(plans, "gpu1/p0").rendered.argv)
    decode = command_flags(plan_of(plans, "gpu1/d0").rendered.argv)
    router = plan_of(plans, "edge/router").rendered.argv
    assert prefill["--disaggregation-mode"] == "prefill"
    assert prefill["--disaggregation-bootstrap-port"] == "9100"
    assert prefill["--disaggregation-transfer-backend"] == "mooncake"
    assert decode["--disaggregation-mode"] == "decode"
    # A decode learns the prefill's bootstrap port from the router, per request.
    assert "--disaggregation-bootstrap-port" not in decode
    assert decode["--disaggregation-ib-device"] == "mlx5_0,mlx5_1"
    assert "--pd-disaggregation" in router
    assert plan_of(plans, "gpu1/p0").extra_ports == {9100: "bootstrap_port, where decodes fetch KV"}
    assert plan_of(plans, "gpu1/d0").extra_ports == {}
    # Checked free where SGLang binds them: its --host (the bootstrap server, the router's
    # --prometheus-host), not on every address.
    bind_host = plan_of(plans, "gpu1/p0").host.settings.bind_host
    assert plan_of(plans, "gpu1/p0").extra_port_addresses == {9100: bind_host}
    router_plan = plan_of(plans, "edge/router")
    assert set(router_plan.extra_port_addresses.values()) == {router_plan.host.settings.bind_host}


def test_a_server_without_a_role_renders_no_disaggregation_flag() -> None:
    hosts = [Host("gpu1", {**DEFAULT_VARS, "model_path": "/m", "tp": 1})]
    plans = plan_launch(Project(None), hosts, None, None, [], {})
    assert not [a for a in plans[0].rendered.argv if "disaggregation" in a]
    assert plans[0].pd_role is None and plans[0].extra_ports == {}


def test_a_role_that_is_not_prefill_or_decode_is_refused_naming_the_variable() -> None:
    with pytest.raises(
        InventoryError, match=r"host gpu1, deployment p0: role 'prefil' is not prefill or decode"
    ):
        fleet({"p0": {"role": "prefil", "router": "edge/router"}})


def test_two_prefills_on_one_host_need_their_own_bootstrap_ports() -> None:
    two = {
        "p0": {"role": "prefill", "port": 30001, "gpus": [0, 1, 2, 3], "router": "edge/router"},
        "p1": {"role": "prefill", "port": 30003, "gpus": [4, 5, 6, 7], "router": "edge/router"},
    }
    with pytest.raises(PreflightError, match="gpu1/p1's bootstrap_port 8998 is also gpu1/p0's"):
        fleet(two)
    two["p1"]["bootstrap_port"] = 8999
    _, plans = fleet(two)
    assert {p.bootstrap_port for p in plans if p.pd_role} == {8998, 8999}


def test_a_bootstrap_port_that_is_a_server_port_on_the_host_is_refused() -> None:
    with pytest.raises(PreflightError, match="gpu1/p0's bootstrap_port 30002 is also gpu1/d0's"):
        fleet(pair(), bootstrap_port=30002)


def test_prefills_on_two_hosts_may_use_the_same_bootstrap_port() -> None:
    gpu2 = {"p1": {"role": "prefill", "port": 30001, "gpus": [0], "router": "edge/router"}}
    _, plans = fleet(pair(), gpu2)
    assert [p.bootstrap_port for p in plans if p.pd_role is PdRole.PREFILL] == [8998, 8998]


def checked(inv: Inventory, plans: list[Plan], label: str) -> tuple[list[str], list[str]]:
    found = routing_check(inv.select, plan_of(plans, label))
    return found.problems, found.warnings


def test_a_matching_pair_passes_and_a_pd_router_with_both_roles_too() -> None:
    inv, plans = fleet(pair())
    for label in ("gpu1/p0", "gpu1/d0", "edge/router"):
        assert checked(inv, plans, label) == ([], []), label


def test_a_loopback_prefill_is_refused_when_a_decode_is_on_another_host() -> None:
    gpu2 = {"d1": {"role": "decode", "port": 30002, "gpus": [0], "router": "edge/router"}}
    loopback = {"bind_host": "127.0.0.1", "worker_url": "http://10.0.0.5:30001"}
    gpu1 = pair()
    gpu1["p0"].update(loopback)
    inv, plans = fleet(gpu1, gpu2)
    problems, _ = checked(inv, plans, "gpu1/p0")
    assert problems == [
        "gpu2/d1 cannot fetch KV from gpu1/p0: its bootstrap server listens on loopback "
        "(127.0.0.1) (sglang#10001)",
        "gpu1/p0's bootstrap server listens on loopback (127.0.0.1), where decodes sent by its "
        "router edge/router (on 10.0.0.9) cannot reach it (sglang#10001)",
    ]
    # The decode on the prefill's own machine reaches a loopback bootstrap server...
    problems, _ = checked(inv, plans, "gpu1/d0")
    assert problems == []
    # ...and the other one is told why it would fail.
    problems, _ = checked(inv, plans, "gpu2/d1")
    assert problems == [
        "gpu2/d1 cannot fetch KV from gpu1/p0: its bootstrap server listens on loopback "
        "(127.0.0.1) (sglang#10001)"
    ]


def test_a_prefill_on_loopback_is_reachable_from_elsewhere_only_at_its_worker_url() -> None:
    def prefill(bind: str, url_host: str = "") -> PdServer:
        return PdServer("h/p", PdRole.PREFILL, "/m", 1, 1, "mooncake", "10.0.0.5", bind, url_host)

    assert not unreachable_from(prefill("0.0.0.0"), "10.0.0.6")
    assert not unreachable_from(prefill("10.0.0.5"), "10.0.0.6")
    assert unreachable_from(prefill("127.0.0.1"), "10.0.0.6")
    assert not unreachable_from(prefill("127.0.0.1"), "10.0.0.5")  # its own machine
    assert not unreachable_from(prefill("127.0.0.1"), "10.5")  # its own, written another way
    # A worker_url at the address it listens on is the user's word that it is reached there
    # (a tunnel, or machines that share a loopback); one elsewhere is not.
    assert not unreachable_from(prefill("127.0.0.2", "127.0.0.2"), "10.0.0.6")
    assert unreachable_from(prefill("127.0.0.1", "10.0.0.5"), "10.0.0.6")


def test_a_pair_serving_two_models_or_two_backends_is_refused() -> None:
    inv, plans = fleet(pair(model_path="/models/other"))
    problems, _ = checked(inv, plans, "gpu1/d0")
    assert problems == [
        "gpu1/d0 serves /models/other but gpu1/p0, behind the same router, serves /models/m"
    ]
    inv, plans = fleet(pair(transfer_backend="nixl"))
    problems, _ = checked(inv, plans, "gpu1/p0")
    assert problems == ["gpu1/p0 moves KV with mooncake but gpu1/d0 with nixl"]


def test_a_decode_pp_other_than_the_prefills_or_1_is_refused_and_prefill_pp_warned() -> None:
    inv, plans = fleet(pair(extra_args=["--pp-size", "4"]))
    problems, _ = checked(inv, plans, "gpu1/d0")
    assert problems == [
        "gpu1/d0 has pipeline parallelism 4, but its prefill gpu1/p0 has 1: a decode's must be "
        "the prefill's or 1"
    ]
    both = {name: {**vars_, "extra_args": ["--pp-size", "2"]} for name, vars_ in pair().items()}
    inv, plans = fleet(both)
    problems, warnings = checked(inv, plans, "gpu1/p0")
    assert problems == [] and any("sglang#8424" in w for w in warnings), warnings


def test_different_tp_is_refused_unless_the_model_is_mla_then_warned() -> None:
    inv, plans = fleet(pair(tp=2))
    found = routing_check(inv.select, plan_of(plans, "gpu1/d0"), mla=False)
    assert found.problems == [
        "gpu1/d0 has TP 2 and gpu1/p0 TP 4: the model is not MLA, and a non-MLA model crashes "
        "under load with different TP (sglang#15674)"
    ]
    unknown = routing_check(inv.select, plan_of(plans, "gpu1/d0"), mla=None)
    assert "not known to be MLA" in unknown.problems[0]
    mla = routing_check(inv.select, plan_of(plans, "gpu1/d0"), mla=True)
    assert mla.problems == []
    assert mla.warnings == [
        "gpu1/d0 has TP 2 and gpu1/p0 TP 4: an MLA model may differ, but watch it under load "
        "(sglang#15674)"
    ]
    # One TP on both sides: nothing to say, MLA or not.
    inv, plans = fleet(pair())
    assert routing_check(inv.select, plan_of(plans, "gpu1/d0"), mla=False).problems == []


def test_roles_and_the_routers_mode_must_agree() -> None:
    no_role = {"s0": {"port": 30003, "gpus": [7], "router": "edge/router"}}
    inv, plans = fleet({**pair(gpus=[4, 5, 6]), **no_role})
    problems, _ = checked(inv, plans, "gpu1/s0")
    assert problems == [
        "gpu1/s0 has no role, but its router edge/router routes prefill/decode pairs"
    ]
    inv, plans = fleet(pair())
    inv.hosts["edge"].vars["deployments"]["router"]["pd"] = False
    problems, _ = checked(inv, plans, "gpu1/p0")
    assert problems == [
        "gpu1/p0 is a prefill, but its router edge/router does not route prefill/decode pairs"
    ]


def test_a_pd_router_or_a_role_without_the_other_side_is_refused() -> None:
    only_prefill = {k: v for k, v in pair().items() if k == "p0"}
    inv, plans = fleet(only_prefill)
    problems, _ = checked(inv, plans, "edge/router")
    assert problems == [
        "edge/router routes prefill/decode pairs, but no decode names it: nothing would serve"
    ]
    problems, _ = checked(inv, plans, "gpu1/p0")
    assert problems == [
        "gpu1/p0 is a prefill, but no decode names its router edge/router: nothing would serve"
    ]


def test_a_side_launched_alone_is_refused_when_its_router_has_only_its_own_role() -> None:
    # The router is not in this launch (it runs already, or is launched later): only each
    # server's own check can refuse it. Other servers of the same role are no other side.
    prefills = {
        "p0": {"role": "prefill", "port": 30001, "gpus": [0, 1], "router": "edge/router"},
        "p1": {"role": "prefill", "port": 30003, "gpus": [2, 3], "router": "edge/router",
               "bootstrap_port": 8999},
    }  # fmt: skip
    inv, plans = fleet(prefills, only="gpu1/p0", tp=2)
    assert [p.host.label for p in plans] == ["gpu1/p0"]
    assert checked(inv, plans, "gpu1/p0")[0] == [
        "gpu1/p0 is a prefill, but no decode names its router edge/router: nothing would serve"
    ]
    decodes = {
        "d0": {"role": "decode", "port": 30001, "gpus": [0, 1], "router": "edge/router"},
        "d1": {"role": "decode", "port": 30003, "gpus": [2, 3], "router": "edge/router"},
    }
    inv, plans = fleet(decodes, only="gpu1/d1", tp=2)
    assert checked(inv, plans, "gpu1/d1")[0] == [
        "gpu1/d1 is a decode, but no prefill names its router edge/router: nothing would serve"
    ]


def test_a_prefill_cannot_use_the_fake_transfer_backend() -> None:
    server = PdServer("h/p", PdRole.PREFILL, "/m", 1, 1, "fake", "a", "0.0.0.0")
    decode = PdServer("h/d", PdRole.DECODE, "/m", 1, 1, "fake", "a", "0.0.0.0")
    router = PdRouter("r", "a", True, 1800)
    assert check_server(server, [server, decode], router).problems == [
        "h/p: a prefill cannot use the fake transfer backend"
    ]
    assert check_server(decode, [server, decode], router).problems == []
    assert check_router("r", [server, decode]).problems == []


def test_ib_devices_are_checked_as_paths_on_the_host_in_each_form_sglang_takes() -> None:
    assert ib_device_paths("mlx5_0, mlx5_1,mlx5_0") == [
        "/sys/class/infiniband/mlx5_0",
        "/sys/class/infiniband/mlx5_1",
    ]
    assert ib_device_paths('{"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}') == [
        "/sys/class/infiniband/mlx5_0",
        "/sys/class/infiniband/mlx5_1",
        "/sys/class/infiniband/mlx5_2",
    ]
    assert ib_device_paths("/etc/ib.json") == ["/etc/ib.json"]
    assert ib_device_paths(None) == []
    _, plans = fleet(pair(ib_device="mlx5_3"))
    assert "/sys/class/infiniband/mlx5_3" in plan_of(plans, "gpu1/d0").check_paths()


def test_both_sides_timeouts_are_rendered_together_and_under_the_routers() -> None:
    _, plans = fleet(pair(), pd_timeout=120)
    env = plan_of(plans, "gpu1/d0").rendered.env
    assert env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] == "120"
    assert env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "120"
    assert env["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == "5.0"
    assert env["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == "2"
    assert "--request-timeout-secs=1800" in plan_of(plans, "edge/router").rendered.argv
    # A server without a role gets none of them.
    hosts = [Host("gpu1", {**DEFAULT_VARS, "model_path": "/m", "tp": 1})]
    plain = plan_launch(Project(None), hosts, None, None, [], {})[0]
    assert not [k for k in plain.rendered.env if "DISAGGREGATION" in k]


def test_a_side_that_would_wait_as_long_as_its_router_is_refused() -> None:
    # 1790 s + two 5 s heartbeats = the router's 1800 s: the client would see the router's
    # timeout, never the failed transfer.
    inv, plans = fleet(pair(), pd_timeout=1790)
    problems, _ = checked(inv, plans, "gpu1/d0")
    assert problems == [
        "gpu1/d0 may wait 1800s for its other side, but its router edge/router gives a "
        "request only 1800s"
    ]
    inv, plans = fleet(pair(), pd_timeout=1789)
    assert checked(inv, plans, "gpu1/d0") == ([], [])
    # The user's own env wins over pd_timeout, and is what is checked.
    inv, plans = fleet(pair(env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "5000"}))
    assert plan_of(plans, "gpu1/d0").rendered.env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "5000"
    problems, _ = checked(inv, plans, "gpu1/d0")
    assert problems and "may wait 5010s" in problems[0]


# ---- supervision ---------------------------------------------------------------------------


def test_a_decode_failing_is_blamed_on_its_prefill_only_within_the_window() -> None:
    losses = PrefillLoss(window=60)
    assert losses.blames("edge/router", 100.0) is None
    losses.down("edge/router", "gpu1/p0", 100.0)
    assert losses.blames("edge/router", 130.0) == ("gpu1/p0", 30.0)
    assert losses.blames("edge/router", 159.9) == pytest.approx(("gpu1/p0", 59.9))
    assert losses.blames("edge/router", 160.0) is None  # the prefill is back for a window
    assert losses.blames("other/router", 130.0) is None  # another router's prefill
    assert losses.blames(None, 130.0) is None
    losses.down("edge/router", "gpu1/p0", 170.0)  # seen down again: the window starts anew
    assert losses.blames("edge/router", 200.0) == ("gpu1/p0", 30.0)


def failing_decode(*alive: bool) -> Unit:
    """A decode (one node per entry of `alive`, each alive or dead) failing its health with a
    failed request's trace in its log, as it does after its prefill died."""
    trace = CrashReport(
        "RuntimeError", "KV transfer from the prefill failed", None, None, None, ("TP0",), 1,
        "kv-transfer", "a failed transfer", "",
    )  # fmt: skip
    run = cast(RunRecord, {"id": "d0-1", "status": "running"})
    nodes = [
        HostResult(
            Host(f"gpu{rank}", dict(DEFAULT_VARS)),
            RunStatus(run, alive=up, health=None if not up else 503, crashes=[trace]),
        )
        for rank, up in enumerate(alive)
    ]
    return Unit("gpu0/d0", nodes)


def test_a_decode_is_held_while_its_prefill_is_down_only_if_its_own_process_lives() -> None:
    losses = PrefillLoss(window=60)
    losses.down("edge/router", "gpu1/p0", 100.0)
    side = (PdRole.DECODE, "edge/router")
    alive = failing_decode(True)
    assert alive.crashed and held_decode(alive, side, 110.0, losses) == ("gpu1/p0", 10.0)
    # Its process died: its own failure, restarted whatever its prefill does.
    dead = failing_decode(False)
    assert dead.crashed and held_decode(dead, side, 110.0, losses) is None
    # A multi-node decode one of whose nodes died, too.
    assert held_decode(failing_decode(True, False), side, 110.0, losses) is None
    assert held_decode(failing_decode(True, True), side, 110.0, losses) == ("gpu1/p0", 10.0)
    # A prefill is never held, nor a decode once its prefill is back for a window.
    assert held_decode(alive, (PdRole.PREFILL, "edge/router"), 110.0, losses) is None
    assert held_decode(alive, side, 160.0, losses) is None


def test_a_transfer_is_stuck_once_requests_wait_with_no_token_out_for_the_time_set() -> None:
    watch = TransferWatch(after=30)
    assert watch.look("d", 0, waiting=2, tokens=100, throughput=0) is None  # first sight
    assert watch.look("d", 29, waiting=2, tokens=100, throughput=0) is None
    assert watch.look("d", 30, waiting=2, tokens=100, throughput=0) == 30
    assert watch.look("d", 40, waiting=2, tokens=100, throughput=0) is None  # said once
    # Tokens come out again: the episode ends, and a new one is reported anew.
    assert watch.look("d", 50, waiting=2, tokens=101, throughput=0) is None
    assert watch.look("d", 79, waiting=2, tokens=101, throughput=0) is None
    assert watch.look("d", 80, waiting=2, tokens=101, throughput=0) == 30


def test_a_busy_decode_or_an_idle_one_is_never_stuck() -> None:
    watch = TransferWatch(after=30)
    for t in range(0, 200, 10):  # tokens keep coming out
        assert watch.look("busy", t, waiting=8, tokens=100.0 + t, throughput=50) is None
        assert watch.look("idle", t, waiting=0, tokens=100, throughput=0) is None


def test_without_the_token_counter_the_throughput_gauge_says_whether_tokens_come_out() -> None:
    watch = TransferWatch(after=30)
    for t in range(0, 100, 10):
        assert watch.look("busy", t, waiting=4, tokens=None, throughput=120.0) is None
    assert watch.look("stuck", 0, waiting=4, tokens=None, throughput=0.0) is None
    assert watch.look("stuck", 30, waiting=4, tokens=None, throughput=0.0) == 30


def test_the_metrics_read_a_decodes_transfer_queue_and_its_token_counter() -> None:
    text = (
        "# TYPE sglang:num_decode_transfer_queue_reqs gauge\n"
        'sglang:num_decode_transfer_queue_reqs{tp_rank="0"} 3.0\n'
        "# TYPE sglang:generation_tokens_total counter\n"
        'sglang:generation_tokens_total{model_name="m",stream="a"} 12.0\n'
        'sglang:generation_tokens_total{model_name="m",stream="b"} 3.0\n'
    )
    found = parse_metrics(text)
    assert found["num_decode_transfer_queue_reqs"] == 3.0
    assert found["generation_tokens_total"] == 15.0
    assert parse_metrics("")["generation_tokens_total"] is None


# ---- rollouts per role -----------------------------------------------------------------------


def listed(url: str, role: PdRole | None) -> ListedWorker:
    kind = WorkerKind(role, 8998 if role is PdRole.PREFILL else None)
    return ListedWorker(url, True, 0, f"ours{url}", kind=kind)


def test_a_pd_rollout_keeps_a_healthy_prefill_and_a_healthy_decode() -> None:
    pd = RouterState("edge/router", "workers", pd=True)
    prefill, decode = listed("p", PdRole.PREFILL), listed("d", PdRole.DECODE)
    assert lacking_roles(pd, [prefill, decode]) == ""
    assert lacking_roles(pd, [decode, decode]) == "prefill"
    assert lacking_roles(pd, [prefill]) == "decode"
    assert lacking_roles(pd, []) == "worker"
    # A router that does not say a worker's role leaves no role known to be kept.
    assert lacking_roles(pd, [ListedWorker("x", True, 0, "ours")]) == "prefill or decode"
    # A router of whole-request workers needs any one.
    plain = RouterState("edge/router", "workers")
    assert lacking_roles(plain, [decode]) == ""
    assert lacking_roles(plain, []) == "worker"


def test_a_rollout_replaces_prefills_first_and_routers_last() -> None:
    gpu2 = {"d1": {"role": "decode", "port": 30002, "gpus": [0], "router": "edge/router"}}
    _, plans = fleet({"d0": pair()["d0"], "p0": pair()["p0"]}, gpu2)
    by_label = {p.host.label: p for p in plans}
    unit_plans = [
        UnitPlan(label, [by_label[label]], [], [], [], [], {}, None)
        for label in ("edge/router", "gpu1/d0", "gpu2/d1", "gpu1/p0")
    ]
    ordered = sorted(unit_plans, key=rollout_order)
    assert [u.name for u in ordered] == ["gpu1/p0", "gpu1/d0", "gpu2/d1", "edge/router"]


def test_a_pd_router_serves_only_with_a_serving_prefill_and_decode() -> None:
    prefill, decode = listed("p", PdRole.PREFILL), listed("d", PdRole.DECODE)
    assert RouterState("r", "workers", [prefill, decode], pd=True).missing_roles == []
    assert RouterState("r", "workers", [prefill], pd=True).missing_roles == [PdRole.DECODE]
    unhealthy = ListedWorker("d", False, 0, "ours/d", kind=decode.kind)
    assert RouterState("r", "workers", [prefill, unhealthy], pd=True).missing_roles == [
        PdRole.DECODE
    ]
    # Ours, seen not serving by our own status round, whatever the router's flag says.
    dead = ListedWorker("d", True, 0, None, owner="ours/d", kind=decode.kind)
    assert RouterState("r", "workers", [prefill, dead], pd=True).missing_roles == [PdRole.DECODE]
    # A router of whole-request workers, or one not read, lacks no role.
    assert RouterState("r", "workers", [], pd=False).missing_roles == []
    assert RouterState("r", None, [], pd=True).missing_roles == []
