"""Where servers go, as pure functions: deployment targets, GPU sets, the server's
environment, and the nodes of multi-node deployments. Fast: no host is touched."""

from __future__ import annotations

from typing import Any

import pytest

from deployctl.deployments import deployment_targets, gpu_set, group_of, server_env
from deployctl.errors import InventoryError, UsageError
from deployctl.inventory import Host, Inventory

# ---- the model: targets, GPU sets, the server's environment --------------------------------


def host(**variables: Any) -> Host:
    return Host("h1", {"env": {"A": "1"}, "port": 30000, **variables})


def test_a_host_without_deployments_is_its_own_single_deployment() -> None:
    plain = host()
    assert deployment_targets([plain]) == [plain]
    assert plain.label == "h1"


def test_deployments_override_the_hosts_variables_and_merge_env_key_by_key() -> None:
    table = {
        "r1": {"gpus": [0, 1], "port": 30001, "env": {"B": "2"}},
        "r2": {"gpus": "2,3", "env": {"A": "over"}},
    }
    r1, r2 = deployment_targets([host(deployments=table)])
    assert (r1.label, r2.label) == ("h1/r1", "h1/r2")
    assert r1.vars["port"] == 30001 and r2.vars["port"] == 30000
    assert r1.vars["env"] == {"A": "1", "B": "2"} and r2.vars["env"] == {"A": "over"}
    assert "deployments" not in r1.vars
    assert gpu_set(r1) == [0, 1] and gpu_set(r2) == [2, 3]
    assert [t.label for t in deployment_targets([host(deployments=table)], "r2")] == ["h1/r2"]


