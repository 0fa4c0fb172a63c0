"""The launcher seam's declarations: the verbs each launcher answers (which launcher a host
uses is a user's choice, `choices.LaunchKind`).

A launcher is how a deployment's server starts and ends: a process group on the host over
SSH, or a Slurm job from a login node. Everything that differs between them is a verb here;
the code that starts, waits for, reads and stops runs (ops/) asks the launcher, never which
one it is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from deployctl.choices import LaunchKind
from deployctl.findings import Findings
from deployctl.inventory import Host
from deployctl.remote.protocol import JobInfo, JobRef, PreflightReply, RunRecord
from deployctl.settings import Settings


@dataclass(frozen=True)
class ServerCommand:
    """The server's command as a launcher wraps it (the real one, or the one people see)."""

    argv: Sequence[str]
    env: Mapping[str, str]
    tp: int
    port: int
    bind_host: str


@dataclass(frozen=True)
class Lease:
    """A run's granted time: its id with its scheduler (a job's) and the seconds it has left."""

    id: str
    time_left: float


class Launcher(Protocol):
    """The verbs every launcher answers (the client side; remote/launchers.py is the host's).

    Starting, polling, stopping and reading a run are agent calls whose host side dispatches
    by launcher; these verbs are what the client does differently around them."""

    kind: LaunchKind
    # The server runs on the host itself: its GPUs, its ports and the host's other runs are
    # the host's to check (a job's are on nodes its scheduler picks, and checked there).
    checks_host: bool
    # Where its router reaches it is known before it starts (a job's head node is not).
    address_known_at_start: bool
    # Its log's ready line means the API answers where the client asks (a job's node may
    # write it before the login node can reach the server).
    trusts_ready_line: bool

    def owns(self, run: Mapping[str, Any]) -> bool:
        """Did this launcher start the recorded (or live) run?"""
        ...

    def template_context(self, settings: Settings) -> dict[str, Any]:
        """What a template sees besides the host's variables (a job's node rank, …)."""
        ...

    def host_gpus(self, host: Host) -> list[int] | None:
        """The host's GPUs a server gets (None: all of them; []: none of the host's)."""
        ...

    def host_share(self, tp: int, nnodes: int) -> int:
        """The GPUs the host itself gives a server of tensor parallelism `tp`."""
        ...

    def checked_form(self, argv: Sequence[str]) -> list[str]:
        """The command as the host's flag check sees it (words the launcher fills in given
        a value)."""
        ...

    def script(self, settings: Settings, server: ServerCommand, max_used_mib: int) -> str | None:
        """The command wrapper the host is given (a batch script); None: the command runs
        as it is."""
        ...

    def preflight(self, host: Host, tp: int, bind_host: str, reply: PreflightReply) -> Findings:
        """What the launcher itself needs of the host and the settings."""
        ...

    def answers_at(self, run: Mapping[str, Any], job: JobInfo | None) -> str:
        """Where the run's server answers, from the host that launched it ("": not known
        yet, a job not placed)."""
        ...

    def head(self, job: JobInfo | None) -> str:
        """The address its router reaches it at when that is not the host's ("": the
        host's, or `worker_url`)."""
        ...

    def handle(self, run: Mapping[str, Any]) -> str:
        """How people find a run: `pid 4321`, `job 1234`."""
        ...

    def job_ref(self, state_dir: str, run: RunRecord) -> JobRef | None:
        """What a poll of the run names besides its processes (a Slurm job)."""
        ...

    def jobs(self, job: JobInfo | None) -> list[JobInfo]:
        """The scheduler's jobs a status lists for the run (its `Slurm jobs` table)."""
        ...

    def words(self, job: JobInfo | None) -> str:
        """What the launcher says of a run's state besides alive and healthy ("": nothing)."""
        ...

    def waiting(self, job: JobInfo | None) -> bool:
        """The run waits to (re)start: nothing of it serves, and its log is an earlier
        start's."""
        ...

    def waiting_line(self, job: JobInfo | None) -> str | None:
        """The line a wait shows while the run is not started yet (None: its log's)."""
        ...

    def current_log(self, log: str, job: JobInfo | None) -> str:
        """The part of the log that is the run's latest start (where crashes count)."""
        ...

    def time_limit(self, settings: Settings) -> tuple[str, float] | None:
        """The time limit its runs get (as written, in seconds); None: none."""
        ...

    def lease(self, job: JobInfo | None) -> Lease | None:
        """The running run's time left (None: it has no limit, or it is not running)."""
        ...
