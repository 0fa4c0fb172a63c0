"""The SGLang installation and patch sets: probe, apply, revert."""

from __future__ import annotations

import fcntl
import os
import sys
import time

from .files import (
    digest,
    fail,
    find_package,
    put_back,
    read_bytes,
    read_json,
    sha256,
    state_path,
    with_site_packages,
    write_atomic,
    write_json,
)
from .lean import sha256_hex

TYPE_CHECKING = False  # the types for the checker only (files.py says why)
if TYPE_CHECKING:
    from typing import IO

    from .patch_types import (
        ApplyArgs,
        ApplyReply,
        BlockMark,
        HunkMark,
        Manifest,
        PatchRecord,
        RevertArgs,
        RevertReply,
    )
    from .protocol import ProbeArgs, ProbeReply, SglangInstall


def sglang_install() -> SglangInstall:
    """Find SGLang without importing it (its __init__ needs torch)."""
    spec = find_package("sglang")
    if spec is None or not spec.submodule_search_locations:
        return {"error": f"SGLang is not installed for {sys.executable}"}
    site = os.path.dirname(next(iter(spec.submodule_search_locations)))
    return {"version": dist_version(site, "sglang"), "site": site, "python": sys.executable}


def metadata_version(metadata: bytes) -> str | None:
    """The `Version:` of a dist-info's METADATA."""
    for line in metadata.decode("utf-8", errors="replace").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None


def dist_version(site: str, name: str) -> str | None:
    """The installed version from <site>/<name>-*.dist-info/METADATA.

    Reading it directly is ~80 ms cheaper per call than importing importlib.metadata, and
    it describes the copy that `import sglang` really finds.
    """
    for entry in sorted(os.listdir(site)):
        if entry.lower().startswith(name + "-") and entry.endswith(".dist-info"):
            found = metadata_version(read_bytes(os.path.join(site, entry, "METADATA")) or b"")
            if found is not None:
                return found
    import importlib.metadata  # an editable or unusual install: ask the slow way

    with_site_packages()

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


PATCH_LOCK_WAIT = 60.0


def patches_dir(state_dir: str) -> str:
    return state_path(state_dir, "patches")


def records_dir(state_dir: str, site: str) -> str:
    """Where the records of one SGLang installation (its site-packages) are kept."""
    key = sha256_hex(site.encode())[:16]
    return os.path.join(patches_dir(state_dir), "sites", key)


def record_path(state_dir: str, site: str, name: str) -> str:
    """This installation's record of a set; one written before records were kept per
    installation (patches/<set>.json) still counts, for the installation it names."""
    legacy = os.path.join(patches_dir(state_dir), name + ".json")
    old = read_json(legacy)
    if isinstance(old, dict) and old.get("site") == site:
        return legacy
    return os.path.join(records_dir(state_dir, site), name + ".json")


def records(state_dir: str, site: str | None) -> dict[str, PatchRecord]:
    """The records of the installation at `site`; another installation's are not its own."""
    found: dict[str, PatchRecord] = {}
    if site is None:
        return found
    for folder in (patches_dir(state_dir), records_dir(state_dir, site)):
        if os.path.isdir(folder):
            for name in sorted(os.listdir(folder)):
                record = read_json(os.path.join(folder, name)) if name.endswith(".json") else None
                if isinstance(record, dict) and record.get("site") == site:
                    found[name[:-5]] = record  # type: ignore[assignment]  # as it was written
    return found


def lock_patches(state_dir: str) -> IO[str]:
    """Serialise patch changes on this host; the lock dies with the process."""
    folder = patches_dir(state_dir)
    os.makedirs(folder, exist_ok=True)
    handle = open(os.path.join(folder, ".lock"), "w")  # noqa: SIM115 - held until exit
    # Another installation of this host may be patched right now (deployments with their own
    # python): wait for it a while rather than fail at once.
    deadline = time.monotonic() + PATCH_LOCK_WAIT
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except OSError:
            if time.monotonic() > deadline:
                fail("another deployctl patch operation is running on this host")
            time.sleep(0.2)


def cmd_probe(args: ProbeArgs) -> ProbeReply:
    """SGLang version and site, patch records, sha256 of the files of interest, and which
    hunks of each set's variant for this version the files have."""
    return probe_install(sglang_install(), args)


