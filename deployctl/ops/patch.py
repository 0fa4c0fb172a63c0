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
from deployctl.remote.protocol import (
    ApplyArgs,
    Manifest,
    PatchRecord,
    ProbeArgs,
    ProbeReply,
    ReadArgs,
    RevertArgs,
)

T = TypeVar("T")

# GNU patch, strict: no fuzz, so a hunk never lands in the wrong place.
PATCH_ARGS = ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch"]


@dataclass(frozen=True)
class PatchFacts:
    """What a host has: its SGLang, the patch records, and current file hashes."""

    sglang_version: str | None
    site: str | None
    error: str | None
    records: dict[str, PatchRecord]
    files: dict[str, str | None]

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


def probe_args(host: Host, sets: Sequence[PatchSet]) -> ProbeArgs:
    paths = sorted({f for s in sets for v in s.variants.values() for f in v.files})
    return {"state_dir": host.settings.state_dir, "paths": paths}


def parse_patch_facts(reply: ProbeReply) -> PatchFacts:
    """Turn the agent's probe answer into PatchFacts."""
    install = reply["sglang"]
    return PatchFacts(
        sglang_version=install.get("version"),
        site=install.get("site"),
        error=install.get("error"),
        records=dict(reply["records"]),
        files=dict(reply["files"]),
    )


def patch_facts(host: Host, conn: Connection, sets: Sequence[PatchSet]) -> PatchFacts:
    """Probe SGLang and the patch records in one round trip."""
    return parse_patch_facts(agent.call(host, conn, agent.PROBE, probe_args(host, sets)))


# ---- audit -------------------------------------------------------------------------------


class PatchState(StrEnum):
    """Where a patch set stands on one SGLang installation."""

    APPLIED = "applied"
    MISSING = "missing"
    OUTDATED = "outdated"  # an older version, or content changed without a version bump
    DRIFTED = "drifted"  # patched files changed since apply, or SGLang was reinstalled
    UNSUPPORTED = "unsupported"  # no variant for that SGLang version


@dataclass(frozen=True)
class SetState:
    state: PatchState
    version: str | None
    expected_version: str
    detail: str = ""

    @property
    def good(self) -> bool:
        return self.state is PatchState.APPLIED


def set_state(facts: PatchFacts, patch_set: PatchSet) -> SetState:
    """Judge one set on one host."""
    expected = patch_set.version
    record = facts.records.get(patch_set.name)
    applied = record["version"] if record else None
    if facts.sglang_version not in patch_set.variants and record is None:
        return SetState(
            PatchState.UNSUPPORTED, None, expected, f"no variant for SGLang {facts.sglang_version}"
        )
    if record is None:
        return SetState(PatchState.MISSING, None, expected)
    drifted = facts.drifted_files(patch_set.name)
    if record.get("site") != facts.site or record.get("sglang_version") != facts.sglang_version:
        reinstalled = "SGLang was reinstalled since apply"
        return SetState(PatchState.DRIFTED, applied, expected, reinstalled)
    if drifted:
        changed = "changed since apply: " + ", ".join(drifted)
        return SetState(PatchState.DRIFTED, applied, expected, changed)
    if version_key(record["version"]) < version_key(expected):
        return SetState(
            PatchState.OUTDATED,
            applied,
            expected,
            f"{record['version']} applied, {expected} available",
        )
    if record["hash"] != patch_set.content_hash:
        unbumped = "set content changed without a version bump"
        return SetState(PatchState.OUTDATED, applied, expected, unbumped)
    return SetState(PatchState.APPLIED, applied, expected)


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
    names = list(expected) + [n for n in facts.records if n not in expected and n in available]
    states = {name: set_state(facts, available[name]) for name in names}
    return AuditReport(facts.sglang_version, states, expected)


def host_patch_names(host: Host) -> list[str]:
    """The host's `patches` variable as a list of names."""
    return host.settings.patches


# ---- apply -------------------------------------------------------------------------------


class ActionKind(StrEnum):
    """What apply or revert did with one set."""

    APPLIED = "applied"
    REPLACED = "replaced"  # an older version, replaced in one step
    UNCHANGED = "unchanged"
    WOULD_APPLY = "would apply"
    REVERTED = "reverted"
    NOT_APPLIED = "not applied"


@dataclass
class PatchAction:
    set: str
    version: str
    action: ActionKind
    files: list[str] = field(default_factory=list)
    replaced: str | None = None  # the version a REPLACED action replaced


