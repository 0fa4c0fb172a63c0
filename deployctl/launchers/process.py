"""The process launcher (`launcher: ssh`): the server is a process group on the host, started
over SSH; its host side is remote/processes.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deployctl.choices import LaunchKind
from deployctl.deployments import gpu_set
from deployctl.findings import Findings
from deployctl.inventory import Host
from deployctl.launchers.base import Lease, ServerCommand
from deployctl.remote.protocol import JobInfo, JobRef, PreflightReply, RunRecord
from deployctl.settings import Settings


class ProcessLauncher:
    kind = LaunchKind.PROCESS
    checks_host = True
    address_known_at_start = True
    trusts_ready_line = True

    def owns(self, run: Mapping[str, Any]) -> bool:
        return True  # registered last: any run no other launcher claims

    def template_context(self, settings: Settings) -> dict[str, Any]:
        return {}

    def host_gpus(self, host: Host) -> list[int] | None:
        return gpu_set(host)

    def host_share(self, tp: int, nnodes: int) -> int:
        return tp // nnodes

    def checked_form(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def script(self, settings: Settings, server: ServerCommand, max_used_mib: int) -> str | None:
        return None

    def preflight(self, host: Host, tp: int, bind_host: str, reply: PreflightReply) -> Findings:
        return Findings()  # the host's GPUs and ports: checks_host

    def answers_at(self, run: Mapping[str, Any], job: JobInfo | None) -> str:
        return str(run["bind_host"])

    def head(self, job: JobInfo | None) -> str:
        return ""

    def handle(self, run: Mapping[str, Any]) -> str:
        return f"pid {run['pid']}"

    def words(self, job: JobInfo | None) -> str:
        return ""

    def waiting(self, job: JobInfo | None) -> bool:
        return False

    def job_ref(self, state_dir: str, run: RunRecord) -> JobRef | None:
        return None

    def jobs(self, job: JobInfo | None) -> list[JobInfo]:
        return []

    def waiting_line(self, job: JobInfo | None) -> str | None:
        return None

    def current_log(self, log: str, job: JobInfo | None) -> str:
        return log

    def time_limit(self, settings: Settings) -> tuple[str, float] | None:
        return None

    def lease(self, job: JobInfo | None) -> Lease | None:
        return None
