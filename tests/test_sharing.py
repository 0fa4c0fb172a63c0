"""Deployments sharing a GPU (issue 42, item 5): allowed only when each one on it sets
`mem_fraction_static` and their sum there is at most SHARED_GPU_BOUND. The arithmetic and the
placement are pure (fast); the lab tests run two stand-ins on one fake GPU over real sshd."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployctl.deployments import deployment_targets
from deployctl.errors import DeployctlError, InventoryError, PreflightError
from deployctl.facts import Gpu, GpuProcess, GpuState, parse_gpus_command
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.ops import preflight
from deployctl.ops.gpus import GpuReport, gpu_report
from deployctl.ops.plan import Plan, plan_launch
from deployctl.ops.runs import start_waves
from deployctl.ops.sharing import SHARED_GPU_BOUND, GpuUser, fraction_problem, shared_gpu_problems
from deployctl.project import Project
from deployctl.remote import locks
from deployctl.remote.protocol import ClientIdentity, LiveRun
from deployctl.remote.server_argv import CommandValues
from deployctl.settings import check_settings
from tests.conftest import CLI
from tests.sshd_hosts import REPO, SSHLab, free_port
from tests.test_deployments import deployments_of, replicas, run_json, standin_starts
from tests.test_lifecycle import rank_pids

CAPTURES = REPO / "tests" / "data" / "nvidia-smi" / "h200-deployctl"


def plans(table: dict[str, dict[str, Any]], **host_vars: Any) -> list[Plan]:
    """Plan one host's deployments (baseline template, TP1, ports of their own)."""
    ports = {name: {"port": 30000 + i, **own} for i, (name, own) in enumerate(table.items())}
    h1 = Host(
        "h1",
        {**DEFAULT_VARS, "tp": 1, "model_path": "/m", "deployments": ports, **host_vars},
    )
    return plan_launch(Project(None), deployment_targets([h1]), "baseline", None, [], {})


def pair(first: Any, second: Any, gpus: Any = (0, 0)) -> dict[str, dict[str, Any]]:
    """A prefill/decode pair, each with its fraction (None: unset) on its GPUs."""
    table: dict[str, dict[str, Any]] = {}
    for name, fraction, where in (("p", first, gpus[0]), ("d", second, gpus[1])):
        table[name] = {"gpus": [where] if isinstance(where, int) else list(where)}
        if fraction is not None:
            table[name]["mem_fraction_static"] = fraction
    return table


def test_the_bound_is_the_documented_one() -> None:
    assert SHARED_GPU_BOUND == 0.9
    page = (REPO / "docs" / "guides" / "deployments.md").read_text(encoding="utf-8")
    assert "at most 0.9" in page and "## Sharing a GPU" in page


@pytest.mark.parametrize(
    ("first", "second"),
    [(0.4, 0.4), (0.45, 0.45), (0.34, 0.56), (0.3, 0.6)],  # 0.34 + 0.56 is 0.9000000000000001
)
def test_a_pair_on_one_gpu_within_the_bound_is_planned_each_knowing_the_other(
    first: float, second: float
) -> None:
    p, d = plans(pair(first, second))
    assert (p.mem_fraction, d.mem_fraction) == (first, second)
    assert p.siblings == [GpuUser("h1/d", [0], second)]
    assert d.siblings == [GpuUser("h1/p", [0], first)]
    assert f"--mem-fraction-static={first}" in p.rendered.argv


def test_a_pair_past_the_bound_is_refused_naming_the_gpu_the_deployments_and_the_sum() -> None:
    with pytest.raises(PreflightError) as refused:
        plans(pair(0.6, 0.6))
    assert refused.value.message == (
        "GPU 0 of h1 would hold 0.6 (h1/p) + 0.6 (h1/d) = 1.2 of its memory; "
        "at most 0.9 when deployments share a GPU"
    )
    assert "mem_fraction_static" in (refused.value.hint or "")
    with pytest.raises(PreflightError, match=r"0\.45 \(h1/p\) \+ 0\.4501 \(h1/d\) = 0\.9001"):
        plans(pair(0.45, 0.4501))


