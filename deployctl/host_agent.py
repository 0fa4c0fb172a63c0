"""Runs ON a host, with the host's python (stdlib only): SGLang probes, patches, server runs.

deployctl keeps a copy of this file on each host under its content hash
(`<state_dir>/agent/<sha256>.py`) and runs it through `BOOTSTRAP` as
`python -c BOOTSTRAP FILE CALL JSON-ARGS`, with any payload on stdin; it reads one JSON
document from stdout. A copy that is missing, or whose content is not the hash in its name,
answers `AGENT_MISSING` instead, and the client sends the file again.
Each call is one round trip, and its arguments and reply are declared below (`*Args`,
`*Reply`); the client checks every reply against its declaration. Apply and revert read
their whole input before touching anything, ignore a dropped connection, and restore every
file on failure, so a host is never left half-patched.

Everything deployctl keeps on a host lives under `state_dir` (default ~/.deployctl), laid
out here and nowhere else:

    agent/<sha256>.py                     this file, named by the hash of its content
    lock                                  held while a launch changes the host
    tune-lock[-<deployment>]              held while a tune replaces the deployment's runs
    runs/<run-id>.json                    one record per launch (run id = log name); kept
    runs/<run-id>.cmd                     the unmasked command, mode 0600, for restart
    runs/<run-id>.env                     the server's own environment (JSON), mode 0600
    runs/current                          id of the host's current run
    patches/sites/<key>/<set>.json        what is applied now to one SGLang installation (key:
                                          sha256 of its site-packages path): version, hash,
                                          files, sha256s (patches/<set>.json: the same, as
                                          written before records were kept per installation)
    patches/.lock                         serialises patch changes (flock, dies with us)
    router-locks/<deployment>             serialises the rollouts through one router (flock,
                                          held by a `hold` call until its client goes; the
                                          holder's identity as JSON inside)
    patches/history/<set>-<id>-<why>.json records of reverted or replaced applies
    patches/backups/<set>/<id>/<relpath>  originals saved by one apply; never overwritten
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import io
import json
import os
import py_compile
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any, NoReturn, TypedDict, cast

AGENT_DIR = "agent"
# Printed (with exit status AGENT_MISSING_EXIT) when the copy named is absent or altered.
AGENT_MISSING = "@@deployctl-agent-missing@@"
AGENT_MISSING_EXIT = 97
# Starts the line that holds a reply: what a login prints (motd, an rc file) is never read.
REPLY_MARK = "@@deployctl-reply@@ "
# Run as `python -c BOOTSTRAP FILE ARGS…`: check FILE against the hash in its name, then run it.
BOOTSTRAP = f"""import hashlib, sys
path = sys.argv[1]
try:
    code = open(path, "rb").read()
except OSError:
    code = b""
if hashlib.sha256(code).hexdigest() != path.rsplit("/", 1)[-1][:-3]:
    print("{AGENT_MISSING}")
    sys.exit({AGENT_MISSING_EXIT})
sys.argv = sys.argv[1:]
exec(compile(code, path, "exec"), {{"__name__": "__main__", "__file__": path}})
"""


# ---- the protocol: each call's arguments and reply ----------------------------------------


class SglangInstall(TypedDict, total=False):
    version: str | None
    site: str
    python: str
    error: str


class FileSums(TypedDict):
    original_sha256: str | None
    patched_sha256: str | None


class AppliedSet(TypedDict):
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


class ProbeArgs(TypedDict):
    state_dir: str
    paths: list[str]


class ProbeReply(TypedDict):
    sglang: SglangInstall
    records: dict[str, PatchRecord]
    files: dict[str, str | None]


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


class RevertReply(TypedDict):
    reverted: bool
    files: list[str]


class ClientIdentity(TypedDict):
    host: str
    pid: int
    user: str
    op: str
    expires: float


class LockReply(TypedDict):
    acquired: bool
    token: str | None
    holder: dict[str, Any] | None  # the lock file as found; its "token" is always set


class PreflightArgs(ProbeArgs):
    deployment: str | None
    gpus: list[int] | None  # None: every GPU
    port: int
    also_ports: list[int]  # more ports the server will listen on (a multi-node rank 0's)
    bind_host: str
    check_paths: list[str]
    module: str | None
    log_dir: str
    log_stem: str
    client: ClientIdentity
    break_lock: str | None
    server_argv: list[str] | None  # checked against the installation's options; None: not


class LiveRunOrigin(TypedDict, total=False):
    origin: str | None  # the inventory that launched it; None (or absent): not recorded
    job: str  # the Slurm job it is (no members here: its processes are on the job's nodes)


class LiveRun(LiveRunOrigin):
    id: str
    pid: int
    deployment: str | None
    gpus: list[int] | None
    port: int
    members: list[int]


class OptionSpec(TypedDict):
    dest: str
    kind: str  # flag (no value), value (one), list (several), any (a custom action)
    nargs: str | None  # "?" for an optional value, "+"/"*" for lists
    type: str | None  # int, float or str when argparse checks it; None: not checked here
    choices: list[Any] | None


class ArgFinding(TypedDict):
    level: str  # error (refuses the launch) or warning
    flag: str
    message: str
    candidates: list[str]


class ArgvCheck(TypedDict):
    method: str  # declarations (read statically), parser (SGLang's own), none
    note: str
    options: int  # how many option names the installation has
    findings: list[ArgFinding]
    seconds: float


class CheckArgsArgs(TypedDict):
    server_argv: list[str] | None


class CheckArgsReply(TypedDict):
    sglang: SglangInstall
    check: ArgvCheck


class PreflightReply(ProbeReply):
    live_runs: list[LiveRun]  # every deployment's current run whose processes are still there
    module_found: bool
    port_free: bool
    port_error: str
    busy_ports: dict[str, str]  # of also_ports: port → why it cannot be bound
    argv_check: ArgvCheck
    paths: dict[str, bool]
    log_dir_writable: bool
    log_dir_error: str
    next_log: str
    next_version: int
    lock: LockReply
    sbatch: str | None  # where sbatch is (a Slurm login node); None: not on the PATH


class RunShown(TypedDict, total=False):
    # Records before 0.2 lack these.
    env: dict[str, str]  # the server's environment, secrets masked
    deployment: str | None
    gpus: list[int] | None
    origin: str  # the inventory that launched it (its sources' paths); older records lack it
    # Where its router lists it, as its launch computed it: a stop removes this one, whatever
    # the inventory says since. "": a Slurm job's head node's (known once it runs).
    worker_url: str


class RunInfo(RunShown):
    template: str
    threshold: int | None
    command: str  # as shown to people: secrets masked
    port: int
    bind_host: str
    tp: int
    patches: dict[str, str]
    deployctl_version: str
    started_by: str
    restart_of: str | None


class LeaderIdentity(TypedDict, total=False):
    # The leader's start time in clock ticks since boot (/proc/PID/stat field 22): with it, a
    # PID that now names another process is never taken for the run. Older records lack it.
    starttime: int


class JobInfo(TypedDict):
    """A Slurm job as squeue (or, once slurmctld forgot it, sacct) last saw it."""

    id: str
    state: str  # Slurm's: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, …; UNKNOWN
    reason: str  # why it waits (squeue's %r: Resources, Priority, BeginTime…); "" otherwise
    nodes: list[str]  # its nodes, the first one the head
    head: str  # the head node's address (its NodeAddr): where the server answers
    time_left: float | None  # seconds to its time limit; None: no limit, or not running
    exit_code: str  # "code:signal" once it ended, as sacct and scontrol give it; "" before


class JobRecord(TypedDict, total=False):
    job: JobInfo  # a run that is a Slurm job (`launcher: slurm`); its last known state


class RunRecord(RunInfo, LeaderIdentity, JobRecord):
    # A stop also writes `stop_requested_at` before it signals the run (a launch waiting for
    # it then knows why it died) and `stopped_at` once it has ended.
    id: str
    log: str
    pid: int
    pgid: int
    sid: int
    started_at: float
    status: str  # running | stopped


class StartArgs(TypedDict):
    state_dir: str
    deployment: str | None
    log_dir: str
    log_stem: str
    command: str  # the real command, secrets included
    env: dict[str, str]  # the real environment for the server, over the login's
    min_version: int  # the log version to use at least (one N on every node of a group)
    run: RunInfo
    lock_token: str | None
    files: dict[str, str]  # path (from the home folder, or absolute) → text, written first
    batch: str | None  # a Slurm batch script to submit instead of starting `command` here


class JobRef(TypedDict):
    id: str
    state_dir: str
    run: str  # the run whose record keeps the job's last known state


class JobIdentity(TypedDict, total=False):
    job: JobRef  # the run is this Slurm job: liveness from squeue, health at its head node


class StartReply(TypedDict):
    run: RunRecord


class PollArgs(LeaderIdentity, JobIdentity):
    pgid: int
    sid: int
    log: str
    port: int
    bind_host: str
    offset: int  # negative: the last `limit` bytes
    limit: int
    wait: float


class PollReply(TypedDict):
    alive: bool
    members: list[int]
    health: int | None
    size: int
    data: str  # base64
    job: JobInfo | None  # a Slurm job's state; None for a process on this host


class StatusArgs(TypedDict):
    state_dir: str
    deployment: str | None
    run: str | None
    tail_bytes: int
    metrics_bytes: int  # > 0: also GET /metrics from a live server, at most this much


class MetricsPage(TypedDict):
    status: int | None  # the HTTP status; None when nothing answered
    text: str


class StatusReply(PollReply):
    run: RunRecord | None
    command: str | None
    env: dict[str, str] | None
    metrics: MetricsPage | None  # asked for and the server alive


class StopArgs(TypedDict):
    state_dir: str
    deployment: str | None
    timeout: float
    run: str | None  # a run of the deployment by id (a renewed job's predecessor); None: current


class PointArgs(TypedDict):
    state_dir: str
    deployment: str | None
    run: str  # make this recorded run the deployment's current one again


class PointReply(TypedDict):
    pointed: bool  # False: no such run is recorded


class StopReply(TypedDict):
    run: RunRecord | None
    ended: list[int]
    killed: list[int]
    left: list[int]
    job: JobInfo | None  # a Slurm job as the stop left it


class ReleaseArgs(TypedDict):
    state_dir: str
    deployment: str | None
    token: str


class ReleaseReply(TypedDict):
    released: bool


class RunsArgs(TypedDict):
    state_dir: str


class RunsReply(TypedDict):
    live_runs: list[LiveRun]


# ---- files ---------------------------------------------------------------------------------


def digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def sha256(path: str) -> str | None:
    return digest(read_bytes(path))


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_atomic(path: str, data: bytes, mode: int | None = None) -> None:
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


def write_json(path: str, document: Any, mode: int | None = None) -> None:
    write_atomic(path, json.dumps(document, indent=2).encode(), mode)


def put_back(target: str, data: bytes | None) -> bool:
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


def state_path(state_dir: str, *parts: str) -> str:
    return os.path.join(os.path.expanduser(state_dir), *parts)


def fail(message: str, code: str = "patch") -> NoReturn:
    """Answer with an error instead of a reply; `code` says what kind (see the client)."""
    sys.stdout.write(REPLY_MARK + json.dumps({"error": message, "code": code}) + "\n")
    sys.exit(1)


# ---- SGLang and patches --------------------------------------------------------------------


def sglang_install() -> SglangInstall:
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


def dist_version(site: str, name: str) -> str | None:
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


PATCH_LOCK_WAIT = 60.0


def patches_dir(state_dir: str) -> str:
    return state_path(state_dir, "patches")


def records_dir(state_dir: str, site: str) -> str:
    """Where the records of one SGLang installation (its site-packages) are kept."""
    key = hashlib.sha256(site.encode()).hexdigest()[:16]
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
                    found[name[:-5]] = cast(PatchRecord, record)
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
    """SGLang version and site, patch records, and sha256 of the files of interest."""
    install = sglang_install()
    found = records(args["state_dir"], install.get("site"))
    paths = set(args["paths"])
    for record in found.values():
        paths.update(record.get("files", {}))
    files: dict[str, str | None] = {}
    if "site" in install:
        files = {p: sha256(os.path.join(install["site"], p)) for p in sorted(paths)}
    return {"sglang": install, "records": found, "files": files}


def cmd_read(args: ReadArgs) -> ReadReply:
    """Return the named files under `base` as base64 (None for a file that does not exist)."""
    contents: dict[str, str | None] = {}
    for path in args["paths"]:
        data = read_bytes(os.path.join(args["base"], path))
        contents[path] = None if data is None else base64.b64encode(data).decode()
    return {"files": contents}


def cmd_apply(args: ApplyArgs, payload: bytes) -> ApplyReply:
    """Back up, write patched files, compile, verify; undo everything on any failure."""
    # A dropped connection can cut the upload at a tar block boundary, which reads as a
    # valid but shorter archive: check that every byte arrived before using any of it.
    if hashlib.sha256(payload).hexdigest() != args["payload_sha256"]:
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


# ---- SGLang's own options: is the command one the installation accepts? -------------------

# Where 0.5.23 declares its options: annotated fields `name: A[type, "help" | Arg(...)]` in
# these files, plus the few `parser.add_argument` calls in ServerArgs.add_cli_args.
FIELDS_DIR = "sglang/srt/arg_groups/fields"
CHOICES_FILE = "sglang/srt/arg_groups/choices.py"
SERVER_ARGS_FILE = "sglang/srt/server_args.py"
PARSER_TIMEOUT = 45.0  # well inside a preflight's command_timeout (120 s by default)
# Asks SGLang's own parser for its options: the fallback for a layout this file does not know.
PARSER_SCRIPT = """import argparse, json
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out = []
for action in parser._actions:
    if not action.option_strings or "-h" in action.option_strings:
        continue
    flag = action.nargs == 0
    nargs = None if action.nargs is None else str(action.nargs)
    kind = "flag" if flag else "list" if nargs in ("+", "*") else "value"
    type_name = getattr(action.type, "__name__", None)
    choices = None
    if action.choices is not None:
        choices = [c if isinstance(c, (int, float, str)) else str(c) for c in action.choices]
    spec = {"dest": action.dest, "kind": kind, "nargs": nargs,
            "type": type_name if type_name in ("int", "float", "str") else None,
            "choices": choices}
    out.append([list(action.option_strings), spec])
