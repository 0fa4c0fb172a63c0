"""Runs ON a host, with the host's python (stdlib only): SGLang probes, patches, server runs.

deployctl sends this file's source as `python -c SOURCE COMMAND JSON-ARGS` with any payload
on stdin, and reads one JSON document from stdout. Each command is one round trip. Apply
and revert read their whole input before touching anything, ignore a dropped connection,
and restore every file on failure, so a host is never left half-patched.

Everything deployctl keeps on a host lives under `state_dir` (default ~/.deployctl), laid
out here and nowhere else:

    lock                                  held while a launch changes the host
    runs/<run-id>.json                    one record per launch (run id = log name); kept
    runs/<run-id>.cmd                     the unmasked command, mode 0600, for restart
    runs/current                          id of the host's current run
    patches/<set>.json                    what is applied now: version, hash, files, sha256s
    patches/.lock                         serialises patch changes (flock, dies with us)
    patches/history/<set>-<id>-<why>.json records of reverted or replaced applies
    patches/backups/<set>/<id>/<relpath>  originals saved by one apply; never overwritten
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import json
import os
import py_compile
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time


def digest(data):
    return None if data is None else hashlib.sha256(data).hexdigest()


def sha256(path):
    return digest(read_bytes(path))


def sglang_install():
    """Find SGLang without importing it (its __init__ needs torch)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return {"error": f"SGLang is not installed for {sys.executable}"}
    site = os.path.dirname(next(iter(spec.submodule_search_locations)))
    return {"version": dist_version(site, "sglang"), "site": site, "python": sys.executable}


def dist_version(site, name):
    """The installed version from <site>/<name>-*.dist-info/METADATA.

    Reading it directly is ~80 ms cheaper per call than importing importlib.metadata, and
    it describes the copy that `import sglang` really finds.
    """
    for entry in sorted(os.listdir(site)):
        if entry.lower().startswith(name + "-") and entry.endswith(".dist-info"):
            metadata = read_bytes(os.path.join(site, entry, "METADATA")) or b""
            for line in metadata.decode("utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    import importlib.metadata  # an editable or unusual install: ask the slow way

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


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


def put_back(target, data):
    """Give `target` its original bytes again (None: it did not exist); True when done."""
    try:
        if data is None:
            if os.path.lexists(target):
                os.unlink(target)
            return True
        try:
            write_atomic(target, data)
        except OSError:
            # A full disk has no room for a second copy: drop ours first, then write.
            mode = os.stat(target).st_mode & 0o7777
            os.unlink(target)
            write_atomic(target, data, mode)
    except OSError:
        return False
    return True


def cmd_apply(args, payload):
    """Back up, write patched files, compile, verify; undo everything on any failure."""
    # A dropped connection can cut the upload at a tar block boundary, which reads as a
    # valid but shorter archive: check that every byte arrived before using any of it.
    if hashlib.sha256(payload).hexdigest() != args.get("payload_sha256"):
        fail(
            f"the upload is incomplete ({len(payload)} of {args.get('payload_size')} bytes; "
            "connection dropped?); nothing was changed"
        )
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        for member in tar.getmembers():
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted is not None:
                members[member.name] = extracted.read()
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
    before = {p: read_bytes(os.path.join(site, p)) for p in manifest["files"]}
    replaced = []  # the files this apply changed, in order: only these are put back
    try:
        for path, data in originals.items():
            if data is not None:
                write_atomic(os.path.join(backup_dir, path), data)
        for path, data in patched.items():
            target = os.path.join(site, path)
            if data is None:
                if os.path.exists(target):
                    os.unlink(target)
                    replaced.append(path)
            else:
                write_atomic(target, data)
                replaced.append(path)
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
                    "original_sha256": digest(originals[p]),
                    "patched_sha256": sha256(os.path.join(site, p)),
                }
                for p in manifest["files"]
            },
        }
        record_path = os.path.join(patches_dir(state_dir), name + ".json")
        previous = read_json(record_path)
        if previous:
            archive(state_dir, previous, "replaced")
        # Without its record an apply cannot be audited or reverted: it is part of the change.
        write_atomic(record_path, json.dumps(record, indent=2).encode())
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
    originals: dict[str, bytes | None] = {}
    for path, sums in record["files"].items():
        backup = os.path.join(record["backup_dir"], path)
        if sums["original_sha256"] is None:
            originals[path] = None
        else:
            originals[path] = read_bytes(backup)
            if digest(originals[path]) != sums["original_sha256"]:
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


