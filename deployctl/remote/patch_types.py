"""The protocol's types of patch sets on a host (stdlib only): what an apply records, the
marks a probe looks for a set's hunks by, and the read, apply and revert calls' arguments and
replies. Declarations only; the call table is `protocol`'s."""

from __future__ import annotations

from typing import TypedDict


class FileSums(TypedDict):
    original_sha256: str | None
    patched_sha256: str | None


class Adopted(TypedDict, total=False):
    adopted: bool  # the files had it already: the backup is them without its hunks (reverse diff)


class AppliedSet(Adopted):
    """Which set, which version of it, on which SGLang, applied when and by whom."""

    set: str
    version: str
    hash: str
    variant: str
    sglang_version: str
    site: str
    apply_id: str
    applied_at: str
    applied_by: str


class PatchRecord(AppliedSet):
    """patches/sites/<key>/<set>.json: an applied set, its backups and the sha256 of each of
    its files."""

    backup_dir: str
    files: dict[str, FileSums]


class BlockMark(TypedDict):
    """Lines found without sending them: count, sha256 joined by "\\n", longest one and where."""

    lines: int
    sha256: str
    anchor: int
    line: str


class HunkMark(TypedDict):  # a hunk of a set's diff: the lines it expects, and it leaves
    before: BlockMark
    after: BlockMark


class ReadArgs(TypedDict):
    base: str
    paths: list[str]


class ReadReply(TypedDict):
    files: dict[str, str | None]  # base64, or None for a file that does not exist


class ApplyArgs(TypedDict):
    state_dir: str
    payload_sha256: str
    payload_size: int


class Manifest(AppliedSet):
    """manifest.json inside an apply's payload (a tar on stdin)."""

    files: list[str]
    expect: dict[str, str | None]
    verify: list[str]


class ApplyReply(TypedDict):
    record: PatchRecord


class RevertArgs(TypedDict):
    state_dir: str
    set: str
    force: bool
    forget: bool  # the files already lack the set: drop its record, touch no file


class RevertReply(TypedDict):
    reverted: bool
    files: list[str]