print(json.dumps(out))
"""


def _literal(node: Any) -> Any:
    import ast

    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _name_of(node: Any) -> str:
    """`Optional`, `typing.Optional`, `argparse.BooleanOptionalAction` → their last name."""
    import ast

    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _module_constants(tree: Any) -> dict[str, Any]:
    """Module-level `NAME = [literal, ...]` assignments (choice lists)."""
    import ast

    found: dict[str, Any] = {}
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        for target in targets:
            if isinstance(target, ast.Name):
                value = _literal(stmt.value)
                if isinstance(value, (list, tuple, set, frozenset)):
                    found[target.id] = (
                        sorted(value, key=str)
                        if isinstance(value, (set, frozenset))
                        else list(value)
                    )
    return found


def _unwrap_type(node: Any) -> Any:
    """`Optional[X]`, `X | None`, `Union[X, None]` → X."""
    import ast

    if isinstance(node, ast.Subscript) and _name_of(node.value) == "Optional":
        return node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not _is_none(s)]
        return sides[0] if len(sides) == 1 else node
    if isinstance(node, ast.Subscript) and _name_of(node.value) == "Union":
        members = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rest = [m for m in members if not _is_none(m)]
        return rest[0] if len(rest) == 1 else node
    return node


def _is_none(node: Any) -> bool:
    import ast

    return isinstance(node, ast.Constant) and node.value is None


def _scalar_type(node: Any) -> str | None:
    name = _name_of(node)
    return name if name in ("int", "float", "str") else None


def _option_spec(
    dest: str, type_node: Any, keywords: dict[str, Any], constants: dict[str, Any]
) -> OptionSpec:
    """What argparse will do with one option, from its declared type and Arg(...) keywords."""
    import ast

    choices_node = keywords.get("choices")
    choices = None
    if choices_node is not None:
        choices = _literal(choices_node)
        if choices is None and isinstance(choices_node, ast.Name):
            choices = constants.get(choices_node.id)
        choices = list(choices) if isinstance(choices, (list, tuple)) else None
    nargs = _literal(keywords["nargs"]) if "nargs" in keywords else None
    spec: OptionSpec = {
        "dest": dest,
        "kind": "value",
        "nargs": nargs,
        "type": None,
        "choices": choices,
    }
    action = keywords.get("action")
    if action is not None:
        words = _literal(action)
        if (
            words in ("store_true", "store_false", "store_const", "count")
            or _name_of(action) == "BooleanOptionalAction"
        ):
            spec["kind"] = "flag"
        else:
            spec["kind"] = "any"
        return spec
    inner = _unwrap_type(type_node) if type_node is not None else None
    if isinstance(inner, ast.Subscript) and _name_of(inner.value) == "Literal":
        values = _literal(inner.slice)
        values = list(values) if isinstance(values, tuple) else [values]
        spec["choices"] = choices or values
        spec["type"] = (
            type(values[0]).__name__
            if values and type(values[0]).__name__ in ("int", "float", "str")
            else None
        )
    elif (
        isinstance(inner, ast.Subscript)
        and _name_of(inner.value) in ("list", "List")
        and "type_parser" not in keywords
    ):
        spec["kind"], spec["nargs"], spec["type"] = "list", nargs or "+", _scalar_type(inner.slice)
    elif _name_of(inner) == "bool":
        spec["kind"] = "flag"
    elif "type_parser" not in keywords:
        spec["type"] = (
            _scalar_type(inner) if inner is not None else _scalar_type(keywords.get("type"))
        )
    if spec["kind"] == "value" and nargs in ("+", "*"):
        spec["kind"] = "list"
    custom = "type_parser" in keywords or ("type" in keywords and not spec["type"])
    if custom:  # its own conversion runs before argparse compares with the choices
        spec["type"], spec["choices"] = None, None
    return spec


def _field_options(tree: Any, constants: dict[str, Any]) -> list[tuple[list[str], OptionSpec]]:
    """The options that annotated fields `name: A[type, "help" | Arg(...)]` declare."""
    import ast

    found: list[tuple[list[str], OptionSpec]] = []
    for cls in (s for s in tree.body if isinstance(s, ast.ClassDef)):
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = stmt.annotation
            if not (isinstance(ann, ast.Subscript) and _name_of(ann.value) in ("A", "Annotated")):
                continue
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            keywords: dict[str, Any] | None = None
            for meta in parts[1:]:
                if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
                    keywords = {}
                    break
                if isinstance(meta, ast.Call) and _name_of(meta.func) == "Arg":
                    keywords = {k.arg: k.value for k in meta.keywords if k.arg}
                    break
            if keywords is None or _literal(keywords.get("no_cli")) is True:
                continue  # not a command-line option (Derived, runtime-only, no_cli)
            dest = stmt.target.id
            cli_name = _literal(keywords["cli_name"]) if "cli_name" in keywords else None
            names = [cli_name or "--" + dest.replace("_", "-")]
            names += [a for a in _literal(keywords.get("aliases")) or [] if isinstance(a, str)]
            spec = _option_spec(dest, parts[0], keywords, constants)
            if _name_of(keywords.get("action")) == "BooleanOptionalAction":
                names += ["--no-" + n[2:] for n in names if n.startswith("--")]
            found.append((names, spec))
    return found


def _hand_added_options(tree: Any, constants: dict[str, Any]) -> list[tuple[list[str], OptionSpec]]:
    """`parser.add_argument("--x", ...)` calls inside a function named add_cli_args."""
    import ast

    found: list[tuple[list[str], OptionSpec]] = []
    for func in (
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"
    ):
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            if _name_of(call.func) != "add_argument":
                continue
            names = [
                a.value
                for a in call.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.startswith("-")
            ]
            if not names:
                continue
            keywords = {k.arg: k.value for k in call.keywords if k.arg}
            dest = _literal(keywords.get("dest")) or names[0].lstrip("-").replace("-", "_")
            found.append((names, _option_spec(dest, None, keywords, constants)))
    return found


def declared_options(site: str) -> dict[str, OptionSpec] | None:
    """Every option name of the installation at `site`, read from its source without importing
    it (that would need torch); None when the layout is not 0.5.23's."""
    import ast

    fields_dir = os.path.join(site, FIELDS_DIR)
    server_args = os.path.join(site, SERVER_ARGS_FILE)
    if not (os.path.isdir(fields_dir) and os.path.isfile(server_args)):
        return None
    constants: dict[str, Any] = {}
    trees = []
    for path in [
        os.path.join(site, CHOICES_FILE),
        *sorted(os.path.join(fields_dir, f) for f in os.listdir(fields_dir) if f.endswith(".py")),
    ]:
        source = read_bytes(path)
        if source is None:
            continue
        tree = ast.parse(source, path)
        constants.update(_module_constants(tree))
        trees.append(tree)
    options: dict[str, OptionSpec] = {}
    for tree in trees:
        for names, spec in _field_options(tree, constants):
            options.update(dict.fromkeys(names, spec))
    server_tree = ast.parse(read_bytes(server_args) or b"", server_args)
    constants.update(_module_constants(server_tree))
    for names, spec in _hand_added_options(server_tree, constants):
        options.update(dict.fromkeys(names, spec))
    return options if len(options) > 20 else None  # a few: not the layout we know


