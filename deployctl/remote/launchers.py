"""The launcher seam on the host side: each way a run starts here answers the same verbs —
`start`, `watch` (a poll's look: alive, where it answers, may it serve), `liveness`, `stop`
and its preflight `facts` — and this module is the one place that says which launcher a
run, a start or a poll is (SkyPilot's `sky/provision/__init__.py` routes the same way).

A start names its launcher by kind (`StartArgs.launcher`), a poll of a placed run by its
placement (`PlacementRef.launcher`), a record by its `launcher` (`launcher_kind`: an older
record names none). A third launcher is a module beside `processes.py` and `slurm_jobs.py`
with one class, and its `register` in `LAUNCHERS` below."""

from __future__ import annotations

from .files import fail
from .placements import launcher_kind
from .processes import ProcessLauncher
from .slurm_jobs import SlurmJobLauncher

# The seam's types, for the checker only (files.py says why): a launcher is any class with
# these verbs.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from .protocol import (
        LiveRunOrigin,
        Placement,
        PlacementRef,
        PollArgs,
        RunRecord,
        StartArgs,
        StopReply,
    )

    class Watch(Protocol):
        placement: Placement | None  # what the reply says of its placement (None: it has none)

        def look(self) -> tuple[list[int], bool, str, bool]: ...

        def end(self) -> None: ...

    class HostLauncher(Protocol):
        kind: str  # its `launcher` setting's value: the key its starts, records and placements name

        def placement_ref(self, state_dir: str, run: RunRecord) -> PlacementRef | None:
            """What a poll of the run names besides its processes (its placement)."""
            ...

        def facts(self) -> dict[str, str | None]: ...

        def start(self, args: StartArgs, run_id: str, log_path: str, log_fd: int) -> RunRecord: ...

        def watch(self, args: PollArgs) -> Watch: ...

        def liveness(self, run: RunRecord) -> tuple[list[int], bool, LiveRunOrigin]: ...

        def stop(
            self, state_dir: str, run: RunRecord, timeout: float, first_signal: str
        ) -> StopReply: ...


# By kind. The process launcher is the default: it started any record that names no launcher
# (but an older Slurm job's: `launcher_kind`), and every poll that names no placement.
LAUNCHERS: dict[str, HostLauncher] = {}
DEFAULT = ProcessLauncher.kind


def register(launcher: HostLauncher) -> None:
    LAUNCHERS[launcher.kind] = launcher


register(ProcessLauncher())
register(SlurmJobLauncher())


def launcher_of(run: RunRecord) -> HostLauncher:
    """The launcher that started a recorded run (one this agent lacks: the host's error)."""
    return _by_kind(launcher_kind(run) or DEFAULT)


def _by_kind(kind: str) -> HostLauncher:
    if kind not in LAUNCHERS:
        fail(f"this host's deployctl agent has no launcher {kind!r}", "host")
    return LAUNCHERS[kind]


def launcher_to_start(args: StartArgs) -> HostLauncher:
    """The launcher a start asks for."""
    return _by_kind(args["launcher"])


def start(args: StartArgs, run_id: str, log_path: str, log_fd: int) -> RunRecord:
    """Start a run with the launcher it asks for: its record names that launcher."""
    launcher = launcher_to_start(args)
    return {**launcher.start(args, run_id, log_path, log_fd), "launcher": launcher.kind}


def liveness(run: RunRecord) -> tuple[list[int], bool, LiveRunOrigin]:
    """A recorded run's live members, whether it lives, and what a live run says of it
    besides: its launcher, and what that launcher says (a job's id)."""
    launcher = launcher_of(run)
    members, alive, said = launcher.liveness(run)
    return members, alive, {**said, "launcher": launcher.kind}


def launcher_to_poll(args: PollArgs) -> HostLauncher:
    """The launcher of the run a poll watches."""
    return _by_kind(args["placement"]["launcher"] if "placement" in args else DEFAULT)


def preflight_facts() -> dict[str, str | None]:
    """What each launcher tells a preflight of this host (sbatch's path, …)."""
    found: dict[str, str | None] = {}
    for launcher in LAUNCHERS.values():
        found.update(launcher.facts())
    return found
