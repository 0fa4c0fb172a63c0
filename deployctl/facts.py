"""Read-only probes: a shell command and a pure parser for its output."""

from __future__ import annotations

import csv
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from deployctl.connection import Connection
from deployctl.errors import ParseError
from deployctl.text import is_number

# The GPU queries (GPUS_COMMAND, whose real output is captured under tests/data/nvidia-smi/)
# are on the wire: remote.protocol, since a kept agent answers them through NVML.
_PROBE_MARK = "@@deployctl-probe@@"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: int | None
    compute_cap: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("compute_cap")
        return data


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_memory_mib: int | None
    gpu_uuid: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(text: str) -> int | None:
    """Parse '8811 MiB', '0 %', '8802' or '[N/A]' to an int (None when not available)."""
    match = re.match(r"\s*(\d+)", text)
    return int(match.group(1)) if match else None


def _csv_rows(text: str, header_prefix: str) -> list[list[str]]:
    rows = []
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        cells = [cell.strip() for cell in row]
        if cells and cells[0] == header_prefix:
            continue
        rows.append(cells)
    return rows


def parse_gpus(text: str) -> list[Gpu]:
    """Parse GPU_QUERY output (csv, with or without header and units)."""
    gpus = []
    for cells in _csv_rows(text, "index"):
        if len(cells) < 6 or not is_number(cells[0]):
            raise ParseError(f"unexpected nvidia-smi GPU line: {','.join(cells)[:200]}")
        used, total = _number(cells[3]), _number(cells[4])
        if used is None or total is None:
            raise ParseError(f"no memory figures in nvidia-smi GPU line: {','.join(cells)[:200]}")
        gpus.append(
            Gpu(
                index=int(cells[0]),
                uuid=cells[1],
                name=cells[2],
                memory_used_mib=used,
                memory_total_mib=total,
                utilization_pct=_number(cells[5]),
                compute_cap=cells[7] if len(cells) > 7 else None,
            )
        )
    return gpus


def parse_gpu_processes(text: str) -> list[GpuProcess]:
    """Parse GPU_APPS_QUERY output (csv, with or without header and units)."""
    processes = []
    for cells in _csv_rows(text, "pid"):
        if len(cells) < 4 or not is_number(cells[0]):
            raise ParseError(f"unexpected nvidia-smi process line: {','.join(cells)[:200]}")
        processes.append(GpuProcess(int(cells[0]), cells[1], _number(cells[2]), cells[3]))
    return processes


@dataclass(frozen=True)
class GpuState:
    gpus: list[Gpu]
    processes: list[GpuProcess]


def parse_gpus_command(exit_code: int, output: str, stderr: str = "") -> GpuState:
    """Parse GPUS_COMMAND's output; raise ParseError with nvidia-smi's own message.

    Only stdout is data: what nvidia-smi warns about on stderr never reaches the parser.
    """
    if exit_code != 0:
        message = " ".join(f"{output} {stderr}".split()) or f"nvidia-smi exited {exit_code}"
        raise ParseError(message[:300])
    gpu_text, sep, apps_text = output.partition("@@apps")
    if not sep:
        raise ParseError("nvidia-smi output is incomplete")
    gpus = parse_gpus(gpu_text)
    if not gpus:  # never "clean (0 GPUs)": a host without a GPU listed cannot be judged
        raise ParseError("nvidia-smi listed no GPU")
    return GpuState(gpus, parse_gpu_processes(apps_text))


# How GPUs are linked: `nvidia-smi topo -m`'s matrix (NV<n>: n NVLinks; PIX, PXB, PHB, NODE,
# SYS: PCIe paths, from one switch to across sockets).
TOPOLOGY_COMMAND = "nvidia-smi topo -m"


@dataclass(frozen=True)
class Topology:
    """The GPUs' links and each GPU's NUMA node (None where nvidia-smi says N/A)."""

    links: dict[tuple[int, int], str]
    numa: dict[int, str | None]

    def islands(self) -> list[list[int]]:
        """GPUs that one server should span: those joined by NVLink; with no NVLink at all,
        those of one NUMA node. Each island sorted, islands by their first GPU."""
        gpus = sorted(self.numa)
        joined = {g: {g} for g in gpus}
        for (a, b), link in self.links.items():
            if link.startswith("NV") and a in joined and b in joined and joined[a] is not joined[b]:
                merged = joined[a] | joined[b]
                for g in merged:
                    joined[g] = merged
        groups = {min(group): sorted(group) for group in joined.values()}
        if len(gpus) > 1 and all(len(g) == 1 for g in groups.values()):
            by_numa: dict[str | None, list[int]] = {}
            for g in gpus:
                by_numa.setdefault(self.numa[g], []).append(g)
            return sorted(by_numa.values())
        return [groups[k] for k in sorted(groups)]


