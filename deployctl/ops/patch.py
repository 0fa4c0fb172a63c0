"""Patch sets on hosts: apply (atomic, verified, reversible), revert, audit."""

from __future__ import annotations

import base64
import getpass
import hashlib
import io
import json
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from deployctl import agent
from deployctl.connection import Connection
from deployctl.errors import PatchError
from deployctl.fanout import Fleet, FleetResult, HostResult
from deployctl.inventory import Host
from deployctl.patchset import PatchSet, Variant, select_sets, version_key
from deployctl.remote.patch_types import (
    ApplyArgs,
    HunkMark,
    Manifest,
    PatchRecord,
    ReadArgs,
    RevertArgs,
)
from deployctl.remote.protocol import ProbeArgs, ProbeReply

T = TypeVar("T")

# GNU patch, strict: no fuzz, so a hunk never lands in the wrong place.
PATCH_ARGS = ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch"]
# The same, taking hunks out: only hunks the files are known to have are given.
UNPATCH_ARGS = ["patch", "-p1", "--batch", "--reverse", "--fuzz=0", "--no-backup-if-mismatch"]


@dataclass(frozen=True)
class PatchFacts:
    """What a host has: its SGLang, the patch records, current file hashes, and which hunks
    of each set its files have (set → file → per hunk: applied, missing or differs)."""

    sglang_version: str | None
    site: str | None
    error: str | None
    records: dict[str, PatchRecord]
    files: dict[str, str | None]
    hunks: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def require_sglang(self) -> tuple[str, str]:
        if self.error or not self.site or not self.sglang_version:
            raise PatchError(self.error or "SGLang's version could not be read")
        return self.sglang_version, self.site

    def drifted_files(self, name: str) -> list[str]:
        """Files of an applied set whose content changed since apply."""
        record = self.records.get(name)
        if record is None:
            return []
        return sorted(
            path
            for path, sums in record["files"].items()
            if self.files.get(path) != sums["patched_sha256"]
        )

    def changed_by_others(self, name: str) -> list[str]:
        """Files of an applied set changed since apply, but not by the last apply recorded
        here over them (another set sharing the file)."""
        return [
            path
            for path in self.drifted_files(name)
            if not any(
                path in other["files"]
                and other["files"][path]["patched_sha256"] == self.files.get(path)
                for other_name, other in self.records.items()
                if other_name != name
            )
        ]

    def as_recorded(self, name: str) -> bool:
        """This state_dir has a record of the set, for this SGLang, and its files are as the
        apply left them."""
        record = self.records.get(name)
        return (
            record is not None
            and record.get("site") == self.site
            and record.get("sglang_version") == self.sglang_version
            and not self.drifted_files(name)
        )


def probe_args(host: Host, sets: Sequence[PatchSet]) -> ProbeArgs:
    paths = sorted({f for s in sets for v in s.variants.values() for f in v.files})
    return {"state_dir": host.settings.state_dir, "paths": paths, "hunks": hunk_marks(sets)}


def hunk_marks(sets: Sequence[PatchSet]) -> dict[str, dict[str, dict[str, list[HunkMark]]]]:
    """What the host looks for to tell which hunks of each set its files have."""
    return {s.name: {v: variant.marks() for v, variant in s.variants.items()} for s in sets}


def parse_patch_facts(reply: ProbeReply) -> PatchFacts:
    """Turn the agent's probe answer into PatchFacts."""
    install = reply["sglang"]
    return PatchFacts(
        sglang_version=install.get("version"),
        site=install.get("site"),
        error=install.get("error"),
        records=dict(reply["records"]),
        files=dict(reply["files"]),
        hunks=dict(reply["hunks"]),
    )


def patch_facts(host: Host, conn: Connection, sets: Sequence[PatchSet]) -> PatchFacts:
    """Probe SGLang, the patch records and the sets' files in one round trip."""
    return parse_patch_facts(agent.call(host, conn, agent.PROBE, probe_args(host, sets)))


