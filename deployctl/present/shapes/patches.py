"""The typed documents of patch list, patch apply and revert, patch audit.

No `from __future__ import annotations` (see the package's docstring).
"""

from typing import Annotated, TypedDict

from deployctl.ops.patch import FileState, PatchState
from deployctl.present.shapes.common import HostEntry


class PatchSetEntry(TypedDict):
    name: str
    version: str
    hash: str
    sglang_versions: list[str]
    description: str
    requires: list[str]
    flags: list[str]


class PatchList(TypedDict):
    patches: list[PatchSetEntry]


class Action(TypedDict):
    set: str
    version: str
    action: Annotated[
        str,
        "applied, replaced <old version>, adopted (the files had it: recorded, no file changed), unchanged, would apply, would adopt, reverted or not applied.",
    ]
    files: list[str]
    detail: Annotated[
        str,
        "How: a partly applied set completed, what an adopted set's backup holds, a set taken out by its reverse diff; empty when nothing is to be said.",
    ]


class PatchesFields(TypedDict):
    patches: list[Action]


class PatchActions(TypedDict):
    hosts: dict[str, HostEntry[PatchesFields]]


class SetState(TypedDict):
    state: Annotated[
        PatchState,
        "What the installation's files are, told by each file's shipped hashes, else hunk by hunk; the record of this state_dir second. applied: every hunk is in the files (detail `no record here` when this state_dir has no record of it); partly applied: some are (detail names the files that lack it); missing: none is; outdated: recorded here as an older version (or other content), the files as that apply left them; drifted: a file has, for some hunk, neither its lines nor those it expects (detail names it), or SGLang was reinstalled since apply; unsupported: no variant for this SGLang.",
    ]
    version: Annotated[
        str | None, "The version the files carry (applied), else the one recorded here."
    ]
    expected_version: str
    detail: str
    recorded: Annotated[bool, "This state_dir has a record of the set on this installation."]
    files: Annotated[
        dict[str, FileState],
        "Each file of the set's variant for this SGLang: applied, partly applied (some hunks), missing, or differs (a hunk whose lines are neither the set's nor the release's).",
    ]


class AuditFields(TypedDict):
    sglang_version: str | None
    patches: dict[str, SetState]


class Audit(TypedDict):
    hosts: dict[str, HostEntry[AuditFields]]


class Note(TypedDict):
    """What --new-token did."""

    note: str
