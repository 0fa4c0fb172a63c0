"""The client of the host agent: run its calls on a host and check each reply's shape.

The agent is the package `deployctl/remote/`, shipped as one bundle (a deterministic zip of
its modules) named by the sha256 of its bytes. A host unpacks it once per state_dir into
`<state_dir>/agent/<sha256>/`; each call then imports it from there (with its bytecode kept)
through a short bootstrap. The bundle is sent again only when that folder is missing,
incomplete or not private, so no call carries the agent in its argv (except on a host where
nothing can be written: a full disk must not stop a `stop`; the bundle then rides in argv
and is imported from memory).
Every reply is checked against the call's declared reply type; a reply that lacks a key is
an error, never read as a default.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

from deployctl.connection import CommandResult, Connection, Held
from deployctl.errors import AgentError, CommandError, HostError, InventoryError, PatchError
from deployctl.facts import ProbeOutput, run_probes
from deployctl.inventory import Host
from deployctl.remote import bootstrap
from deployctl.remote import protocol as proto
from deployctl.remote.protocol import (
    APPLY,
    BENCH,
    BENCH_RESULTS,
    BENCH_SAVE,
    CALLS,
    CHECK_ARGS,
    HOLD,
    POINT,
    POLL,
    PREFLIGHT,
    PROBE,
    READ,
    RELEASE,
    REVERT,
    ROUTER,
    RUNS,
    START,
    STATUS,
    STOP,
    TUNE_LOCK,
    TUNE_RECORDS,
    TUNE_SAVE,
    TUNE_UNLOCK,
    Call,
)  # fmt: skip
from deployctl.remote.shapes import shape_problems
from deployctl.shell import join

# The calls, as the protocol declares them: `agent.STATUS` is `protocol.STATUS`.
__all__ = [
    "APPLY", "BENCH", "BENCH_RESULTS", "BENCH_SAVE", "CALLS", "CHECK_ARGS", "HOLD", "POINT",
    "POLL", "PREFLIGHT", "PROBE", "READ", "RELEASE", "REVERT", "ROUTER", "RUNS", "START",
    "STATUS", "STOP", "TUNE_LOCK", "TUNE_RECORDS", "TUNE_SAVE", "TUNE_UNLOCK", "Call",
    "agent_bundle", "agent_command", "agent_folder", "agent_hash", "call", "call_beside",
    "hold", "install_agent", "parse_reply", "shape_problems",
]  # fmt: skip

REMOTE_DIR = Path(proto.__file__).resolve().parent
A = TypeVar("A", bound=Mapping[str, Any])
R = TypeVar("R")
# Every entry's date: the bundle's bytes (so its hash) depend only on the modules' text.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def bundle_files() -> list[Path]:
    """The modules the bundle holds: every module of `deployctl/remote/`, by name."""
    return sorted(REMOTE_DIR.glob("*.py"))


@cache
def agent_bundle() -> bytes:
    """The agent as one zip: `deployctl_remote/<module>.py`, sorted, with fixed dates."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for path in bundle_files():
            entry = zipfile.ZipInfo(f"{bootstrap.PACKAGE}/{path.name}", date_time=_ZIP_EPOCH)
            entry.compress_type = zipfile.ZIP_DEFLATED  # small enough to ride in one argument
            entry.external_attr = 0o600 << 16
            bundle.writestr(entry, path.read_bytes(), compresslevel=9)
    return buffer.getvalue()


@cache
def agent_hash() -> str:
    return hashlib.sha256(agent_bundle()).hexdigest()


# (host, agent folder) where the bundle could not be unpacked in this invocation.
_NOT_KEPT: set[tuple[str, str]] = set()


def agent_folder(host: Host) -> str:
    """Where the host keeps this version of the agent, unpacked."""
    state_dir = host.settings.state_dir
    if not state_dir.strip():
        raise InventoryError(
            f"{host.name}: state_dir is empty", hint="set it to a folder, e.g. ~/.deployctl"
        )
    return f"{state_dir.rstrip('/')}/{proto.AGENT_DIR}/{agent_hash()}"


def agent_command(host: Host, call: str, args: Mapping[str, Any]) -> str:
    """The shell line that runs one agent call with the host's python."""
    python, folder = host.settings.python, agent_folder(host)
    if (host.name, folder) in _NOT_KEPT:  # the bundle rides in argv where it cannot be kept
        carried = base64.b64encode(agent_bundle()).decode()
        return join([python, "-c", bootstrap.IN_MEMORY, carried, call, json.dumps(args)])
    return join([python, "-c", bootstrap.BOOTSTRAP, folder, call, json.dumps(args)])