def probe_install(install: SglangInstall, args: ProbeArgs) -> ProbeReply:
    """`probe`'s answer for one SGLang installation (this interpreter's, or another's a
    survey found)."""
    found = records(args["state_dir"], install.get("site"))
    paths = set(args["paths"])
    for record in found.values():
        paths.update(record.get("files", {}))
    files: dict[str, str | None] = {}
    hunks: dict[str, dict[str, list[str]]] = {}
    if "site" in install:
        site = install["site"]
        files = {p: sha256(os.path.join(site, p)) for p in sorted(paths)}
        for name, variants in args["hunks"].items():
            variant = variants.get(str(install.get("version")))
            if variant is not None:
                hunks[name] = {
                    path: hunk_states(read_bytes(os.path.join(site, path)), marks)
                    for path, marks in variant.items()
                }
    return {"sglang": install, "records": found, "files": files, "hunks": hunks}


def block_sha256(lines: list[str]) -> str:
    """A run of lines hashed as the client's BlockMark is (patch_types.BlockMark)."""
    return sha256_hex("\n".join(lines).encode("utf-8", "surrogateescape"))


def hunk_states(data: bytes | None, marks: list[HunkMark]) -> list[str]:
    """For each hunk, whether the file has its lines (applied), else the lines it expects
    (missing), else neither (differs). Found as GNU patch finds a hunk at fuzz 0: the whole
    run of lines, anywhere in the file. An empty run stands for a file that does not exist
    (before a hunk that creates it, after one that deletes it)."""
    lines = None if data is None else data.decode("utf-8", "surrogateescape").split("\n")
    where: dict[str, list[int]] = {}
    for number, line in enumerate(lines or []):
        where.setdefault(line, []).append(number)

    def found(mark: BlockMark) -> bool:
        if mark["lines"] == 0:
            return lines is None
        if lines is None:
            return False
        for number in where.get(mark["line"], []):
            start = number - mark["anchor"]
            run = lines[start : start + mark["lines"]]
            if start >= 0 and len(run) == mark["lines"] and block_sha256(run) == mark["sha256"]:
                return True
        return False

    return [
        "applied" if found(m["after"]) else "missing" if found(m["before"]) else "differs"
        for m in marks
    ]


