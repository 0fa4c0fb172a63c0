"""Are a host's GPUs clean? Every GPU near 0 MiB and no compute process."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

from deployctl import agent
from deployctl.connection import Connection
from deployctl.errors import DeployctlError
from deployctl.facts import Gpu, GpuProcess, GpuState, parse_gpus_command, run_probes
from deployctl.inventory import Host
from deployctl.remote.protocol import RunsArgs
from deployctl.remote.wire import GPUS_COMMAND
from deployctl.text import counted

DEFAULT_MAX_USED_MIB = 16


@dataclass(frozen=True)
class GpuReport:
    """A host's GPUs, their compute processes, and the clean/dirty verdict."""

    gpus: list[Gpu]
    processes: list[GpuProcess]
    max_used_mib: int
    holders: dict[int, str] = field(default_factory=dict)  # PID → our run (and deployment)

    @property
    def busy_gpus(self) -> list[Gpu]:
        return [g for g in self.gpus if g.memory_used_mib > self.max_used_mib]

    @property
    def clean(self) -> bool:
        return not self.processes and not self.busy_gpus

    @property
    def ok(self) -> bool:
        return self.clean

    @property
    def held_by_ours(self) -> bool:
        """Every process on these GPUs is one of our live runs' (`holders`, from
        find_holders): a shared GPU after one sharer stopped. Memory in use with no process
        listed (a container's) is nobody's we know: not ours."""
        if not self.processes:
            return not self.busy_gpus
        return all(p.pid in self.holders for p in self.processes)

    @property
    def pids(self) -> list[int]:
        return sorted({p.pid for p in self.processes})

    def memory_of(self, members: Collection[int]) -> int:
        """The MiB a run whose processes are `members` holds on these GPUs: its own processes'
        (a GPU shared with other runs holds theirs too). Where nvidia-smi lists none of them
        (a container's other PID namespace) or gives one no figure, its GPUs' whole use."""
        own = [p.used_memory_mib for p in self.processes if p.pid in members]
        if own and None not in own:
            return sum(m for m in own if m is not None)
        return sum(g.memory_used_mib for g in self.gpus)

    def verdict(self) -> str:
        """Say in a few words why the host is clean or dirty."""
        if self.clean:
            return f"clean ({counted(len(self.gpus), 'GPU')})"
        parts = []
        if self.processes:
            parts.append("PIDs " + ", ".join(map(str, self.pids)) + " hold GPU memory")
        busy = self.busy_gpus
        if busy and not self.processes:
            used = ", ".join(f"GPU{g.index} {g.memory_used_mib} MiB" for g in busy)
            parts.append(f"memory in use with no process listed: {used}")
        return "dirty: " + "; ".join(parts)


def gpu_report(state: GpuState, max_used_mib: int, only: Sequence[int] | None = None) -> GpuReport:
    """Judge a parsed GPU state: every GPU, or `only` those indices (a deployment's)."""
    if only is None:
        return GpuReport(state.gpus, state.processes, max_used_mib)
    gpus = [g for g in state.gpus if g.index in only]
    uuids = {g.uuid for g in gpus}
    return GpuReport(gpus, [p for p in state.processes if p.gpu_uuid in uuids], max_used_mib)


def check_gpus(
    host: Host,
    conn: Connection,
    max_used_mib: int = DEFAULT_MAX_USED_MIB,
    only: Sequence[int] | None = None,
) -> GpuReport:
    """Query nvidia-smi once on the host and judge its GPUs (or `only` those)."""
    probe = run_probes(conn, {"gpus": GPUS_COMMAND})["gpus"]
    state = parse_gpus_command(probe.exit_code, probe.output, probe.stderr)
    return gpu_report(state, max_used_mib, only)


def find_holders(host: Host, conn: Connection, report: GpuReport) -> GpuReport:
    """Name, for each GPU process that is one of our runs, that run and its deployment.

    Asked only when some process holds a GPU: a clean host costs no second round trip.
    """
    if not report.processes:
        return report
    args: RunsArgs = {"state_dir": host.settings.state_dir}
    try:
        runs = agent.call(host, conn, agent.RUNS, args)["live_runs"]
    except DeployctlError:  # the GPUs are still worth showing without their holders
        return report
    holders = {
        pid: run["id"] if run["deployment"] is None else f"{run['deployment']} ({run['id']})"
        for run in runs
        for pid in run["members"]
    }
    return replace(report, holders=holders)
