"""The launcher seam on the host side: each way a run starts here answers the same verbs —
`start`, `watch` (a poll's look: alive, where it answers, may it serve), `liveness`, `stop`
and its preflight `facts` — and this module is the one place that says which launcher a
run, a start or a poll is (SkyPilot's `sky/provision/__init__.py` routes the same way).

A third launcher is a module beside `processes.py` and `slurm_jobs.py` with one class, and
its entry in `LAUNCHERS`."""

from __future__ import annotations

from typing import Protocol

from .processes import ProcessLauncher
from .protocol import JobInfo, JobRef, LiveRunOrigin, PollArgs, RunRecord, StartArgs, StopReply
from .slurm_jobs import SlurmJobLauncher


class Watch(Protocol):
    job: JobInfo | None  # what the reply says of a job (None: the run is none)

    def look(self) -> tuple[list[int], bool, str, bool]: ...

    def end(self) -> None: ...


class HostLauncher(Protocol):
    def owns_run(self, run: RunRecord) -> bool: ...

    def owns_start(self, args: StartArgs) -> bool: ...

    def owns_poll(self, args: PollArgs) -> bool: ...

    def job_ref(self, state_dir: str, run: RunRecord) -> JobRef | None:
        """What a poll of the run names besides its processes (a Slurm job)."""
        ...

    def facts(self) -> dict[str, object]: ...

    def start(self, args: StartArgs, run_id: str, log_path: str, log_fd: int) -> RunRecord: ...

    def watch(self, args: PollArgs) -> Watch: ...

    def liveness(self, run: RunRecord) -> tuple[list[int], bool, LiveRunOrigin]: ...

    def stop(
        self, state_dir: str, run: RunRecord, timeout: float, first_signal: str
    ) -> StopReply: ...


# The process launcher last: it claims whatever no other launcher does (older records too).
LAUNCHERS: tuple[HostLauncher, ...] = (SlurmJobLauncher(), ProcessLauncher())


def launcher_of(run: RunRecord) -> HostLauncher:
    """The launcher that started a recorded run."""
    return next(launcher for launcher in LAUNCHERS if launcher.owns_run(run))


def launcher_to_start(args: StartArgs) -> HostLauncher:
    """The launcher a start asks for."""
    return next(launcher for launcher in LAUNCHERS if launcher.owns_start(args))


def launcher_to_poll(args: PollArgs) -> HostLauncher:
    """The launcher of the run a poll watches."""
    return next(launcher for launcher in LAUNCHERS if launcher.owns_poll(args))


def preflight_facts() -> dict[str, object]:
    """What each launcher tells a preflight of this host (sbatch's path, …)."""
    found: dict[str, object] = {}
    for launcher in LAUNCHERS:
        found.update(launcher.facts())
    return found
