"""Preflight (ops/preflight.py) over real sshd hosts: each problem is said once, with its hint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deployctl.deployments import deployment_targets
from deployctl.errors import PreflightError
from deployctl.inventory import DEFAULT_VARS, Host, Inventory
from deployctl.ops.plan import Plan, plan_launch
from deployctl.project import Project
from tests.conftest import CLI
from tests.sshd_hosts import SSHLab
from tests.test_lifecycle import inventory


def test_each_preflight_problem_is_listed_once_with_one_hint_each(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"])
    hosts.hosts["alpha"].set_gpus("busy", 2)
    result = cli(
        "launch", "-i", str(inv), "--json", "--dry-run", "--set", "model_path=/no/such/model"
    )
    assert result.returncode == 1, result.stderr
    preflight = json.loads(result.stdout)["hosts"]["alpha"]["preflight"]
    problems = preflight["problems"]
    assert len(problems) == 2, problems
    assert problems[0].startswith("GPUs are not clean: dirty: PIDs"), problems
    assert problems[1] == "/no/such/model does not exist on alpha", problems
    human = cli("launch", "-i", str(inv), "--dry-run", "--set", "model_path=/no/such/model")
    lines = human.stderr.splitlines()
    errors = [ln for ln in lines if ln.startswith("alpha: error: ")]
    hints = [ln for ln in lines if ln.startswith("alpha: hint: ")]
    assert len(errors) == 2 and len(hints) == 1, human.stderr


# ---- placement, checked before any host is touched ---------------------------------------


def group_plans(variables: dict[str, dict[str, Any]]) -> list[Plan]:
    """Plan a two-node group (n1, n2) with each node's own variables over the defaults."""
    hosts = [
        Host(name, {**DEFAULT_VARS, "tp": 1, "gpus": [0], "model_path": "/m",
                    "deployments": {"kimi": {"nodes": "kimi", "tp": 2}}, **own})
        for name, own in variables.items()
    ]  # fmt: skip
    inv = Inventory({h.name: h for h in hosts}, {"kimi": list(variables)}, "test")
    targets = deployment_targets(hosts, resolve=inv.select)
    return plan_launch(Project(None), targets, "baseline", None, [], {})


def test_two_nodes_of_a_group_on_one_machine_may_not_share_gpus_or_port() -> None:
    same_box = {"ansible_host": "127.0.0.2"}
    own_state = {**same_box, "state_dir": "~/.deployctl-n2"}
    one_machine = r"n1/kimi and n2/kimi \(one machine: 127.0.0.2\)"
    with pytest.raises(PreflightError, match=rf"{one_machine} would share GPUs \(GPU 0"):
        group_plans({"n1": same_box, "n2": own_state})
    with pytest.raises(PreflightError, match=f"{one_machine} would share port 30000"):
        group_plans({"n1": same_box, "n2": {**own_state, "gpus": [1]}})
    # One box, its own GPU, port and state_dir for each node: a group on a two-GPU machine.
    assert len(group_plans({"n1": same_box, "n2": {**own_state, "gpus": [1], "port": 30001}})) == 2
    # One state_dir: one node's launch lock would lock out the other, their runs collide.
    with pytest.raises(PreflightError, match="both would keep deployment kimi in state_dir"):
        group_plans({"n1": same_box, "n2": {**same_box, "gpus": [1], "port": 30001}})
    # Two machines: the same GPU index and port on each is what a group usually has.
    assert len(group_plans({"n1": same_box, "n2": {"ansible_host": "127.0.0.3"}})) == 2


def test_rank_0s_dist_port_may_not_be_a_server_port_on_its_machine() -> None:
    with pytest.raises(PreflightError, match="n1/kimi's dist_port 30000, where the other nodes"):
        group_plans({"n1": {"ansible_host": "127.0.0.2", "dist_port": 30000},
                     "n2": {"ansible_host": "127.0.0.3"}})  # fmt: skip
