"""`patch port`: a candidate variant of a patch set for another SGLang release.

The nearest existing variant's diffs are applied to the target release's pristine files in a
scratch folder — exactly if they can be, else with GNU patch's offsets and fuzz — and every
hunk's outcome is reported. Exact diffs against the pristine files are written as the
candidate; the verify scripts run on the patched copy when the whole release is at hand. It
never touches a host and never adds the candidate to patch.yml: that is the reviewer's call.
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import subprocess
import tempfile
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypedDict

from deployctl.connection import Connection
from deployctl.errors import PatchError
from deployctl.inventory import Host
from deployctl.localfiles import check_folder, write_folder
from deployctl.patchset import (
    HASHES_FILE,
    PatchSet,
    Variant,
    diff_hunks,
    diff_targets,
    diffs_digest,
    file_hashes,
    hashes_document,
    version_key,
)
from deployctl.remote.patches import dist_version, metadata_version, run_verify_scripts
from deployctl.schema import versioned

PORT_ARGS = ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "--fuzz=3"]
_HUNK_LINE = re.compile(
    r"Hunk #(\d+) (succeeded|FAILED) at (\d+)(?: with fuzz (\d+))?(?: \(offset (-?\d+) lines?\))?"
)
_PATCHING = re.compile(r"^patching file (.+)$")
_CREATING = re.compile(r"would create the file (.+),$")
_CREATED = re.compile(r"^--- /dev/null\n\+\+\+ b/(\S+)", re.M)


class PortedHunk(TypedDict):
    diff: str
    file: str
    hunk: int
    outcome: Annotated[str, "exact, offset, fuzz or failed."]
    detail: str


class PortDocument(TypedDict):
    # `patch port --json`, and the candidate's report.json (its schema is generated from this
    # declaration: deployctl/present/shapes/ names it).
    set: str
    from_version: str
    to_version: str
    source: str
    out: str
    ok: bool
    hunks: list[PortedHunk]
    verify: Annotated[dict[str, str], "Verify script → passed, failed: … or not run: …."]


@dataclass
class HunkOutcome:
    diff: str
    file: str
    hunk: int
    outcome: str  # exact, offset, fuzz, failed
    detail: str = ""  # `offset 3`, `fuzz 2, offset -1`, or the rejected hunk's text

    def to_json(self) -> PortedHunk:
        return {
            "diff": self.diff,
            "file": self.file,
            "hunk": self.hunk,
            "outcome": self.outcome,
            "detail": self.detail,
        }


@dataclass
class PortReport:
    set: str
    from_version: str
    to_version: str
    source: str
    out: str
    hunks: list[HunkOutcome] = field(default_factory=list)
    verify: dict[str, str] = field(default_factory=dict)  # script → passed / failed: … / not run: …

    @property
    def ok(self) -> bool:
        """Every hunk applied and no verify script that ran failed."""
        return all(h.outcome != "failed" for h in self.hunks) and not any(
            v.startswith("failed") for v in self.verify.values()
        )

    def to_json(self) -> PortDocument:
        return {
            "set": self.set,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "source": self.source,
            "out": self.out,
            "ok": self.ok,
            "hunks": [h.to_json() for h in self.hunks],
            "verify": self.verify,
        }


def nearest_variant(patch_set: PatchSet, target: str) -> Variant:
    """The variant of the closest release: the newest at or below the target, else the
    oldest above it."""
    if not patch_set.variants:
        raise PatchError(f"patch set {patch_set.name} has no variant to port from")
    ordered = sorted(patch_set.variants, key=version_key)
    below = [v for v in ordered if version_key(v) <= version_key(target)]
    return patch_set.variants[below[-1] if below else ordered[0]]


def check_release(found: str | None, target: str, source: Path) -> None:
    """Refuse a source that holds another release than the one ported to."""
    if found is not None and found != target:
        raise PatchError(
            f"{source} holds SGLang {found}, not {target}",
            hint=f"port to {found} (--to {found}), or give the {target} release",
        )


def wheel_version(wheel: zipfile.ZipFile) -> str | None:
    """The release a wheel holds, from its sglang dist-info's METADATA (nothing unpacked)."""
    for name in sorted(wheel.namelist()):
        if name.lower().startswith("sglang-") and name.endswith(".dist-info/METADATA"):
            return metadata_version(wheel.read(name))
    return None


