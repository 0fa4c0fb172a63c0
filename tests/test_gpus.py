"""`deployctl gpus` end to end against real sshd hosts with replayed nvidia-smi captures."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import CLI
from tests.sshd_hosts import SSHLab


def gpus_json(cli: CLI, inventory: Path, *extra: str) -> tuple[int, dict]:
    result = cli("gpus", "-i", str(inventory), "--json", *extra)
    assert "Traceback" not in result.stderr
    return result.returncode, json.loads(result.stdout)


def test_clean_hosts_report_clean_and_exit_zero(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    hosts.hosts["bravo"].set_gpus("clean", 8)
    code, doc = gpus_json(cli, inventory)
    assert code == 0
    alpha, bravo = doc["hosts"]["alpha"], doc["hosts"]["bravo"]
    assert alpha["ok"] and alpha["clean"] and alpha["error"] is None
    assert alpha["gpus"] == [
        {
            "index": 0,
            "uuid": "GPU-0f384172-4faf-f5c3-14fd-9c3861703c69",
            "name": "NVIDIA H200",
            "memory_used_mib": 0,
            "memory_total_mib": 143771,
            "utilization_pct": 0,
        }
    ]
    assert alpha["processes"] == []
    assert [g["index"] for g in bravo["gpus"]] == list(range(8))


def test_busy_host_is_dirty_naming_the_pid(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    hosts.hosts["bravo"].set_gpus("busy")
    code, doc = gpus_json(cli, inventory)
    assert code == 1
    assert doc["hosts"]["alpha"]["clean"] is True
    bravo = doc["hosts"]["bravo"]
    assert bravo["ok"] is True and bravo["clean"] is False
    assert bravo["processes"] == [
        {
            "pid": 419,
            "name": "python3",
            "used_memory_mib": 8802,
            "gpu_uuid": "GPU-0f384172-4faf-f5c3-14fd-9c3861703c69",
            "held_by": None,  # not one of our runs
        }
    ]
    human = cli("gpus", "-i", str(inventory), "-H", "bravo")
    assert human.returncode == 1
    assert "dirty: PIDs 419 hold GPU memory" in human.stdout


def test_missing_and_failing_nvidia_smi_are_reported_per_host(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo", "charlie"])
    hosts.hosts["alpha"].set_gpus("missing")
    hosts.hosts["bravo"].set_gpus("failing")
    code, doc = gpus_json(cli, inventory)
    assert code == 1
    assert doc["hosts"]["alpha"]["ok"] is False
    assert "nvidia-smi: command not found" in doc["hosts"]["alpha"]["error"]
    assert doc["hosts"]["bravo"]["ok"] is False
    assert "couldn't communicate with the NVIDIA driver" in doc["hosts"]["bravo"]["error"]
    assert doc["hosts"]["charlie"]["clean"] is True


def test_unreachable_host_does_not_stop_the_others(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo", "charlie"])
    hosts.hosts["bravo"].stop()
    code, doc = gpus_json(cli, inventory)
    assert code == 1
    assert doc["hosts"]["alpha"]["clean"] is True
    assert doc["hosts"]["charlie"]["clean"] is True
    assert doc["hosts"]["bravo"]["ok"] is False
    assert "cannot connect" in doc["hosts"]["bravo"]["error"]


def test_max_used_mib_judges_memory_that_no_listed_process_holds(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # What real drivers show when a process in another PID namespace holds the memory.
    hosts.hosts["alpha"].set_gpus("ghost", 1)
    inventory = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    code, doc = gpus_json(cli, inventory)  # the default: 16 MiB
    assert code == 1 and doc["hosts"]["alpha"]["clean"] is False
    assert doc["hosts"]["alpha"]["processes"] == []
    human = cli("gpus", "-i", str(inventory))
    assert "memory in use with no process listed: GPU0 8811 MiB" in human.stdout
    assert gpus_json(cli, inventory, "--max-used-mib", "8811")[0] == 0
    assert gpus_json(cli, inventory, "--max-used-mib", "8810")[0] == 1
