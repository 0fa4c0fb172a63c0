"""The Slurm launcher (`launcher: slurm`): the server is a batch job submitted from the host,
a login node; its placement is the job. The batch script is `batch`'s; the host side is
remote/slurm_jobs.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deployctl.choices import LaunchKind
from deployctl.deployments import is_loopback
from deployctl.findings import Findings
from deployctl.inventory import Host
from deployctl.launchers.base import Launcher, Lease, ServerCommand
from deployctl.launchers.slurm.batch import (
    WAITING_JOB_STATES,
    batch_script,
    checked_form,
    gpus_per_node,
    job_words,
    latest_start,
    template_context,
    time_limit_s,
)
from deployctl.remote.protocol import Placement, PreflightReply
from deployctl.settings import Settings


class SlurmJobLauncher(Launcher):
    kind = LaunchKind.SLURM_JOB
    checks_host = False  # its nodes' GPUs and ports are checked by the job itself
    address_known_at_start = False  # at its head node, which changes from job to job
    trusts_ready_line = False
    placements_title = "Slurm jobs"
    placement_word = "job"

    def template_context(self, settings: Settings) -> dict[str, Any]:
        return template_context(settings)

    def host_gpus(self, host: Host) -> list[int] | None:
        return []  # its GPUs are its nodes'

    def host_share(self, tp: int, nnodes: int) -> int:
        return 0

    def checked_form(self, argv: Sequence[str]) -> list[str]:
        return checked_form(argv)

    def script(self, settings: Settings, server: ServerCommand, max_used_mib: int) -> str | None:
        return batch_script(
            settings, server.argv, server.env, tp=server.tp, port=server.port,
            bind_host=server.bind_host, max_used_mib=max_used_mib,
        )  # fmt: skip

    def preflight(self, host: Host, tp: int, bind_host: str, reply: PreflightReply) -> Findings:
        """What a Slurm job needs of its login node and its settings."""
        found = Findings()
        if reply["launcher_facts"].get("sbatch") is None:
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
                f"{gpus_per_node(host.settings, tp)} GPUs (slurm_gpus_per_node)"
            )
        return found

    def words(self, placed: Placement | None) -> str:
        return job_words(placed) if placed is not None else ""

    def waiting(self, placed: Placement | None) -> bool:
        return placed is not None and placed["state"] in WAITING_JOB_STATES

    def waiting_line(self, placed: Placement | None) -> str | None:
        pending = placed is not None and placed["state"] == "PENDING"
        return job_words(placed) if placed is not None and pending else None

    def current_log(self, log: str, placed: Placement | None) -> str:
        return "" if self.waiting(placed) else latest_start(log)

    def time_limit(self, settings: Settings) -> tuple[str, float] | None:
        text = settings.optional_text("slurm_time")
        limit = None if text is None else time_limit_s(text)
        return None if text is None or limit is None else (text, limit)

    def lease(self, placed: Placement | None) -> Lease | None:
        if placed is None or placed["state"] != "RUNNING" or placed["time_left"] is None:
            return None
        return Lease(placed["id"], placed["time_left"])