def pristine_from(source: Path, scratch: Path, target: str) -> Path:
    """A site folder holding the release's sglang/ package (and its dist-info): from a wheel
    or a site folder."""
    site = scratch / "site"
    if source.is_file() and source.suffix == ".whl":
        try:
            with zipfile.ZipFile(source) as wheel:
                # Checked before the ~6,000 files are written (seconds of CPU): a wrong
                # release is refused at once.
                check_release(wheel_version(wheel), target, source)
                # Compiled extensions (43 MB of 0.5.23's 117) need the release's CUDA stack,
                # which no verify script here can load: the sources are what a port reads.
                wanted = [
                    n for n in wheel.namelist() if n.startswith("sglang") and not n.endswith(".so")
                ]
                wheel.extractall(site, wanted)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:  # cut short, not a zip
            raise PatchError(
                f"{source} is not a readable wheel: {exc}",
                hint="download the wheel again (pip download --no-deps sglang==X.Y.Z)",
            ) from None
    elif (source / "sglang").is_dir():
        shutil.copytree(source / "sglang", site / "sglang", symlinks=True)
        for info in source.glob("sglang-*.dist-info"):
            shutil.copytree(info, site / info.name)
    else:
        raise PatchError(
            f"{source} is neither an SGLang wheel nor a folder holding sglang/",
            hint="--from PATH: a sglang-X.Y.Z-*.whl, or a site-packages folder",
        )
    return site


def release_version(site: Path) -> str | None:
    """The installed release, as the host agent reads it (the dist-info's METADATA)."""
    return dist_version(str(site), "sglang")


def _rejected_hunks(reject: Path) -> list[str]:
    if not reject.exists():
        return []
    text = reject.read_text(encoding="utf-8", errors="replace")
    return ["@@" + part for part in text.split("\n@@")[1:]] or ([text] if text.strip() else [])


def apply_for_port(diff: Path, site: Path, scratch: Path) -> list[HunkOutcome]:
    """Apply one diff with offsets and fuzz allowed; say how each hunk went."""
    text = diff.read_text(encoding="utf-8")
    counts = diff_hunks(text, diff.name)
    # A file the diff changes that this release lacks (moved, renamed, not there yet: 0.5.23's
    # arg_groups/fields/spec.py is in 0.5.17's server_args.py): its hunks fail, the rest port.
    created = set(_CREATED.findall(text))
    missing = {path for path in counts if path not in created and not (site / path).exists()}
    reject = scratch / f"{diff.name}.rej"
    done = subprocess.run(
        [*PORT_ARGS, "-d", str(site), "-i", str(diff), "-r", str(reject)],
        check=False,
        capture_output=True,
        text=True,
    )
    rejected = iter(_rejected_hunks(reject))
    outcomes: dict[tuple[str, int], HunkOutcome] = {}
    already: set[str] = set()  # files GNU patch skipped whole: the change is there already
    current = ""
    for line in done.stdout.splitlines():
        patching = _PATCHING.match(line.strip())
        if patching:
            current = patching.group(1).strip("'\"")
            continue
        creating = _CREATING.search(line)
        if creating:  # `The next patch would create the file X,` (no `patching file` line)
            current = creating.group(1).strip("'\"")
            continue
        if "No file to patch" in line:  # a missing file: reported below, not "already there"
            continue
        if "Skipping patch" in line:  # reversed, previously applied, or already created
            already.add(current)
            continue
        hunk = _HUNK_LINE.search(line)
        if hunk is None:
            continue
        number, status, _, fuzz, offset = hunk.groups()
        if status == "FAILED":
            outcome, detail = "failed", next(rejected, "")
        elif fuzz:
            outcome, detail = "fuzz", f"fuzz {fuzz}" + (f", offset {offset}" if offset else "")
        else:
            outcome, detail = "offset", f"offset {offset}"
        outcomes[(current, int(number))] = HunkOutcome(
            diff.name, current, int(number), outcome, detail
        )
    if done.returncode not in (0, 1) or ("can't find file" in done.stdout and not missing):
        raise PatchError(
            f"{diff.name}: GNU patch could not read it: {done.stderr.strip() or done.stdout.strip()[-300:]}"
        )
    report = []
    for path, count in counts.items():
        for number in range(1, count + 1):
            found = outcomes.get((path, number))
            if path in missing:
                detail = f"{path} does not exist in this release (moved or renamed?)"
                found = HunkOutcome(diff.name, path, number, "failed", detail)
            elif found is None and path in already:
                detail = "the file already has this change (a patched copy?); skipped"
                found = HunkOutcome(diff.name, path, number, "failed", detail)
            report.append(found or HunkOutcome(diff.name, path, number, "exact"))
    return report


def exact_diff(pristine: Mapping[str, bytes | None], patched: Mapping[str, bytes | None]) -> str:
    """A unified diff (a/ b/ paths) from the pristine to the patched files: applies at fuzz 0."""
    chunks: list[str] = []
    for path in sorted(patched):
        old, new = pristine.get(path), patched[path]
        if old == new:
            continue
        old_lines = [] if old is None else old.decode().splitlines(keepends=True)
        new_lines = [] if new is None else new.decode().splitlines(keepends=True)
        chunks.append(f"diff --git a/{path} b/{path}\n")
        if old is None:
            chunks.append("new file mode 100644\n")
        chunks += difflib.unified_diff(
            old_lines,
            new_lines,
            "/dev/null" if old is None else f"a/{path}",
            "/dev/null" if new is None else f"b/{path}",
        )
    return "".join(chunks)