def test_sharing_without_a_fraction_on_every_deployment_is_refused() -> None:
    with pytest.raises(PreflightError) as refused:
        plans(pair(0.4, None))
    assert refused.value.message == (
        "h1/p and h1/d would share GPUs (GPU 0 and GPU 0); h1/d sets no mem_fraction_static"
    )
    with pytest.raises(PreflightError, match="h1/p and h1/d set no mem_fraction_static"):
        plans(pair(None, None))
    # Disjoint GPUs need no fraction, and each may take most of its own GPU.
    assert len(plans(pair(None, 0.95, gpus=(0, 1)))) == 2


def test_overlapping_subsets_are_summed_per_gpu() -> None:
    # [0,1] and [1,2]: only GPU 1 is shared.
    with pytest.raises(PreflightError, match=r"^GPU 1 of h1 would hold 0\.5 \(h1/p\) \+ 0\.5"):
        plans(pair(0.5, 0.5, gpus=([0, 1], [1, 2])))
    # Three deployments: GPU 1 holds all three; GPUs 0 and 2 two each.
    three = {
        "a": {"gpus": [0, 1], "mem_fraction_static": 0.3},
        "b": {"gpus": [1], "mem_fraction_static": 0.3},
        "c": {"gpus": [1, 2], "mem_fraction_static": 0.3},
    }
    assert [len(p.siblings) for p in plans(three)] == [2, 2, 2]
    three["c"]["mem_fraction_static"] = 0.31
    with pytest.raises(PreflightError, match=r"GPU 1 .* = 0\.91 of its memory"):
        plans(three)
    # Two on [0,1] and [2,3] share nothing: 0.8 each is fine.
    assert len(plans(pair(0.8, 0.8, gpus=([0, 1], [2, 3])))) == 2


def test_deployments_on_every_gpu_of_the_host_share_all_of_them() -> None:
    table = {"p": {"mem_fraction_static": 0.5}, "d": {"mem_fraction_static": 0.5}}
    with pytest.raises(PreflightError, match=r"^every GPU of h1 would hold 0\.5 \(h1/p\)"):
        plans(table)
    # One on every GPU and one on GPU 3: GPU 3 is shared.
    with pytest.raises(PreflightError, match=r"^GPU 3 of h1 would hold"):
        plans({"p": {"mem_fraction_static": 0.5}, "d": {"gpus": [3], "mem_fraction_static": 0.5}})


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "nan", "inf"])
def test_a_fraction_outside_0_to_1_is_refused_naming_host_deployment_and_variable(
    bad: Any,
) -> None:
    variables = {"deployments": {"p": {"mem_fraction_static": bad}}}
    with pytest.raises(InventoryError) as refused:
        check_settings(variables, "host h1")
    assert refused.value.message == (
        f"host h1, deployment p: mem_fraction_static {bad!r} is not a fraction of GPU memory "
        "(above 0, below 1)"
    )
    check_settings({"mem_fraction_static": 0.88}, "host h1")


def test_the_launch_and_the_agent_name_a_sharing_launch_alike() -> None:
    assert preflight.SHARING_OP == locks.SHARING_OP


def test_one_launchs_sharers_of_a_gpu_hold_their_locks_together_and_no_one_else(
    tmp_path: Path,
) -> None:
    def client(op: str, pid: int = 4242) -> ClientIdentity:
        return {"host": "ctl", "pid": pid, "user": "u", "op": op, "expires": time.time() + 60}

    state = str(tmp_path)
    sharing = client(locks.SHARING_OP)
    assert locks.take_lock(state, sharing, None, "p", [0])["acquired"]
    assert locks.take_lock(state, sharing, None, "d", [0, 1])["acquired"]
    # Another launch on that GPU, or one of this process that does not share: refused.
    other = locks.take_lock(state, client(locks.SHARING_OP, pid=99), None, "e", [1])
    assert not other["acquired"] and (other["holder"] or {}).get("deployment") == "d"
    assert not locks.take_lock(state, client("launch"), None, "e", [0])["acquired"]
    # The same deployment twice is never two locks.
    assert not locks.take_lock(state, sharing, None, "p", [0])["acquired"]