# ---- audit -------------------------------------------------------------------------------


class PatchState(StrEnum):
    """Where a patch set stands on one SGLang installation."""

    APPLIED = "applied"  # the files have every hunk (recorded here or not)
    PARTLY = "partly applied"  # the files have some hunks; the others' lines are as before
    MISSING = "missing"
    OUTDATED = "outdated"  # recorded here as an older version (or other content), files as left
    DRIFTED = "drifted"  # files match neither the set nor the release, or SGLang was reinstalled
    UNSUPPORTED = "unsupported"  # no variant for that SGLang version


class FileState(StrEnum):
    """Where one file stands for one set: told by its hashes, else hunk by hunk."""

    APPLIED = "applied"
    PARTLY = "partly applied"
    MISSING = "missing"
    DIFFERS = "differs"  # a hunk whose lines are neither the set's nor the release's


@dataclass(frozen=True)
class SetState:
    state: PatchState
    version: str | None
    expected_version: str
    detail: str = ""
    recorded: bool = False  # this state_dir has a record of the set on this installation
    files: dict[str, FileState] = field(default_factory=dict)

    @property
    def good(self) -> bool:
        return self.state is PatchState.APPLIED


def file_state(variant: Variant, path: str, sha: str | None, hunks: list[str] | None) -> FileState:
    """Judge one file: its hash against the release's and the patched one (exact), else
    what the host found of each hunk."""
    sums = (variant.hashes or {}).get(path)
    if sums is not None and sha == sums.patched:
        return FileState.APPLIED
    if sums is not None and sha == sums.original:
        return FileState.MISSING
    if not hunks or "differs" in hunks:
        return FileState.DIFFERS
    if all(h == "applied" for h in hunks):
        return FileState.APPLIED
    if all(h == "missing" for h in hunks):
        return FileState.MISSING
    return FileState.PARTLY


def files_verdict(files: Mapping[str, FileState]) -> FileState:
    """A set's files together: any that differs decides, then all applied or all missing."""
    found = set(files.values())
    if FileState.DIFFERS in found:
        return FileState.DIFFERS
    if found <= {FileState.APPLIED}:
        return FileState.APPLIED
    if found <= {FileState.MISSING}:
        return FileState.MISSING
    return FileState.PARTLY


def set_files(facts: PatchFacts, patch_set: PatchSet, variant: Variant) -> dict[str, FileState]:
    """Each file of the set's variant, judged on the host's installation."""
    hunks = facts.hunks.get(patch_set.name, {})
    return {p: file_state(variant, p, facts.files.get(p), hunks.get(p)) for p in variant.files}