def variant_files(variant: Variant) -> list[str]:
    return sorted({f for d in variant.diffs for f in diff_targets(d.read_text(), d.name)})


def _check_out(out: Path) -> None:
    check_folder(out)
    if out.exists() and not out.is_dir():
        raise PatchError(f"{out} is a file, not a folder; nothing was written",
                         hint="--out names the candidate's folder")  # fmt: skip
    if out.exists() and any(out.iterdir()):
        raise PatchError(f"{out} already exists and is not empty; nothing was written",
                         hint="choose another --out, or remove the old candidate")  # fmt: skip


def port_set(patch_set: PatchSet, target: str, source: Path, out: Path) -> PortReport:
    """Write a candidate variant of the set for release `target` into `out`, with a report,
    from that release's wheel or site folder (the verify scripts run on the ported copy)."""
    _check_out(out)
    variant = nearest_variant(patch_set, target)
    with tempfile.TemporaryDirectory(prefix="deployctl-port-") as tmp:
        site = pristine_from(source, Path(tmp), target)
        check_release(release_version(site), target, source)  # a site folder's
        report = PortReport(patch_set.name, variant.sglang_version, target, str(source), str(out))
        return _port(variant, site, Path(tmp), report, verify=True)


def port_from_files(
    patch_set: PatchSet, target: str, where: str, files: Mapping[str, bytes | None], out: Path
) -> PortReport:
    """The same from the files the diffs touch, as read from a host: only those are at hand,
    so the verify scripts (which import SGLang) are not run."""
    _check_out(out)
    variant = nearest_variant(patch_set, target)
    with tempfile.TemporaryDirectory(prefix="deployctl-port-") as tmp:
        site = Path(tmp) / "site"
        for path, data in files.items():
            if data is not None:
                (site / path).parent.mkdir(parents=True, exist_ok=True)
                (site / path).write_bytes(data)
        report = PortReport(patch_set.name, variant.sglang_version, target, where, str(out))
        return _port(variant, site, Path(tmp), report, verify=False)


def _port(
    variant: Variant, site: Path, scratch: Path, report: PortReport, verify: bool
) -> PortReport:
    out = Path(report.out)
    files = variant_files(variant)
    pristine = {f: (site / f).read_bytes() if (site / f).exists() else None for f in files}
    for diff in variant.diffs:
        report.hunks += apply_for_port(diff, site, scratch)
    patched = {f: (site / f).read_bytes() if (site / f).exists() else None for f in files}
    candidate: dict[str, bytes] = {}
    for diff in variant.diffs:
        mine = diff_targets(diff.read_text(), diff.name)
        text = exact_diff({f: pristine[f] for f in mine}, {f: patched[f] for f in mine})
        candidate[diff.name] = text.encode()
    if not verify:
        why = "not run: only the files the diffs touch were read from the host"
        report.verify = {s.name: why for s in variant.verify}
    elif any(h.outcome == "failed" for h in report.hunks):
        report.verify = {s.name: "not run: a hunk failed" for s in variant.verify}
    else:
        members = {f"verify/{s.name}": s.read_bytes() for s in variant.verify}
        for script in variant.verify:
            try:
                run_verify_scripts(str(site), [script.name], members)
                report.verify[script.name] = "passed"
            except RuntimeError as exc:
                report.verify[script.name] = f"failed: {exc}"
    # The candidate's files hashed as the audit judges them: hashes.json's entry for it.
    digest = diffs_digest(candidate[d.name] for d in variant.diffs)
    hashes = {report.to_version: (digest, file_hashes(pristine, patched))}
    candidate[HASHES_FILE] = hashes_document(hashes).encode()
    # The --json document, kept beside the candidate; the folder appears whole or not at all.
    candidate["report.json"] = (json.dumps(versioned(report.to_json()), indent=2) + "\n").encode()
    write_folder(out, candidate)
    return report


def port_from_host(
    host: Host, conn: Connection, patch_set: PatchSet, target: str, out: Path
) -> PortReport:
    """Port with the pristine files read from a host that has the release (read only)."""
    from deployctl.ops.patch import patch_facts, read_files

    version, site = patch_facts(host, conn, []).require_sglang()
    if version != target:
        raise PatchError(
            f"{host.name} has SGLang {version}, not {target}",
            hint=f"port to {version} (--to {version}), or pick a host with {target}",
        )
    files = read_files(host, conn, site, variant_files(nearest_variant(patch_set, target)))
    return port_from_files(patch_set, target, f"{host.name}:{site}", files, out)
