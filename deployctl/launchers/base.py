"""The launcher seam's declarations: the verbs each launcher answers, with the answers of a
launcher that needs nothing of them (which launcher a host uses is a user's choice, its
`launcher` setting: `choices.LaunchKind`, or the kind of any launcher registered besides).

A launcher is how a deployment's server starts and ends: a process group on the host over
SSH, or a Slurm job from a login node. Everything that differs between them is a verb here;
the code that starts, waits for, reads and stops runs (ops/) asks the launcher, never which
one it is. What a launcher reports of a server besides its processes is its `Placement`
(remote/protocol.py): its handle, its state in the launcher's words, its nodes and head,
its time left."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deployctl.deployments import gpu_set
from deployctl.findings import Findings
from deployctl.inventory import Host
from deployctl.remote.protocol import Placement, PlacementRef, PreflightReply, RunRecord
from deployctl.remote.wire import answers_at, placement_ref
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
    """A run's granted time: its placement's id and the seconds it has left."""

    id: str
    time_left: float


class Launcher:
    """The verbs every launcher answers (the client side; remote/launchers.py is the host's),
    each answered here as a server on the host itself, with no placement, needs: a launcher
    states only what differs.

    Starting, polling, stopping and reading a run are agent calls whose host side dispatches
    by launcher; these verbs are what the client does differently around them."""

    kind: str  # its `launcher` setting's value, and its host side's kind
    # The server runs on the host itself: its GPUs, its ports and the host's other runs are
    # the host's to check (a job's are on nodes its scheduler picks, and checked there).
    checks_host = True
    # Where its router reaches it is known before it starts (a job's head node is not).
    address_known_at_start = True
    # Its log's ready line means the API answers where the client asks (a job's node may
    # write it before the login node can reach the server).
    trusts_ready_line = True
    # What a status calls its placements (a table's title) and each one (its first column).
    placements_title = "placements"
    placement_word = "placement"

    def template_context(self, settings: Settings) -> dict[str, Any]:
        """What a template sees besides the host's variables (a job's node rank, …)."""
        return {}

    def host_gpus(self, host: Host) -> list[int] | None:
        """The host's GPUs a server gets (None: all of them; []: none of the host's)."""
        return gpu_set(host)

    def host_share(self, tp: int, nnodes: int) -> int:
        """The GPUs the host itself gives a server of tensor parallelism `tp`."""
        return tp // nnodes

    def checked_form(self, argv: Sequence[str]) -> list[str]:
        """The command as the host's flag check sees it (words the launcher fills in given
        a value)."""
        return list(argv)

    def script(self, settings: Settings, server: ServerCommand, max_used_mib: int) -> str | None:
        """The command's wrapper the host is given (a batch script); None: the command runs
        as it is."""
        return None

    def preflight(self, host: Host, tp: int, bind_host: str, reply: PreflightReply) -> Findings:
        """What the launcher itself needs of the host and the settings."""
        return Findings()

    def answers_at(self, run: Mapping[str, Any], placed: Placement | None) -> str:
        """Where the run's server answers, from the host that launched it: its placement's
        head ("": not known yet), or its `bind_host` when it has none."""
        return answers_at(str(run["bind_host"]), placed)

    def head(self, placed: Placement | None) -> str:
        """The address its router reaches it at when that is not the host's ("": the
        host's, or `worker_url`)."""
        return "" if self.address_known_at_start or placed is None else placed["head"]

    def handle(self, run: Mapping[str, Any]) -> str:
        """How people find a run: `pid 4321`, `job 1234`."""
        placed = run.get("job", run.get("placement"))
        if placed is None:
            return f"pid {run['pid']}"
        return f"{self.placement_word} {placed if isinstance(placed, str) else placed['id']}"

    def placement_ref(self, state_dir: str, run: RunRecord) -> PlacementRef | None:
        """What a poll of the run names besides its processes (its placement)."""
        placed = run.get("job")
        return None if placed is None else placement_ref(self.kind, state_dir, run, placed)

    def placements(self, placed: Placement | None) -> list[Placement]:
        """What a status lists for the run in its `placements_title` table."""
        return [] if placed is None else [placed]

    def words(self, placed: Placement | None) -> str:
        """What the launcher says of a run's state besides alive and healthy ("": nothing)."""
        return ""

    def waiting(self, placed: Placement | None) -> bool:
        """The run waits to (re)start: nothing of it serves, and its log is an earlier
        start's."""
        return False

    def waiting_line(self, placed: Placement | None) -> str | None:
        """The line a wait shows while the run is not started yet (None: its log's)."""
        return None

    def current_log(self, log: str, placed: Placement | None) -> str:
        """The part of the log that is the run's latest start (where crashes count)."""
        return log

    def time_limit(self, settings: Settings) -> tuple[str, float] | None:
        """The time limit its runs get (as written, in seconds); None: none."""
        return None

    def lease(self, placed: Placement | None) -> Lease | None:
        """The running run's time left (None: it has no limit, or it is not running)."""
        return None
