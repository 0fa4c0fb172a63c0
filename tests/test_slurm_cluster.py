"""The Slurm test cluster itself: two idle nodes that run a lab user's jobs as a cluster would."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from deployctl.connection import ConnectOptions, SSHConnection
from tests.slurm_cluster import SlurmCluster
from tests.sshd_hosts import SSHLab
from tests.test_connection import ssh_host

GPU_MEMORY_QUERY = "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits"


@pytest.fixture
def alpha(slurm_lab: SlurmCluster, hosts: SSHLab) -> Iterator[SSHConnection]:
    """An sshd session on the lab host alpha, the cluster's login node."""
    conn = SSHConnection(ssh_host(hosts, "alpha"), ConnectOptions())
    yield conn
    conn.close()


def submit(conn: SSHConnection, script: str, *options: str) -> str:
    """sbatch a script from the login node's session; return the job id."""
    result = conn.run(["sbatch", "--parsable", *options], stdin=script.encode()).check("alpha")
    return result.stdout.strip()


def wait_for(predicate: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def finished_output(slurm: SlurmCluster, hosts: SSHLab, job_id: str) -> str:
    """Wait for the job to complete; return its output file (in the submitting home)."""
    wait_for(lambda: slurm.job(job_id)["state"] not in ("PENDING", "RUNNING", "COMPLETING"), job_id)
    assert slurm.job(job_id)["state"] == "COMPLETED", slurm.job(job_id)
    return (hosts.hosts["alpha"].home / f"slurm-{job_id}.out").read_text()


def test_both_nodes_are_idle_in_the_gpu_partition_and_n2_in_debug(slurm_lab: SlurmCluster) -> None:
    assert slurm_lab.node_states() == {"n1": "idle", "n2": "idle"}
    partitions = slurm_lab.run("sinfo", "--noheader", "--format=%P %N %l").stdout.split("\n")
    assert partitions[:2] == ["gpu* n[1-2] infinite", "debug n2 infinite"]


def test_a_lab_users_two_node_job_runs_one_task_on_each_node(
    slurm_lab: SlurmCluster, hosts: SSHLab, alpha: SSHConnection
) -> None:
    # Read inside the step: the batch shell's own SLURM_NODEID is 0 on both nodes.
    script = "#!/bin/sh\nsrun --ntasks-per-node=1 sh -c 'echo \"$SLURM_NODEID $SLURMD_NODENAME\"'\n"
    job_id = submit(alpha, script, "--nodes=2")
    assert slurm_lab.job(job_id)["user"] == hosts.hosts["alpha"].user
    assert sorted(finished_output(slurm_lab, hosts, job_id).splitlines()) == ["0 n1", "1 n2"]
    assert slurm_lab.job(job_id)["nodes"] == "n[1-2]"
    # No slurmdbd: plain sacct says accounting is disabled; the job completion log answers.
    completion = alpha.run("sacct --completion --noheader --parsable2 --format=JobID,State")
    assert f"{job_id}|COMPLETED" in completion.check("alpha").stdout.splitlines()


def test_a_gpu_per_node_gives_the_step_cuda_visible_devices(
    slurm_lab: SlurmCluster, hosts: SSHLab, alpha: SSHConnection
) -> None:
    script = "#!/bin/sh\nsrun sh -c 'echo \"visible=${CUDA_VISIBLE_DEVICES-unset}\"'\n"
    job_id = submit(alpha, script, "--gpus-per-node=1", "--partition=debug")
    assert finished_output(slurm_lab, hosts, job_id) == "visible=0\n"
    assert slurm_lab.job(job_id)["nodes"] == "n2"


def test_a_job_to_begin_later_is_pending_for_its_begin_time(
    slurm_lab: SlurmCluster, alpha: SSHConnection
) -> None:
    job_id = submit(alpha, "#!/bin/sh\ntrue\n", "--begin=now+1hour")
    wait_for(lambda: slurm_lab.job(job_id)["reason"] == "BeginTime", "reason BeginTime")
    assert slurm_lab.job(job_id)["state"] == "PENDING"


def test_scancel_of_a_running_job_leaves_it_cancelled_and_its_processes_gone(
    slurm_lab: SlurmCluster, alpha: SSHConnection
) -> None:
    job_id = submit(alpha, "#!/bin/sh\nsrun sleep 300\n")
    wait_for(lambda: slurm_lab.job(job_id)["state"] == "RUNNING", "the job to run")
    wait_for(lambda: any("sleep 300" in c for c in slurm_lab.job_processes().values()), "sleep")
    alpha.run(["scancel", job_id]).check("alpha")
    wait_for(lambda: slurm_lab.job(job_id)["state"] == "CANCELLED", "state CANCELLED")
    wait_for(lambda: not slurm_lab.job_processes(), "the job's processes to end")


def test_the_fake_nvidia_smi_answers_per_node(
    slurm_lab: SlurmCluster, hosts: SSHLab, alpha: SSHConnection
) -> None:
    hosts.hosts["alpha"].set_node_gpus("n1", "busy")
    hosts.hosts["alpha"].set_node_gpus("n2", "clean", 3)
    script = f"""#!/bin/sh
srun --ntasks-per-node=1 sh -c 'echo "$SLURMD_NODENAME $({GPU_MEMORY_QUERY} | tr "\\n" ";")"'
"""
    job_id = submit(alpha, script, "--nodes=2")
    assert sorted(finished_output(slurm_lab, hosts, job_id).splitlines()) == [
        "n1 0, 8811;1, 0;",
        "n2 0, 0;1, 0;2, 0;",
    ]
    # Outside a job the login node shows the host's own GPUs.
    assert alpha.run(GPU_MEMORY_QUERY).check("alpha").stdout == "0, 0\n"