def test_a_fraction_given_another_way_is_checked_in_the_command() -> None:
    argv = ["python3", "-m", "sglang.launch_server", "--mem-fraction-static=1.2"]
    assert fraction_problem(CommandValues(argv)) == (
        "--mem-fraction-static '1.2' is not a fraction of GPU memory (above 0, below 1)"
    )
    assert fraction_problem(CommandValues([*argv, "--mem-fraction-static", "0.4"])) is None
    with pytest.raises(DeployctlError, match="h1/p: --mem-fraction-static 'x' is not a fraction"):
        plans({"p": {"extra_args": ["--mem-fraction-static=x"]}})
    with pytest.raises(
        DeployctlError, match=r"h1/p: --mem-fraction-static '1\.5' is not a fraction"
    ):
        plans({"p": {"mem_fraction_static": 0.4, "extra_args": ["--mem-frac", "1.5"]}})


def test_the_fraction_counted_is_the_one_sglang_takes_from_extra_args() -> None:
    # SGLang's parser takes `--mem-frac` for --mem-fraction-static, and the last one given.
    with pytest.raises(PreflightError) as refused:
        plans({**pair(0.4, 0.4), "d": {"gpus": [0], "mem_fraction_static": 0.4,
                                        "extra_args": ["--mem-frac=0.8"]}})  # fmt: skip
    assert refused.value.message == (
        "GPU 0 of h1 would hold 0.4 (h1/p) + 0.8 (h1/d) = 1.2 of its memory; "
        "at most 0.9 when deployments share a GPU"
    )
    # Set only in extra_args, in any spelling: the deployment does cap its memory.
    p, d = plans({**pair(0.4, None), "d": {"gpus": [0], "extra_args": ["--mem-frac", "0.45"]}})
    assert (p.mem_fraction, d.mem_fraction) == (0.4, 0.45)
    assert p.siblings == [GpuUser("h1/d", [0], 0.45)]


# ---- preflight on a shared GPU: its free memory, from real captures -----------------------


def captured(prefix: str, used_mib: int | None = None) -> GpuState:
    """An H200 as nvidia-smi answered deployctl's query (busy-standin: our stand-in rank,
    pid 553; busy-torch: someone's python3, pid 476); `used_mib` in place of its used."""
    gpus = (CAPTURES / f"{prefix}-query-gpu.csv").read_text()
    if used_mib is not None:
        line = gpus.splitlines()[1].split(", ")
        gpus = gpus.replace(f", {line[3]}, ", f", {used_mib} MiB, ")
    apps = (CAPTURES / f"{prefix}-query-compute-apps.csv").read_text()
    return parse_gpus_command(0, f"{gpus}@@apps\n{apps}")


def live(members: list[int], fraction: float | None = 0.4, gpus: Any = (0,)) -> LiveRun:
    return {
        "id": "p_baseline_v1", "pid": members[0], "deployment": "p", "port": 30000,
        "gpus": None if gpus is None else list(gpus), "members": members,
        "mem_fraction_static": fraction,
    }  # fmt: skip


