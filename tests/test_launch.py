"""Preflight (ops/launch.py) over real sshd hosts: each problem is said once, with its hint."""

from __future__ import annotations

import json
from pathlib import Path

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
