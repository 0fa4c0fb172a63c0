"""Deployments: several servers per host on their own GPUs, ports, logs and records.

The sshd tests run the stand-in server on real test hosts whose nvidia-smi is in `live`
mode: the GPUs show the ranks that are running, placed by their CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import CLI
from tests.sshd_hosts import REPO, SSHLab, TestHost, free_port
from tests.test_lifecycle import prepare, rank_pids, watch_until


def test_render_names_each_deployment_and_its_log_stem(cli: CLI) -> None:
    example = str(REPO / "inventories" / "example.yml")
    result = cli("render", "-i", example, "-H", "h200-a08")
    assert result.returncode == 0, result.stderr
    assert "# h200-a08/qwen-a\nCUDA_DEVICE_ORDER=PCI_BUS_ID\nCUDA_VISIBLE_DEVICES=0,1,2,3\n" in (
        result.stdout
    )
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7\n" in result.stdout and "--port=30001" in result.stdout
    doc = json.loads(cli("render", "-i", example, "-H", "h200", "--json").stdout)
    assert set(doc["hosts"]) == {f"h200-a0{i}" for i in range(1, 8)}  # the replicas box is not h200
    doc = json.loads(
        cli("render", "-i", example, "-H", "h200-a08", "-d", "qwen-b", "--json").stdout
    )
    entry = doc["hosts"]["h200-a08"]
    assert list(entry["deployments"]) == ["qwen-b"] and entry["ok"] is True
    assert entry["deployments"]["qwen-b"]["env"]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


# ---- over real sshd hosts --------------------------------------------------------------------


def replicas(lab: SSHLab, tmp_path: Path, table: dict[str, dict[str, Any]], gpus: int = 2) -> Path:
    """alpha with `gpus` live GPUs and the given deployments of the stand-in, TP1 each."""
    alpha = lab.hosts["alpha"]
    variables = {**prepare(alpha, tp=1), "template": "baseline", "deployments": table}
    alpha.set_gpus("live", gpus)
    return lab.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})


def two_replicas(lab: SSHLab, tmp_path: Path) -> tuple[Path, dict[str, int]]:
    address = lab.hosts["alpha"].address
    ports = {"r1": free_port(address), "r2": free_port(address)}
    table = {name: {"gpus": [i], "port": port} for i, (name, port) in enumerate(ports.items())}
    return replicas(lab, tmp_path, table), ports


def run_json(cli: CLI, *args: str) -> tuple[int, dict[str, Any], str]:
    """(exit status, the document, stderr); stderr then the document when the command
    failed, so `assert code == 0, err` says why (with --json, why is in the document)."""
    result = cli(*args, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    said = result.stderr + (f"\n{result.stdout}" if result.returncode else "")
    return result.returncode, json.loads(result.stdout), said


def deployments_of(doc: dict[str, Any], name: str = "alpha") -> dict[str, Any]:
    entry: dict[str, Any] = doc["hosts"][name]["deployments"]
    return entry


def standin_starts(host: TestHost) -> list[dict[str, Any]]:
    lines = (host.home / "model" / "standin-argv.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_two_deployments_on_one_host_run_side_by_side_on_their_own_gpus(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, _ = two_replicas(hosts, tmp_path)
    alpha = hosts.hosts["alpha"]
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    launched = deployments_of(doc)
    assert {n: e["state"] for n, e in launched.items()} == {"r1": "ready", "r2": "ready"}
    assert launched["r1"]["log"] == str(alpha.home / "logs" / "r1_baseline_v1.log")
    assert launched["r2"]["log"] == str(alpha.home / "logs" / "r2_baseline_v1.log")
    # Each server saw only its own GPU, numbered as nvidia-smi numbers them.
    seen = {
        s["env"]["CUDA_VISIBLE_DEVICES"]: s["env"]["CUDA_DEVICE_ORDER"]
        for s in standin_starts(alpha)
    }
    assert seen == {"0": "PCI_BUS_ID", "1": "PCI_BUS_ID"}

    code, doc, err = run_json(cli, "status", "-i", str(inv))
    assert code == 0, err
    status = deployments_of(doc)
    assert status["r1"]["ready"] and status["r2"]["ready"]
    assert (status["r1"]["gpus"], status["r2"]["gpus"]) == ([0], [1])
    assert status["r1"]["gpu_memory_used_mib"] == 3682  # its own GPU only, not the host's 7364
    human = cli("status", "-i", str(inv)).stdout
    assert "alpha/r1" in human and "alpha/r2" in human

    # gpus names the deployment that holds each GPU.
    code, doc, _ = run_json(cli, "gpus", "-i", str(inv))
    held = {p["gpu_uuid"][-2:]: p["held_by"] for p in doc["hosts"]["alpha"]["processes"]}
    assert held["69"] == "r1 (r1_baseline_v1)" and held["01"] == "r2 (r2_baseline_v1)"
    assert "[r1 (r1_baseline_v1)]" in cli("gpus", "-i", str(inv)).stdout

    # Stop one: the other keeps its GPU and goes on serving.
    r2_pid = status["r2"]["pid"]
    code, doc, err = run_json(cli, "stop", "-i", str(inv), "-d", "r1")
    assert code == 0, err
    stopped = deployments_of(doc)
    assert list(stopped) == ["r1"] and stopped["r1"]["gpus_clean"] is True
    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    status = deployments_of(doc)
    assert status["r1"]["alive"] is False and status["r2"]["ready"] is True
    assert status["r2"]["pid"] == r2_pid and len(rank_pids(alpha)) == 1

    # The log of each deployment's run.
    logs = cli("logs", "-i", str(inv), "-d", "r2", "-n", "200")
    assert "ready to roll" in logs.stdout and logs.returncode == 0
    crash = cli("crash", "-i", str(inv), "-d", "r2")
    assert f"no crash found in {alpha.home}/logs/r2_baseline_v1.log" in crash.stdout

    # Stop without -d says which deployments it ends, then ends them all.
    result = cli("stop", "-i", str(inv))
    assert result.returncode == 0, result.stderr
    assert "alpha: stopping every deployment: r1, r2" in result.stderr
    assert rank_pids(alpha) == []


def test_overlapping_gpus_and_shared_ports_are_refused_and_nothing_starts(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv, ports = two_replicas(hosts, tmp_path)
    code, _, err = run_json(cli, "launch", "-i", str(inv), "-d", "r1", "--timeout", "60")
    assert code == 0, err
    starts = len(standin_starts(alpha))

    # A third deployment wants r1's GPU; a fourth a free GPU but r1's port.
    document = yaml.safe_load(inv.read_text())
    table = document["all"]["hosts"]["alpha"]["deployments"]
    table["r3"] = {"gpus": [0, 1], "port": free_port(alpha.address)}
    table["r4"] = {"gpus": [1], "port": ports["r1"]}
    inv.write_text(yaml.safe_dump(document))
    code, doc, _ = run_json(cli, "launch", "-i", str(inv), "-d", "r3", "--timeout", "60")
    assert code == 1 and doc["started"] is False
    problems = " ".join(deployments_of(doc)["r3"]["preflight"]["problems"])
    assert "deployment r1 holds GPU 0 on alpha (run r1_baseline_v1" in problems
    assert "GPUs 0,1 of alpha are not clean" in problems
    code, doc, _ = run_json(cli, "launch", "-i", str(inv), "-d", "r4", "--timeout", "60")
    assert code == 1 and doc["started"] is False
    problems = " ".join(deployments_of(doc)["r4"]["preflight"]["problems"])
    assert f"port {ports['r1']} on alpha is deployment r1's (run r1_baseline_v1" in problems
    assert "holds GPU" not in problems  # GPU 1 is free: only the port stands in the way
    # Within one launch, a shared GPU is refused before any host is touched.
    result = cli("launch", "-i", str(inv), "-d", "r1", "--dry-run")  # r1 alone: already running
    assert "run r1_baseline_v1" in result.stderr and "still running" in result.stderr
    both = cli("launch", "-i", str(inv), "--timeout", "60")
    assert both.returncode == 1
    assert "error: alpha/r1 and alpha/r3 would share GPUs (GPU 0 and GPUs 0,1)" in both.stderr
    assert len(standin_starts(alpha)) == starts and len(rank_pids(alpha)) == 1
    assert sorted(p.name for p in (alpha.home / "logs").iterdir()) == ["r1_baseline_v1.log"]
    assert not list((alpha.home / ".deployctl").glob("lock*"))  # every refused lock released


def test_gpu_placement_is_checked_against_the_host(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    port = free_port(hosts.hosts["alpha"].address)
    inv = replicas(hosts, tmp_path, {"big": {"gpus": [1, 5], "port": port, "tp": 2}})
    code, doc, _ = run_json(cli, "launch", "-i", str(inv), "--dry-run")
    assert code == 1
    problems = deployments_of(doc)["big"]["preflight"]["problems"]
    assert "GPU 5 not on alpha (it has GPUs 0,1)" in problems
    inv = replicas(hosts, tmp_path, {"big": {"gpus": [1], "port": port, "tp": 2}})
    code, doc, _ = run_json(cli, "launch", "-i", str(inv), "--dry-run")
    problems = deployments_of(doc)["big"]["preflight"]["problems"]
    assert code == 1
    assert "tensor parallelism 2 needs 2 GPUs; deployment big has 1 (GPU 1)" in problems


def test_disjoint_deployments_launched_at_once_from_two_terminals_both_start(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, _ = two_replicas(hosts, tmp_path)
    procs = [cli.popen("launch", "-i", str(inv), "-d", name, "--json") for name in ("r1", "r2")]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    states = [json.loads(out)["hosts"]["alpha"]["deployments"] for out, _ in outputs]
    assert states[0]["r1"]["state"] == "ready" and states[1]["r2"]["state"] == "ready"
    cli("stop", "-i", str(inv))


def test_restart_crashed_brings_back_only_the_crashed_deployment(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv, _ = two_replicas(hosts, tmp_path)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    r1, r2 = (deployments_of(doc)[n]["pid"] for n in ("r1", "r2"))
    os.killpg(r1, signal.SIGKILL)  # r1 dies without a word, as an OOM kill leaves it
    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    assert deployments_of(doc)["r1"]["crashed"] is True and code == 1

    code, doc, err = run_json(cli, "restart", "--crashed", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    restarted = deployments_of(doc)
    assert list(restarted) == ["r1"] and restarted["r1"]["run"] == "r1_baseline_v2"
    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    status = deployments_of(doc)
    assert status["r1"]["ready"] and status["r1"]["run"] == "r1_baseline_v2"
    assert status["r2"]["pid"] == r2 and status["r2"]["run"] == "r2_baseline_v1"
    # The restarted run kept its GPU.
    assert standin_starts(alpha)[-1]["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    # --replace stops and relaunches one deployment, not its neighbour.
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "-d", "r2", "--replace")
    assert code == 0 and deployments_of(doc)["r2"]["run"] == "r2_baseline_v2", err
    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    assert (
        deployments_of(doc)["r1"]["run"] == "r1_baseline_v2" and deployments_of(doc)["r1"]["ready"]
    )
    cli("stop", "-i", str(inv))


def test_deployment_env_arrives_exact_and_secrets_stay_masked(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    tricky = "a b 'q' \"d\" $HOME `x`\nline2"
    port = free_port(alpha.address)
    table = {"r1": {"gpus": [0], "port": port, "env": {"HF_TOKEN": "hf_secret_42", "ODD": tricky}}}
    inv = replicas(hosts, tmp_path, table)
    document = yaml.safe_load(inv.read_text())
    document["all"]["hosts"]["alpha"]["env"] = {"NCCL_DEBUG": "WARN"}
    inv.write_text(yaml.safe_dump(document))

    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    env = standin_starts(alpha)[-1]["env"]
    assert (
        env["ODD"] == tricky and env["HF_TOKEN"] == "hf_secret_42" and env["NCCL_DEBUG"] == "WARN"
    )
    shown = deployments_of(doc)["r1"]["env"]
    assert shown["HF_TOKEN"] == "********" and shown["ODD"] == tricky
    runs = alpha.home / ".deployctl" / "runs"
    assert "hf_secret_42" not in (runs / "r1_baseline_v1.json").read_text()
    assert oct((runs / "r1_baseline_v1.env").stat().st_mode & 0o777) == "0o600"
    assert (runs / "current-r1").read_text() == "r1_baseline_v1"
    for command in (["status"], ["launch", "--dry-run"], ["render"]):
        result = cli(*command, "-i", str(inv), "--json")
        assert "hf_secret_42" not in result.stdout + result.stderr, command
    cli("stop", "-i", str(inv))


def test_a_stop_of_every_deployment_also_ends_runs_the_inventory_no_longer_names(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = replicas(hosts, tmp_path, {})
    document = yaml.safe_load(inv.read_text())
    del document["all"]["hosts"]["alpha"]["deployments"]
    inv.write_text(yaml.safe_dump(document))
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0 and doc["hosts"]["alpha"]["run"] == "baseline_v1", err
    # The host gets deployments while its single server still runs on every GPU.
    port = free_port(alpha.address)
    document["all"]["hosts"]["alpha"]["deployments"] = {"r1": {"gpus": [1], "port": port}}
    inv.write_text(yaml.safe_dump(document))
    refused = cli("launch", "-i", str(inv), "--timeout", "60")
    assert refused.returncode == 1
    assert (
        "alpha/r1: error: the host's default deployment holds every GPU on alpha "
        "(run baseline_v1" in refused.stderr
    )
    assert "(deployctl stop -H alpha)" in refused.stderr
    result = cli("stop", "-i", str(inv), "--json")
    assert result.returncode == 0, result.stderr
    assert "alpha: stopping every deployment: r1, (default)" in result.stderr
    stopped = json.loads(result.stdout)["hosts"]["alpha"]
    assert stopped["deployments"]["r1"]["note"] == "no run recorded"
    assert stopped["run"] == "baseline_v1" and stopped["gpus_clean"] is True
    assert rank_pids(alpha) == []


def test_watch_restarts_only_the_deployment_that_died(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv, _ = two_replicas(hosts, tmp_path)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    r1, r2 = (deployments_of(doc)[n]["pid"] for n in ("r1", "r2"))
    os.killpg(r2, signal.SIGKILL)
    text, err = watch_until(cli, inv, "restarted as")
    assert "alpha/r2: r2_baseline_v1 crashed (died); restarting (attempt 1)" in text, text + err
    assert "alpha/r2: restarted as r2_baseline_v2: ready" in text
    assert "alpha/r1" not in text
    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    assert code == 0 and deployments_of(doc)["r1"]["pid"] == r1
    cli("stop", "-i", str(inv))