def parser_options() -> tuple[dict[str, OptionSpec] | None, str]:
    """The options of SGLang's own parser, built in a child (it imports torch)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PARSER_SCRIPT],
            capture_output=True,
            text=True,
            timeout=PARSER_TIMEOUT,
            check=False,
            cwd=os.path.expanduser("~"),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"SGLang's parser could not be built: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"SGLang's parser could not be built: {last}"
    options: dict[str, OptionSpec] = {}
    try:  # the last line: importing SGLang may print before it
        for names, spec in json.loads((done.stdout.strip().splitlines() or ["[]"])[-1]):
            options.update(dict.fromkeys(names, spec))
    except (ValueError, TypeError) as exc:
        return None, f"SGLang's parser gave no option list ({exc})"
    return options, ""


def sglang_options(install: SglangInstall) -> tuple[dict[str, OptionSpec] | None, str, str]:
    """(options, method, note) for the installation: declarations first, else its parser."""
    site = install.get("site")
    if not site:
        return None, "none", install.get("error", "SGLang is not installed")
    try:
        options = declared_options(site)
    except (OSError, SyntaxError, ValueError) as exc:
        options, note = None, f"declarations unreadable ({exc})"
    else:
        note = ""
    if options is not None:
        return options, "declarations", note
    options, why = parser_options()
    if options is not None:
        return (
            options,
            "parser",
            "declarations not in the layout deployctl reads; used SGLang's parser",
        )
    return None, "none", why


def _resolve_flag(word: str, options: dict[str, OptionSpec]) -> tuple[str, list[str]]:
    """argparse's lookup of `--name[=value]`: (the option, []) for an exact name or a unique
    prefix, ("", candidates) for an ambiguous or unknown one."""
    name = word.split("=", 1)[0]
    if name in options:
        return name, []
    matches = sorted(o for o in options if o.startswith(name) and o.startswith("--"))
    if len(matches) == 1:
        return matches[0], []
    return "", matches


def _value_problem(value: str, spec: OptionSpec) -> str:
    kind = spec["type"]
    converted: Any = value
    if kind in ("int", "float"):
        try:
            converted = int(value) if kind == "int" else float(value)
        except ValueError:
            return f"expected {'an integer' if kind == 'int' else 'a number'}, got {value!r}"
    if spec["choices"] is not None and converted not in spec["choices"]:
        shown = ", ".join(str(c) for c in spec["choices"][:12])
        more = ", …" if len(spec["choices"]) > 12 else ""
        return f"{value!r} is not one of the choices ({shown}{more})"
    return ""


# argparse (3.11) takes these as values, not options: negative numbers, and words with a space.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _looks_like_flag(word: str) -> bool:
    if not word.startswith("-") or word == "-":
        return False
    return not (_NEGATIVE_NUMBER.match(word) or (" " in word and "=" not in word))


# Options whose values deployctl itself reads from the command (the GPUs a launch needs, the
# port and address it probes, the paths it checks): given twice, it and SGLang could disagree.
READ_BY_DEPLOYCTL = frozenset(
    {"tp_size", "port", "host", "model_path", "speculative_draft_model_path", "nnodes",
     "node_rank", "dist_init_addr"}
)  # fmt: skip


def check_server_argv(argv: list[str], options: dict[str, OptionSpec]) -> list[ArgFinding]:
    """What SGLang's argparse would say about the command, before anything starts: unknown and
    ambiguous flags, abbreviations, flags given values they cannot take, bad values."""
    import difflib

    findings: list[ArgFinding] = []

    def say(level: str, flag: str, message: str, candidates: list[str] | None = None) -> None:
        findings.append(
            {"level": level, "flag": flag, "message": message, "candidates": candidates or []}
        )

    first_given: dict[str, str] = {}  # dest → the flag as first given
    index = 0
    while index < len(argv):
        word = argv[index]
        index += 1
        if not _looks_like_flag(word):
            say(
                "error", word, f"unexpected argument {word!r}: SGLang takes no positional arguments"
            )
            continue
        given, eq, explicit = word.partition("=")
        option, matches = _resolve_flag(word, options)
        if not option and matches:
            say("error", given, f"{given} is ambiguous: it could be {', '.join(matches)}", matches)
        elif not option:
            close = difflib.get_close_matches(given, list(options), n=3, cutoff=0.75)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            say("error", given, f"{given} is not an option of this SGLang{hint}", close)
        elif option != given:
            say(
                "warning",
                given,
                f"{given} is an abbreviation of {option}; write {option}",
                [option],
            )
        if not option:
            while index < len(argv) and not _looks_like_flag(argv[index]):
                index += 1  # its values, if any, go with it
            continue
        spec = options[option]
        earlier = first_given.setdefault(spec["dest"], given)
        if earlier is not given and spec["dest"] in READ_BY_DEPLOYCTL:
            # argparse keeps the last; deployctl's checks (GPUs for --tp-size…) may read another.
            say(
                "error",
                option,
                f"{option} is given twice ({earlier}, then {given}): SGLang would take the "
                "last, so the checks and the server would disagree; give it once",
            )
        values: list[str] = [explicit] if eq else []
        if spec["kind"] == "flag":
            if eq:
                say("error", option, f"{option} takes no value (given {explicit!r})")
            continue
        if spec["kind"] == "any":
            while not eq and index < len(argv) and not _looks_like_flag(argv[index]):
                index += 1
            continue
        several = spec["kind"] == "list"
        if not eq:
            while index < len(argv) and not _looks_like_flag(argv[index]):
                values.append(argv[index])
                index += 1
                if not several:
                    break
        if not values and spec["nargs"] not in ("?", "*"):
            say("error", option, f"{option} needs a value")
        for value in values:
            problem = _value_problem(value, spec)
            if problem:
                say("error", option, f"{option}: {problem}")
    return findings


def argv_check(server_argv: list[str] | None, install: SglangInstall) -> ArgvCheck:
    if server_argv is None:
        return {
            "method": "off",
            "note": "check_flags is off, or the launcher is not `-m <launch_module>`",
            "options": 0,
            "findings": [],
            "seconds": 0.0,
        }
    began = time.monotonic()
    try:
        options, method, note = sglang_options(install)
        findings = check_server_argv(server_argv, options) if options is not None else []
    except Exception as exc:  # a checker that fails must not stop every launch on the host
        options, method, findings = None, "none", []
        note = f"the flags could not be checked: {type(exc).__name__}: {exc}"
    return {
        "method": method,
        "note": note,
        "options": len(options or {}),
        "findings": findings,
        "seconds": round(time.monotonic() - began, 4),
    }


def cmd_check_args(args: CheckArgsArgs) -> CheckArgsReply:
    install = sglang_install()
    return {"sglang": install, "check": argv_check(args["server_argv"], install)}


# ---- server lifecycle ----------------------------------------------------------------------

LOG_NAME = re.compile(r"(?P<stem>.+)_v(?P<n>\d+)\.log\Z")
RUN_NAME = re.compile(r"(?P<stem>.+)_v(?P<n>\d+)\.json\Z")


def next_log_version(log_dir: str, stem: str, runs_dir: str) -> int:
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


def lock_identity(raw: bytes) -> tuple[dict[str, Any], str]:
    """The lock file as a dict and the token that names it.

    A record without a token of its own (hand-made, or cut short) is named by its content's
    hash, so that exactly that record can be broken and nothing written after it.
    """
    try:
        holder = json.loads(raw)
    except ValueError:
        holder = None
    if not isinstance(holder, dict):
        holder = {}
    token = holder.get("token")
    if not isinstance(token, str) or not token:
        token = "sha256:" + hashlib.sha256(raw).hexdigest()
    return dict(holder, token=token), token


LOCK_PREFIX = "lock"


def lock_name(deployment: str | None) -> str:
    """One launch lock per deployment: `lock` for the host's implicit one, `lock-NAME`."""
    return LOCK_PREFIX if deployment is None else f"{LOCK_PREFIX}-{deployment}"


def lock_files(state_dir: str) -> list[str]:
    folder = state_path(state_dir)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return [
        os.path.join(folder, n)
        for n in sorted(names)
        if n == LOCK_PREFIX or n.startswith(LOCK_PREFIX + "-")
    ]


def shares_gpus(first: list[int] | None, second: list[int] | None) -> bool:
    """Do two GPU sets share a GPU? None stands for every GPU of the host; [] for none (a
    router's)."""
    if first == [] or second == []:
        return False
    return first is None or second is None or bool(set(first) & set(second))