def set_state(facts: PatchFacts, patch_set: PatchSet) -> SetState:
    """Judge one set on one host: from the installation's files first, then this state_dir's
    record (which says what was applied here, and when, but not what the files are)."""
    expected, name = patch_set.version, patch_set.name
    record = facts.records.get(name)
    recorded = record is not None
    applied = record["version"] if record else None
    variant = patch_set.variants.get(facts.sglang_version or "")
    if variant is None:
        if record is None:
            return SetState(
                PatchState.UNSUPPORTED,
                None,
                expected,
                f"no variant for SGLang {facts.sglang_version}",
            )
        reinstalled = "SGLang was reinstalled since apply"
        return SetState(PatchState.DRIFTED, applied, expected, reinstalled, recorded)
    files = set_files(facts, patch_set, variant)
    verdict = files_verdict(files)

    def judged(state: PatchState, version: str | None, detail: str = "") -> SetState:
        return SetState(state, version, expected, detail, recorded, files)

    current = record is not None and (record["version"], record["hash"]) == (
        expected,
        patch_set.content_hash,
    )
    if verdict is FileState.APPLIED:
        if record is None:
            return judged(PatchState.APPLIED, expected, "no record here")
        notes = []
        if not current:
            notes.append(f"recorded here as {record['version']} ({record['hash'][:12]})")
        if facts.changed_by_others(name):  # outside the set's own lines: they are all there
            notes.append("changed since apply: " + ", ".join(facts.changed_by_others(name)))
        return judged(PatchState.APPLIED, expected, "; ".join(notes))
    if record is not None and not current and facts.as_recorded(name):
        if version_key(record["version"]) < version_key(expected):
            newer = f"{record['version']} applied, {expected} available"
            return judged(PatchState.OUTDATED, applied, newer)
        return judged(PatchState.OUTDATED, applied, "set content changed without a version bump")
    if verdict is FileState.MISSING:
        if record is None:
            return judged(PatchState.MISSING, None)
        gone = (
            f"recorded here as {record['version']}, but the files lack it (reverted by hand, "
            "or SGLang reinstalled)"
        )
        return judged(PatchState.MISSING, None, gone)
    if verdict is FileState.PARTLY:
        return judged(PatchState.PARTLY, applied, "lacks it: " + lacking(facts, name, files))
    if record is not None and (record.get("site"), record.get("sglang_version")) != (
        facts.site,
        facts.sglang_version,
    ):
        return judged(PatchState.DRIFTED, applied, "SGLang was reinstalled since apply")
    if record is not None and facts.drifted_files(name):
        return judged(
            PatchState.DRIFTED,
            applied,
            "changed since apply: " + ", ".join(facts.drifted_files(name)),
        )
    odd = [p for p, f in files.items() if f is FileState.DIFFERS]
    neither = (
        "neither its lines nor the lines it expects are in " + ", ".join(odd) + " (edited, "
        "another version of the set, or not the release the diff was made for)"
    )
    return judged(PatchState.DRIFTED, applied, neither)


def lacking(facts: PatchFacts, name: str, files: Mapping[str, FileState]) -> str:
    """The files of a partly applied set that lack some of it, with how much they have."""
    parts = []
    for path, state in files.items():
        if state is FileState.MISSING:
            parts.append(path)
        elif state is FileState.PARTLY:
            hunks = facts.hunks.get(name, {}).get(path, [])
            parts.append(f"{path} ({hunks.count('applied')} of {len(hunks)} hunks applied)")
    return ", ".join(parts)


@dataclass(frozen=True)
class AuditReport:
    sglang_version: str | None
    states: dict[str, SetState]
    expected: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Every expected set is applied."""
        return all(self.states[name].good for name in self.expected)


def audit_host(
    host: Host, conn: Connection, available: Mapping[str, PatchSet], expect: Sequence[str]
) -> AuditReport:
    """Audit one host against the expected sets (one round trip)."""
    facts = patch_facts(host, conn, list(available.values()))
    facts.require_sglang()
    expected = tuple(expect) or tuple(host_patch_names(host))
    names = list(expected) + [
        n for n in available if n not in expected and (n in facts.records or _found(facts, n))
    ]
    states = {name: set_state(facts, available[name]) for name in names}
    return AuditReport(facts.sglang_version, states, expected)


def _found(facts: PatchFacts, name: str) -> bool:
    """Some hunk of the set is in the files (recorded here or not)."""
    return any("applied" in hunks for hunks in facts.hunks.get(name, {}).values())


def host_patch_names(host: Host) -> list[str]:
    """The host's `patches` variable as a list of names."""
    return host.settings.patches


# ---- apply -------------------------------------------------------------------------------


class ActionKind(StrEnum):
    """What apply or revert did with one set."""

    APPLIED = "applied"
    REPLACED = "replaced"  # an older version, replaced in one step
    ADOPTED = "adopted"  # the files had it already: recorded here, no file changed
    UNCHANGED = "unchanged"
    WOULD_APPLY = "would apply"
    WOULD_ADOPT = "would adopt"
    REVERTED = "reverted"
    NOT_APPLIED = "not applied"


