"""Runs ON a host, with the host's python (stdlib only): probe SGLang, apply and revert patches.

deployctl sends this file's source as `python -c SOURCE COMMAND JSON-ARGS` with any payload
on stdin, and reads one JSON document from stdout. Each command is one round trip. Apply
and revert read their whole input before touching anything, ignore a dropped connection,
and restore every file on failure, so a host is never left half-patched.
"""

import base64
import fcntl
import hashlib
import io
import json
import os
import py_compile
import signal
import subprocess
import sys
import tarfile
import tempfile
import time


def sha256(path):
    data = read_bytes(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def sglang_install():
    """Find SGLang without importing it (its __init__ needs torch)."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return {"error": f"SGLang is not installed for {sys.executable}"}
    package_dir = next(iter(spec.submodule_search_locations))
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"version": version, "site": os.path.dirname(package_dir), "python": sys.executable}


def read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_atomic(path, data, mode=None):
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=".deployctl.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def patches_dir(state_dir):
    return os.path.join(os.path.expanduser(state_dir), "patches")


def records(state_dir):
    folder = patches_dir(state_dir)
    found = {}
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".json"):
                record = read_json(os.path.join(folder, name))
                if record:
                    found[name[:-5]] = record
    return found


def lock_patches(state_dir):
    """Serialise patch changes on this host; the lock dies with the process."""
    folder = patches_dir(state_dir)
    os.makedirs(folder, exist_ok=True)
    handle = open(os.path.join(folder, ".lock"), "w")  # noqa: SIM115 - held until exit
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fail("another deployctl patch operation is running on this host")
    return handle


def cmd_probe(args):
    """SGLang version and site, patch records, and sha256 of the files of interest."""
    install = sglang_install()
    found = records(args["state_dir"])
    paths = set(args.get("paths", []))
    for record in found.values():
        paths.update(record.get("files", {}))
    files = {}
    if "site" in install:
        files = {p: sha256(os.path.join(install["site"], p)) for p in sorted(paths)}
    return {"sglang": install, "records": found, "files": files}


def cmd_read(args):
    """Return the named files under `base` as base64 (None for a file that does not exist)."""
    contents = {}
    for path in args["paths"]:
        data = read_bytes(os.path.join(args["base"], path))
        contents[path] = None if data is None else base64.b64encode(data).decode()
    return {"files": contents}


def restore(site, originals):
    for path, data in originals.items():
        target = os.path.join(site, path)
        if data is None:
            if os.path.exists(target):
                os.unlink(target)
        else:
            write_atomic(target, data)


def cmd_apply(args, payload):
    """Back up, write patched files, compile, verify; undo everything on any failure."""
    members = {}
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                members[member.name] = tar.extractfile(member).read()
    manifest = json.loads(members.pop("manifest.json"))
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
    for path, data in originals.items():
        if data is not None:
            write_atomic(os.path.join(backup_dir, path), data)
    before = {p: read_bytes(os.path.join(site, p)) for p in manifest["files"]}
    try:
        for path, data in patched.items():
            target = os.path.join(site, path)
            if data is None:
                if os.path.exists(target):
                    os.unlink(target)
            else:
                write_atomic(target, data)
        for path in manifest["files"]:
            if path.endswith(".py") and patched[path] is not None:
                py_compile.compile(os.path.join(site, path), doraise=True)
        verify_dir = tempfile.mkdtemp(prefix="deployctl-verify-")
        for script in manifest["verify"]:
            script_path = os.path.join(verify_dir, os.path.basename(script))
            with open(script_path, "wb") as handle:
                handle.write(members["verify/" + script])
            env = dict(os.environ, DEPLOYCTL_SITE=site)
            done = subprocess.run(
                [sys.executable, script_path], check=False, cwd=verify_dir, env=env,
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            if done.returncode != 0:
                detail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [
                    "no output"
                ]
                raise RuntimeError(f"verify {os.path.basename(script)} failed: {detail[0]}")
    except (py_compile.PyCompileError, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        restore(site, before)
        back = {p: sha256(os.path.join(site, p)) for p in manifest["files"]}
        message = str(exc).strip().splitlines()
        reason = " ".join(line.strip() for line in message[-4:])
        fail(
            f"rolled back ({'all files restored' if back == current else 'RESTORE MISMATCH'}): {reason}"
        )
    record = {
        "set": name,
        "version": manifest["version"],
        "hash": manifest["hash"],
        "variant": manifest["variant"],
        "sglang_version": manifest["sglang_version"],
        "site": site,
        "apply_id": manifest["apply_id"],
        "applied_at": manifest["applied_at"],
        "applied_by": manifest["applied_by"],
        "backup_dir": backup_dir,
        "files": {
            p: {
                "original_sha256": None
                if originals[p] is None
                else hashlib.sha256(originals[p]).hexdigest(),
                "patched_sha256": sha256(os.path.join(site, p)),
            }
            for p in manifest["files"]
        },
    }
    record_path = os.path.join(patches_dir(state_dir), name + ".json")
    previous = read_json(record_path)
    if previous:
        archive(state_dir, previous, "replaced")
    write_atomic(record_path, json.dumps(record, indent=2).encode())
    lock.close()
    return {"record": record}


def archive(state_dir, record, why):
    record = dict(record, ended=why, ended_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    path = os.path.join(
        patches_dir(state_dir), "history", f"{record['set']}-{record['apply_id']}-{why}.json"
    )
    write_atomic(path, json.dumps(record, indent=2).encode())


def cmd_revert(args):
    """Restore a set's originals from its backup and check their hashes."""
    state_dir, name = args["state_dir"], args["set"]
    lock = lock_patches(state_dir)
    record_path = os.path.join(patches_dir(state_dir), name + ".json")
    record = read_json(record_path)
    if record is None:
        return {"reverted": False, "reason": "not applied"}
    site = record["site"]
    for other_name, other in records(state_dir).items():
        shared = set(other.get("files", {})) & set(record["files"])
        if other_name != name and shared and other["applied_at"] > record["applied_at"]:
            fail(f"{other_name} was applied later over the same file(s): revert {other_name} first")
    drifted = [
        p for p, sums in record["files"].items()
        if sha256(os.path.join(site, p)) != sums["patched_sha256"]
    ]  # fmt: skip
    if drifted and not args.get("force"):
        fail(
            f"drifted since apply (hand edits or a reinstall): {', '.join(drifted)}; use --force to restore anyway"
        )
    originals = {}
    for path, sums in record["files"].items():
        backup = os.path.join(record["backup_dir"], path)
        if sums["original_sha256"] is None:
            originals[path] = None
        else:
            with open(backup, "rb") as handle:
                originals[path] = handle.read()
            if hashlib.sha256(originals[path]).hexdigest() != sums["original_sha256"]:
                fail(f"backup of {path} does not match its recorded hash; nothing restored")
    restore(site, originals)
    mismatched = [
        p for p, sums in record["files"].items()
        if sha256(os.path.join(site, p)) != sums["original_sha256"]
    ]  # fmt: skip
    if mismatched:
        fail(f"restored files do not match their original hashes: {', '.join(mismatched)}")
    archive(state_dir, record, "reverted")
    os.unlink(record_path)
    lock.close()
    return {"reverted": True, "files": sorted(record["files"])}


def fail(message):
    sys.stdout.write(json.dumps({"error": message}) + "\n")
    sys.exit(1)


def main():
    # A dropped connection must not interrupt a change half-way: finish or roll back.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    command, args = sys.argv[1], json.loads(sys.argv[2])
    payload = sys.stdin.buffer.read() if command == "apply" else b""
    handlers = {
        "probe": lambda: cmd_probe(args),
        "read": lambda: cmd_read(args),
        "apply": lambda: cmd_apply(args, payload),
        "revert": lambda: cmd_revert(args),
    }
    result = handlers[command]()
    try:
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    except OSError:
        pass


if __name__ == "__main__":
    main()