def take_lock(
    state_dir: str,
    client: ClientIdentity,
    break_token: str | None,
    deployment: str | None = None,
    gpus: list[int] | None = None,
) -> LockReply:
    """Take the deployment's launch lock unless a lock on any of its GPUs is held.

    Deployments on disjoint GPUs launch at once; one on every GPU (gpus None) waits for all.
    Report the holder that stands in the way.
    """
    folder = state_path(state_dir)
    os.makedirs(folder, exist_ok=True)
    # One taker at a time, so checking the others and writing ours is one step; the folder
    # itself is the mutex (closing it unlocks), so no file is left behind.
    guard = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        held = []
        for path in lock_files(state_dir):
            raw = read_bytes(path)
            if raw is None:
                continue
            holder, token = lock_identity(raw)
            if break_token and token == break_token:
                os.unlink(path)
                continue
            held.append((path, holder))
        ours = state_path(state_dir, lock_name(deployment))
        for path, holder in held:
            theirs = holder.get("gpus")
            if path == ours or shares_gpus(gpus, theirs if isinstance(theirs, list) else None):
                return {"acquired": False, "token": None, "holder": holder}
        token = f"{client['host']}-{client['pid']}-{time.time_ns()}"
        record = dict(client, token=token, since=time.time(), deployment=deployment, gpus=gpus)
        write_json(ours, record)
    finally:
        os.close(guard)
    return {"acquired": True, "token": token, "holder": None}


def tune_lock_name(deployment: str | None) -> str:
    """One tune at a time per deployment (launch's own lock is held only while it starts)."""
    return "tune-lock" if deployment is None else f"tune-lock-{deployment}"


def take_tune_lock(state_dir: str, client: ClientIdentity, break_token: str | None,
                   deployment: str | None) -> LockReply:  # fmt: skip
    """Take the deployment's tune lock unless another holds it (a stale one is broken by
    naming its token, as launch's is)."""
    folder = state_path(state_dir)
    os.makedirs(folder, exist_ok=True)
    guard = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # the folder is the mutex
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        path = state_path(state_dir, tune_lock_name(deployment))
        raw = read_bytes(path)
        if raw is not None:
            holder, token = lock_identity(raw)
            if not (break_token and token == break_token):
                return {"acquired": False, "token": None, "holder": holder}
        token = f"{client['host']}-{client['pid']}-{time.time_ns()}"
        write_json(path, dict(client, token=token, since=time.time(), deployment=deployment))
    finally:
        os.close(guard)
    return {"acquired": True, "token": token, "holder": None}


def release_lock(
    state_dir: str, token: str, deployment: str | None = None, name: str | None = None
) -> bool:
    path = state_path(state_dir, name or lock_name(deployment))
    holder = read_json(path)
    if isinstance(holder, dict) and holder.get("token") == token:
        os.unlink(path)
        return True
    return False


def module_found(module: str | None) -> bool:
    """Can `python -m module` find the module's top-level package (without importing it)?"""
    import importlib.util

    if not module:
        return True
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def port_free(host: str, port: int) -> tuple[bool, str]:
    import socket

    address = "0.0.0.0" if host in ("", "0.0.0.0") else host
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as sock:
        # Like the server will: connections in TIME_WAIT do not make the port busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, int(port)))
        except OSError as exc:
            return False, str(exc)
    return True, ""


def writable_dir(path: str) -> tuple[bool, str]:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return False, str(exc)
    return os.access(path, os.W_OK | os.X_OK), "not writable"


def cmd_preflight(args: PreflightArgs) -> PreflightReply:
    """Everything a launch needs to know, and the host lock, in one round trip."""
    probe = cmd_probe(args)
    log_dir = os.path.expanduser(args["log_dir"])
    free, port_error = port_free(args["bind_host"], args["port"])
    busy = {str(p): why for p in args["also_ports"] for ok, why in [port_free("", p)] if not ok}
    writable, log_dir_error = writable_dir(log_dir)
    version = next_log_version(log_dir, args["log_stem"], state_path(args["state_dir"], "runs"))
    return {
        **probe,
        "live_runs": live_runs(args["state_dir"]),
        "module_found": module_found(args["module"]),
        "port_free": free,
        "port_error": port_error,
        "busy_ports": busy,
        # As the server will see them: it runs from the home folder, and no shell expands a
        # `~` inside `--flag=~/x` for it.
        "paths": {
            p: os.path.exists(os.path.join(os.path.expanduser("~"), p)) for p in args["check_paths"]
        },
        "log_dir_writable": writable,
        "log_dir_error": log_dir_error,
        "next_log": os.path.join(log_dir, f"{args['log_stem']}_v{version}.log"),
        "next_version": version,
        "argv_check": argv_check(args["server_argv"], probe["sglang"]),
        "lock": take_lock(
            args["state_dir"], args["client"], args["break_lock"], args["deployment"], args["gpus"]
        ),
        "sbatch": shutil.which("sbatch"),
    }


def stat_fields(pid: int | str) -> list[bytes] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, session, …]; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def process_starttime(pid: int) -> int | None:
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])


def process_group(pgid: int, sid: int) -> list[int]:
    """PIDs whose process group and session are the run's (never anyone else's)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields and int(fields[2]) == pgid and int(fields[3]) == sid and fields[0] != b"Z":
            members.append(int(entry))
    return sorted(members)


def run_members(run: PollArgs | RunRecord) -> list[int]:
    """The run's live processes; none when its leader's PID now names another process.

    While any process of the run is left, Linux does not give its group id (the leader's
    PID) to a new process; so a process with that PID and another start time means the
    whole run is gone, and what shares that group now belongs to someone else.
    """
    recorded = run.get("starttime")
    if recorded is not None:
        now = process_starttime(run["pgid"])
        if now is not None and now != recorded:
            return []
    return process_group(run["pgid"], run["sid"])


def cmd_start(args: StartArgs) -> StartReply:
    """Start the server detached in its own session, logging to a new versioned file."""
    state_dir, log_dir = args["state_dir"], os.path.expanduser(args["log_dir"])
    runs = state_path(state_dir, "runs")
    os.makedirs(log_dir, exist_ok=True)
    for path, text in args["files"].items():  # what the command names, e.g. its config
        target = os.path.join(os.path.expanduser("~"), os.path.expanduser(path))
        if read_bytes(target) != text.encode():
            os.makedirs(os.path.dirname(target), exist_ok=True)
            write_atomic(target, text.encode(), mode=0o644)
    version = max(next_log_version(log_dir, args["log_stem"], runs), args["min_version"])
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
    record: RunRecord
    if args["batch"] is not None:
        os.close(log_fd)
        record = submit_job(args, run_id, log_path)
    else:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", "exec " + args["command"]],
            stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, cwd=os.path.expanduser("~"),
            env={**os.environ, **args["env"]},
        )  # fmt: skip
        os.close(log_fd)
        identity: LeaderIdentity = {}
        starttime = process_starttime(proc.pid)
        if starttime is not None:
            identity["starttime"] = starttime
        record = cast(RunRecord, {
            **args["run"],
            **identity,
            "id": run_id,
            "log": log_path,
            "pid": proc.pid,
            "pgid": proc.pid,
            "sid": proc.pid,
            "started_at": time.time(),
            "status": "running",
        })  # fmt: skip
    # Private: the record shows the (masked) command, and the .cmd file the real one.
    write_atomic(os.path.join(runs, run_id + ".cmd"), args["command"].encode(), mode=0o600)
    write_json(os.path.join(runs, run_id + ".env"), args["env"], mode=0o600)
    write_json(os.path.join(runs, run_id + ".json"), record, mode=0o600)
    write_atomic(os.path.join(runs, pointer_name(args["deployment"])), run_id.encode())
    if args["lock_token"]:
        release_lock(state_dir, args["lock_token"], args["deployment"])
    return {"run": record}


def server_address(bind_host: str) -> str:
    """Where a client on this host reaches a server bound to `bind_host` (any address: loopback)."""
    return "127.0.0.1" if bind_host in ("", "0.0.0.0", "::") else bind_host


def http_get(
    host: str, port: int, path: str, limit: int = 0, timeout: float = 0.5, method: str = "GET"
) -> tuple[int | None, bytes]:
    """GET `path` from the server on this host: the status code (None when nothing answers)
    and up to `limit` bytes of the body."""
    import socket

    address = server_address(host)
    try:
        with socket.create_connection((address, int(port)), timeout=timeout) as sock:
            request = f"{method} {path} HTTP/1.0\r\nHost: {address}\r\nContent-Length: 0\r\n\r\n"
            sock.sendall(request.encode())
            reply = sock.makefile("rb")
            status_line = reply.readline().split()
            while limit and reply.readline().strip():  # the headers
                pass
            body = reply.read(limit) if limit else b""
    except OSError:
        return None, b""
    code = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else None
    return code, body


# Real SGLang's /health (0.5.17: the same handler as /health_generate) sends a 1-token request
# to the scheduler and answers 200 only after a 1 s sleep, under load too: 0.5 s never saw it.
HEALTH_TIMEOUT = 5.0


def health(host: str, port: int) -> int | None:
    """GET /health on the host itself: the status code, or None when nothing answers."""
    return http_get(host, port, "/health", timeout=HEALTH_TIMEOUT)[0]


def read_from(path: str, offset: int, limit: int) -> tuple[int, bytes]:
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = size - limit if offset < 0 else offset
            handle.seek(max(0, min(start, size)))
            data = handle.read(limit)
    except OSError:
        return 0, b""
    return size, data


def cmd_poll(args: PollArgs) -> PollReply:
    """Is the run alive, is it healthy, and what did its log gain since `offset`.

    With `wait`, keep watching (in this one process) until something changes, so the
    caller learns of a ready line or a crash within ~50 ms instead of a poll interval. A
    Slurm job is asked of slurmctld at most every SLURM_QUERY_EVERY seconds meanwhile.
    """
    deadline = time.monotonic() + float(args["wait"])
    ref = args.get("job")
    job: JobInfo | None = None
    if ref is not None:
        recorded = current_run(ref["state_dir"], ref["run"])
        job = recorded.get("job") if recorded else None
    first, asked = job, 0.0
    while True:
        if ref is None:
            members = run_members(args)
            alive, address = bool(members), args["bind_host"]
        else:
            if time.monotonic() >= asked + SLURM_QUERY_EVERY:
                job, asked = query_job(ref["id"], job), time.monotonic()
            assert job is not None
            members, alive, address = [], job_alive(job), job["head"]
        size, data = read_from(args["log"], args["offset"], args["limit"])
        serving = alive and (ref is None or (job is not None and job["state"] == "RUNNING"))
        code = health(address, args["port"]) if serving and address else None
        if data or not alive or code == 200 or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if ref is not None and job is not None and _changed(first, job):
        remember_job(ref["state_dir"], ref["run"], job)
    return {
        "alive": alive,
        "members": members,
        "health": code,
        "size": size,
        "data": base64.b64encode(data).decode(),
        "job": job,
    }


def _changed(before: JobInfo | None, now: JobInfo) -> bool:
    """Worth writing to the record: anything but the time left, which changes every second."""
    if before is None:
        return True
    return {**before, "time_left": None} != {**now, "time_left": None}


def job_ref(state_dir: str, run: RunRecord) -> JobRef | None:
    """What a poll of the run needs to ask Slurm about it (None: a process on this host)."""
    if "job" not in run:
        return None
    return {"id": run["job"]["id"], "state_dir": state_dir, "run": run["id"]}


POINTER = "current"


def pointer_name(deployment: str | None) -> str:
    """The file naming a deployment's current run: `current`, or `current-NAME`."""
    return POINTER if deployment is None else f"{POINTER}-{deployment}"


