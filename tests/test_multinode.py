"""Multi-node deployments: one server across several hosts, run and restarted as one unit.

Over real sshd hosts with the stand-in taught the multi-node contract: rank 0 hosts the
rendezvous at --dist-init-addr and serves the API; the other nodes join it, serve only a
dummy /health, and end with an NCCL error a little after a node they are joined to is gone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import CLI
from tests.sglang_wheel import SGLANG_VERSION, claim_version, install_on
from tests.sshd_hosts import REPO, STANDIN, SSHLab, free_port, loopback_address
from tests.test_deployments import run_json, standin_starts
from tests.test_faults import agents, wait_until
from tests.test_lifecycle import prepare, rank_pids, streaming, watch_until

# ---- over real sshd hosts --------------------------------------------------------------------


def group_inventory(lab: SSHLab, tmp_path: Path, names: list[str], **knobs: Any) -> Path:
    """The hosts as one group `kimi` running one TP-len(names) server, one rank per node."""
    host_vars = {n: {**prepare(lab.hosts[n], tp=1, **knobs), "template": "baseline"} for n in names}
    path = lab.inventory(tmp_path / "inv.yml", names, host_vars)
    document = yaml.safe_load(path.read_text())
    dist_port = free_port(lab.hosts[names[0]].address)
    kimi = {"nodes": "kimi", "tp": len(names), "dist_port": dist_port}
    document["all"]["children"] = {
        "kimi": {"hosts": {n: None for n in names}, "vars": {"deployments": {"kimi": kimi}}}
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def dist_port(inv: Path) -> int:
    document = yaml.safe_load(inv.read_text())
    return int(document["all"]["children"]["kimi"]["vars"]["deployments"]["kimi"]["dist_port"])


def set_knobs(lab: SSHLab, name: str, **knobs: Any) -> None:
    (lab.hosts[name].home / "model" / "standin.json").write_text(
        json.dumps({"startup_s": 0.3, **knobs})
    )


def launched_group(
    lab: SSHLab, cli: CLI, tmp_path: Path, names: list[str]
) -> tuple[Path, dict[str, Any]]:
    """A group over `names`, launched to ready: its inventory and launch document."""
    inv = group_inventory(lab, tmp_path, names)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    return inv, doc


def node_entries(doc: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any]]:
    return {n: doc["hosts"][n]["deployments"]["kimi"] for n in names}


@pytest.mark.parametrize("names", [["alpha", "bravo"], ["alpha", "bravo", "charlie"]])
def test_a_group_launches_to_ready_with_its_ranks_and_one_init_address(
    hosts: SSHLab, cli: CLI, tmp_path: Path, names: list[str]
) -> None:
    inv = group_inventory(hosts, tmp_path, names)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, (err, doc)
    entries = node_entries(doc, names)
    assert {n: e["state"] for n, e in entries.items()} == dict.fromkeys(names, "ready")
    assert {e["run"] for e in entries.values()} == {"kimi_baseline_v1"}
    addresses = set()
    for rank, name in enumerate(names):
        argv = standin_starts(hosts.hosts[name])[-1]["argv"]
        assert f"--node-rank={rank}" in argv and f"--nnodes={len(names)}" in argv
        assert f"--tp-size={len(names)}" in argv
        addresses |= {a for a in argv if a.startswith("--dist-init-addr=")}
        assert len(rank_pids(hosts.hosts[name])) == 1  # one TP rank per node
    assert addresses == {f"--dist-init-addr={hosts.hosts[names[0]].address}:{dist_port(inv)}"}

    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    assert code == 0
    group = doc["deployments"]["kimi"]
    assert group["state"] == "ready" and group["nnodes"] == len(names)
    assert [(n["host"], n["node_rank"], n["alive"]) for n in group["nodes"]] == [
        (name, rank, True) for rank, name in enumerate(names)
    ]
    human = cli("status", "-i", str(inv)).stdout
    assert f"kimi ({', '.join(names)})" in human and "ready" in human

    result = cli("stop", "-i", str(inv), "--json")
    assert result.returncode == 0, result.stderr
    stopped = node_entries(json.loads(result.stdout), names)
    assert all(e["gpus_clean"] is True for e in stopped.values())
    assert all(rank_pids(hosts.hosts[n]) == [] for n in names)


def test_a_groups_stop_drains_rank_0_whose_end_ends_the_other_nodes(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    # Node > 0's main process dies of SIGTERM at once (it has no drain of its own) and its
    # ranks with it: a stop that signals it breaks rank 0's requests. Rank 0's drain ends it.
    names = ["alpha", "bravo"]
    inv = group_inventory(hosts, tmp_path, names, drain_s=0.5, step_ms=20.0)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    launched = node_entries(doc, names)
    threads, answers = streaming(hosts.hosts["alpha"], inv, Path(launched["alpha"]["log"]), 2, 300)
    result = cli("stop", "-i", str(inv), "--json", "--timeout", "60")
    for thread in threads:
        thread.join(timeout=60)
    assert answers == [(300, True)] * 2, answers  # every token, through rank 0's drain
    assert result.returncode == 0, result.stderr
    stopped = node_entries(json.loads(result.stdout), names)
    assert (stopped["alpha"]["shutdown"], stopped["alpha"]["killed"]) == ("drained", [])
    # Bravo's stop comes after rank 0's: it followed rank 0 (ended already, or ending).
    assert stopped["bravo"]["shutdown"] in ("drained", None) and stopped["bravo"]["killed"] == []
    assert all(e["gpus_clean"] is True for e in stopped.values())
    assert all(rank_pids(hosts.hosts[n]) == [] for n in names)
    bravo = Path(launched["bravo"]["log"]).read_text()
    assert re.search(r"Scheduler or DataParallelController \d+ terminated with 0$", bravo, re.M)
    assert "NCCL error" not in bravo and "crashed with exit code" not in bravo
    code, doc, _ = run_json(cli, "crash", "-i", str(inv))
    assert code == 0 and all(not e["crashes"] for e in node_entries(doc, names).values()), doc


def test_one_node_failing_preflight_starts_nothing_anywhere(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    names = ["alpha", "bravo"]
    inv = group_inventory(hosts, tmp_path, names)
    hosts.hosts["bravo"].set_gpus("busy", 1)
    code, doc, _ = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 1 and doc["started"] is False
    entries = node_entries(doc, names)
    assert entries["alpha"]["preflight"]["ready"] is True
    assert "not clean" in " ".join(entries["bravo"]["preflight"]["problems"])
    for name in names:
        assert rank_pids(hosts.hosts[name]) == []
        assert not (hosts.hosts[name].home / "model" / "standin-argv.jsonl").exists()


def test_rank_0s_dist_port_in_use_is_refused(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    import socket

    inv = group_inventory(hosts, tmp_path, ["alpha", "bravo"])
    port = dist_port(inv)
    with socket.socket() as busy:
        # On another address of the host: torch's rendezvous store binds every address.
        busy.bind((loopback_address(250), port))
        busy.listen()
        result = cli("launch", "-i", str(inv), "--timeout", "60")
    assert result.returncode == 1
    assert f"alpha/kimi: error: port {port} (dist_port, where the other nodes join) is in use" in (
        result.stderr
    )


def test_a_rank_crashing_at_start_fails_the_launch_and_leaves_no_process(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    names = ["alpha", "bravo", "charlie"]
    inv = group_inventory(hosts, tmp_path, names)
    set_knobs(hosts, "bravo", crash="startup", crash_message="CUDA out of memory on node 1")
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 1
    entries = node_entries(doc, names)
    assert entries["bravo"]["state"] in ("crashed", "died"), entries
    assert "CUDA out of memory on node 1" in json.dumps(entries["bravo"]["crashes"])
    assert all(rank_pids(hosts.hosts[n]) == [] for n in names), err
    human = cli("status", "-i", str(inv)).stdout
    assert "ready" not in human


def test_rank_0_killed_then_restart_crashed_relaunches_every_node(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    names = ["alpha", "bravo"]
    inv, doc = launched_group(hosts, cli, tmp_path, names)
    os.killpg(node_entries(doc, names)["alpha"]["pid"], signal.SIGKILL)
    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    group = doc["deployments"]["kimi"]
    assert code == 1 and group["state"] == "crashed" and group["down"][0] == "alpha"

    code, doc, err = run_json(cli, "restart", "--crashed", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    entries = node_entries(doc, names)
    assert {e["run"] for e in entries.values()} == {"kimi_baseline_v2"}
    assert all(e["state"] == "ready" for e in entries.values())
    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    assert doc["deployments"]["kimi"]["state"] == "ready"
    cli("stop", "-i", str(inv))
    assert all(rank_pids(hosts.hosts[n]) == [] for n in names)


def test_watch_restarts_the_whole_group_when_one_node_dies(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    names = ["alpha", "bravo"]
    inv, doc = launched_group(hosts, cli, tmp_path, names)
    os.killpg(node_entries(doc, names)["bravo"]["pid"], signal.SIGKILL)
    text, err = watch_until(cli, inv, "restarted as")
    # Alpha's rank may die of bravo's death before the round that sees it (as NCCL peers do).
    assert re.search(r"kimi \(alpha, bravo\): kimi_baseline_v1 crashed on (alpha, )?bravo", text), (
        text + err
    )
    assert "kimi (alpha, bravo): restarted as kimi_baseline_v2: ready" in text
    for name in names:
        logs = sorted(p.name for p in (hosts.hosts[name].home / "logs").iterdir())
        assert logs == ["kimi_baseline_v1.log", "kimi_baseline_v2.log"]
    cli("stop", "-i", str(inv))


def test_a_second_group_on_a_host_of_a_running_group_is_refused_naming_it(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = group_inventory(hosts, tmp_path, ["alpha", "bravo", "charlie"])
    document = yaml.safe_load(inv.read_text())
    children = document["all"]["children"]
    children["kimi"]["hosts"] = {"alpha": None, "bravo": None}
    children["kimi"]["vars"]["deployments"]["kimi"]["tp"] = 2
    glm = {"nodes": "glm", "tp": 2, "dist_port": free_port(hosts.hosts["bravo"].address)}
    port = free_port(hosts.hosts["bravo"].address)
    children["glm"] = {"hosts": {"bravo": None, "charlie": None}}
    for name in ("bravo", "charlie"):
        table = {"kimi": children["kimi"]["vars"]["deployments"]["kimi"]} if name == "bravo" else {}
        document["all"]["hosts"][name]["deployments"] = {**table, "glm": {**glm, "port": port}}
    inv.write_text(yaml.safe_dump(document))
    code, _, err = run_json(cli, "launch", "-i", str(inv), "-d", "kimi", "--timeout", "60")
    assert code == 0, err
    result = cli("launch", "-i", str(inv), "-d", "glm", "--timeout", "60")
    assert result.returncode == 1
    assert "bravo/glm: error: deployment kimi holds every GPU on bravo (run kimi_baseline_v1" in (
        result.stderr
    )
    assert rank_pids(hosts.hosts["charlie"]) == []
    cli("stop", "-i", str(inv))


def test_a_node_whose_connection_drops_while_waited_for_is_reconnected(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    """bravo's sshd and our session with it go away while the group starts and come back a
    second later: the wait connects again and the group reaches ready, the loss on record."""
    names = ["alpha", "bravo"]
    # Start-up outlasts the steps below on a busy machine: a group ready before bravo went
    # away would show no loss.
    inv = group_inventory(hosts, tmp_path, names, startup_s=10)
    bravo = hosts.hosts["bravo"]
    launch = cli.popen("launch", "-i", str(inv), "--json", "--timeout", "60")
    wait_until(lambda: agents(bravo, "poll"), timeout=30)  # started: the wait is polling it
    bravo.go_away()
    time.sleep(1)
    bravo.start()
    out, err = launch.communicate(timeout=90)
    assert launch.returncode == 0, out + err
    entries = node_entries(json.loads(out), names)
    assert {n: e["state"] for n, e in entries.items()} == dict.fromkeys(names, "ready")
    assert entries["alpha"]["connection_losses"] == []
    assert len(entries["bravo"]["connection_losses"]) == 1, entries["bravo"]
    assert entries["bravo"]["connection_losses"][0].startswith("bravo: ")
    cli("stop", "-i", str(inv))


def with_sglang(lab: SSHLab, inv: Path, template: Path, names: list[str]) -> None:
    """Each named host runs the stand-in from its own copy of the real SGLang venv."""
    document = yaml.safe_load(inv.read_text())
    for name in names:
        python = install_on(lab.hosts[name], template, standin=STANDIN)
        document["all"]["hosts"][name]["python"] = python
    inv.write_text(yaml.safe_dump(document, sort_keys=False))


def test_nodes_on_another_sglang_or_other_patch_sets_are_refused_naming_each_one(
    hosts: SSHLab, sglang_template: Path, cli: CLI, tmp_path: Path
) -> None:
    names = ["alpha", "bravo"]
    inv = group_inventory(hosts, tmp_path, names)
    with_sglang(hosts, inv, sglang_template, names)
    bravo = hosts.hosts["bravo"]
    group = "the nodes of kimi (alpha, bravo) would run different SGLang or patch sets: "

    def refused() -> list[str]:
        code, doc, err = run_json(cli, "launch", "-i", str(inv), "--dry-run")
        assert code == 1, err
        entries = node_entries(doc, names)
        assert entries["bravo"]["preflight"]["problems"] == []
        assert "deployctl patch audit" in entries["alpha"]["preflight"]["hints"][0]
        problems: list[str] = entries["alpha"]["preflight"]["problems"]
        return problems

    claim_version(bravo, "0.5.22")
    assert refused() == [
        f"{group}alpha/kimi runs SGLang {SGLANG_VERSION} with no patch set; bravo/kimi runs "
        "SGLang 0.5.22 with no patch set"
    ]
    claim_version(bravo, SGLANG_VERSION)
    # Applied on alpha alone (-H alpha would name the whole group).
    python = yaml.safe_load(inv.read_text())["all"]["hosts"]["alpha"]["python"]
    alone = hosts.inventory(tmp_path / "alpha.yml", ["alpha"], {"alpha": {"python": python}})
    assert cli("patch", "apply", "spec-disable", "-i", str(alone)).returncode == 0
    version = yaml.safe_load((REPO / "patches" / "spec-disable" / "patch.yml").read_text())
    assert refused() == [
        f"{group}alpha/kimi runs SGLang {SGLANG_VERSION} with spec-disable "
        f"{version['version']}; bravo/kimi runs SGLang {SGLANG_VERSION} with no patch set"
    ]
    assert cli("patch", "apply", "spec-disable", "-i", str(inv)).returncode == 0  # on bravo too
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--dry-run")
    assert code == 0, err
    for name in names:
        assert rank_pids(hosts.hosts[name]) == []
        assert not (hosts.hosts[name].home / "model" / "standin-argv.jsonl").exists()
