"""Are a host's GPUs clean? Every GPU near 0 MiB and no compute process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployctl.connection import Connection
from deployctl.facts import GPUS_COMMAND, Gpu, GpuProcess, GpuState, parse_gpus_command, run_probes
from deployctl.inventory import Host

DEFAULT_MAX_USED_MIB = 16


@dataclass(frozen=True)
class GpuReport:
    """A host's GPUs, their compute processes, and the clean/dirty verdict."""

    gpus: list[Gpu]
    processes: list[GpuProcess]
    max_used_mib: int

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
    def pids(self) -> list[int]:
        return sorted({p.pid for p in self.processes})

    def verdict(self) -> str:
        """Say in a few words why the host is clean or dirty."""
        if self.clean:
            return f"clean ({len(self.gpus)} GPU{'s' if len(self.gpus) != 1 else ''})"
        parts = []
        if self.processes:
            parts.append("PIDs " + ", ".join(map(str, self.pids)) + " hold GPU memory")
        busy = self.busy_gpus
        if busy and not self.processes:
            used = ", ".join(f"GPU{g.index} {g.memory_used_mib} MiB" for g in busy)
            parts.append(f"memory in use with no process listed: {used}")
        return "dirty: " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "gpus": [g.to_json() for g in self.gpus],
            "processes": [p.to_json() for p in self.processes],
        }


def gpu_report(state: GpuState, max_used_mib: int) -> GpuReport:
    """Judge a parsed GPU state."""
    return GpuReport(state.gpus, state.processes, max_used_mib)


def check_gpus(host: Host, conn: Connection, max_used_mib: int = DEFAULT_MAX_USED_MIB) -> GpuReport:
    """Query nvidia-smi once on the host and judge its GPUs."""
    probe = run_probes(conn, {"gpus": GPUS_COMMAND})["gpus"]
    return gpu_report(parse_gpus_command(probe.exit_code, probe.output, probe.stderr), max_used_mib)