@dataclass
class PatchAction:
    set: str
    version: str
    action: ActionKind
    files: list[str] = field(default_factory=list)
    replaced: str | None = None  # the version a REPLACED action replaced
    detail: str = ""


def patched_copies(
    variant: Variant, originals: Mapping[str, bytes | None], files: Sequence[str]
) -> dict[str, bytes | None]:
    """Apply the variant's diffs with GNU patch to a local copy of the original files."""
    diffs = [(d.name, d.read_text(encoding="utf-8")) for d in variant.diffs]
    return _run_patch(diffs, originals, files, reverse=False)


def unpatched_copies(
    variant: Variant,
    current: Mapping[str, bytes | None],
    files: Sequence[str],
    present: Mapping[str, list[str]],
) -> dict[str, bytes | None]:
    """Take out of a local copy of the files the hunks of the variant that they have
    (`present`: file → per hunk, as the host found it), by GNU patch's reverse diff: what is
    left is the files without this set, other changes kept."""
    diffs = []
    for diff, sections in reversed(variant.sections):
        chosen = [
            (
                section,
                [
                    h
                    for h, state in zip(section.hunks, present.get(section.path, []), strict=False)
                    if state == "applied"
                ],
            )
            for section in sections
        ]
        text = "".join(s.head + "".join(h.text for h in hunks) for s, hunks in chosen if hunks)
        if text:
            diffs.append((diff.name, text))
    return _run_patch(diffs, current, files, reverse=True)


