"""Deployments run as Slurm jobs, on a real Slurm (Debian's slurm-wlm 22.05): the sshd lab
host alpha is the login node, and the cluster's two nodes n1 and n2 are this machine, each
with a loopback address of its own (tests/slurm_cluster.py). The stand-in server binds its
node's address there (its `bind_by_node` knob), as a server on a real node binds the node's.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployctl.remote.placements import STEP_DRAINS
from tests import streamed
from tests.conftest import CLI
from tests.slurm_cluster import NODE_ADDRESSES, SlurmCluster
from tests.sshd_hosts import SSHLab, free_port, sh
from tests.test_deployments import deployments_of, run_json, standin_starts
from tests.test_faults import wait_until
from tests.test_lifecycle import prepare
from tests.test_rollout import Load
from tests.test_router import real_router, router_vars


def slurm_inventory(lab: SSHLab, tmp_path: Path, nodes: int = 1, **settings: Any) -> Path:
    """alpha as a Slurm login node running one stand-in server as a job of `nodes` nodes."""
    alpha = lab.hosts["alpha"]
    variables = prepare(alpha, tp=nodes, bind_by_node=NODE_ADDRESSES)
    variables.update(
        launcher="slurm",
        template="baseline",
        python="/usr/bin/python3",
        bind_host="0.0.0.0",
        port=free_port(NODE_ADDRESSES["n1"]),
        slurm_nodes=nodes,
        slurm_time="30:00",
    )
    if nodes > 1:
        variables["dist_port"] = free_port(NODE_ADDRESSES["n1"])
    variables.update(settings)
    return lab.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables})


def set_knobs(lab: SSHLab, **knobs: Any) -> None:
    (lab.hosts["alpha"].home / "model" / "standin.json").write_text(
        json.dumps({"startup_s": 0.3, "bind_by_node": NODE_ADDRESSES, **knobs})
    )


def entry(doc: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = doc["hosts"]["alpha"]
    return found


def standin_processes(lab: SSHLab) -> str:
    """The stand-in's processes of alpha's user, zombies aside."""
    user = lab.hosts["alpha"].user
    found = sh("pgrep", "-a", "-u", user, "--runstates", "R,S,D,T", "-f", "sglang::|sglang_standin",
               check=False)  # fmt: skip
    return found.stdout.strip()


def launched(cli: CLI, inv: Path) -> dict[str, Any]:
    """Launch the inventory to ready; its launch document."""
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 0, (err, doc)
    return doc


def job_of(doc: dict[str, Any]) -> dict[str, Any]:
    job: dict[str, Any] = entry(doc)["job"]
    return job


def test_a_one_node_job_launches_reports_its_job_and_stops_to_nothing(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path)
    shown = cli("render", "-i", str(inv))
    assert shown.returncode == 0, shown.stderr
    assert "#SBATCH --nodes=1" in shown.stdout and "#SBATCH --time=30:00" in shown.stdout
    doc = launched(cli, inv)
    first = entry(doc)
    assert first["state"] == "ready", first
    job = job_of(doc)
    assert job["state"] == "RUNNING" and len(job["nodes"]) == 1
    node = job["nodes"][0]
    assert job["head"] == NODE_ADDRESSES[node]
    assert [j["state"] for j in slurm_lab.active_jobs()] == ["RUNNING"]
    [start] = standin_starts(hosts.hosts["alpha"])
    assert start["env"]["SLURM_JOB_ID"] == job["id"]
    assert start["env"]["CUDA_VISIBLE_DEVICES"]  # one of the node's two gres GPUs
    # status: the job's id, state, nodes and time left beside the usual columns.
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    assert code == 0, err
    status = entry(doc)
    assert status["state"] == "ready" and status["run"] == first["run"]
    assert status["job"]["state"] == "RUNNING" and status["job"]["nodes"] == [node]
    assert 0 < status["job"]["time_left_s"] <= 30 * 60
    table = cli("status", "-i", str(inv))
    assert f"job {job['id']}" in table.stdout and "Slurm jobs" in table.stdout
    # Metrics and bench reach the head node from the login node.
    code, doc, err = run_json(cli, "status", "-i", str(inv), "--metrics")
    assert code == 0 and entry(doc)["metrics_note"] == "", err
    code, doc, err = run_json(
        cli, "bench", "-i", str(inv), "--concurrency", "2", "--input-len", "16",
        "--output-len", "20", "--requests-per-stream", "1",
    )  # fmt: skip
    assert code == 0, err
    assert "output_tokens_per_s" in json.dumps(doc)
    code, doc, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err
    assert job_of(doc)["state"] in ("CANCELLED", "COMPLETED", "FAILED")
    assert slurm_lab.active_jobs() == []
    assert standin_processes(hosts) == ""
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    assert entry(doc)["state"] == "stopped" and entry(doc)["crashed"] is False


def test_a_two_node_job_reads_ranks_0_and_1_inside_its_steps_and_meets_at_the_head(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path, nodes=2)
    doc = launched(cli, inv)
    assert entry(doc)["state"] == "ready"
    job = job_of(doc)
    assert job["nodes"] == ["n1", "n2"] and job["head"] == NODE_ADDRESSES["n1"]
    starts = standin_starts(hosts.hosts["alpha"])
    ranks = {}
    for start in starts:
        argv = start["argv"]
        rank = next(a for a in argv if a.startswith("--node-rank=")).split("=")[1]
        ranks[start["env"]["SLURMD_NODENAME"]] = rank
        head = next(a for a in argv if a.startswith("--dist-init-addr=")).split("=")[1]
        assert head.startswith(NODE_ADDRESSES["n1"] + ":")
        assert "--nnodes=2" in argv and "--tp-size=2" in argv
    assert ranks == {"n1": "0", "n2": "1"}
    code, doc, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err
    assert slurm_lab.active_jobs() == [] and standin_processes(hosts) == ""


def test_a_crashed_job_is_explained_and_restarted_as_a_new_job(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path)
    set_knobs(hosts, crash="startup")
    code, doc, err = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 1
    crashed = entry(doc)
    assert crashed["state"] in ("crashed", "died"), crashed
    assert crashed["crashes"] and crashed["crashes"][0]["signature"] == "tensor-shape-mismatch"
    first = job_of(doc)["id"]
    wait_until(lambda: not slurm_lab.active_jobs(), 30, 0.2)
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    status = entry(doc)
    assert status["crashed"] is True and status["job"]["state"] == "FAILED"
    table = cli("status", "-i", str(inv))
    assert f"job {first} FAILED" in table.stdout
    set_knobs(hosts)  # the cause is mended
    code, doc, err = run_json(cli, "restart", "--crashed", "-i", str(inv), "--timeout", "60")
    assert code == 0, err
    again = json.dumps(doc)
    assert "baseline_v2" in again
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    status = entry(doc)
    assert status["state"] == "ready" and status["run"].endswith("_v2")
    assert status["job"]["id"] != first and status["job"]["state"] == "RUNNING"
    code, _, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err


def test_a_pending_job_shows_why_and_stop_cancels_it(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path, slurm_extra=["--begin=now+1hour"])
    result = cli("launch", "-i", str(inv), "--timeout", "4")
    assert result.returncode == 1
    assert "PENDING (BeginTime)" in result.stdout + result.stderr
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    status = entry(doc)
    assert status["state"] == "starting"
    assert (status["job"]["state"], status["job"]["reason"]) == ("PENDING", "BeginTime")
    code, doc, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err
    assert job_of(doc)["state"] == "CANCELLED"
    assert slurm_lab.active_jobs() == []


def test_a_dirty_gpu_on_the_node_fails_the_job_before_the_server_starts(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path)
    for node in NODE_ADDRESSES:
        hosts.hosts["alpha"].set_node_gpus(node, "busy")
    code, doc, _ = run_json(cli, "launch", "-i", str(inv), "--timeout", "60")
    assert code == 1
    crashes = entry(doc)["crashes"]
    assert crashes and crashes[0]["signature"] == "slurm-gpu-not-clean", entry(doc)
    assert "MiB in use" in crashes[0]["message"]
    assert not (hosts.hosts["alpha"].home / "model" / "standin-argv.jsonl").exists()


def test_a_job_cancelled_outside_deployctl_is_reported_as_cancelled(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path)
    doc = launched(cli, inv)
    job = job_of(doc)["id"]
    slurm_lab.run("scancel", job)
    wait_until(lambda: not slurm_lab.active_jobs(), 30, 0.2)
    time.sleep(0.5)
    _, doc, _ = run_json(cli, "status", "-i", str(inv))
    status = entry(doc)
    assert status["crashed"] is True and status["job"]["state"] == "CANCELLED"
    assert f"job {job} CANCELLED" in cli("status", "-i", str(inv)).stdout


# ---- time limits: watch --renew-before ---------------------------------------------------


def renewing_inventory(
    lab: SSHLab, tmp_path: Path, with_router: bool, **settings: Any
) -> tuple[Path, int]:
    """alpha running a real router (over SSH) and `kimi`, a one-minute Slurm job that takes a
    whole node's two GPUs (so its successor must go to the other node) and names the router
    when `with_router`; the router's port. `settings`: more (or other) of kimi's."""
    alpha = lab.hosts["alpha"]
    router = router_vars(alpha.address, real_router())
    kimi: dict[str, Any] = {
        "launcher": "slurm",
        "python": "/usr/bin/python3",
        "bind_host": "0.0.0.0",
        "port": free_port(NODE_ADDRESSES["n1"]),
        "slurm_time": "1",
        "slurm_gpus_per_node": 2,
        **settings,
    }
    table: dict[str, Any] = {"kimi": kimi}
    if with_router:
        kimi["router"] = "alpha/router"
        table["router"] = router
    variables = {
        **prepare(alpha, tp=1, bind_by_node=NODE_ADDRESSES),
        "template": "baseline",
        "deployments": table,
    }
    return lab.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": variables}), router["port"]


def watch_events(
    cli: CLI, inv: Path, until: tuple[str, ...], timeout: float, *extra: str
) -> list[dict[str, Any]]:
    """watch --json (every second) until an event of a kind in `until`, then Ctrl-C."""
    return streamed.watch_events(
        cli, inv, streamed.kind_in(*until), timeout, "--interval", "1", *extra
    )


RENEW = ("--renew-before", "58s")


def test_watch_renews_a_job_before_its_limit_through_its_router_without_a_failed_request(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv, router_port = renewing_inventory(hosts, tmp_path, with_router=True)
    doc = launched(cli, inv)
    first = deployments_of(doc)["kimi"]
    assert first["job"]["nodes"] == ["n1"]
    load = Load(hosts.hosts["alpha"].address, router_port)
    with load:
        events = watch_events(cli, inv, ("renewed",), 50, *RENEW)
    kinds = [e["event"] for e in events]
    assert "time_limit_near" in kinds and kinds[-1] == "renewed", events
    near = next(e for e in events if e["event"] == "time_limit_near")
    assert near["renewing"] is True and near["job"] == first["job"]["id"]
    renewed = events[-1]
    assert renewed["error"] == "" and renewed["state"] == "ready", renewed
    assert renewed["old_run"] == first["run"] and renewed["new_run"].endswith("_v2")
    assert load.failed == [] and len(load.done) > 5, (load.failed, len(load.done))
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    kimi = deployments_of(doc)["kimi"]
    assert kimi["run"] == renewed["new_run"] and kimi["job"]["nodes"] == ["n2"]
    listed = [w["url"] for w in deployments_of(doc)["router"]["router"]["workers"]]
    assert listed == [f"http://{NODE_ADDRESSES['n2']}:{kimi_port(inv)}"]
    assert [j["id"] for j in slurm_lab.active_jobs()] == [kimi["job"]["id"]]
    code, _, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err


def test_watch_says_when_a_job_without_a_router_will_be_down(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv, _ = renewing_inventory(hosts, tmp_path, with_router=False)
    launched(cli, inv)
    events = watch_events(cli, inv, ("time_limit_near",), 30, *RENEW)
    assert events and events[-1]["event"] == "time_limit_near", events
    assert events[-1]["renewing"] is False and 0 < events[-1]["time_left_s"] <= 58
    text = cli("watch", "--help").stdout
    assert "--renew-before" in text
    code, _, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err


def kimi_port(inv: Path) -> int:
    document = yaml.safe_load(inv.read_text())
    return int(document["all"]["hosts"]["alpha"]["deployments"]["kimi"]["port"])


def test_watch_restarts_a_crashed_job_as_a_new_job_and_stops_at_a_crash_loop(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path)
    set_knobs(hosts, crash="after_ready", crash_after_s=3.0)
    doc = launched(cli, inv)
    first = job_of(doc)["id"]
    events = watch_events(cli, inv, ("crash_loop", "watch_stopped"), 60)
    kinds = [e["event"] for e in events]
    assert kinds[:3] == ["watching", "restarting", "replaced"] and "crash_loop" in kinds, kinds
    replaced = events[2]
    assert replaced["old_run"].endswith("_v1") and replaced["new_run"].endswith("_v2")
    # The same crash twice: the breaker counted the new job's crash.
    loop = next(e for e in events if e["event"] == "crash_loop")
    assert loop["repeated"] is True and loop["run"].endswith("_v2")
    _, doc, _ = run_json(cli, "status", "-i", str(inv))
    assert entry(doc)["job"]["id"] != first and entry(doc)["crashed"] is True


def test_watch_renews_a_job_once_when_its_limit_is_within_the_window(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    # A one-minute limit the up-front check cannot see (sbatch's own --time): the window of
    # 90 s holds the whole job, and its successor's from the start.
    inv, _ = renewing_inventory(
        hosts, tmp_path, with_router=True, slurm_time=None, slurm_extra=["--time=1"]
    )
    before = max((int(j["id"]) for j in slurm_lab.jobs()), default=0)
    launched(cli, inv)
    watch = streamed.WatchJson(cli, inv, "--interval", "1", "--renew-before", "90s")
    try:
        watch.until(lambda evs: len([e for e in evs if e["event"] == "renewed"]) >= 2, 60)
        watch.until(lambda evs: False, 10)  # ten more looks: no renewal is tried again
    finally:
        events = watch.stop()
    renewed = [e for e in events if e["event"] == "renewed"]
    assert [e["new_run"] is not None for e in renewed] == [True, False], events
    first, refused = renewed
    assert first["error"] == "" and refused["old_run"] == first["new_run"], renewed
    assert "not renewed again" in refused["error"] and refused["state"] == "refused"
    # kimi's first job and its one successor (the router runs over SSH): nothing more.
    assert len([j for j in slurm_lab.jobs() if int(j["id"]) > before]) == 2, slurm_lab.jobs()
    code, _, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err


# ---- a stop on purpose, odd values, requeues, suspensions, forgotten jobs -----------------


def test_a_stop_on_purpose_ends_the_job_completed_not_failed(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path)
    job = job_of(launched(cli, inv))["id"]
    code, doc, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err
    assert job_of(doc)["state"] == "COMPLETED", job_of(doc)
    # What the cluster's own records (and its alerts) keep: the job completion log. Read as a
    # file: root's `sacct --completion` would chmod it 0644, shutting the lab users out.
    ends = [
        line
        for line in (slurm_lab.logs / "jobcomp.txt").read_text().splitlines()
        if line.startswith(f"JobId={job} ")
    ]
    assert len(ends) == 1 and " JobState=COMPLETED " in ends[0], ends
    assert " ExitCode=0:0" in ends[0], ends


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_stop_drains_the_jobs_server_and_its_streamed_requests_finish(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path, nodes: int
) -> None:
    # `scancel --signal=TERM` reaches every process of the step: the schedulers die under
    # the server and its requests are cut. The step's supervisor drains it instead.
    inv = slurm_inventory(hosts, tmp_path, nodes=nodes)
    set_knobs(hosts, drain_s=0.5, step_ms=20.0)
    doc = launched(cli, inv)
    log = Path(entry(doc)["log"])
    port = yaml.safe_load(inv.read_text())["all"]["hosts"]["alpha"]["port"]
    answers: list[tuple[int, bool]] = []
    streams = [
        threading.Thread(
            target=streamed.stream_tokens, args=(job_of(doc)["head"], port, 300, answers)
        )
        for _ in range(2)
    ]
    for thread in streams:
        thread.start()
    wait_until(lambda: log.read_text().count("POST /v1/completions") >= 2, 30, 0.05)
    code, doc, err = run_json(cli, "stop", "-i", str(inv), "--timeout", "60")
    for thread in streams:
        thread.join(timeout=60)
    assert answers == [(300, True)] * 2, answers  # every token of both
    assert code == 0, err
    assert (entry(doc)["shutdown"], job_of(doc)["state"]) == ("drained", "COMPLETED"), doc
    assert slurm_lab.active_jobs() == [] and standin_processes(hosts) == ""
    text = log.read_text()
    assert "Gracefully exiting... Remaining number of requests 0." in text
    assert text.count("was stopped (exit") == nodes
    assert "crashed with exit code" not in text and "NCCL error" not in text
    code, doc, _ = run_json(cli, "crash", "-i", str(inv))
    assert code == 0 and entry(doc)["crashes"] == [], doc


def test_a_job_whose_script_predates_the_drain_is_sent_sigterm_as_then(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path)
    run = entry(launched(cli, inv))["run"]
    script = hosts.hosts["alpha"].home / ".deployctl" / "runs" / f"{run}.sbatch"
    script.write_text(script.read_text().replace(STEP_DRAINS + "\n", ""))
    code, doc, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err
    assert (entry(doc)["shutdown"], job_of(doc)["state"]) == ("cut", "COMPLETED"), doc
    assert slurm_lab.active_jobs() == [] and standin_processes(hosts) == ""


def test_env_values_reach_the_job_byte_exact_and_run_nothing(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    marker = alpha.home / "ran"
    odd = {
        "ODD_SUBST": f"$(touch {marker})`touch {marker}`",
        "ODD_SPACE": "two  words\tand a tab",
        "ODD_QUOTES": 'it\'s "quoted" \\ $HOME ${HOME} ; true',
        "ODD_LINES": "line one\nexport INJECTED=1",
    }
    inv = slurm_inventory(hosts, tmp_path, env=odd)
    launched(cli, inv)
    [start] = standin_starts(alpha)
    assert {name: start["env"].get(name) for name in odd} == odd
    assert "INJECTED" not in start["env"] and not marker.exists()
    code, _, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err


def urgent_job(cluster: SlurmCluster) -> str:
    """A job in the `urgent` partition wanting every GPU of both nodes: it preempts ours."""
    out = cluster.run("sbatch", "--parsable", "--partition=urgent", "--nodes=2",
                      "--gpus-per-node=2", "--output=/dev/null", "--wrap=sleep 300").stdout  # fmt: skip
    return out.strip()


def test_a_preempted_and_requeued_job_is_pending_again_not_crashed(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv = slurm_inventory(hosts, tmp_path)
    job = job_of(launched(cli, inv))["id"]
    urgent = urgent_job(slurm_lab)
    wait_until(lambda: slurm_lab.job(urgent)["state"] == "RUNNING", 30, 0.2)
    assert slurm_lab.job(job)["state"] == "PENDING"  # requeued: it waits to start again
    time.sleep(0.5)
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    status = entry(doc)
    [log] = hosts.hosts["alpha"].home.glob(f"**/{Path(status['log']).name}")
    assert "DUE TO PREEMPTION" in log.read_text()  # a crash signature, of the start before
    assert (status["state"], status["crashed"], status["uptime_s"]) == ("starting", False, None)
    assert status["job"]["state"] == "PENDING" and status["crash"] is None, status
    code, doc, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0 and job_of(doc)["state"] == "CANCELLED", (err, doc)


def test_a_suspended_job_is_not_ended_and_serves_again_once_resumed(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    # The days form the README shows, as sbatch takes it.
    inv = slurm_inventory(hosts, tmp_path, slurm_time="1-12:00:00")
    job = job_of(launched(cli, inv))["id"]
    slurm_lab.run("scontrol", "suspend", job)
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    status = entry(doc)
    assert status["job"]["state"] == "SUSPENDED" and status["crashed"] is False, status
    assert status["alive"] is True
    slurm_lab.run("scontrol", "resume", job)
    wait_until(lambda: entry(run_json(cli, "status", "-i", str(inv))[1])["state"] == "ready", 20)
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    assert 35 * 3600 < entry(doc)["job"]["time_left_s"] <= 36 * 3600
    code, _, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err


def test_a_job_slurm_forgot_keeps_its_head_and_stop_takes_that_out_of_the_router(
    hosts: SSHLab, slurm_lab: SlurmCluster, cli: CLI, tmp_path: Path
) -> None:
    inv, _ = renewing_inventory(hosts, tmp_path, with_router=True, slurm_time="10")
    doc = launched(cli, inv)
    kimi = deployments_of(doc)["kimi"]
    url = f"http://{kimi['job']['head']}:{kimi_port(inv)}"
    # slurmctld forgets a job MinJobAge after its end, and this cluster keeps no accounting:
    # the record is made to name a job id Slurm has no trace of, while the record saw it RUNNING.
    [record] = hosts.hosts["alpha"].home.glob(f"**/runs/{kimi['run']}.json")
    data = json.loads(record.read_text())
    assert data["job"]["state"] == "RUNNING"
    record.write_text(json.dumps({**data, "job": {**data["job"], "id": "999999"}}))
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    job = deployments_of(doc)["kimi"]["job"]
    assert job["state"] == "UNKNOWN" and job["reason"].startswith("last seen RUNNING"), job
    assert job["head"] == kimi["job"]["head"]
    assert "job 999999 UNKNOWN (last seen RUNNING" in cli("status", "-i", str(inv)).stdout
    code, doc, err = run_json(cli, "stop", "-i", str(inv), "-d", "kimi")
    assert code == 0, err
    code, doc, err = run_json(cli, "status", "-i", str(inv))
    listed = [w["url"] for w in deployments_of(doc)["router"]["router"]["workers"]]
    assert url not in listed, listed
    slurm_lab.run("scancel", kimi["job"]["id"])
    code, _, err = run_json(cli, "stop", "-i", str(inv))
    assert code == 0, err
