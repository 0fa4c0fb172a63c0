"""Server metrics: the /metrics parser, `status --metrics`, `top` and `metrics-targets`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deployctl.metrics import MetricsError, parse_metrics, quantile
from tests.conftest import CLI
from tests.sshd_hosts import REPO, SSHLab
from tests.test_deployments import run_json
from tests.test_lifecycle import prepare
from tests.test_multinode import group_inventory, set_knobs

INF = float("inf")


def test_quantiles_are_read_as_prometheus_histogram_quantile_reads_them() -> None:
    counts = {0.1: 0.0, 0.2: 4.0, 0.4: 10.0, INF: 10.0}
    assert quantile(0.5, counts) == pytest.approx(0.2 + 0.2 * (5 - 4) / 6)
    assert quantile(0.2, counts) == pytest.approx(0.1 + 0.1 * 2 / 4)
    assert quantile(0.5, {0.1: 0.0, INF: 0.0}) is None  # no request seen yet
    assert quantile(0.99, {0.1: 0.0, 0.2: 1.0, INF: 3.0}) == 0.2  # beyond the last bucket


def sglang_page(rank1_running: float = 7.0) -> str:
    """A /metrics page shaped like SGLang 0.5.23's: two TP ranks' gauges, a histogram per
    streaming flag, and metrics deployctl does not show."""
    labels = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0"'
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f'sglang:num_running_reqs{{{labels},tp_rank="1"}} {rank1_running}',
        f'sglang:num_running_reqs{{{labels},tp_rank="0"}} 3.0',
        "# TYPE sglang:gen_throughput gauge",
        f'sglang:gen_throughput{{{labels},tp_rank="0"}} 812.5',
        "# TYPE sglang:decode_sum_seq_lens gauge",
        f'sglang:decode_sum_seq_lens{{{labels},tp_rank="0"}} 4096.0',
        "# TYPE sglang:time_to_first_token_seconds histogram",
    ]
    for flag, counts in (("true", (1, 3, 4)), ("false", (0, 1, 2))):
        for bound, count in zip(("0.1", "0.2", "+Inf"), counts, strict=True):
            lines.append(
                f'sglang:time_to_first_token_seconds_bucket{{{labels},tp_rank="0",'
                f'is_streaming="{flag}",le="{bound}"}} {count}'
            )
        lines.append(
            f'sglang:time_to_first_token_seconds_count{{{labels},tp_rank="0",'
            f'is_streaming="{flag}"}} {counts[-1]}'
        )
    lines.append("# TYPE process_cpu_seconds_total counter")
    lines.append("process_cpu_seconds_total 12.0")
    return "\n".join(lines) + "\n"


def test_gauges_come_from_tp_rank_0_and_histograms_sum_their_label_sets() -> None:
    metrics = parse_metrics(sglang_page())
    assert metrics["num_running_reqs"] == 3.0  # rank 0's, listed after rank 1's
    assert metrics["gen_throughput"] == 812.5
    assert metrics["spec_accept_length"] is None  # not exported without speculation
    assert metrics["num_queue_reqs"] is None
    ttft = metrics["time_to_first_token_seconds"]
    assert ttft["count"] == 6  # 4 streaming + 2 not
    assert ttft["p50"] == pytest.approx(0.1 + 0.1 * (3 - 1) / 3)  # cumulative 1, 4, 6
    assert metrics["inter_token_latency_seconds"] == {"p50": None, "p99": None, "count": 0}


@pytest.mark.parametrize(
    "text",
    [
        "<html>Not Found</html>",
        "sglang:gen_throughput{ 5\n",
        'sglang:gen_throughput{tp_rank="0" 5\n',
    ],
)
def test_a_page_that_is_not_prometheus_text_is_an_error(text: str) -> None:
    with pytest.raises(MetricsError, match="not Prometheus text"):
        parse_metrics(text)


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
    nodes = {n: doc["hosts"][n]["deployments"]["kimi"] for n in ("alpha", "bravo")}
    assert nodes["alpha"]["metrics"]["gen_throughput"] == 773.0
    assert "metrics" not in nodes["bravo"]  # its dummy server has none: not asked
    cli("stop", "-i", str(inv))


def test_top_refreshes_over_kept_connections_and_survives_a_host_going_away(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = served(hosts, cli, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPLOYCTL_", "SSH_AUTH"))}
    env.update(HOME=str(cli.home), PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "deployctl", "top", "--json", "-i", str(inv), "--interval", "0.3"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cli.cwd
    )
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
                for pid in bravo.sshd_pids():  # its sshd goes away, our session with it
                    os.kill(pid, signal.SIGKILL)
            elif phases["up"] and not phases["down"] and not entry["ok"]:
                phases["down"] = True
                assert doc["hosts"]["alpha"]["metrics"]["gen_throughput"] == 773.0
                bravo.start()
            elif phases["down"] and entry["ok"]:
                phases["back"] = True
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        if bravo.proc is None or bravo.proc.poll() is not None:
            bravo.start()
    assert phases == {"up": True, "down": True, "back": True}, (seen[-1:], err)
    assert proc.returncode == 0 and "Traceback" not in err
    cli("stop", "-i", str(inv))
