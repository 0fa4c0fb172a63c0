"""Server metrics: the /metrics parser, `status --metrics`, `top` and `metrics-targets`."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.conftest import CLI, FullDisk
from tests.sshd_hosts import REPO, SSHLab
from tests.test_deployments import run_json
from tests.test_lifecycle import prepare
from tests.test_multinode import group_inventory, set_knobs


def test_metrics_targets_list_every_deployment_that_serves_metrics(
    cli: CLI, tmp_path: Path
) -> None:
    example = str(REPO / "inventories" / "example.yml")
    out = tmp_path / "targets.json"
    result = cli("metrics-targets", "-i", example, "-H", "h200-a08,rtx-b01", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "3 targets written" in result.stderr
    entries = json.loads(out.read_text())
    assert entries == [
        {
            "targets": ["h200-a08:30000"],
            "labels": {"host": "h200-a08", "deployment": "qwen-a", "group": "h200-replicas",
                       "template": "baseline"},
        },
        {
            "targets": ["h200-a08:30001"],
            "labels": {"host": "h200-a08", "deployment": "qwen-b", "group": "h200-replicas",
                       "template": "baseline"},
        },
        {
            "targets": ["rtx-b01:30000"],
            "labels": {"host": "rtx-b01", "deployment": "", "group": "rtx6000",
                       "template": "eagle3"},
        },
    ]  # fmt: skip


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    """The `error:` line of a user mistake: exit 1, an error and a hint, never a bug."""
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr
    assert [line.split(":")[0] for line in lines] == ["error", "hint"], lines
    assert "bug" not in result.stderr
    return lines[0]


def test_metrics_targets_into_a_missing_folder_or_onto_a_folder_is_one_line(
    cli: CLI, tmp_path: Path
) -> None:
    example = str(REPO / "inventories" / "example.yml")
    missing = tmp_path / "nowhere" / "targets.json"
    assert "does not exist" in one_error(cli("metrics-targets", "-i", example, "-o", str(missing)))
    assert not missing.parent.exists()
    assert "is a folder" in one_error(cli("metrics-targets", "-i", example, "-o", str(tmp_path)))
    assert {p.name for p in tmp_path.iterdir()} == {"work", "client-home"}


def test_metrics_targets_on_a_full_disk_keeps_the_old_file_and_leaves_nothing(
    cli: CLI, full_disk: FullDisk
) -> None:
    example = str(REPO / "inventories" / "example.yml")
    out = full_disk.path / "targets.json"
    out.write_text("[]\n")
    full_disk.fill()
    error = one_error(cli("metrics-targets", "-i", example, "-o", str(out)))
    assert error == f"error: cannot write {out}: No space left on device"
    assert out.read_text() == "[]\n"
    assert full_disk.names() == {"targets.json"}


def test_metrics_targets_warn_on_stderr_of_servers_bound_to_loopback(
    cli: CLI, tmp_path: Path
) -> None:
    inventory = tmp_path / "inv.yml"
    inventory.write_text(
        "all:\n  hosts:\n"
        "    local1: {}\n"  # bind_host's default, 127.0.0.1
        "    open1: {bind_host: 0.0.0.0}\n"
        "    two1:\n      bind_host: 0.0.0.0\n      deployments:\n"
        "        a: {port: 30001, bind_host: '::1'}\n"
        "        b: {port: 30002, bind_host: localhost}\n"
        "        c: {port: 30003}\n"
        "        d: {port: 30004, bind_host: 127.0.0.1, enable_metrics: false}\n"
    )
    warning = (
        "warning: local1, two1/a, two1/b: bound to a loopback address (bind_host), so "
        "Prometheus on another machine cannot scrape them; set bind_host: 0.0.0.0 (or the "
        "host's address) for those"
    )
    printed = cli("metrics-targets", "-i", str(inventory))
    assert printed.returncode == 0 and printed.stderr.splitlines() == [warning]
    assert len(json.loads(printed.stdout)) == 5  # the file is Prometheus' list, nothing else
    out = tmp_path / "targets.json"
    written = cli("metrics-targets", "-i", str(inventory), "-o", str(out))
    assert written.stderr.splitlines() == [warning, f"5 targets written to {out}"]
    assert json.loads(out.read_text()) == json.loads(printed.stdout)
    quiet = cli("metrics-targets", "-i", str(inventory), "-H", "open1")
    assert quiet.returncode == 0 and quiet.stderr == ""


# ---- over real sshd hosts --------------------------------------------------------------------

KNOBS: dict[str, Any] = {
    "metrics": {"num_running_reqs": 12, "num_queue_reqs": 3, "gen_throughput": 773.0,
                "token_usage": 0.41, "cache_hit_rate": 0.25},
    "observations": {"time_to_first_token_seconds": [0.15] * 9,
                     "inter_token_latency_seconds": [0.012] * 40},
}  # fmt: skip


def served(lab: SSHLab, cli: CLI, tmp_path: Path, **extra: Any) -> Path:
    """alpha serving the stand-in with metrics (bravo too, with `extra` variables)."""
    host_vars = {
        "alpha": {**prepare(lab.hosts["alpha"], tp=1, **KNOBS), "template": "baseline"},
        "bravo": {**prepare(lab.hosts["bravo"], tp=1), "template": "baseline", **extra},
    }
    inv = lab.inventory(tmp_path / "inv.yml", ["alpha", "bravo"], host_vars)
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    return inv


def test_status_metrics_shows_the_servers_numbers_and_metrics_off(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = served(hosts, cli, tmp_path, enable_metrics=False)
    code, doc, _ = run_json(cli, "status", "--metrics", "-i", str(inv))
    assert code == 0
    alpha, bravo = doc["hosts"]["alpha"], doc["hosts"]["bravo"]
    metrics = alpha["metrics"]
    assert alpha["metrics_note"] == ""
    assert (metrics["num_running_reqs"], metrics["num_queue_reqs"]) == (12, 3)
    assert metrics["gen_throughput"] == 773.0 and metrics["token_usage"] == 0.41
    assert 0.1 < metrics["time_to_first_token_seconds"]["p50"] <= 0.2  # its bucket
    assert 0.010 < metrics["inter_token_latency_seconds"]["p50"] <= 0.015
    assert metrics["time_to_first_token_seconds"]["count"] == 9
    assert bravo["metrics"] is None and bravo["metrics_note"] == "metrics off"
    assert bravo["ok"] is True  # no metrics is not an error

    human = cli("status", "--metrics", "-i", str(inv)).stdout
    assert "773.0" in human and "41%" in human and "metrics off" in human
    plain = json.loads(cli("status", "-i", str(inv), "--json").stdout)["hosts"]["alpha"]
    assert "metrics" not in plain  # only when asked for

    code, doc, _ = run_json(cli, "top", "--once", "-i", str(inv))
    assert code == 0 and doc["hosts"]["alpha"]["metrics"]["gen_throughput"] == 773.0
    cli("stop", "-i", str(inv))


def test_a_multi_node_servers_metrics_come_from_rank_0(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = group_inventory(hosts, tmp_path, ["alpha", "bravo"])
    set_knobs(hosts, "alpha", **KNOBS)
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    code, doc, _ = run_json(cli, "status", "--metrics", "-i", str(inv))
    assert code == 0
    nodes = {n: doc["hosts"][n]["deployments"]["kimi"] for n in ("alpha", "bravo")}
    assert nodes["alpha"]["metrics"]["gen_throughput"] == 773.0
    assert "metrics" not in nodes["bravo"]  # its dummy server has none: not asked
    cli("stop", "-i", str(inv))


def test_top_keeps_refreshing_while_a_host_goes_away_and_comes_back(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = served(hosts, cli, tmp_path)
    proc = cli.popen("top", "--json", "-i", str(inv), "--interval", "0.3")
    bravo = hosts.hosts["bravo"]
    seen: list[dict[str, Any]] = []
    phases = {"up": False, "down": False, "back": False}
    try:
        deadline = time.monotonic() + 60
        while proc.stdout is not None and time.monotonic() < deadline and not phases["back"]:
            doc = json.loads(proc.stdout.readline())
            seen.append(doc)
            entry = doc["hosts"]["bravo"]
            if not phases["up"] and entry["ok"]:
                phases["up"] = True
                bravo.go_away()  # its sshd goes away, our session with it
            elif phases["up"] and not phases["down"] and not entry["ok"]:
                phases["down"] = True
                assert doc["hosts"]["alpha"]["metrics"]["gen_throughput"] == 773.0
                bravo.start()
            elif phases["down"] and entry["ok"]:
                phases["back"] = True
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        bravo.ensure_running()
    assert phases == {"up": True, "down": True, "back": True}, (seen[-1:], err)
    assert proc.returncode == 0 and "Traceback" not in err
    cli("stop", "-i", str(inv))
