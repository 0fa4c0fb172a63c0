"""The typed document of `deployctl init --json`.

No `from __future__ import annotations` (see the package's docstring).
"""

from typing import Annotated, NotRequired, TypedDict

from deployctl.present.shapes.common import Entry
from deployctl.present.shapes.fleet import Gpu


class FoundSglang(TypedDict):
    python: str
    python_version: str
    version: str | None
    site: str
    patches: Annotated[dict[str, str], "Each patch set's state on this installation."]


class FoundPython(TypedDict):
    python: str
    version: str


class SuggestedServer(TypedDict):
    name: str
    gpus: list[int]
    tp: int
    port: int
    why: str


class SurveyFields(TypedDict):
    hostname: str
    user: NotRequired[str]
    gpus: list[Gpu]
    gpu_error: NotRequired[
        Annotated[str | None, "Why no GPU was read (no nvidia-smi, a driver error)."]
    ]
    islands: NotRequired[
        Annotated[list[list[int]] | None, "GPUs joined by NVLink (or one NUMA node)."]
    ]
    topology_error: NotRequired[str | None]
    sglang: Annotated[list[FoundSglang], "Every Python found with SGLang."]
    pythons: NotRequired[list[FoundPython]]
    deployments: Annotated[
        list[SuggestedServer], "The servers the GPUs suggest (one: the host's own)."
    ]
    ports: Annotated[list[int], "TCP ports in use."]
    models: Annotated[list[str], "Folders holding a model's config.json."]
    sbatch: Annotated[str | None, "Where Slurm's sbatch is; null: no Slurm client."]


class Init(TypedDict):
    hosts: dict[str, Entry[SurveyFields]]
    path: Annotated[str, "The inventory file written, or that would be."]
    written: Annotated[bool, "False for --dry-run, or when no host could be read."]
    backup: Annotated[str | None, "Where the file that was at `path` is kept."]
    extended: Annotated[str | None, "The inventory -i named, that the hosts were added to."]
    inventory: Annotated[str, "The YAML written (with -i: what was added to the file)."]