def cmd_apply(args: ApplyArgs, payload: bytes) -> ApplyReply:
    """Back up, write patched files, compile, verify; undo everything on any failure."""
    # Only a change needs these: imported here, they cost no other call's start.
    import io
    import json
    import py_compile
    import subprocess
    import tarfile

    # A dropped connection can cut the upload at a tar block boundary, which reads as a
    # valid but shorter archive: check that every byte arrived before using any of it.
    if sha256_hex(payload) != args["payload_sha256"]:
        fail(
            f"the upload is incomplete ({len(payload)} of {args['payload_size']} bytes; "
            "connection dropped?); nothing was changed"
        )
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        for member in tar.getmembers():
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted is not None:
                members[member.name] = extracted.read()
    manifest: Manifest = json.loads(members.pop("manifest.json"))
    site, name = manifest["site"], manifest["set"]
    state_dir = args["state_dir"]
    lock = lock_patches(state_dir)
    current = {p: sha256(os.path.join(site, p)) for p in manifest["files"]}
    if current != manifest["expect"]:
        changed = sorted(p for p in current if current[p] != manifest["expect"].get(p))
        fail(f"files changed on the host while the patch was prepared: {', '.join(changed)}")
    originals = {p: members.get("originals/" + p) for p in manifest["files"]}
    patched = {p: members.get("patched/" + p) for p in manifest["files"]}
    backup_dir = os.path.join(patches_dir(state_dir), "backups", name, manifest["apply_id"])
    if os.path.exists(backup_dir):
        fail(f"backup folder {backup_dir} already exists; refusing to overwrite a backup")
    before = {p: read_bytes(os.path.join(site, p)) for p in manifest["files"]}
    replaced = []  # the files this apply changed, in order: only these are put back
    try:
        for path, data in originals.items():
            if data is not None:
                write_atomic(os.path.join(backup_dir, path), data)
        for path, data in patched.items():
            target = os.path.join(site, path)
            if data == before[path]:  # already so (a set found applied, being adopted)
                continue
            if data is None:
                if os.path.exists(target):
                    os.unlink(target)
                    replaced.append(path)
            else:
                write_atomic(target, data)
                replaced.append(path)
        for path in replaced:  # a file left as it was (an adopted set's) is not ours to judge
            if path.endswith(".py") and patched[path] is not None:
                py_compile.compile(os.path.join(site, path), doraise=True)
        run_verify_scripts(site, manifest["verify"], members)
        record: PatchRecord = {
            "set": name,
            "version": manifest["version"],
            "hash": manifest["hash"],
            "variant": manifest["variant"],
            "sglang_version": manifest["sglang_version"],
            "site": site,
            "apply_id": manifest["apply_id"],
            "applied_at": manifest["applied_at"],
            "applied_by": manifest["applied_by"],
            "adopted": manifest.get("adopted", False),
            "backup_dir": backup_dir,
            "files": {
                p: {
                    "original_sha256": digest(originals[p]),
                    "patched_sha256": sha256(os.path.join(site, p)),
                }
                for p in manifest["files"]
            },
        }
        where = record_path(state_dir, site, name)
        previous = read_json(where)
        if previous:
            archive(state_dir, previous, "replaced")
        # Without its record an apply cannot be audited or reverted: it is part of the change.
        write_json(where, record)
    except (py_compile.PyCompileError, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        stuck = [p for p in reversed(replaced) if not put_back(os.path.join(site, p), before[p])]
        back = {p: sha256(os.path.join(site, p)) for p in manifest["files"]}
        message = str(exc).strip().splitlines()
        reason = " ".join(line.strip() for line in message[-4:])
        if back == current:
            outcome = "all files restored"
        else:
            differ = sorted(p for p in back if back[p] != current[p])
            outcome = f"RESTORE MISMATCH: {', '.join(stuck or differ)} not restored"
        fail(f"rolled back ({outcome}): {reason}")
    lock.close()
    return {"record": record}


def run_verify_scripts(site: str, scripts: list[str], members: dict[str, bytes]) -> None:
    """Run each verify script of the set against the patched files; raise on the first failure."""
    import subprocess  # as in cmd_apply
    import tempfile

    with tempfile.TemporaryDirectory(prefix="deployctl-verify-") as verify_dir:
        for script in scripts:
            script_path = os.path.join(verify_dir, os.path.basename(script))
            with open(script_path, "wb") as handle:
                handle.write(members["verify/" + script])
            env = dict(os.environ, DEPLOYCTL_SITE=site)
            done = subprocess.run(
                [sys.executable, script_path], check=False, cwd=verify_dir, env=env,
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            if done.returncode != 0:
                output = (done.stderr.strip() or done.stdout.strip()).splitlines()
                detail = output[-1] if output else "no output"
                raise RuntimeError(f"verify {os.path.basename(script)} failed: {detail}")


def archive(state_dir: str, record: PatchRecord, why: str) -> None:
    ended = dict(record, ended=why, ended_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    path = os.path.join(
        patches_dir(state_dir), "history", f"{record['set']}-{record['apply_id']}-{why}.json"
    )
    write_json(path, ended)


def cmd_revert(args: RevertArgs) -> RevertReply:
    """Restore a set's originals from its backup and check their hashes."""
    state_dir, name = args["state_dir"], args["set"]
    lock = lock_patches(state_dir)
    install = sglang_install()
    if "site" not in install:
        fail(install.get("error", "SGLang is not installed"))
    site = install["site"]
    where = record_path(state_dir, site, name)
    record: PatchRecord | None = read_json(where)
    if record is None:
        return {"reverted": False, "files": []}
    if args["forget"]:  # the files lack the set already (reverted by hand, reinstalled)
        archive(state_dir, record, "gone")
        os.unlink(where)
        lock.close()
        return {"reverted": False, "files": sorted(record["files"])}
    for other_name, other in records(state_dir, site).items():
        shared = set(other.get("files", {})) & set(record["files"])
        if other_name != name and shared and other["applied_at"] > record["applied_at"]:
            fail(f"{other_name} was applied later over the same file(s): revert {other_name} first")
    drifted = [
        p for p, sums in record["files"].items()
        if sha256(os.path.join(site, p)) != sums["patched_sha256"]
    ]  # fmt: skip
    if drifted and not args["force"]:
        fail(
            f"drifted since apply (hand edits or a reinstall): {', '.join(drifted)}; use --force to restore anyway"
        )
    originals: dict[str, bytes | None] = {}
    for path, sums in record["files"].items():
        if sums["original_sha256"] is None:
            originals[path] = None
        else:
            originals[path] = read_bytes(os.path.join(record["backup_dir"], path))
            if digest(originals[path]) != sums["original_sha256"]:
                fail(f"backup of {path} does not match its recorded hash; nothing restored")
    stuck = [p for p, data in originals.items() if not put_back(os.path.join(site, p), data)]
    if stuck:
        fail(
            f"could not write back {', '.join(stuck)} (disk full?); the originals stay in "
            f"{record['backup_dir']}, and the set stays recorded: free space, then revert again"
        )
    mismatched = [
        p for p, sums in record["files"].items()
        if sha256(os.path.join(site, p)) != sums["original_sha256"]
    ]  # fmt: skip
    if mismatched:
        fail(f"restored files do not match their original hashes: {', '.join(mismatched)}")
    archive(state_dir, record, "reverted")
    os.unlink(where)
    lock.close()
    return {"reverted": True, "files": sorted(record["files"])}
