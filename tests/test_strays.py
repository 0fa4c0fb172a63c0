"""Stray runs (ops/strays.py) over real sshd hosts: `stop` without -d ends only
what its own inventory launched."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import CLI
from tests.sshd_hosts import SSHLab, free_port
from tests.test_deployments import deployments_of, replicas, run_json
from tests.test_lifecycle import rank_pids


def test_stop_without_d_leaves_another_inventorys_runs_alone_unless_told(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    # Two projects share alpha and its default state_dir: A runs `t`, B runs `f`.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    port_t, port_f = free_port(alpha.address), free_port(alpha.address)
    a = replicas(hosts, tmp_path / "a", {"t": {"gpus": [0], "port": port_t}})
    b = replicas(hosts, tmp_path / "b", {"f": {"gpus": [1], "port": port_f}})
    for inv in (a, b):
        code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
        assert code == 0, err
    assert len(rank_pids(alpha)) == 2

    stopped = cli("stop", "-i", str(b))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopping every deployment" not in stopped.stderr  # only f is B's
    assert (
        f"alpha: leaving run t_baseline_v1 (t) running: this inventory does not name it "
        f"(launched from {a.resolve()}); stop it from there, or with --orphans"
    ) in stopped.stderr
    code, doc, _ = run_json(cli, "status", "-i", str(a))
    assert deployments_of(doc)["t"]["ready"] is True, doc

    # Told to: listed first, then ended.
    orphans = cli("stop", "-i", str(b), "--orphans")
    assert orphans.returncode == 0, orphans.stderr
    assert "alpha: also stopping run t_baseline_v1 (t), launched from" in orphans.stderr
    assert rank_pids(alpha) == []


def test_stop_without_d_ends_what_its_own_inventory_no_longer_names(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = replicas(hosts, tmp_path, {"r1": {"gpus": [0], "port": free_port(alpha.address)}})
    code, _, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    # The same inventory, once r1 is gone from it (renamed r2): r1 is its own leftover.
    inv.write_text(inv.read_text().replace("r1:", "r2:"))
    stopped = cli("stop", "-i", str(inv))
    assert stopped.returncode == 0, stopped.stderr
    assert "alpha: stopping every deployment: r2, r1" in stopped.stderr
    assert rank_pids(alpha) == []