def test_a_chosen_deployment_skips_hosts_without_it_and_fails_when_none_has_it() -> None:
    with_table = Host("h2", {"deployments": {"r1": {"gpus": [0]}}})
    assert [t.label for t in deployment_targets([host(), with_table], "r1")] == ["h2/r1"]
    with pytest.raises(UsageError, match="no deployment 'r9'"):
        deployment_targets([host(), with_table], "r9")
    with pytest.raises(UsageError, match="not a deployment name"):
        deployment_targets([with_table], "R1")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"Bad_Name": {}}, "deployment name 'Bad_Name' is not allowed"),
        ({"-r1": {}}, "deployment name '-r1' is not allowed"),
        ({"r1": ["tp", 4]}, "its variables must be a mapping"),
        ({"r1": {"ansible_host": "10.0.0.9"}}, "cannot set ansible_host"),
        ({"r1": {"deployments": {}}}, "cannot set deployments"),
        ({"r1": {"gpus": [0, 0]}}, "lists GPU 0 twice"),
        ({"r1": {"gpus": [0, -1]}}, "is not a list of GPU indices"),
        ({"r1": {"gpus": "0,x"}}, "is not a list of GPU indices"),
        ({"r1": {"gpus": [True]}}, "is not a list of GPU indices"),
        ({"r1": {"gpus": []}}, "gpus is empty"),
        ({"r1": {"env": {"1BAD": "x"}}}, "env name '1BAD' is not a variable name"),
        ({}, "deployments must be a mapping"),
    ],
)
def test_bad_deployment_tables_fail_before_any_host_is_touched(table: Any, message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        deployment_targets([host(deployments=table)])


def test_gpus_pin_the_server_with_pci_bus_numbering() -> None:
    target = host(gpus=[4, 5])
    assert server_env(target, target.vars) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "A": "1",
        "CUDA_VISIBLE_DEVICES": "4,5",
    }
    assert server_env(host(), host().vars) == {"A": "1"}  # no gpus: every GPU, no CUDA variables
    own_order = host(gpus=[1], env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert server_env(own_order, own_order.vars)["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    clash = host(gpus=[1], env={"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(InventoryError, match="contradicts gpus"):
        server_env(clash, clash.vars)


# ---- multi-node deployments -------------------------------------------------------------------------------


def fleet(*hosts: Host, **groups: list[str]) -> Inventory:
    return Inventory({h.name: h for h in hosts}, dict(groups), "test")


def node(name: str, total_tp: int = 16, **variables: Any) -> Host:
    kimi = {"kimi": {"nodes": "kimi", "tp": total_tp}}
    return Host(
        name, {"ansible_host": f"10.0.0.{name[-1]}", "tp": 8, "deployments": kimi, **variables}
    )


def test_nodes_follow_inventory_order_and_share_rank_0s_init_address() -> None:
    nodes = [node("n1", 24), node("n2", 24), node("n3", 24, port=30001)]
    inv = fleet(*nodes, kimi=["n1", "n2", "n3"])
    targets = deployment_targets([inv.hosts["n2"]], resolve=inv.select)  # any node selects all
    assert [t.label for t in targets] == ["n1/kimi", "n2/kimi", "n3/kimi"]
    assert [t.vars["node_rank"] for t in targets] == [0, 1, 2]
    assert {t.vars["dist_init_addr"] for t in targets} == {"10.0.0.1:20000"}
    assert {t.vars["nnodes"] for t in targets} == {3} and targets[2].vars["port"] == 30001
    assert all(group_of(t) == ("kimi", ("n1", "n2", "n3")) for t in targets)
    # Selecting two nodes still gives the group once.
    assert len(deployment_targets(list(inv.hosts.values()), resolve=inv.select)) == 3


def test_a_host_that_sets_node_rank_takes_it() -> None:
    inv = fleet(node("n1"), node("n2", node_rank=0), kimi=["n1", "n2"])
    targets = deployment_targets([inv.hosts["n1"]], resolve=inv.select)
    assert [(t.name, t.vars["node_rank"]) for t in targets] == [("n2", 0), ("n1", 1)]
    assert targets[0].vars["dist_init_addr"] == "10.0.0.2:20000"


def test_an_ipv6_rank_0_is_bracketed_and_dist_port_is_used() -> None:
    first = node("n1", ansible_host="fd00::1", dist_port=29500)
    inv = fleet(first, node("n2"), kimi=["n1", "n2"])
    assert deployment_targets([first], resolve=inv.select)[1].vars["dist_init_addr"] == (
        "[fd00::1]:29500"
    )


@pytest.mark.parametrize(
    ("table", "extra", "message"),
    [
        ({"nodes": "nope"}, {}, "nodes 'nope' matches no host"),
        ({"nodes": "kimi", "nnodes": 3}, {}, "nnodes 3 disagrees with nodes 'kimi' (2 hosts)"),
        ({"nodes": "kimi", "tp": 3}, {}, "tp 3 is not divisible by its 2 nodes"),
        ({"nodes": ["n1", "n2"]}, {}, "nodes must be a host pattern"),
        ({"nodes": "kimi"}, {"node_rank": 5}, "node_rank 5 of n1 is not a rank of its 2 nodes"),
    ],
)
def test_bad_multi_node_deployments_are_clear_errors(
    table: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    first = node("n1", deployments={"kimi": table}, **extra)
    inv = fleet(first, node("n2"), kimi=["n1", "n2"])
    with pytest.raises(InventoryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        deployment_targets([first], resolve=inv.select)


def test_two_nodes_with_one_rank_each_are_refused_as_duplicates() -> None:
    inv = fleet(node("n1", node_rank=1), node("n2", node_rank=1), kimi=["n1", "n2"])
    with pytest.raises(InventoryError, match="two nodes have node_rank 1"):
        deployment_targets([inv.hosts["n1"]], resolve=inv.select)


# ---- the exact words and edges of the rules --------------------------------------------------


def test_a_missing_deployment_says_whether_any_host_has_deployments() -> None:
    with pytest.raises(UsageError) as plain:
        deployment_targets([host()], "r1")
    assert plain.value.message == "no deployment 'r1' on the selected hosts (none has deployments)"
    assert plain.value.hint == "see each host's `deployments` with deployctl hosts"
    with pytest.raises(UsageError) as tabled:
        deployment_targets([host(deployments={"r2": {}})], "r1")
    assert tabled.value.message == "no deployment 'r1' on the selected hosts"


@pytest.mark.parametrize("table", ["r1", ["r1"], {}])
def test_deployments_must_be_a_non_empty_mapping(table: Any) -> None:
    with pytest.raises(
        InventoryError,
        match=r"^host h1: deployctl_deployments must be a mapping of name: variables",
    ):
        deployment_targets([host(deployctl_deployments=table)])


@pytest.mark.parametrize("table", ["r1", ["r1"]])
def test_a_bare_deployments_that_is_no_mapping_is_the_users_own(table: Any) -> None:
    plain = host(deployments=table)
    assert deployment_targets([plain]) == [plain]  # one implicit deployment


def test_a_deployment_that_sets_how_hosts_are_reached_is_named_with_the_fix() -> None:
    with pytest.raises(InventoryError) as caught:
        deployment_targets([host(deployments={"r1": {"ansible_user": "x", "ansible_port": 2}})])
    assert caught.value.message == (
        "host h1, deployment r1: a deployment cannot set ansible_port, ansible_user"
    )
    assert caught.value.hint == "set how a host is reached on the host itself"


def test_a_bad_env_inside_a_multi_node_deployment_names_the_node() -> None:
    table = {"kimi": {"nodes": "kimi", "tp": 16, "env": {"9X": "1"}}}
    inv = fleet(node("n1", deployments=table), node("n2"), kimi=["n1", "n2"])
    with pytest.raises(InventoryError, match=r"^host n1, deployment kimi: env name '9X'"):
        deployment_targets([inv.hosts["n1"]], resolve=inv.select)


def test_single_and_multi_node_deployments_of_one_host_are_all_kept() -> None:
    table = {"solo": {"gpus": [7], "port": 31000}, "kimi": {"nodes": "kimi", "tp": 16}}
    inv = fleet(node("n1", deployments=table), node("n2", deployments=table), kimi=["n1", "n2"])
    labels = [t.label for t in deployment_targets(list(inv.hosts.values()), resolve=inv.select)]
    assert labels == ["n1/solo", "n1/kimi", "n2/kimi", "n2/solo"]


def test_a_node_gets_its_placement_and_not_the_nodes_pattern() -> None:
    table = {"kimi": {"nodes": "kimi", "tp": 16, "dist_port": 29500}}
    inv = fleet(node("n1", deployments=table), node("n2"), kimi=["n1", "n2"])
    first, second = deployment_targets([inv.hosts["n1"]], resolve=inv.select)
    assert "nodes" not in first.vars and "deployments" not in first.vars
    assert (first.vars["dist_port"], second.vars["dist_init_addr"]) == (29500, "10.0.0.1:29500")
    assert first.vars["node_hosts"] == second.vars["node_hosts"] == ["n1", "n2"]
    given = {"kimi": {"nodes": "kimi", "tp": 16, "dist_init_addr": "ib0.n1:4000"}}
    inv = fleet(node("n1", deployments=given), node("n2"), kimi=["n1", "n2"])
    assert {
        t.vars["dist_init_addr"] for t in deployment_targets([inv.hosts["n1"]], resolve=inv.select)
    } == {"ib0.n1:4000"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tp": True}, "tp True is not divisible by its 2 nodes"),
        ({"tp": "sixteen"}, "tp 'sixteen' is not divisible by its 2 nodes"),
        ({}, "tp 1 is not divisible by its 2 nodes"),  # no tp anywhere: SGLang's 1
    ],
)
def test_tp_must_be_a_whole_multiple_of_the_nodes(overrides: dict[str, Any], message: str) -> None:
    table = {"kimi": {"nodes": "kimi", **overrides}}
    first = Host("n1", {"ansible_host": "10.0.0.1", "deployments": table})
    inv = fleet(first, Host("n2", {}), kimi=["n1", "n2"])
    with pytest.raises(InventoryError) as caught:
        deployment_targets([first], resolve=inv.select)
    assert caught.value.message == f"host n1, deployment kimi: {message}"
    assert caught.value.hint == "tp is the total over all nodes, e.g. tp: 16 on two 8-GPU nodes"


@pytest.mark.parametrize("rank", [2, "2"])
def test_a_node_rank_outside_the_group_is_refused_with_the_range(rank: Any) -> None:
    inv = fleet(node("n1", node_rank=rank), node("n2"), kimi=["n1", "n2"])
    with pytest.raises(InventoryError) as caught:
        deployment_targets([inv.hosts["n1"]], resolve=inv.select)
    assert caught.value.message == (
        f"host n1, deployment kimi: node_rank {rank!r} of n1 is not a rank of its 2 nodes (0-1)"
    )


@pytest.mark.parametrize("rank", [True, "first", -1])
def test_a_node_rank_that_is_no_rank_is_refused_in_deployctls_spelling(rank: Any) -> None:
    inv = fleet(node("n1", deployctl_node_rank=rank), node("n2"), kimi=["n1", "n2"])
    with pytest.raises(InventoryError) as caught:
        deployment_targets([inv.hosts["n1"]], resolve=inv.select)
    assert caught.value.message == (
        f"host n1: deployctl_node_rank {rank!r} is not a rank (0 or more)"
    )


@pytest.mark.parametrize("rank", [True, "first"])
def test_a_bare_node_rank_that_is_no_number_is_the_users_own(rank: Any) -> None:
    inv = fleet(node("n1", node_rank=rank), node("n2", node_rank=0), kimi=["n1", "n2"])
    targets = deployment_targets([inv.hosts["n1"]], resolve=inv.select)
    assert [(t.name, t.settings.given("node_rank")) for t in targets] == [("n2", 0), ("n1", 1)]


def test_nnodes_given_by_hand_must_match_and_says_how_to_fix_it() -> None:
    table = {"kimi": {"nodes": "kimi", "tp": 16, "nnodes": 2}}
    inv = fleet(node("n1", deployments=table), node("n2"), kimi=["n1", "n2"])
    assert len(deployment_targets([inv.hosts["n1"]], resolve=inv.select)) == 2  # agrees: fine
    table["kimi"]["nnodes"] = 4
    with pytest.raises(InventoryError) as caught:
        deployment_targets([inv.hosts["n1"]], resolve=inv.select)
    assert caught.value.hint == "leave nnodes out: it is the number of hosts `nodes` matches"


def test_only_a_multi_node_target_is_a_group_node() -> None:
    assert group_of(host()) is None
    assert group_of(Host("h1", {"node_hosts": ["h1", "h2"]})) is None  # no deployment
    assert group_of(Host("h1", {"node_hosts": ["h1"]}, "solo")) is None  # one node
    assert group_of(Host("h1", {"node_hosts": "h1,h2"}, "x")) is None  # not a list


def test_bad_deployment_names_say_what_names_may_be() -> None:
    with pytest.raises(InventoryError) as caught:
        deployment_targets([host(deployments={"R1": {}})])
    assert caught.value.message == "host h1: deployment name 'R1' is not allowed"
    assert caught.value.hint == (
        "names are lower-case letters, digits and -, starting with a letter or digit"
    )
    with pytest.raises(UsageError) as option:
        deployment_targets([host()], "R1")
    assert option.value.hint == "names are lower-case letters, digits and -"
