"""The Slurm launcher (`launcher: slurm`): the server is a batch job submitted from the host,
a login node. The batch script is deployctl/slurm_batch.py's; the host side is
remote/slurm_jobs.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deployctl import slurm_batch
from deployctl.choices import LaunchKind
from deployctl.deployments import is_loopback
from deployctl.findings import Findings
from deployctl.inventory import Host
from deployctl.launchers.base import Lease, ServerCommand
from deployctl.remote.protocol import JobInfo, JobRef, PreflightReply, RunRecord, answers_at
from deployctl.remote.protocol import job_ref as protocol_job_ref
from deployctl.settings import Settings


class SlurmJobLauncher:
    kind = LaunchKind.SLURM_JOB
    checks_host = False  # its nodes' GPUs and ports are checked by the job itself
    address_known_at_start = False  # at its head node, which changes from job to job
    trusts_ready_line = False

    def owns(self, run: Mapping[str, Any]) -> bool:
        return "job" in run  # a job's record (and live run) names its job

    def template_context(self, settings: Settings) -> dict[str, Any]:
        return slurm_batch.template_context(settings)

    def host_gpus(self, host: Host) -> list[int] | None:
        return []  # its GPUs are its nodes'

    def host_share(self, tp: int, nnodes: int) -> int:
        return 0

    def checked_form(self, argv: Sequence[str]) -> list[str]:
        return slurm_batch.checked_form(argv)

    def script(self, settings: Settings, server: ServerCommand, max_used_mib: int) -> str | None:
        return slurm_batch.batch_script(
            settings, server.argv, server.env, tp=server.tp, port=server.port,
            bind_host=server.bind_host, max_used_mib=max_used_mib,
        )  # fmt: skip

    def preflight(self, host: Host, tp: int, bind_host: str, reply: PreflightReply) -> Findings:
        """What a Slurm job needs of its login node and its settings."""
        found = Findings()
        if reply["sbatch"] is None:
            found.problems.append(f"sbatch is not on the PATH of {host.name} (launcher: slurm)")
            found.hints.append("run deployctl against a Slurm login node, or set launcher: ssh")
        if is_loopback(bind_host):
            found.problems.append(
                f"bind_host {bind_host} is loopback: the server on its Slurm node could not "
                f"be reached from {host.name}"
            )
            found.hints.append("set bind_host: 0.0.0.0 for deployments run as Slurm jobs")
        nodes = host.settings.slurm_nodes
        if tp % nodes:
            found.problems.append(f"tensor parallelism {tp} is not divisible by its {nodes} nodes")
            found.hints.append("tp is the total over all nodes, e.g. tp: 16 with slurm_nodes: 2")
        if host.settings.given("gpus"):
            found.warnings.append(
                "gpus does not apply to a Slurm job: Slurm gives each node "
                f"{slurm_batch.gpus_per_node(host.settings, tp)} GPUs (slurm_gpus_per_node)"
            )
        return found

    def answers_at(self, run: Mapping[str, Any], job: JobInfo | None) -> str:
        return answers_at(str(run["bind_host"]), job)  # at its head node, once placed

    def head(self, job: JobInfo | None) -> str:
        return job["head"] if job is not None else ""

    def handle(self, run: Mapping[str, Any]) -> str:
        job = run["job"]
        return f"job {job if isinstance(job, str) else job['id']}"

    def words(self, job: JobInfo | None) -> str:
        return slurm_batch.job_words(job) if job is not None else ""

    def job_ref(self, state_dir: str, run: RunRecord) -> JobRef | None:
        return protocol_job_ref(state_dir, run, run["job"])

    def jobs(self, job: JobInfo | None) -> list[JobInfo]:
        return [] if job is None else [job]

    def waiting(self, job: JobInfo | None) -> bool:
        return job is not None and job["state"] in slurm_batch.WAITING_JOB_STATES

    def waiting_line(self, job: JobInfo | None) -> str | None:
        return slurm_batch.job_words(job) if job is not None and job["state"] == "PENDING" else None

    def current_log(self, log: str, job: JobInfo | None) -> str:
        return "" if self.waiting(job) else slurm_batch.latest_start(log)

    def time_limit(self, settings: Settings) -> tuple[str, float] | None:
        text = settings.optional_text("slurm_time")
        limit = None if text is None else slurm_batch.time_limit_s(text)
        return None if text is None or limit is None else (text, limit)

    def lease(self, job: JobInfo | None) -> Lease | None:
        if job is None or job["state"] != "RUNNING" or job["time_left"] is None:
            return None
        return Lease(job["id"], job["time_left"])