def test_a_shared_gpu_needs_room_for_the_fraction_not_a_clean_gpu() -> None:
    me = GpuUser("h1/d", [0], 0.4)
    ours = captured("busy-standin")  # 3691 of 143771 MiB used, by our rank 553
    assert shared_gpu_problems("h1", me, [], [live([550, 553])], ours, 16) == []
    # A real server at 0.4 holds about 0.4 of the GPU and more: 0.4 more does not fit.
    full = captured("busy-standin", used_mib=90000)
    assert shared_gpu_problems("h1", me, [], [live([550, 553])], full, 16) == [
        "GPU 0 of h1 has 53771 MiB free; h1/d needs mem_fraction_static 0.4 of its 143771 MiB "
        "(57509 MiB)"
    ]
    # Its siblings of the same launch start with it: their share counts too.
    roomy = captured("busy-standin", used_mib=80000)
    assert shared_gpu_problems("h1", me, [], [live([553])], roomy, 16) == []
    sibling = GpuUser("h1/e", [0], 0.1)
    [problem] = shared_gpu_problems("h1", me, [sibling], [live([553])], roomy, 16) or []
    assert problem == (
        "GPU 0 of h1 has 63771 MiB free; h1/d and h1/e, starting together, need "
        "0.4 (h1/d) + 0.1 (h1/e) = 0.5 of its 143771 MiB (71886 MiB)"
    )


def test_a_process_that_is_not_ours_on_a_shared_gpu_is_refused() -> None:
    someone = captured("busy-torch")  # pid 476, not a member of our run
    assert shared_gpu_problems("h1", GpuUser("h1/d", [0], 0.4), [], [live([553])], someone, 16) == [
        "GPU 0 of h1 is not clean: PIDs 476 that are not our runs hold memory"
    ]


def test_without_fractions_on_both_sides_the_clean_check_applies() -> None:
    ours = captured("busy-standin")
    assert (
        shared_gpu_problems("h1", GpuUser("h1/d", [0], None), [], [live([553])], ours, 16) is None
    )
    unset = live([553], fraction=None)
    assert shared_gpu_problems("h1", GpuUser("h1/d", [0], 0.4), [], [unset], ours, 16) is None
    assert shared_gpu_problems("h1", GpuUser("h1/d", [0], 0.4), [], [], ours, 16) is None


def test_after_a_sharer_stops_only_our_other_runs_may_be_left_on_its_gpus() -> None:
    decode = {553: "d (d_baseline_v1)"}  # the live decode's rank
    left = gpu_report(captured("busy-standin"), 16)
    assert replace(left, holders=decode).held_by_ours  # the decode stays: the stop is done
    assert not left.held_by_ours  # 553 is no live run of ours (the stopped one's, say)
    assert not replace(gpu_report(captured("busy-torch"), 16), holders=decode).held_by_ours
    # Memory in use with no process listed is nobody's we know.
    assert not gpu_report(captured("idle", used_mib=4000), 16).held_by_ours
    assert gpu_report(captured("idle"), 16).held_by_ours


def test_a_run_sharing_a_gpu_is_shown_holding_its_own_memory_not_the_gpus() -> None:
    # As on the H200 with two SGLang 0.5.17 replicas on GPU 0 (benchmarks/h200-canary):
    # nvidia-smi listed their schedulers at 37,128 and 27,716 MiB, the GPU at 64,860 used.
    gpu = Gpu(0, "GPU-0", "NVIDIA H200", 64860, 143771, 0)
    r1 = GpuProcess(875, "sglang::scheduler", 37128, "GPU-0")
    r2 = GpuProcess(1717, "sglang::scheduler", 27716, "GPU-0")
    shared = GpuReport([gpu], [r1, r2], 16)
    assert shared.memory_of([773, 875]) == 37128
    assert shared.memory_of([1631, 1717]) == 27716
    # None of its processes listed (a container's other PID namespace): the GPU's use.
    assert shared.memory_of([773]) == 64860
    # One of them listed with no figure ([N/A]): the GPU's use, never a part as the whole.
    unknown = GpuReport([gpu], [replace(r1, used_memory_mib=None), r2], 16)
    assert unknown.memory_of([773, 875]) == 64860


# ---- over real sshd hosts: two stand-ins on one fake GPU ------------------------------------


def shared_pair(lab: SSHLab, tmp_path: Path, first: float, second: float) -> Path:
    address = lab.hosts["alpha"].address
    table = {
        name: {"gpus": [0], "port": free_port(address), "mem_fraction_static": fraction}
        for name, fraction in (("p", first), ("d", second))
    }
    return replicas(lab, tmp_path, table, gpus=1)


