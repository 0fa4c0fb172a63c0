"""The typed documents of hosts, render (and its flag check), gpus and crash.

No `from __future__ import annotations` (see the package's docstring).
"""

from typing import Annotated, Any, NotRequired, TypedDict

from deployctl.choices import ThresholdMode
from deployctl.present.shapes.common import HostEntry
from deployctl.remote.measures import CrashRecord


class HostListed(TypedDict):
    address: str
    port: Annotated[int | None, "The SSH port; null for a local host."]
    user: str | None
    connection: str
    vars: Annotated[dict[str, Any], "The host's merged variables."]


class Inventory(TypedDict):
    """deployctl hosts --json"""

    hosts: dict[str, HostListed]


class GroupEntry(TypedDict):
    """A group's child groups and its own hosts, in declaration order."""

    children: list[str]
    hosts: list[str]


class Graph(TypedDict):
    """deployctl hosts --graph --json"""

    groups: dict[str, GroupEntry]


class Flags(TypedDict):
    """What the host's SGLang says of the command's flags."""

    method: Annotated[str, "How the command was checked: declarations, parser, or why not."]
    note: str
    options: int
    seconds: float
    problems: list[str]
    warnings: list[str]
    hints: list[str]


class RenderedFields(TypedDict):
    command: str
    env: dict[str, str]
    threshold_mode: Annotated[ThresholdMode | None, "patch or adaptive; null: no threshold."]
    files: Annotated[dict[str, str], "Files launch writes on the host first: path → text."]
    batch_script: NotRequired[
        Annotated[
            str | None,
            "A Slurm job's batch script as sbatch is given it, secrets masked (launcher: slurm); null otherwise",
        ]
    ]


class CheckedFields(RenderedFields):
    flags: Flags


class Rendered(TypedDict):
    """deployctl render --json"""

    hosts: dict[str, HostEntry[RenderedFields]]


class Checked(TypedDict):
    """deployctl render --check --json"""

    hosts: dict[str, HostEntry[CheckedFields]]


class Gpu(TypedDict):
    index: int
    uuid: str
    name: str
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: int | None


class GpuProcess(TypedDict):
    pid: int
    name: str
    used_memory_mib: int | None
    gpu_uuid: str
    held_by: Annotated[str | None, "The deployctl run holding it, if one."]


class GpusFields(TypedDict):
    clean: bool
    gpus: list[Gpu]
    processes: list[GpuProcess]


class Gpus(TypedDict):
    hosts: dict[str, HostEntry[GpusFields]]


class ScanFields(TypedDict):
    log: str | None
    size: int
    scanned_bytes: int
    crashes: list[CrashRecord]
    healthy: bool
    warnings: list[CrashRecord]


class Fleet(TypedDict):
    """deployctl crash --json"""

    hosts: dict[str, HostEntry[ScanFields]]


class LocalCrashes(TypedDict):
    """deployctl crash --file FILE --json"""

    crashes: list[CrashRecord]
