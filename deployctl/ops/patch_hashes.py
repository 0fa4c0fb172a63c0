"""Each patch set's hashes.json, made from its diffs and SGLang's own wheels.

For every variant: each file its diffs touch, hashed as the release ships it and with only
that set applied (by GNU patch as `patch apply` runs it). The audit judges a host's files by
them first. scripts/patch-hashes writes or checks them (a test checks the shipped ones).
"""

from __future__ import annotations

import difflib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deployctl.errors import PatchError
from deployctl.ops.patch import patched_copies
from deployctl.patchset import (
    HASHES_FILE,
    FileHashes,
    PatchSet,
    Variant,
    diffs_digest,
    file_hashes,
    hashes_document,
)

REGENERATE = "scripts/patch-hashes --write"


def wheel_of(wheels: Path, version: str) -> Path:
    """SGLang's own wheel of one release, from the folder of wheels."""
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        raise PatchError(
            f"no SGLang {version} wheel in {wheels}",
            hint=f"pip download --no-deps --only-binary=:all: --python-version 3.11 -d {wheels} "
            f"sglang=={version}",
        )
    return found[0]


def release_files(wheel: Path, paths: Sequence[str]) -> dict[str, bytes | None]:
    """The named files as the wheel ships them (None: not in it), nothing else unpacked."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        return {p: archive.read(p) if p in names else None for p in paths}


def variant_hashes(variant: Variant, wheel: Path) -> tuple[str, dict[str, FileHashes]]:
    """One variant's entry: the digest of its diffs and each file's two hashes."""
    pristine = release_files(wheel, variant.files)
    patched = patched_copies(variant, pristine, variant.files)
    return diffs_digest(variant.diffs), file_hashes(pristine, patched)


def set_hashes(patch_set: PatchSet, wheels: Path) -> str:
    """hashes.json's text for one set."""
    return hashes_document(
        {
            version: variant_hashes(variant, wheel_of(wheels, version))
            for version, variant in patch_set.variants.items()
        }
    )


@dataclass(frozen=True)
class HashesFile:
    """One set's hashes.json: where, as shipped, and as its diffs and wheels make it."""

    path: Path
    shipped: str
    made: str

    @property
    def stale(self) -> bool:
        return self.shipped != self.made

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.shipped.splitlines(keepends=True),
                self.made.splitlines(keepends=True),
                f"{self.path} (shipped)",
                f"{self.path} (from the diffs and wheels)",
            )
        )


def hashes_files(sets: Sequence[PatchSet], wheels: Path) -> list[HashesFile]:
    """Each set's hashes.json as shipped and as made now."""
    found = []
    for patch_set in sets:
        path = patch_set.folder / HASHES_FILE
        shipped = path.read_text(encoding="utf-8") if path.exists() else ""
        found.append(HashesFile(path, shipped, set_hashes(patch_set, wheels)))
    return found