def _topology_columns(header: str) -> list[str]:
    cells = header.split("\t") if "\t" in header else re.split(r"\s{2,}", header)
    return [c.strip() for c in cells if c.strip()]


def parse_topology(text: str) -> Topology:
    """Parse `nvidia-smi topo -m`'s matrix (its legend ignored)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if re.match(r"\s+GPU0\b", ln)), None)
    if header is None:
        raise ParseError(f"no GPU matrix in nvidia-smi topo -m: {text.strip()[:200]}")
    columns = _topology_columns(header)
    devices = [c for c in columns if not c.endswith("Affinity") and c != "GPU NUMA ID"]
    numa_column = "NUMA Affinity" in columns
    links: dict[tuple[int, int], str] = {}
    numa: dict[int, str | None] = {}
    for line in lines:
        row = re.match(r"GPU(\d+)\s", line)
        if row is None:
            continue
        cells = line.split()[1:]
        if len(cells) < len(devices):
            raise ParseError(f"short row in nvidia-smi topo -m: {line.strip()[:200]}")
        gpu = int(row.group(1))
        for column, link in zip(devices, cells, strict=False):
            if column.startswith("GPU") and column[3:].isdigit() and link != "X":
                links[(gpu, int(column[3:]))] = link
        rest = cells[len(devices) :]  # CPU affinity, NUMA affinity, GPU NUMA ID
        node = rest[1] if numa_column and len(rest) > 1 else None
        numa[gpu] = None if node in (None, "N/A") else node
    if not numa:
        raise ParseError("nvidia-smi topo -m listed no GPU row")
    return Topology(links, numa)


@dataclass(frozen=True)
class ProbeOutput:
    exit_code: int
    output: str  # the probe's stdout: its data
    stderr: str = ""  # kept apart, so a tool's warnings never reach a parser


def probe_script(probes: Mapping[str, str]) -> str:
    """Join several probe commands into one shell script (one round trip).

    Each probe's stdout and stderr come back between marks, so whatever the login prints
    (motd, an rc file's banner) is outside every frame and ignored.
    """
    mark = shlex.quote(_PROBE_MARK)
    # The newline before each closing mark keeps it at the start of a line when the output
    # has no final newline; the parser takes that newline back off.
    parts = [
        f'echo {shlex.quote(f"{_PROBE_MARK} {name}")}; ( {command} ) 2>"$t"; '
        f"printf '\\n%s rc=%s\\n' {mark} \"$?\"; cat \"$t\"; printf '\\n%s end\\n' {mark}"
        for name, command in probes.items()
    ]
    setup = "t=$(mktemp 2>/dev/null) || t=/dev/null"
    return "\n".join([setup, *parts, '[ "$t" = /dev/null ] || rm -f "$t"'])


def parse_probe_output(text: str) -> dict[str, ProbeOutput]:
    """Split probe_script output back into each probe's exit code, stdout and stderr."""
    results: dict[str, ProbeOutput] = {}
    name: str | None = None
    code = 0
    stdout: str | None = None
    lines: list[str] = []
    for line in text.split("\n"):
        if not line.startswith(_PROBE_MARK):
            lines.append(line)
            continue
        tag = line[len(_PROBE_MARK) + 1 :]
        body = "\n".join(lines).removesuffix("\n")
        if tag.startswith("rc=") and name is not None:
            code, stdout = int(tag[3:] or 1), body
        elif tag == "end" and name is not None and stdout is not None:
            results[name] = ProbeOutput(code, stdout, body)
            name, stdout = None, None
        else:
            name, stdout = tag, None
        lines = []
    return results


def run_probes(
    conn: Connection, probes: Mapping[str, str], purpose: str | None = None
) -> dict[str, ProbeOutput]:
    """Run several probes in one round trip; a probe that did not report is an error."""
    result = conn.run(probe_script(probes), purpose=purpose or f"read {', '.join(probes)}")
    outputs = parse_probe_output(result.stdout)
    missing = [name for name in probes if name not in outputs]
    if missing:
        detail = (result.stderr or result.stdout).strip()[-300:]
        raise ParseError(f"probe {missing[0]} gave no result (exit {result.exit_code}): {detail}")
    return outputs