def patched_copies(
    variant: Variant, originals: Mapping[str, bytes | None], files: Sequence[str]
) -> dict[str, bytes | None]:
    """Apply the variant's diffs with GNU patch to a local copy of the original files."""
    with tempfile.TemporaryDirectory(prefix="deployctl-patch-") as tmp:
        root = Path(tmp)
        for path, data in originals.items():
            if data is not None:
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_bytes(data)
        for diff in variant.diffs:
            done = subprocess.run(
                [*PATCH_ARGS, "-d", str(root), "-i", str(diff)],
                check=False,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                failed = [
                    ln.strip() for ln in done.stdout.splitlines() if "FAILED" in ln or "can't" in ln
                ]
                reason = "; ".join(failed[:3]) or done.stdout.strip()[-300:] or done.stderr.strip()
                raise PatchError(
                    f"{diff.name} does not apply to this host's SGLang files: {reason}",
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
    """Apply one set on one host, or say why it is already in place."""
    sglang_version, site = facts.require_sglang()
    variant = patch_set.variant_for(sglang_version)
    record = facts.records.get(patch_set.name)
    if record is not None:
        drifted = facts.drifted_files(patch_set.name)
        if drifted:
            raise PatchError(
                f"{patch_set.name} is applied but drifted ({', '.join(drifted)})",
                hint=f"deployctl patch revert {patch_set.name} --force -H {host.name}, then apply again",
            )
        if record["version"] == patch_set.version and record["hash"] == patch_set.content_hash:
            return PatchAction(
                patch_set.name, patch_set.version, ActionKind.UNCHANGED, sorted(record["files"])
            )
    files = sorted(set(variant.files) | set(record["files"] if record else []))
    if record is not None:
        # A newer version replaces the older one in one step: diff the originals, not the old patch.
        originals = read_files(host, conn, record["backup_dir"], files)
        originals.update(
            {
                p: data
                for p, data in read_files(host, conn, site, files).items()
                if p not in record["files"]
            }
        )
    else:
        originals = read_files(host, conn, site, files)
    patched = patched_copies(variant, originals, files)
    if dry_run:
        return PatchAction(patch_set.name, patch_set.version, ActionKind.WOULD_APPLY, files)
    manifest: Manifest = {
        "set": patch_set.name,
        "version": patch_set.version,
        "hash": patch_set.content_hash,
        "variant": variant.sglang_version,
        "sglang_version": sglang_version,
        "site": site,
        "files": files,
        "expect": {p: facts.files.get(p) for p in files},
        "verify": [v.name for v in variant.verify],
        "apply_id": time.strftime("%Y%m%dT%H%M%S") + f"-{time.time_ns() % 1_000_000:06d}",
        "applied_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "applied_by": f"{getpass.getuser()}@{socket.gethostname()}",
    }
    members = {"manifest.json": json.dumps(manifest).encode()}
    members.update({f"originals/{p}": d for p, d in originals.items() if d is not None})
    members.update({f"patched/{p}": d for p, d in patched.items() if d is not None})
    members.update({f"verify/{v.name}": v.read_bytes() for v in variant.verify})
    payload = _tar(members)
    args: ApplyArgs = {
        "state_dir": host.settings.state_dir,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "payload_size": len(payload),
    }
    new_record = agent.call(host, conn, agent.APPLY, args, stdin=payload)["record"]
    facts.records[patch_set.name] = new_record
    facts.files.update({p: s["patched_sha256"] for p, s in new_record["files"].items()})
    if record is None:
        return PatchAction(patch_set.name, patch_set.version, ActionKind.APPLIED, files)
    return PatchAction(
        patch_set.name, patch_set.version, ActionKind.REPLACED, files, record["version"]
    )


def apply_patches(
    host: Host, conn: Connection, sets: Sequence[PatchSet], dry_run: bool = False
) -> list[PatchAction]:
    """Apply sets in order on one host; stop at the first failure (earlier sets stay)."""
    facts = patch_facts(host, conn, sets)
    return [apply_set(host, conn, facts, patch_set, dry_run) for patch_set in sets]


def revert_patches(
    host: Host, conn: Connection, sets: Sequence[PatchSet], force: bool = False
) -> list[PatchAction]:
    """Restore the originals of each set, dependents first, checking their hashes."""
    actions = []
    for patch_set in reversed(sets):
        args: RevertArgs = {
            "state_dir": host.settings.state_dir,
            "set": patch_set.name,
            "force": force,
        }
        reply = agent.call(host, conn, agent.REVERT, args)
        action = ActionKind.REVERTED if reply["reverted"] else ActionKind.NOT_APPLIED
        actions.append(PatchAction(patch_set.name, patch_set.version, action, reply["files"]))
    return actions


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