def _run_patch(
    diffs: Sequence[tuple[str, str]],
    originals: Mapping[str, bytes | None],
    files: Sequence[str],
    reverse: bool,
) -> dict[str, bytes | None]:
    with tempfile.TemporaryDirectory(prefix="deployctl-patch-") as tmp:
        root = Path(tmp) / "site"
        for path, data in originals.items():
            if data is not None:
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_bytes(data)
        root.mkdir(exist_ok=True)
        for name, text in diffs:
            source = Path(tmp) / name
            source.write_text(text, encoding="utf-8")
            done = subprocess.run(
                [*(UNPATCH_ARGS if reverse else PATCH_ARGS), "-d", str(root), "-i", str(source)],
                check=False,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                failed = [
                    ln.strip() for ln in done.stdout.splitlines() if "FAILED" in ln or "can't" in ln
                ]
                reason = "; ".join(failed[:3]) or done.stdout.strip()[-300:] or done.stderr.strip()
                if reverse:
                    raise PatchError(
                        f"{name} cannot be taken out of this host's SGLang files: {reason}",
                        hint="nothing was changed; reinstall SGLang's files (pip install "
                        "--force-reinstall --no-deps) to be rid of the set",
                    )
                raise PatchError(
                    f"{name} does not apply to this host's SGLang files: {reason}",
                    hint="the files differ from the release the diff was made for; nothing was changed",
                )
        return {p: (root / p).read_bytes() if (root / p).exists() else None for p in files}


def read_files(
    host: Host, conn: Connection, base: str, paths: Sequence[str]
) -> dict[str, bytes | None]:
    reply = agent.call(host, conn, agent.READ, ReadArgs(base=base, paths=list(paths)))
    return {p: None if v is None else base64.b64decode(v) for p, v in reply["files"].items()}


def _tar(members: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def apply_set(
    host: Host, conn: Connection, facts: PatchFacts, patch_set: PatchSet, dry_run: bool
) -> PatchAction:
    """Apply one set on one host, or say why it is already in place: a set the files have
    already (applied by hand, or under another state_dir) is adopted, not applied again."""
    sglang_version, site = facts.require_sglang()
    variant = patch_set.variant_for(sglang_version)
    name, version = patch_set.name, patch_set.version
    record = facts.records.get(name)
    judged = set_state(facts, patch_set)
    current = record is not None and (record["version"], record["hash"]) == (
        version,
        patch_set.content_hash,
    )
    if judged.state is PatchState.APPLIED and current:
        return PatchAction(name, version, ActionKind.UNCHANGED, list(variant.files))
    # A newer version replaces the older one in one step: diff the originals, not the old patch.
    replace = record is not None and not current and facts.as_recorded(name)
    if judged.state is PatchState.DRIFTED and record is not None and not replace:
        raise PatchError(
            f"{name} is applied but drifted ({judged.detail})",
            hint=f"deployctl patch revert {name} --force -H {host.name}, then apply again",
        )
    files = sorted(set(variant.files) | set(record["files"] if replace and record else []))
    found = read_files(host, conn, site, files)
    adopt = detail = ""
    if replace and record is not None:
        originals = read_files(host, conn, record["backup_dir"], files)
        originals.update({p: data for p, data in found.items() if p not in record["files"]})
        kind = ActionKind.REPLACED
    elif judged.state is PatchState.DRIFTED:  # GNU patch says which hunks do not apply
        try:
            patched_copies(variant, found, files)
        except PatchError as exc:
            raise PatchError(exc.message, hint=f"{judged.detail}; nothing was changed") from None
        raise PatchError(f"{name} does not apply on {host.name}: {judged.detail}")
    elif judged.state is PatchState.MISSING:
        originals, kind = found, ActionKind.APPLIED
    else:  # the files have some or all of it: what they are without it is the backup
        originals = unpatched_copies(variant, found, files, facts.hunks.get(name, {}))
        if judged.state is PatchState.APPLIED:
            adopt, kind = backup_note(variant, originals), ActionKind.ADOPTED
        else:
            kind, detail = ActionKind.APPLIED, f"completed (it {judged.detail})"
    patched = patched_copies(variant, originals, files)
    if adopt and patched != found:
        raise PatchError(
            f"{name} cannot be adopted on {host.name}: its reverse diff does not give back "
            "the files",
            hint="nothing was changed; put SGLang's own files back, then apply",
        )
    if dry_run:
        would = ActionKind.WOULD_ADOPT if adopt else ActionKind.WOULD_APPLY
        return PatchAction(name, version, would, files, detail=adopt or detail)
    new_record = send_apply(host, conn, facts, patch_set, variant, originals, patched, adopt)
    facts.records[name] = new_record
    facts.files.update({p: s["patched_sha256"] for p, s in new_record["files"].items()})
    if kind is ActionKind.REPLACED and record is not None:
        return PatchAction(name, version, kind, files, record["version"])
    return PatchAction(name, version, kind, files, detail=adopt or detail)


def backup_note(variant: Variant, originals: Mapping[str, bytes | None]) -> str:
    """What the backup of an adopted set is: SGLang's own files (by the shipped hashes), or
    the files without the set, other changes kept (both rebuilt by its reverse diff)."""
    sums = variant.hashes or {}
    own = all(
        path in sums and sums[path].original == (None if data is None else sha256_of(data))
        for path, data in originals.items()
    )
    if own:
        return "the files had it; backup: SGLang's own files, rebuilt by its reverse diff"
    return "the files had it; backup: the files without it, rebuilt by its reverse diff"


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def send_apply(
    host: Host,
    conn: Connection,
    facts: PatchFacts,
    patch_set: PatchSet,
    variant: Variant,
    originals: Mapping[str, bytes | None],
    patched: Mapping[str, bytes | None],
    adopt: str,
    verify: bool = True,
) -> PatchRecord:
    """Have the host back up `originals`, write `patched` (the files that differ), compile,
    verify and record the set; `adopt`: the files had it already (no file differs)."""
    sglang_version, site = facts.require_sglang()
    files = sorted(patched)
    manifest: Manifest = {
        "set": patch_set.name,
        "version": patch_set.version,
        "hash": patch_set.content_hash,
        "variant": variant.sglang_version,
        "sglang_version": sglang_version,
        "site": site,
        "files": files,
        "expect": {p: facts.files.get(p) for p in files},
        "verify": [v.name for v in variant.verify] if verify else [],
        "apply_id": time.strftime("%Y%m%dT%H%M%S") + f"-{time.time_ns() % 1_000_000:06d}",
        "applied_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "applied_by": f"{getpass.getuser()}@{socket.gethostname()}",
        "adopted": bool(adopt),
    }
    members = {"manifest.json": json.dumps(manifest).encode()}
    members.update({f"originals/{p}": d for p, d in originals.items() if d is not None})
    members.update({f"patched/{p}": d for p, d in patched.items() if d is not None})
    if verify:
        members.update({f"verify/{v.name}": v.read_bytes() for v in variant.verify})
    payload = _tar(members)
    args: ApplyArgs = {
        "state_dir": host.settings.state_dir,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "payload_size": len(payload),
    }
    return agent.call(host, conn, agent.APPLY, args, stdin=payload)["record"]


def apply_patches(
    host: Host, conn: Connection, sets: Sequence[PatchSet], dry_run: bool = False
) -> list[PatchAction]:
    """Apply sets in order on one host; stop at the first failure (earlier sets stay)."""
    facts = patch_facts(host, conn, sets)
    return [apply_set(host, conn, facts, patch_set, dry_run) for patch_set in sets]


def revert_set(
    host: Host, conn: Connection, facts: PatchFacts, patch_set: PatchSet, force: bool
) -> PatchAction:
    """Take one set out of the files: from this state_dir's backup while the files are as
    its apply left them (byte-exact), else by the set's reverse diff, hunk by hunk (applied by
    hand, under another state_dir, or files changed since: other changes are kept)."""
    name, version = patch_set.name, patch_set.version
    record = facts.records.get(name)
    if record is not None and facts.as_recorded(name):
        return revert_recorded(host, conn, patch_set, force)
    judged = set_state(facts, patch_set)
    if judged.state is PatchState.UNSUPPORTED:
        return PatchAction(name, version, ActionKind.NOT_APPLIED)
    if judged.state is PatchState.MISSING:
        if record is None:
            return PatchAction(name, version, ActionKind.NOT_APPLIED)
        args: RevertArgs = {
            "state_dir": host.settings.state_dir, "set": name, "force": False, "forget": True,
        }  # fmt: skip
        agent.call(host, conn, agent.REVERT, args)
        gone = "the files lacked it already; its record here was closed"
        return PatchAction(name, version, ActionKind.NOT_APPLIED, detail=gone)
    if judged.state in (PatchState.APPLIED, PatchState.PARTLY):
        _, site = facts.require_sglang()
        variant = patch_set.variant_for(facts.sglang_version or "")
        files = list(variant.files)
        found = read_files(host, conn, site, files)
        originals = unpatched_copies(variant, found, files, facts.hunks.get(name, {}))
        # Recorded first (no verify: it is being taken out), then reverted as any recorded set.
        send_apply(host, conn, facts, patch_set, variant, originals, found, "adopted", False)
        action = revert_recorded(host, conn, patch_set, False)
        why = "no record here" if record is None else "files changed since apply"
        action.detail = f"taken out by its reverse diff ({why}; other changes kept)"
        return action
    if record is not None:
        return revert_recorded(host, conn, patch_set, force)
    raise PatchError(
        f"{name} cannot be reverted on {host.name}: {judged.detail}",
        hint=f"put SGLang's own file back (pip install --force-reinstall --no-deps "
        f"sglang=={facts.sglang_version})",
    )


def revert_recorded(host: Host, conn: Connection, patch_set: PatchSet, force: bool) -> PatchAction:
    """Restore a set's originals from the backup its record names, checking their hashes."""
    args: RevertArgs = {
        "state_dir": host.settings.state_dir, "set": patch_set.name, "force": force,
        "forget": False,
    }  # fmt: skip
    reply = agent.call(host, conn, agent.REVERT, args)
    action = ActionKind.REVERTED if reply["reverted"] else ActionKind.NOT_APPLIED
    return PatchAction(patch_set.name, patch_set.version, action, reply["files"])


def revert_patches(
    host: Host, conn: Connection, sets: Sequence[PatchSet], force: bool = False
) -> list[PatchAction]:
    """Take each set out, dependents first; the files are read again after each (a later
    set may share a file with it)."""
    return [
        revert_set(host, conn, patch_facts(host, conn, sets), patch_set, force)
        for patch_set in reversed(sets)
    ]


def sets_per_host(
    hosts: Sequence[Host], available: Mapping[str, PatchSet], names: Sequence[str]
) -> dict[str, list[PatchSet]]:
    """Resolve the sets for each host or deployment (named, else its `patches`), all checked
    up front; keyed by label."""
    chosen = {}
    for host in hosts:
        wanted = list(names) or host_patch_names(host)
        if not wanted:
            raise PatchError(
                f"no patch sets named, and host {host.label} has no `patches` variable",
                hint="name the sets: deployctl patch apply spec-disable",
            )
        chosen[host.label] = select_sets(available, wanted)
    return chosen


def one_per_installation(
    hosts: Sequence[Host],
    chosen: Mapping[str, list[PatchSet]],
    sites: Mapping[str, str] | None = None,
) -> tuple[list[Host], dict[str, list[PatchSet]]]:
    """One target per SGLang installation (a host, its site-packages — else its `python` —
    and a `state_dir`), with every set any of its deployments wants: deployments that share
    one are patched once. `sites` holds the probed site-packages by label."""
    first: dict[tuple[str, str, str], Host] = {}
    sets: dict[str, dict[str, PatchSet]] = {}
    for host in hosts:
        site = (sites or {}).get(host.label)
        where = f"site {site}" if site else f"python {host.settings.python}"
        key = (host.name, where, host.settings.state_dir)
        target = first.setdefault(key, host)
        wanted = sets.setdefault(target.label, {})
        wanted.update((s.name, s) for s in chosen[host.label])
    return list(first.values()), {label: list(s.values()) for label, s in sets.items()}


def installation_sites(
    fleet: Fleet, targets: Sequence[Host]
) -> tuple[dict[str, str], dict[str, HostResult[Any]]]:
    """The site-packages of each target that may share an installation with another (one
    host and `state_dir`, another `python` path: a symlink, a venv's `python3`), by label;
    and the failed probes. Others are not asked: their `python` tells them apart."""
    pythons: dict[tuple[str, str], set[str]] = {}
    for host in targets:
        place = (host.name, host.settings.state_dir)
        pythons.setdefault(place, set()).add(host.settings.python)
    ask = [h for h in targets if len(pythons[(h.name, str(h.vars.get("state_dir")))]) > 1]
    probed = fleet.run(lambda host, conn: patch_facts(host, conn, []).site, ask)
    sites = {r.name: r.value for r in probed if r.value}
    return sites, {r.name: r for r in probed if r.failed}


def per_installation(
    fleet: Fleet,
    targets: Sequence[Host],
    chosen: Mapping[str, list[PatchSet]],
    action: Callable[[Host, Connection, list[PatchSet]], T],
) -> FleetResult[T]:
    """Run a patch action once per SGLang installation of the targets: two deployments
    that reach one installation by different `python` paths would race on its files."""
    sites, failed = installation_sites(fleet, targets)
    left = [t for t in targets if t.label not in failed]
    grouped, sets = one_per_installation(left, chosen, sites)
    done = {r.name: r for r in fleet.run(lambda h, conn: action(h, conn, sets[h.label]), grouped)}
    done.update(failed)  # a host that could not be asked says why, once
    return FleetResult(done[t.label] for t in targets if t.label in done)