def current_run(
    state_dir: str, run_id: str | None = None, deployment: str | None = None
) -> RunRecord | None:
    runs = state_path(state_dir, "runs")
    if run_id is None:
        current = read_bytes(os.path.join(runs, pointer_name(deployment)))
        if current is None:
            return None
        run_id = current.decode().strip()
    record: RunRecord | None = read_json(os.path.join(runs, run_id + ".json"))
    return record


def live_runs(state_dir: str) -> list[LiveRun]:
    """Every deployment's current run on this host that still has processes."""
    runs = state_path(state_dir, "runs")
    names = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
    found: list[LiveRun] = []
    for name in names:
        if name != POINTER and not name.startswith(POINTER + "-"):
            continue
        deployment = name[len(POINTER) + 1 :] or None
        run = current_run(state_dir, deployment=deployment)
        if not run or run["status"] != "running":
            continue
        job = query_job(run["job"]["id"], run["job"]) if "job" in run else None
        members = [] if job is not None else run_members(run)
        if members or (job is not None and job_alive(job)):
            live: LiveRun = {
                "id": run["id"],
                "pid": run["pid"],
                "deployment": deployment,
                "gpus": run.get("gpus"),
                "port": run["port"],
                "members": members,
                "origin": run.get("origin"),
            }
            if job is not None:
                live["job"] = job["id"]
            found.append(live)
    return found


def cmd_runs(args: RunsArgs) -> RunsReply:
    return {"live_runs": live_runs(args["state_dir"])}


def cmd_status(args: StatusArgs) -> StatusReply:
    """The current (or named) run with liveness, health and the tail of its log."""
    run = current_run(args["state_dir"], args["run"], args["deployment"])
    if run is None:
        nothing: PollReply = {
            "alive": False, "members": [], "health": None, "size": 0, "data": "", "job": None,
        }  # fmt: skip
        return {**nothing, "run": None, "command": None, "env": None, "metrics": None}
    poll_args: PollArgs = {
        "pgid": run["pgid"],
        "sid": run["sid"],
        "log": run["log"],
        "port": run["port"],
        "bind_host": run["bind_host"],
        "offset": -1,
        "limit": args["tail_bytes"],
        "wait": 0,
    }
    if "starttime" in run:
        poll_args["starttime"] = run["starttime"]
    ref = job_ref(args["state_dir"], run)
    if ref is not None:
        poll_args["job"] = ref
    poll = cmd_poll(poll_args)
    command = read_bytes(state_path(args["state_dir"], "runs", run["id"] + ".cmd"))
    env = read_json(state_path(args["state_dir"], "runs", run["id"] + ".env"))
    metrics: MetricsPage | None = None
    if args["metrics_bytes"] > 0 and poll["alive"]:
        address = run["bind_host"] if poll["job"] is None else poll["job"]["head"]
        code, body = http_get(address, run["port"], "/metrics", args["metrics_bytes"], 2.0)
        metrics = {"status": code, "text": body.decode("utf-8", "replace")}
    return {
        **poll,
        "run": run,
        "command": None if command is None else command.decode(),
        "env": env if isinstance(env, dict) else None,
        "metrics": metrics,
    }


def cmd_stop(args: StopArgs) -> StopReply:
    """SIGTERM the run's process group, SIGKILL what is left after the timeout."""
    state_dir = args["state_dir"]
    run = current_run(state_dir, args["run"], args["deployment"])
    if run is None:
        return {"run": None, "ended": [], "killed": [], "left": [], "job": None}
    if "job" in run:
        return stop_job_run(state_dir, run, float(args["timeout"]))
    members = run_members(run)
    killed: list[int] = []
    record = state_path(state_dir, "runs", run["id"] + ".json")
    if members and run["status"] == "running":
        run = cast(RunRecord, dict(run, stop_requested_at=time.time()))
        write_json(record, run)
    if members:
        os.killpg(run["pgid"], signal.SIGTERM)
        deadline = time.monotonic() + float(args["timeout"])
        while run_members(run) and time.monotonic() < deadline:
            time.sleep(0.05)
        killed = run_members(run)
        if killed:
            os.killpg(run["pgid"], signal.SIGKILL)
            while run_members(run) and time.monotonic() < deadline + 10:
                time.sleep(0.05)
    if run["status"] == "running":
        run = cast(RunRecord, dict(run, status="stopped", stopped_at=time.time()))
        write_json(record, run)
    left = run_members(run)
    return {"run": run, "ended": members, "killed": killed, "left": left, "job": None}


def stop_job_run(state_dir: str, run: RunRecord, timeout: float) -> StopReply:
    """cmd_stop for a run that is a Slurm job: scancel, then the record as cmd_stop keeps it."""
    record = state_path(state_dir, "runs", run["id"] + ".json")
    was = query_job(run["job"]["id"], run["job"])
    if job_alive(was) and run["status"] == "running":
        run = cast(RunRecord, dict(run, stop_requested_at=time.time(), job=was))
        write_json(record, run, mode=0o600)
    job = stop_job(state_dir, run, timeout) if job_alive(was) else was
    run = cast(RunRecord, dict(current_run(state_dir, run["id"]) or run, job=job))
    if run["status"] == "running":
        run = cast(RunRecord, dict(run, status="stopped", stopped_at=time.time()))
    write_json(record, run, mode=0o600)
    return {"run": run, "ended": [], "killed": [], "left": [], "job": job}


# ---- Slurm jobs ------------------------------------------------------------------------------
# On a login node (`launcher: slurm`) a run is a batch job: sbatch starts it, squeue (then
# sacct, once slurmctld has forgotten it) says whether it lives, and its server answers on
# the head node. The state it ended in is kept in its record: MinJobAge purges it from
# slurmctld, and a cluster need not keep accounting.

# States in which a job holds (or waits for) its allocation.
ACTIVE_JOB_STATES = frozenset(
    {
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
        "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
        "RESV_DEL_HOLD",
    }
)  # fmt: skip
SQUEUE_FORMAT = "%i|%T|%r|%N|%L"
# The longest a query of slurmctld may take before the job's state counts as unknown.
SLURM_TIMEOUT = 30.0
# The least time between two queries of one job inside one poll: slurmctld serves everyone.
SLURM_QUERY_EVERY = 0.5