def test_a_pair_at_0_4_each_shares_one_gpu_and_stopping_one_leaves_the_other(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = shared_pair(hosts, tmp_path, 0.4, 0.4)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    assert {n: e["state"] for n, e in deployments_of(doc).items()} == {"p": "ready", "d": "ready"}
    starts = standin_starts(alpha)
    assert {s["env"]["CUDA_VISIBLE_DEVICES"] for s in starts} == {"0"}
    assert len(rank_pids(alpha)) == 2
    # One after the other: SGLang sizes its memory from what is free when it starts, so the
    # second starts once the first is ready (the stand-in's startup_s after its start).
    first, second = sorted(s["time"] for s in starts)
    assert second - first >= 0.3, f"{second - first:.2f}s apart, bound 0.3s: {starts}"

    code, doc, err = run_json(cli, "status", "-i", str(inv))
    status = deployments_of(doc)
    assert code == 0 and status["p"]["ready"] and status["d"]["ready"], err
    assert (status["p"]["mem_fraction_static"], status["d"]["mem_fraction_static"]) == (0.4, 0.4)
    assert status["p"]["gpus"] == status["d"]["gpus"] == [0]
    # Each its own rank's memory, not the GPU's (both ranks, 2 × 3682 MiB).
    assert status["p"]["gpu_memory_used_mib"] == status["d"]["gpu_memory_used_mib"] == 3682
    assert "(cap 0.4)" in cli("status", "-i", str(inv)).stdout

    # Stopping the prefill waits for its own rank only: the decode's stays on the GPU.
    d_pid = status["d"]["pid"]
    began = time.monotonic()
    code, doc, err = run_json(cli, "stop", "-i", str(inv), "-d", "p")
    assert code == 0, err
    assert deployments_of(doc)["p"]["gpus_clean"] is True
    took = time.monotonic() - began
    assert took < 30, f"took {took:.2f}s, bound 30s (not the 120 s GPU wait)"
    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    status = deployments_of(doc)
    assert status["p"]["alive"] is False and status["d"]["ready"] is True
    assert status["d"]["pid"] == d_pid and len(rank_pids(alpha)) == 1

    # The prefill comes back beside the live decode: the GPU's free memory is what counts.
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "-d", "p", "--timeout", "60")
    assert code == 0, err
    assert deployments_of(doc)["p"]["state"] == "ready" and len(rank_pids(alpha)) == 2
    result = cli("stop", "-i", str(inv))
    assert result.returncode == 0, result.stderr
    assert rank_pids(alpha) == []


def test_a_pair_at_0_6_each_is_refused_before_anything_starts(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = shared_pair(hosts, tmp_path, 0.6, 0.6)
    result = cli("launch", "-i", str(inv), "--timeout", "60")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        "error: GPU 0 of alpha would hold 0.6 (alpha/p) + 0.6 (alpha/d) = 1.2 of its memory; "
        "at most 0.9 when deployments share a GPU"
    ) in result.stderr
    assert not (alpha.home / "model" / "standin-argv.jsonl").exists()
    assert not (alpha.home / "logs").exists() or not list((alpha.home / "logs").iterdir())
    assert not (alpha.home / ".deployctl").exists() or not list(
        (alpha.home / ".deployctl").glob("lock*")
    )
    assert rank_pids(alpha) == []