# ---- server lifecycle ----------------------------------------------------------------------

LOG_NAME = re.compile(r"(?P<stem>.+)_v(?P<n>\d+)\.log\Z")
RUN_NAME = re.compile(r"(?P<stem>.+)_v(?P<n>\d+)\.json\Z")


def state_path(state_dir, *parts):
    return os.path.join(os.path.expanduser(state_dir), *parts)


def next_log_version(log_dir, stem, runs_dir):
    """One more than the highest version of `stem` among the logs and the run records.

    Run records count too: a log deleted to save space must not let its run id, and so its
    record, be reused.
    """
    highest = 0
    for folder, pattern in ((log_dir, LOG_NAME), (runs_dir, RUN_NAME)):
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                match = pattern.match(name)
                if match and match.group("stem") == stem:
                    highest = max(highest, int(match.group("n")))
    return highest + 1


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take_lock(state_dir, client, break_token):
    """Create the host lock atomically; report the holder when it exists."""
    path = state_path(state_dir, "lock")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    holder = read_json(path)
    if holder and break_token and holder.get("token") == break_token:
        os.unlink(path)
    token = f"{client.get('host')}-{client.get('pid')}-{time.time_ns()}"
    # Written whole first, then linked into place: link() fails when the lock exists, and
    # nobody ever reads a half-written lock.
    fd, tmp = tempfile.mkstemp(prefix=".lock.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(dict(client, token=token, since=time.time()), handle)
        os.link(tmp, path)
    except FileExistsError:
        return {"acquired": False, "holder": read_json(path) or {}}
    finally:
        os.unlink(tmp)
    return {"acquired": True, "token": token}


def release_lock(state_dir, token):
    path = state_path(state_dir, "lock")
    holder = read_json(path)
    if holder and holder.get("token") == token:
        os.unlink(path)
        return True
    return False


def module_found(module):
    """Can `python -m module` find the module's top-level package (without importing it)?"""
    import importlib.util

    if not module:
        return True
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def port_free(host, port):
    import socket

    address = "0.0.0.0" if host in ("", "0.0.0.0", "::") else host
    with socket.socket() as sock:
        # Like the server will: connections in TIME_WAIT do not make the port busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, int(port)))
        except OSError as exc:
            return False, str(exc)
    return True, ""


def writable_dir(path):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return False, str(exc)
    return os.access(path, os.W_OK | os.X_OK), "not writable"


def cmd_preflight(args):
    """Everything a launch needs to know, and the host lock, in one round trip."""
    result = cmd_probe(args)
    result["module_found"] = module_found(args.get("module"))
    log_dir = os.path.expanduser(args["log_dir"])
    result["port_free"], result["port_error"] = port_free(args["bind_host"], args["port"])
    result["paths"] = {p: os.path.exists(os.path.expanduser(p)) for p in args["check_paths"]}
    result["log_dir_writable"], result["log_dir_error"] = writable_dir(log_dir)
    version = next_log_version(log_dir, args["log_stem"], state_path(args["state_dir"], "runs"))
    result["next_log"] = os.path.join(log_dir, f"{args['log_stem']}_v{version}.log")
    if args.get("lock", True):
        result["lock"] = take_lock(args["state_dir"], args["client"], args.get("break_lock"))
    return result


def process_group(pgid, sid):
    """PIDs whose process group and session are the run's (never anyone else's)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and int(fields[3]) == sid and fields[0] != b"Z":
            members.append(int(entry))
    return sorted(members)


def cmd_start(args):
    """Start the server detached in its own session, logging to a new versioned file."""
    state_dir, log_dir = args["state_dir"], os.path.expanduser(args["log_dir"])
    runs = state_path(state_dir, "runs")
    os.makedirs(log_dir, exist_ok=True)
    version = next_log_version(log_dir, args["log_stem"], runs)
    while True:  # O_EXCL: a log is never reused, even by a racing start
        run_id = f"{args['log_stem']}_v{version}"
        log_path = os.path.join(log_dir, run_id + ".log")
        if os.path.exists(os.path.join(runs, run_id + ".json")):
            version += 1
            continue
        try:
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            break
        except FileExistsError:
            version += 1
    proc = subprocess.Popen(
        ["/bin/sh", "-c", "exec " + args["command"]],
        stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
        start_new_session=True, close_fds=True, cwd=os.path.expanduser("~"),
    )  # fmt: skip
    os.close(log_fd)
    record = dict(
        args["run"],
        id=run_id,
        log=log_path,
        pid=proc.pid,
        pgid=proc.pid,
        sid=proc.pid,
        started_at=time.time(),
        status="running",
    )
    command_file = os.path.join(runs, run_id + ".cmd")
    write_atomic(command_file, args["command"].encode(), mode=0o600)
    write_atomic(os.path.join(runs, run_id + ".json"), json.dumps(record, indent=2).encode())
    write_atomic(os.path.join(runs, "current"), run_id.encode())
    if args.get("lock_token"):
        release_lock(state_dir, args["lock_token"])
    return {"run": record}


def health(host, port):
    """GET /health on the host itself: the status code, or None when nothing answers."""
    import socket

    address = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    try:
        with socket.create_connection((address, int(port)), timeout=0.5) as sock:
            sock.sendall(f"GET /health HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
            status_line = sock.makefile("rb").readline().split()
    except OSError:
        return None
    return int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else None


def read_from(path, offset, limit):
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = size - limit if offset < 0 else offset
            handle.seek(max(0, min(start, size)))
            data = handle.read(limit)
    except OSError:
        return 0, b""
    return size, data


def cmd_poll(args):
    """Is the run alive, is it healthy, and what did its log gain since `offset`.

    With `wait`, keep watching (in this one process) until something changes, so the
    caller learns of a ready line or a crash within ~50 ms instead of a poll interval.
    """
    deadline = time.monotonic() + float(args.get("wait", 0))
    while True:
        members = process_group(args["pgid"], args["sid"])
        size, data = read_from(args["log"], args["offset"], args.get("limit", 1 << 20))
        code = health(args["bind_host"], args["port"]) if members else None
        if data or not members or code == 200 or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return {
        "alive": bool(members),
        "members": members,
        "health": code,
        "size": size,
        "data": base64.b64encode(data).decode(),
    }


def current_run(state_dir, run_id=None):
    runs = state_path(state_dir, "runs")
    if run_id is None:
        current = read_bytes(os.path.join(runs, "current"))
        if current is None:
            return None
        run_id = current.decode().strip()
    return read_json(os.path.join(runs, run_id + ".json"))


def cmd_status(args):
    """The current (or named) run with liveness, health and the tail of its log."""
    run = current_run(args["state_dir"], args.get("run"))
    if run is None:
        return {"run": None}
    poll = cmd_poll(dict(run, offset=-1, limit=args.get("tail_bytes", 65536)))
    command = read_bytes(state_path(args["state_dir"], "runs", run["id"] + ".cmd"))
    return dict(poll, run=run, command=None if command is None else command.decode())


def cmd_stop(args):
    """SIGTERM the run's process group, SIGKILL what is left after the timeout."""
    state_dir = args["state_dir"]
    run = current_run(state_dir, args.get("run"))
    if run is None:
        return {"run": None}
    members = process_group(run["pgid"], run["sid"])
    killed = []
    if members:
        os.killpg(run["pgid"], signal.SIGTERM)
        deadline = time.monotonic() + float(args.get("timeout", 30))
        while process_group(run["pgid"], run["sid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        killed = process_group(run["pgid"], run["sid"])
        if killed:
            os.killpg(run["pgid"], signal.SIGKILL)
            while process_group(run["pgid"], run["sid"]) and time.monotonic() < deadline + 10:
                time.sleep(0.05)
    if run.get("status") == "running":
        run = dict(run, status="stopped", stopped_at=time.time())
        path = state_path(state_dir, "runs", run["id"] + ".json")
        write_atomic(path, json.dumps(run, indent=2).encode())
    left = process_group(run["pgid"], run["sid"])
    return {"run": run, "ended": members, "killed": killed, "left": left}


def cmd_release(args):
    return {"released": release_lock(args["state_dir"], args["token"])}


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
        "preflight": lambda: cmd_preflight(args),
        "start": lambda: cmd_start(args),
        "poll": lambda: cmd_poll(args),
        "status": lambda: cmd_status(args),
        "stop": lambda: cmd_stop(args),
        "release": lambda: cmd_release(args),
    }
    result = handlers[command]()
    try:
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    except OSError:
        pass


if __name__ == "__main__":
    main()