def slurm(*argv: str) -> tuple[int, str]:
    """Run a Slurm client command: its exit status and its output (stderr after stdout)."""
    try:
        done = subprocess.run(
            list(argv), check=False, capture_output=True, text=True, timeout=SLURM_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except FileNotFoundError:
        return 127, f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not answer within {SLURM_TIMEOUT:.0f} s"
    return done.returncode, (done.stdout + done.stderr).strip()


def parse_slurm_duration(text: str) -> float | None:
    """Seconds in squeue's `[days-]hours:minutes:seconds` (or `minutes:seconds`); None for
    UNLIMITED, NOT_SET, INVALID and anything else that is no duration."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_squeue(text: str, job_id: str) -> JobInfo | None:
    """The job's line of `squeue --format=SQUEUE_FORMAT --noheader`; None when absent."""
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5 or fields[0] != job_id:
            continue
        _, state, reason, nodelist, left = fields
        running = state in ACTIVE_JOB_STATES and state != "PENDING"
        return {
            "id": job_id,
            "state": state,
            "reason": "" if reason in ("None", "(null)") else reason,
            "nodes": [nodelist] if nodelist and nodelist != "(null)" else [],
            "head": "",
            "time_left": parse_slurm_duration(left) if running else None,
            "exit_code": "",
        }
    return None


def parse_sacct(text: str, job_id: str) -> JobInfo | None:
    """The job's last line of `sacct [--completion] -X -n -P -o JobID,State,ExitCode,NodeList`
    (the completion log has a line per start of a requeued job); None when absent. sacct
    writes `CANCELLED by 1000`: the state is the first word."""
    found: JobInfo | None = None
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or fields[0] != job_id:
            continue
        _, state, exit_code, nodelist = fields
        found = {
            "id": job_id,
            "state": state.split()[0] if state.split() else "UNKNOWN",
            "reason": "",
            "nodes": [nodelist] if nodelist not in ("", "None assigned", "(null)") else [],
            "head": "",
            "time_left": None,
            "exit_code": exit_code,
        }
    return found


def parse_node_address(text: str) -> str:
    """`NodeAddr=` of `scontrol show node NAME`; "" when it has none."""
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", text)
    return match.group(1) if match else ""


def query_job(job_id: str, known: JobInfo | None) -> JobInfo:
    """The job's state now: squeue, else sacct, else what its record last knew (UNKNOWN if
    nothing did). Its node list is expanded and its head node's address looked up."""
    code, out = slurm("squeue", f"--jobs={job_id}", "--states=all", "--noheader",
                      f"--format={SQUEUE_FORMAT}")  # fmt: skip
    if code and "Invalid job id" not in out:
        # slurmctld did not answer: that says nothing of the job, which must not be taken
        # for dead (and restarted beside itself).
        last = out.splitlines()[-1] if out else f"exit status {code}"
        fail(f"squeue failed on the login node: {last}", "host")
    found = parse_squeue(out, job_id) if code == 0 else None
    # Forgotten by slurmctld (MinJobAge): accounting, else the job completion log, which a
    # cluster without accounting (slurmdbd) may keep.
    for source in ([], ["--completion"]):
        if found is None:
            code, out = slurm("sacct", *source, f"--jobs={job_id}", "-X", "-n", "-P",
                              "--format=JobID,State,ExitCode,NodeList")  # fmt: skip
            found = parse_sacct(out, job_id) if code == 0 else None
    if found is None:
        if known is not None and known["state"] not in ACTIVE_JOB_STATES:
            return known  # ended, and forgotten since: its record remembers how
        # Ended some way nobody kept. Where it ran stays known: a router lists it at its head.
        last = f"last seen {known['state']}; " if known is not None else ""
        unknown: JobInfo = {
            "id": job_id, "state": "UNKNOWN",
            "reason": f"{last}Slurm no longer knows the job and keeps no record of its end",
            "nodes": known["nodes"] if known else [], "head": known["head"] if known else "",
            "time_left": None, "exit_code": "",
        }  # fmt: skip
        return unknown
    if found["nodes"]:
        if known is not None and known["nodes"] and known["head"]:
            found["nodes"], found["head"] = known["nodes"], known["head"]
        else:
            code, out = slurm("scontrol", "show", "hostnames", found["nodes"][0])
            names = out.split() if code == 0 and out else found["nodes"]
            found["nodes"] = names
            code, out = slurm("scontrol", "show", "node", names[0])
            found["head"] = (parse_node_address(out) if code == 0 else "") or names[0]
    if found["state"] not in ACTIVE_JOB_STATES and not found["exit_code"]:
        code, out = slurm("scontrol", "show", "job", job_id)
        match = re.search(r"(?:^|\s)ExitCode=(\S+)", out) if code == 0 else None
        found["exit_code"] = match.group(1) if match else ""
    return found


def job_alive(job: JobInfo) -> bool:
    return job["state"] in ACTIVE_JOB_STATES


def remember_job(state_dir: str, run_id: str, job: JobInfo) -> None:
    """Keep the job's state in its run's record when it changed (its end, its nodes)."""
    path = state_path(state_dir, "runs", run_id + ".json")
    record = read_json(path)
    if isinstance(record, dict) and record.get("job") != job:
        write_json(path, dict(record, job=job), mode=0o600)


def submit_job(args: StartArgs, run_id: str, log_path: str) -> RunRecord:
    """sbatch the batch script, logging to the run's (new, empty) log; the run's record."""
    runs = state_path(args["state_dir"], "runs")
    os.makedirs(runs, exist_ok=True)
    script = os.path.join(runs, run_id + ".sbatch")
    write_atomic(script, (args["batch"] or "").encode(), mode=0o600)
    code, out = slurm(
        "sbatch", "--parsable", f"--job-name={run_id}", f"--output={log_path}",
        "--open-mode=append", f"--chdir={os.path.expanduser('~')}", script,
    )  # fmt: skip
    job_id = out.splitlines()[-1].split(";")[0].strip() if code == 0 and out else ""
    if not job_id.isdigit():
        # Nothing was started: the empty log and the script are ours to take back.
        for path in (log_path, script):
            with contextlib.suppress(OSError):
                os.unlink(path)
        last = out.splitlines()[-1] if out else f"exit status {code}"
        fail(f"sbatch refused the job: {last}", "host")
    job: JobInfo = {
        "id": job_id, "state": "PENDING", "reason": "", "nodes": [], "head": "",
        "time_left": None, "exit_code": "",
    }  # fmt: skip
    # pid, pgid and sid 0: no process here is the run's (run_members is never asked).
    return cast(RunRecord, {
        **args["run"],
        "job": job,
        "id": run_id,
        "log": log_path,
        "pid": 0,
        "pgid": 0,
        "sid": 0,
        "started_at": time.time(),
        "status": "running",
    })  # fmt: skip


def stop_job(state_dir: str, run: RunRecord, timeout: float) -> JobInfo:
    """SIGTERM the job's steps (the server shuts down as it would here), cancel it outright
    after `timeout`, and wait until Slurm says it has ended."""
    known = run["job"]
    job = query_job(known["id"], known)
    if job["state"] == "PENDING":
        slurm("scancel", job["id"])
    elif job_alive(job):
        slurm("scancel", "--signal=TERM", job["id"])
    deadline = time.monotonic() + timeout
    cancelled = job["state"] == "PENDING"
    while job_alive(job):
        if not cancelled and time.monotonic() >= deadline:
            slurm("scancel", job["id"])  # TERM again, then KILL after the cluster's KillWait
            cancelled = True
        if time.monotonic() >= deadline + 120:
            break
        time.sleep(0.25)
        job = query_job(job["id"], job)
    remember_job(state_dir, run["id"], job)
    return job


def cmd_point(args: PointArgs) -> PointReply:
    """Make a recorded run the deployment's current one (a successor that failed gives way
    to the run it was to replace)."""
    if current_run(args["state_dir"], args["run"]) is None:
        return {"pointed": False}
    runs = state_path(args["state_dir"], "runs")
    write_atomic(os.path.join(runs, pointer_name(args["deployment"])), args["run"].encode())
    return {"pointed": True}


def cmd_release(args: ReleaseArgs) -> ReleaseReply:
    return {"released": release_lock(args["state_dir"], args["token"], args["deployment"])}


class TuneLockArgs(TypedDict):
    state_dir: str
    deployment: str | None
    client: ClientIdentity
    break_lock: str | None  # the token of a stale holder to replace


def cmd_tune_lock(args: TuneLockArgs) -> LockReply:
    return take_tune_lock(args["state_dir"], args["client"], args["break_lock"], args["deployment"])


def cmd_tune_unlock(args: ReleaseArgs) -> ReleaseReply:
    name = tune_lock_name(args["deployment"])
    return {"released": release_lock(args["state_dir"], args["token"], name=name)}


# ---- bench ---------------------------------------------------------------------------------
# The load generator runs here, on the server's own host: the network and the bind address
# then do not matter, and the metric definitions live in one place.


class BenchArgs(TypedDict):
    bind_host: str
    port: int
    concurrency: int
    prompts: int
    input_len: int
    output_len: int
    flush: bool
    timeout: float
    tool: str  # "builtin" (this agent's generator) or "sglang" (SGLang's serving benchmark)
    env: dict[str, str]  # the run's own variables (HF_HOME, …): the sglang tool runs with them


class Spread(TypedDict):
    p50: float | None
    p99: float | None


class BenchLevel(TypedDict):
    concurrency: int
    prompts: int
    completed: int
    failed: int
    errors: list[str]  # the first few
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms: Spread
    itl_ms: Spread  # builtin: gaps between streamed chunks (bench_serving's OpenAI backends);
    # sglang: per token, a chunk's gap divided by the tokens it brought (its native backend)
    e2e_ms: Spread


class Timing(TypedDict):
    error: str
    ttft: float
    itl: list[float]
    e2e: float
    tokens: int


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread_ms(values: list[float]) -> Spread:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return {
        "p50": None if p50 is None else p50 * 1000,
        "p99": None if p99 is None else p99 * 1000,
    }


def bench_prompt(index: int, words: int) -> str:
    """Random words, about one token each; `index` seeds them, so no two prompts share a
    prefix the server's cache could reuse."""
    import random

    rng = random.Random(index)
    return " ".join(f"w{rng.randrange(100000)}" for _ in range(words))


def stream_completion(args: BenchArgs, prompt: str) -> Timing:
    """One streamed /v1/completions request (EOS ignored), timed from the request."""
    import http.client

    body = json.dumps(
        {
            "model": "default",
            "prompt": prompt,
            "max_tokens": args["output_len"],
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    address = server_address(args["bind_host"])
    timing: Timing = {"error": "", "ttft": 0.0, "itl": [], "e2e": 0.0, "tokens": 0}
    start = time.perf_counter()
    last: float | None = None
    try:
        conn = http.client.HTTPConnection(address, args["port"], timeout=args["timeout"])
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            timing["error"] = f"HTTP {response.status} from /v1/completions"
            return timing
        finished = False
        for raw in response:
            finished = finished or raw.startswith(b"data: [DONE]")
            if not raw.startswith(b"data: {"):
                continue
            now = time.perf_counter()
            chunk = json.loads(raw[6:])
            if chunk.get("usage"):
                timing["tokens"] = int(chunk["usage"].get("completion_tokens") or 0)
            choices = chunk.get("choices") or []
            if not (choices and choices[0].get("text")):
                continue
            if last is None:
                timing["ttft"] = now - start
            else:
                timing["itl"].append(now - last)
            last = now
        conn.close()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        timing["error"] = str(exc) or type(exc).__name__
        return timing
    timing["e2e"] = time.perf_counter() - start
    if last is None:
        timing["error"] = "no token streamed"
    elif not finished:  # the server went away mid-answer: not a completed request
        timing["error"] = f"the stream ended before [DONE], after {len(timing['itl']) + 1} chunks"
    return timing


def cmd_bench(args: BenchArgs) -> BenchLevel:
    """One load level: flush the prefix cache, then keep `concurrency` streams busy until
    `prompts` requests have finished; report the level's figures."""
    import threading

    if args["tool"] == "sglang":
        return bench_serving_level(args)
    if args["flush"]:
        http_get(args["bind_host"], args["port"], "/flush_cache", method="POST")
    timings: list[Timing] = []
    lock = threading.Lock()
    indices = iter(range(args["prompts"]))

    def worker() -> None:
        while True:
            with lock:
                index = next(indices, None)
            if index is None:
                return
            timing = stream_completion(args, bench_prompt(index, args["input_len"]))
            with lock:
                timings.append(timing)

    begin = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args["concurrency"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    duration = time.perf_counter() - begin
    done = [t for t in timings if not t["error"]]
    tokens = sum(t["tokens"] for t in done)
    return {
        "concurrency": args["concurrency"],
        "prompts": args["prompts"],
        "completed": len(done),
        "failed": len(timings) - len(done),
        "errors": sorted({t["error"] for t in timings if t["error"]})[:3],
        "duration_s": duration,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / duration if duration > 0 else 0.0,
        "requests_per_s": len(done) / duration if duration > 0 else 0.0,
        "ttft_ms": spread_ms([t["ttft"] for t in done]),
        "itl_ms": spread_ms([gap for t in done for gap in t["itl"]]),
        "e2e_ms": spread_ms([t["e2e"] for t in done]),
    }


def bench_serving_module(site: str) -> str | None:
    """SGLang's serving benchmark in this installation: `sglang.benchmark.serving` since
    0.5.23 (where `sglang.bench_serving` is a deprecated alias), `sglang.bench_serving` before."""
    for module in ("sglang.benchmark.serving", "sglang.bench_serving"):
        if os.path.isfile(os.path.join(site, *module.split(".")) + ".py"):
            return module
    return None


def bench_serving_argv(module: str, args: BenchArgs, output_file: str) -> list[str]:
    """SGLang's benchmark for one level, as close to the builtin's as it goes: its default
    backend (native /generate), random token ids sent as ids (exact input lengths, no
    dataset download), exact output lengths, EOS ignored (its default)."""
    address = server_address(args["bind_host"])
    argv = [
        sys.executable, "-m", module, "--backend", "sglang",
        "--host", address, "--port", str(args["port"]),
        "--dataset-name", "random-ids", "--tokenize-prompt", "--random-range-ratio", "1.0",
        "--random-input-len", str(args["input_len"]), "--random-output-len", str(args["output_len"]),
        "--num-prompts", str(args["prompts"]), "--max-concurrency", str(args["concurrency"]),
        "--request-rate", "inf", "--disable-tqdm", "--output-details", "--output-file", output_file,
    ]  # fmt: skip
    return [*argv, "--flush-cache"] if args["flush"] else argv


def bench_serving_level(args: BenchArgs) -> BenchLevel:
    """One level run by SGLang's own serving benchmark, read back from its JSONL result."""
    install = sglang_install()
    if "error" in install:
        fail(install["error"] + "; --tool builtin needs only the standard library", "host")
    module = bench_serving_module(install["site"])
    if module is None:
        fail(f"SGLang {install.get('version')} for {sys.executable} has no bench_serving", "host")
    with tempfile.TemporaryDirectory(prefix="deployctl-bench-") as folder:
        result_file = os.path.join(folder, "result.jsonl")
        try:
            done = subprocess.run(
                bench_serving_argv(module, args, result_file),
                check=False,
                cwd=folder,
                # Unbuffered, so its last line is its last word.
                env={**os.environ, **args["env"], "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=args["timeout"],
            )
        except subprocess.TimeoutExpired:
            fail(f"{module} ran past {args['timeout']:g} s", "host")
        lines = (read_bytes(result_file) or b"").decode(errors="replace").splitlines()
        if done.returncode != 0 or not lines:
            said = [ln for ln in done.stdout.decode(errors="replace").splitlines() if ln.strip()]
            last = said[-1].strip() if said else "no output"
            fail(f"{module} exited {done.returncode}: {last}", "host")
    try:
        return bench_serving_result(args, json.loads(lines[-1]))
    except (ValueError, KeyError, TypeError) as exc:
        fail(f"{module} wrote a result this agent cannot read ({exc!r})", "host")


def bench_serving_result(args: BenchArgs, result: dict[str, Any]) -> BenchLevel:
    """SGLang's benchmark result (one JSONL line with --output-details) as a level."""

    def spread(name: str) -> Spread:
        return {"p50": result[f"median_{name}"], "p99": result[f"p99_{name}"]}

    errors = sorted({e.strip().splitlines()[-1] for e in result.get("errors", []) if e.strip()})
    return {
        "concurrency": args["concurrency"],
        "prompts": args["prompts"],
        "completed": result["completed"],
        "failed": args["prompts"] - result["completed"],
        "errors": errors[:3],
        "duration_s": result["duration"],
        "output_tokens": result["total_output_tokens"],
        "output_tokens_per_s": result["output_throughput"],
        "requests_per_s": result["request_throughput"],
        "ttft_ms": spread("ttft_ms"),
        "itl_ms": spread("itl_ms"),
        "e2e_ms": spread("e2e_latency_ms"),
    }


class BenchSaveArgs(TypedDict):
    state_dir: str
    run: str
    result: dict[str, Any]


class BenchSaveReply(TypedDict):
    path: str


def bench_dir(state_dir: str, run: str) -> str:
    return state_path(state_dir, "runs", run + ".bench")


def keep_numbered(folder: str, document: Callable[[int], Any]) -> tuple[int, str]:
    """Write `document(number)` as the folder's next numbered JSON file, never overwriting
    one."""
    os.makedirs(folder, exist_ok=True)
    number = 1 + max((int(n[:-5]) for n in os.listdir(folder) if n[:-5].isdigit()), default=0)
    while True:
        path = os.path.join(folder, f"{number}.json")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            number += 1
    with os.fdopen(fd, "w") as handle:
        json.dump(document(number), handle)
    return number, path


def numbered_files(folder: str) -> list[tuple[int, str]]:
    """The folder's numbered JSON files, oldest first."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted((int(n[:-5]), os.path.join(folder, n)) for n in names if n[:-5].isdigit())


def cmd_bench_save(args: BenchSaveArgs) -> BenchSaveReply:
    """Keep a bench result beside its run's record as the next numbered file."""
    _, path = keep_numbered(bench_dir(args["state_dir"], args["run"]), lambda _: args["result"])
    return {"path": path}


class BenchResultsArgs(TypedDict):
    state_dir: str
    runs: list[str]


class BenchResultsReply(TypedDict):
    results: dict[str, list[dict[str, Any]]]  # run id → its bench results, oldest first
    unreadable: list[str]  # kept files that are not JSON or not a sweep: skipped


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_QUANTILES = ("p50", "p99")


def _level_shape(level: Any) -> bool:
    """A level as BenchLevel declares it: what `--compare`, `--plot` and `--json` read."""
    if not isinstance(level, dict) or not isinstance(level.get("errors"), list):
        return False
    counts = ("concurrency", "prompts", "completed", "failed", "output_tokens")
    rates = ("duration_s", "output_tokens_per_s", "requests_per_s")
    spreads = [level.get(key) for key in ("ttft_ms", "itl_ms", "e2e_ms")]
    return (
        all(_number(level.get(key)) and isinstance(level[key], int) for key in counts)
        and all(_number(level.get(key)) for key in rates)
        and all(
            isinstance(s, dict)
            and all(q in s and (s[q] is None or _number(s[q])) for q in _QUANTILES)
            for s in spreads
        )
    )


def is_sweep(document: Any) -> bool:
    """A kept bench result: a mapping whose `levels` are each shaped as BenchLevel."""
    if not isinstance(document, dict) or not isinstance(document.get("levels"), list):
        return False
    return all(_level_shape(level) for level in document["levels"])


def cmd_bench_results(args: BenchResultsArgs) -> BenchResultsReply:
    found: dict[str, list[dict[str, Any]]] = {}
    unreadable: list[str] = []
    for run in args["runs"]:
        found[run] = []
        for _, path in numbered_files(bench_dir(args["state_dir"], run)):
            document = read_json(path)
            if is_sweep(document):
                found[run].append(document)
            else:  # said, not skipped silently, nor left for the client to trip over
                unreadable.append(path)
    return {"results": found, "unreadable": unreadable}


class TuneSaveArgs(TypedDict):
    state_dir: str
    record: dict[str, Any]


class TuneSaveReply(TypedDict):
    number: int
    path: str


def tune_dir(state_dir: str) -> str:
    return state_path(state_dir, "tunes")


def cmd_tune_save(args: TuneSaveArgs) -> TuneSaveReply:
    """Keep a tune record as the next numbered file, with its number in it."""
    record = args["record"]
    number, path = keep_numbered(tune_dir(args["state_dir"]), lambda n: {**record, "tune": n})
    return {"number": number, "path": path}


class TuneRecordsArgs(TypedDict):
    state_dir: str
    number: int | None  # None: the newest
    deployment: str | None


class TuneRecordsReply(TypedDict):
    record: dict[str, Any] | None
    numbers: list[int]  # every kept tune of the deployment, oldest first
    unreadable: list[str]


NONE = type(None)
# What every reader of a tune record indexes (tune.json's `record` requires these too), and
# its types: a record without one is named as unreadable and skipped, never shown half.
TUNE_RECORD_KEYS: dict[str, tuple[type, ...]] = {
    "host": (str,), "deployment": (str, NONE), "tune": (int, NONE), "outcome": (str,),
    "outcome_note": (str,), "threshold": (int, NONE), "threshold_mode": (str,),
    "phases": (dict,), "refined_levels": (list,), "envelope_ratio": (dict,),
    "min_ratio": (int, float), "held": (bool,), "serving": (str, NONE), "launches": (int,),
    "levels_measured": (int,),
}  # fmt: skip


def is_tune_record(document: Any) -> bool:
    return isinstance(document, dict) and all(
        key in document and isinstance(document[key], kinds)
        for key, kinds in TUNE_RECORD_KEYS.items()
    )


def cmd_tune_records(args: TuneRecordsArgs) -> TuneRecordsReply:
    kept: dict[int, dict[str, Any]] = {}
    unreadable: list[str] = []
    for number, path in numbered_files(tune_dir(args["state_dir"])):
        document = read_json(path)
        if not is_tune_record(document):
            unreadable.append(path)
        elif document.get("deployment") == args["deployment"]:
            kept[number] = document
    wanted = args["number"] if args["number"] is not None else max(kept, default=None)
    return {
        "record": kept.get(wanted) if wanted is not None else None,
        "numbers": sorted(kept),
        "unreadable": unreadable,
    }


# ---- a router's worker list (SGLang's sglang-router) -----------------------------------------


class RouterArgs(TypedDict):
    bind_host: str  # the router's --host and --port, reached from its own host
    port: int
    action: str  # "list", "add", "remove" or "health" (does `url` answer /health now?)
    url: str | None  # the worker to add or remove
    wait: float  # seconds to wait for the change to show in the router's list


class RouterWorker(TypedDict):
    id: str | None  # None on a legacy router (it names workers by URL)
    url: str
    healthy: bool | None  # None: the router does not say
    load: int | None


class RouterReply(TypedDict):
    api: str | None  # "workers" (0.3 and later), "legacy" (up to 0.2.1), None: no router answers
    # Why the action did not happen ("" when it did); not `error`, which is the agent's own
    # failure answer.
    problem: str
    workers: list[RouterWorker]  # the list after the action


ROUTER_TIMEOUT = 5.0


def http_call(
    host: str, port: int, method: str, path: str, body: Any = None
) -> tuple[int | None, bytes]:
    """One HTTP request to a server on this host: its status (None: nothing answers) and body."""
    import http.client

    conn = http.client.HTTPConnection(server_address(host), int(port), timeout=ROUTER_TIMEOUT)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        conn.request(method, path, body=data, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return None, b""
    finally:
        conn.close()


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def router_list(host: str, port: int) -> tuple[str | None, list[RouterWorker], str]:
    """Which registration API the router speaks, its workers, and why none when it fails."""
    status, body = http_call(host, port, "GET", "/workers")
    found = _json_or_none(body) if status == 200 else None
    if isinstance(found, dict) and isinstance(found.get("workers"), list):
        workers: list[RouterWorker] = [
            {
                "id": str(w.get("id")) if w.get("id") is not None else None,
                "url": str(w.get("url")),
                "healthy": w.get("is_healthy") if isinstance(w.get("is_healthy"), bool) else None,
                "load": w.get("load") if isinstance(w.get("load"), int) else None,
            }
            for w in found["workers"]
            if isinstance(w, dict) and w.get("url")
        ]
        return "workers", workers, ""
    if status is None:
        return None, [], f"nothing answers on {server_address(host)}:{port}"
    legacy_status, legacy_body = http_call(host, port, "GET", "/list_workers")
    urls = _json_or_none(legacy_body) if legacy_status == 200 else None
    if isinstance(urls, dict) and isinstance(urls.get("urls"), list):
        listed: list[RouterWorker] = [
            {"id": None, "url": str(u), "healthy": None, "load": None} for u in urls["urls"]
        ]
        return "legacy", listed, ""
    return None, [], f"no router API answers on port {port} (GET /workers: {status})"


def _router_change(args: RouterArgs, api: str, workers: list[RouterWorker]) -> str:
    """Ask the router to add or remove the worker; the reason when it refuses."""
    from urllib.parse import quote

    host, port, url = args["bind_host"], args["port"], str(args["url"])
    adding = args["action"] == "add"
    if api == "legacy":
        path = f"/{'add' if adding else 'remove'}_worker?url={quote(url, safe='')}"
        status, body = http_call(host, port, "POST", path)
    elif adding:
        status, body = http_call(host, port, "POST", "/workers", {"url": url})
    else:
        ids = [w["id"] for w in workers if w["url"] == url and w["id"]]
        if not ids:
            return ""
        status, body = http_call(host, port, "DELETE", f"/workers/{ids[0]}")
    if status is not None and 200 <= status < 300:
        return ""
    reason = body.decode("utf-8", "replace").strip().splitlines()
    return f"the router answered {status or 'nothing'}" + (f": {reason[0][:200]}" if reason else "")


def _router_done(args: RouterArgs, workers: list[RouterWorker]) -> bool:
    listed = [w for w in workers if w["url"] == args["url"]]
    if args["action"] == "remove":
        return not listed
    return bool(listed) and listed[0]["healthy"] is not False


def _generates(url: str, path: str = "/health_generate") -> str:
    """Ask the worker, from the router's host, to generate (`/health_generate`): a worker
    is added only when it serves, and where its router reaches it. Why not, else ""."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + path, timeout=30) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        return f"{url} cannot be reached from the router's host: {exc}"
    return "" if status == 200 else f"{url}{path} answered {status}"


def cmd_router(args: RouterArgs) -> RouterReply:
    """List a router's workers, or add or remove one and wait until its list shows it
    (healthy, for an addition) or `wait` runs out: 0.3's router does both in the background.
    A worker is added only once its /health_generate answers 200 from here."""
    host, port = args["bind_host"], args["port"]
    api, workers, error = router_list(host, port)
    if api is None or args["action"] == "list":
        return {"api": api, "problem": error, "workers": workers}
    if args["action"] == "health":  # does the URL answer /health now, seen from the router?
        return {"api": api, "problem": _generates(str(args["url"]), "/health"), "workers": workers}
    deadline = time.monotonic() + args["wait"]
    if args["action"] == "add":
        error = _generates(str(args["url"]))
        while error and time.monotonic() < deadline:  # a server just up may answer 503 a while
            time.sleep(0.5)
            error = _generates(str(args["url"]))
    if not error and not _router_done(args, workers):
        error = _router_change(args, api, workers)
    while not error:
        api, workers, error = router_list(host, port)
        if api is None or _router_done(args, workers):
            break
        if time.monotonic() > deadline:
            seen = "still listed" if args["action"] == "remove" else "not listed healthy"
            error = f"{args['url']} is {seen} after {args['wait']:g}s"
            break
        time.sleep(0.2)
    return {"api": api, "problem": error, "workers": workers}


# ---- held locks ----------------------------------------------------------------------------


class HoldArgs(TypedDict):
    state_dir: str
    name: str  # the lock: a router deployment's name
    holder: dict[str, Any]  # who takes it, kept in the file for the next taker to name


class HoldReply(TypedDict):
    acquired: bool
    holder: dict[str, Any] | None  # who holds it, when not acquired ({} if it does not say)


ROUTER_LOCKS = "router-locks"
# The file descriptor of the lock this process holds: open until the process ends.
_held: list[int] = []


def cmd_hold(args: HoldArgs) -> HoldReply:
    """Take a lock that lives as long as this process: main() then waits for the client to
    close stdin (or to vanish with its connection), so no lock outlives its holder."""
    folder = state_path(args["state_dir"], ROUTER_LOCKS)
    os.makedirs(folder, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", args["name"]) or "_"
    fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raw = os.read(fd, 1 << 16)
        os.close(fd)
        try:
            holder = json.loads(raw)
        except ValueError:
            holder = None
        return {"acquired": False, "holder": holder if isinstance(holder, dict) else {}}
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(dict(args["holder"], since=time.time())).encode())
    _held.append(fd)
    return {"acquired": True, "holder": None}


def _hold_until_eof() -> None:
    """Keep the lock until the client closes our stdin, or its connection ends."""
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass


# ---- entry point ---------------------------------------------------------------------------


def main() -> None:
    # A dropped connection must not interrupt a change half-way: finish or roll back.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # The server runs `python -m` from the home folder (cmd_start): look for modules there.
    sys.path[0] = os.path.expanduser("~")
    call, args = sys.argv[1], json.loads(sys.argv[2])
    payload = sys.stdin.buffer.read() if call == "apply" else b""
    handlers: dict[str, Callable[[], Any]] = {
        "probe": lambda: cmd_probe(args),
        "read": lambda: cmd_read(args),
        "apply": lambda: cmd_apply(args, payload),
        "revert": lambda: cmd_revert(args),
        "preflight": lambda: cmd_preflight(args),
        "check_args": lambda: cmd_check_args(args),
        "start": lambda: cmd_start(args),
        "poll": lambda: cmd_poll(args),
        "status": lambda: cmd_status(args),
        "stop": lambda: cmd_stop(args),
        "release": lambda: cmd_release(args),
        "point": lambda: cmd_point(args),
        "runs": lambda: cmd_runs(args),
        "bench": lambda: cmd_bench(args),
        "bench_save": lambda: cmd_bench_save(args),
        "bench_results": lambda: cmd_bench_results(args),
        "tune_save": lambda: cmd_tune_save(args),
        "tune_records": lambda: cmd_tune_records(args),
        "tune_lock": lambda: cmd_tune_lock(args),
        "tune_unlock": lambda: cmd_tune_unlock(args),
        "router": lambda: cmd_router(args),
        "hold": lambda: cmd_hold(args),
    }
    if call not in handlers:
        fail(f"unknown agent call {call!r}", "agent")
    try:
        result = handlers[call]()
    except OSError as exc:  # a missing home, a state_dir that is a file, a read-only disk
        where = f": {exc.filename}" if exc.filename else ""
        fail(f"{call} failed on the host: {exc.strerror or exc}{where}", "host")
    except Exception as exc:  # one line for the client, never a traceback on its screen
        fail(f"{call} failed on the host: {type(exc).__name__}: {exc}", "agent")
    try:
        sys.stdout.write(REPLY_MARK + json.dumps(result) + "\n")
        sys.stdout.flush()
    except OSError:
        pass
    if _held:
        _hold_until_eof()


if __name__ == "__main__":
    main()