def test_a_pair_whose_extra_args_raise_a_fraction_past_the_bound_is_refused(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = shared_pair(hosts, tmp_path, 0.4, 0.4)
    document = yaml.safe_load(inv.read_text())
    document["all"]["hosts"]["alpha"]["deployments"]["d"]["extra_args"] = ["--mem-frac=0.8"]
    inv.write_text(yaml.safe_dump(document))
    for args in (("launch", "--dry-run"), ("launch", "--timeout", "60")):
        result = cli(*args, "-i", str(inv))
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert (
            "error: GPU 0 of alpha would hold 0.8 (alpha/d) + 0.4 (alpha/p) = 1.2 of its memory"
        ) in result.stderr
    assert not (alpha.home / "model" / "standin-argv.jsonl").exists()
    assert rank_pids(alpha) == []


def test_status_shows_the_cap_the_server_took(hosts: SSHLab, cli: CLI, tmp_path: Path) -> None:
    alpha = hosts.hosts["alpha"]
    port = free_port(alpha.address)
    table = {"p": {"gpus": [0], "port": port, "mem_fraction_static": 0.4,
                   "extra_args": ["--mem-frac", "0.3"]}}  # fmt: skip
    inv = replicas(hosts, tmp_path, table, gpus=1)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    log = (alpha.home / "logs" / "p_baseline_v1.log").read_text()
    assert "mem_fraction_static=0.3," in log  # what the server's own parser took
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    assert code == 0, err
    assert deployments_of(doc)["p"]["mem_fraction_static"] == 0.3
    assert "(cap 0.3)" in cli("status", "-i", str(inv)).stdout
    cli("stop", "-i", str(inv))


def test_a_launch_beside_a_live_run_counts_its_recorded_fraction(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = shared_pair(hosts, tmp_path, 0.4, 0.6)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "-d", "p", "--timeout", "60")
    assert code == 0, err
    record = json.loads((alpha.home / ".deployctl" / "runs" / "p_baseline_v1.json").read_text())
    assert record["mem_fraction_static"] == 0.4
    code, doc, _ = run_json(cli, "launch", "-i", str(inv), "-d", "d", "--timeout", "60")
    assert code == 1 and doc["started"] is False
    problems = deployments_of(doc)["d"]["preflight"]["problems"]
    assert problems == [
        "GPU 0 of alpha would hold 0.6 (alpha/d) + 0.4 (alpha/p, run p_baseline_v1) = 1 "
        "of its memory; at most 0.9 when deployments share a GPU"
    ]
    assert len(rank_pids(alpha)) == 1
    cli("stop", "-i", str(inv))


def test_a_replace_past_the_bound_is_refused_before_it_stops_the_running_one(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = shared_pair(hosts, tmp_path, 0.4, 0.4)
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    before = {n: e["pid"] for n, e in deployments_of(doc).items()}
    document = yaml.safe_load(inv.read_text())
    document["all"]["hosts"]["alpha"]["deployments"]["p"]["mem_fraction_static"] = 0.6
    inv.write_text(yaml.safe_dump(document))
    result = cli("launch", "-i", str(inv), "-d", "p", "--replace", "--timeout", "60")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "GPU 0 of alpha would hold 0.6 (alpha/p) + 0.4 (alpha/d, run d_baseline_v1) = 1 " in (
        result.stderr
    )
    code, doc, _ = run_json(cli, "status", "-i", str(inv))
    status = deployments_of(doc)
    assert {n: (e["pid"], e["ready"]) for n, e in status.items()} == {
        n: (pid, True) for n, pid in before.items()
    }  # the prefill was not stopped
    assert len(rank_pids(alpha)) == 2
    cli("stop", "-i", str(inv))


def test_sharers_of_a_gpu_start_in_turn_and_the_others_at_once() -> None:
    p, d = plans(pair(0.4, 0.4))
    assert [[x.host.label for x in wave] for wave in start_waves([p, d])] == [["h1/p"], ["h1/d"]]
    apart = plans(pair(None, None, gpus=(0, 1)))
    assert len(start_waves(apart)) == 1
    # [0,1] beside [1,2] share GPU 1; a third on GPU 3 starts with the first.
    a, b, c = plans(
        {"a": {"gpus": [0, 1], "mem_fraction_static": 0.4},
         "b": {"gpus": [1, 2], "mem_fraction_static": 0.4},
         "c": {"gpus": [3]}}
    )  # fmt: skip
    assert [[x.host.label for x in wave] for wave in start_waves([a, b, c])] == [
        ["h1/a", "h1/c"],
        ["h1/b"],
    ]