def _agent_missing(exit_code: int, stdout: str) -> bool:
    return exit_code == proto.AGENT_MISSING_EXIT and proto.AGENT_MISSING in stdout


def install_agent(host: Host, conn: Connection) -> None:
    """Unpack this version of the agent on the host (one round trip)."""
    folder = agent_folder(host)
    command = join([host.settings.python, "-c", bootstrap.UNPACK, folder])
    try:
        conn.run(command, stdin=agent_bundle(), purpose="keep deployctl's agent").check(host.name)
    except CommandError as exc:
        raise HostError(
            f"cannot keep deployctl's agent at {folder} on {host.name}: {exc.output}",
            hint="state_dir must be a folder the login user owns and can write",
        ) from None


def _send_agent(host: Host, conn: Connection) -> None:
    """After a miss: keep the agent on the host, or send it with each call where it cannot be."""
    try:
        install_agent(host, conn)
    except HostError:
        _NOT_KEPT.add((host.name, agent_folder(host)))


def parse_reply(
    host: Host, call: str, exit_code: int, stdout: str, stderr: str, reply_type: type[R]
) -> R:
    """Read the agent's JSON answer and check it has every key its type declares."""
    lines = [line for line in stdout.splitlines() if line.startswith(proto.REPLY_MARK)]
    try:
        doc = json.loads(lines[-1][len(proto.REPLY_MARK) :]) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        detail = (stderr.strip() or stdout.strip())[-300:] or f"exit {exit_code}"
        raise AgentError(f"{host.settings.python} on {host.name} failed: {detail}")
    if "error" in doc:
        error_type = {"patch": PatchError, "host": HostError}.get(str(doc.get("code")), AgentError)
        raise error_type(str(doc["error"]))
    problems = shape_problems(doc, reply_type, call)
    if problems:
        raise AgentError(
            f"{host.name}: the host agent's {call} reply is malformed: {'; '.join(problems[:3])}",
            hint="something on the host answered in deployctl's place, or its files are damaged",
        )
    return cast(R, doc)


def call(
    host: Host,
    conn: Connection,
    spec: Call[A, R],
    args: A,
    stdin: bytes | None = None,
    timeout: float | None = None,
) -> R:
    """Run one agent call on the host: one round trip once the agent is there.

    `timeout`: for a call that itself waits longer than the host's command timeout.
    """

    def run() -> CommandResult:  # the command is built anew: a failed send changes it
        command = agent_command(host, spec.name, args)
        return conn.run(command, stdin=stdin, timeout=timeout, purpose=spec.purpose)

    result = run()
    if _agent_missing(result.exit_code, result.stdout):
        _send_agent(host, conn)
        result = run()
    return parse_reply(host, spec.name, result.exit_code, result.stdout, result.stderr, spec.reply)


def hold(host: Host, conn: Connection, spec: Call[A, R], args: A) -> tuple[R, Held]:
    """Run an agent call that keeps running after its reply (a lock it holds) until the
    returned `Held` is closed, or this process goes."""
    mark = proto.REPLY_MARK.encode()
    command = agent_command(host, spec.name, args)
    held = conn.start(command, mark, purpose=spec.purpose)
    if held.ended and proto.AGENT_MISSING.encode() in held.output:
        held.close()
        _send_agent(host, conn)
        held = conn.start(command, mark, purpose=spec.purpose)
    try:
        reply = parse_reply(
            host, spec.name, 0, held.output.decode(errors="replace"), "", spec.reply
        )
    except BaseException:
        held.close()
        raise
    return reply, held


def call_beside(
    host: Host,
    conn: Connection,
    probes: Mapping[str, str],
    spec: Call[A, R],
    args: A,
) -> tuple[dict[str, ProbeOutput], R]:
    """Run shell probes and one agent call in one round trip (the call's output is "agent")."""

    def run() -> dict[str, ProbeOutput]:  # the command is built anew: a failed send changes it
        asked = {**probes, "agent": agent_command(host, spec.name, args)}
        return run_probes(conn, asked, purpose=spec.purpose)

    outputs = run()
    if _agent_missing(outputs["agent"].exit_code, outputs["agent"].output):
        _send_agent(host, conn)
        outputs = run()
    agent = outputs.pop("agent")
    return outputs, parse_reply(
        host, spec.name, agent.exit_code, agent.output, agent.stderr, spec.reply
    )
