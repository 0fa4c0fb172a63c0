"""The launch lock and the tune lock under state_dir."""

from __future__ import annotations

import fcntl
import os
import time

from .files import read_bytes, read_json, state_path, write_json
from .lean import loads, sha256_hex
from .wire import LOCK_PREFIX, shares_gpus

TYPE_CHECKING = False  # the types for the checker only (files.py says why)
if TYPE_CHECKING:
    from typing import Any

    from .protocol import ClientIdentity, LockReply, ReleaseArgs, ReleaseReply, TuneLockArgs


def lock_identity(raw: bytes) -> tuple[dict[str, Any], str]:
    """The lock file as a dict and the token that names it.

    A record without a token of its own (hand-made, or cut short) is named by its content's
    hash, so that exactly that record can be broken and nothing written after it.
    """
    try:
        holder = loads(raw.decode())
    except (ValueError, RecursionError):
        holder = None
    if not isinstance(holder, dict):
        holder = {}
    token = holder.get("token")
    if not isinstance(token, str) or not token:
        token = "sha256:" + sha256_hex(raw)
    return dict(holder, token=token), token


# Where the machine's identity is kept (systemd's, then D-Bus's older place), and the id of
# the kernel's current boot: a cloned image may share the first, never the second.
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def _first_line(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read(200).decode("ascii", errors="replace").strip()
    except OSError:
        return ""


def machine_identity() -> str:
    """`<machine-id>/<boot-id>`: two names that find the same one reach one running
    machine; "" where neither can be read."""
    found = next((i for i in map(_first_line, MACHINE_ID_FILES) if i), "")
    boot = _first_line(BOOT_ID_FILE)
    return f"{found}/{boot}" if found or boot else ""


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


# The op of a launch whose deployments share a GPU (ops/plan.py says it; the agent may not be
# imported there): its locks on that GPU are held together.
SHARING_OP = "launch sharing GPUs"


def take_lock(
    state_dir: str,
    client: ClientIdentity,
    break_token: str | None,
    deployment: str | None = None,
    gpus: list[int] | None = None,
) -> LockReply:
    """Take the deployment's launch lock unless a lock on any of its GPUs is held.

    Deployments on disjoint GPUs launch at once; one on every GPU (gpus None) waits for all.
    Deployments of one launch that share a GPU (op SHARING_OP: each caps its memory, the
    launch checked their sum) hold theirs together; any other launch on that GPU is refused
    until they are up, so the memory it then sees free is what they left. Report the holder
    that stands in the way.
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
            if path != ours and _same_launch(holder, client):
                continue
            if path == ours or shares_gpus(gpus, theirs if isinstance(theirs, list) else None):
                return {"acquired": False, "token": None, "holder": holder}
        token = f"{client['host']}-{client['pid']}-{time.time_ns()}"
        record = dict(
            client,
            token=token,
            since=time.time(),
            deployment=deployment,
            gpus=gpus,
            machine=machine_identity(),  # a refused taker tells one machine from a shared folder
        )
        write_json(ours, record)
    finally:
        os.close(guard)
    return {"acquired": True, "token": token, "holder": None}


def _same_launch(holder: dict[str, Any], client: ClientIdentity) -> bool:
    """A lock another deployment of this very launch took, sharing a GPU with it."""
    return (
        client["op"] == SHARING_OP
        and holder.get("op") == SHARING_OP
        and holder.get("host") == client["host"]
        and holder.get("pid") == client["pid"]
    )


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


def cmd_release(args: ReleaseArgs) -> ReleaseReply:
    return {"released": release_lock(args["state_dir"], args["token"], args["deployment"])}


def cmd_tune_lock(args: TuneLockArgs) -> LockReply:
    return take_tune_lock(args["state_dir"], args["client"], args["break_lock"], args["deployment"])


def cmd_tune_unlock(args: ReleaseArgs) -> ReleaseReply:
    name = tune_lock_name(args["deployment"])
    return {"released": release_lock(args["state_dir"], args["token"], name=name)}
