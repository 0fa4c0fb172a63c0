"""`deployctl launch --threshold 5`: the spec-disable patch on real SGLang files, stand-in server."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import CLI
from tests.sglang_wheel import install_on
from tests.sshd_hosts import STANDIN, SSHLab
from tests.test_lifecycle import prepare


def sglang_inventory(lab: SSHLab, template: Path, tmp_path: Path, names: list[str]) -> Path:
    host_vars = {}
    for name in names:
        host = lab.hosts[name]
        variables = prepare(host)
        variables["python"] = install_on(host, template, standin=STANDIN)
        host_vars[name] = variables
    return lab.inventory(tmp_path / "inv.yml", names, host_vars)


def test_threshold_needs_the_patch_then_starts_with_the_flag(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    inv = sglang_inventory(hosts, sglang_template, tmp_path, ["alpha"])
    refused = cli("launch", "--threshold", "5", "-i", str(inv), "--timeout", "60")
    assert refused.returncode == 1
    assert "needs patch set spec-disable, which is missing on alpha" in refused.stderr
    assert "hint: deployctl patch apply spec-disable -H alpha" in refused.stderr
    assert not (hosts.hosts["alpha"].home / "logs").exists() or not any(
        (hosts.hosts["alpha"].home / "logs").iterdir()
    )

    assert cli("patch", "apply", "spec-disable", "-i", str(inv)).returncode == 0
    launched = cli("launch", "--threshold", "5", "-i", str(inv), "--json", "--timeout", "60")
    assert launched.returncode == 0, launched.stderr + launched.stdout
    entry = json.loads(launched.stdout)["hosts"]["alpha"]
    assert entry["state"] == "ready" and entry["run"] == "eagle3_t5_v1"
    argv = json.loads(
        (hosts.hosts["alpha"].home / "model" / "standin-argv.jsonl").read_text().splitlines()[-1]
    )["argv"]
    assert "--speculative-disable-batch-threshold=5" in argv
    assert "--speculative-eagle-topk=1" in argv
    run = json.loads((hosts.hosts["alpha"].home / ".deployctl/runs/eagle3_t5_v1.json").read_text())
    assert run["patches"] == {"spec-disable": "1.2.0"} and run["threshold"] == 5
    assert cli("stop", "-i", str(inv)).returncode == 0


def test_threshold_with_topk_4_is_refused_locally(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["alpha"], {"alpha": {"model_path": "/m", "draft_model_path": "/d"}}
    )
    hosts.hosts["alpha"].stop()  # nothing may be contacted: the refusal is local
    for command in ("render", "launch"):
        result = cli(
            command, "--threshold", "5", "--set", "speculative_eagle_topk=4", "-i", str(inv)
        )
        assert result.returncode == 1
        assert "patch set spec-disable" in result.stderr
        assert (
            "--speculative-eagle-topk 1, but the command has --speculative-eagle-topk 4"
            in result.stderr
        )
        assert "cannot connect" not in result.stderr
