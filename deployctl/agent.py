"""The client of the host agent: run its calls on a host and check each reply's shape.

The agent (`host_agent.py`) is kept on the host under its content hash and sent again only
when that copy is missing or altered, so no call carries the agent's source in its argv
(except on a host where the copy cannot be written: a full disk must not stop a `stop`).
Every reply is checked against the call's declared reply type; a reply that lacks a key is
an error, never read as a default.
"""

from __future__ import annotations

import hashlib
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from deployctl import host_agent as proto
from deployctl.connection import CommandResult, Connection, Held
from deployctl.errors import AgentError, CommandError, HostError, InventoryError, PatchError
from deployctl.facts import ProbeOutput, run_probes
from deployctl.inventory import Host
from deployctl.shell import join

AGENT_FILE = Path(proto.__file__).resolve()
A = TypeVar("A", bound=Mapping[str, Any])
R = TypeVar("R")


@dataclass(frozen=True)
class Call(Generic[A, R]):
    """One agent call: its name on the wire, the TypedDict it takes and the one it answers.

    mypy infers `call`'s types from a typed value, not from a dict literal: pass a variable
    annotated with the args type, or build it with that type, e.g. `ReadArgs(base=…, paths=…)`.
    """

    name: str
    args: type[A]
    reply: type[R]
    what: str = ""  # what the call asks of the host, in words, for a timeout's message

    @property
    def purpose(self) -> str:
        return f"deployctl's host agent was asked to {self.what or self.name}"


# Every call the agent answers (host_agent.main's handlers), typed by host_agent's declarations.
PROBE = Call(
    "probe",
    proto.ProbeArgs,
    proto.ProbeReply,
    "read the host's facts (SGLang install, GPUs, ports)",
)
READ = Call("read", proto.ReadArgs, proto.ReadReply, "read files of the SGLang install")
APPLY = Call("apply", proto.ApplyArgs, proto.ApplyReply, "apply a patch set")
REVERT = Call("revert", proto.RevertArgs, proto.RevertReply, "revert a patch set")
PREFLIGHT = Call(
    "preflight",
    proto.PreflightArgs,
    proto.PreflightReply,
    "check the host before a launch (GPUs, ports, lock, log name)",
)
CHECK_ARGS = Call(
    "check_args",
    proto.CheckArgsArgs,
    proto.CheckArgsReply,
    "ask the host's SGLang whether it accepts the command's flags",
)
START = Call("start", proto.StartArgs, proto.StartReply, "start the server")
POLL = Call(
    "poll", proto.PollArgs, proto.PollReply, "wait for the server to be ready, watching its log"
)
STATUS = Call(
    "status",
    proto.StatusArgs,
    proto.StatusReply,
    "read the deployments' status (run records, processes, GPUs, log)",
)
STOP = Call(
    "stop", proto.StopArgs, proto.StopReply, "stop the server and wait for its GPUs to be clean"
)
RELEASE = Call("release", proto.ReleaseArgs, proto.ReleaseReply, "release the launch lock")
POINT = Call("point", proto.PointArgs, proto.PointReply, "make a run the deployment's current run")
RUNS = Call("runs", proto.RunsArgs, proto.RunsReply, "list the deployment's runs")
BENCH = Call("bench", proto.BenchArgs, proto.BenchLevel, "run a benchmark level against the server")
BENCH_SAVE = Call(
    "bench_save", proto.BenchSaveArgs, proto.BenchSaveReply, "keep a benchmark's results"
)
BENCH_RESULTS = Call(
    "bench_results", proto.BenchResultsArgs, proto.BenchResultsReply, "read kept benchmark results"
)
TUNE_SAVE = Call("tune_save", proto.TuneSaveArgs, proto.TuneSaveReply, "keep a tune's record")
TUNE_RECORDS = Call(
    "tune_records", proto.TuneRecordsArgs, proto.TuneRecordsReply, "read kept tune records"
)
TUNE_LOCK = Call("tune_lock", proto.TuneLockArgs, proto.LockReply, "take the tune lock")
TUNE_UNLOCK = Call("tune_unlock", proto.ReleaseArgs, proto.ReleaseReply, "release the tune lock")
ROUTER = Call(
    "router", proto.RouterArgs, proto.RouterReply, "ask the router for its workers or change them"
)
# Through `hold`: it stays running, holding the lock, until its client goes.
HOLD = Call("hold", proto.HoldArgs, proto.HoldReply, "take a router's rollout lock")
CALLS: tuple[Call[Any, Any], ...] = (
    PROBE, READ, APPLY, REVERT, PREFLIGHT, CHECK_ARGS, START, POLL, STATUS, STOP, RELEASE, RUNS,
    BENCH, BENCH_SAVE, BENCH_RESULTS, TUNE_SAVE, TUNE_RECORDS, TUNE_LOCK, TUNE_UNLOCK, ROUTER,
    POINT, HOLD,
)  # fmt: skip


@cache
def agent_source() -> bytes:
    return AGENT_FILE.read_bytes()


@cache
def agent_hash() -> str:
    return hashlib.sha256(agent_source()).hexdigest()


# (host, agent path) where the agent could not be written in this invocation.
_NOT_KEPT: set[tuple[str, str]] = set()


def agent_path(host: Host) -> str:
    """Where the host keeps this version of the agent."""
    state_dir = host.settings.state_dir
    if not state_dir.strip():
        raise InventoryError(
            f"{host.name}: state_dir is empty", hint="set it to a folder, e.g. ~/.deployctl"
        )
    return f"{state_dir.rstrip('/')}/{proto.AGENT_DIR}/{agent_hash()}.py"


def agent_command(host: Host, call: str, args: Mapping[str, Any]) -> str:
    """The shell line that runs one agent call with the host's python."""
    python, path = host.settings.python, agent_path(host)
    if (host.name, path) in _NOT_KEPT:  # the source rides in argv where nothing can be written
        return join([python, "-c", agent_source().decode(), call, json.dumps(args)])
    return join([python, "-c", proto.BOOTSTRAP, path, call, json.dumps(args)])


def _agent_missing(exit_code: int, stdout: str) -> bool:
    return exit_code == proto.AGENT_MISSING_EXIT and proto.AGENT_MISSING in stdout


def install_agent(host: Host, conn: Connection) -> None:
    """Put this version of the agent on the host (one round trip)."""
    path = agent_path(host)
    try:
        conn.write_file(path, agent_source())
    except CommandError as exc:
        raise HostError(
            f"cannot keep deployctl's agent at {path} on {host.name}: {exc.output}",
            hint="state_dir must be a folder the login user can write",
        ) from None


def _send_agent(host: Host, conn: Connection) -> None:
    """After a miss: keep the agent on the host, or send it with each call where it cannot be."""
    try:
        install_agent(host, conn)
    except HostError:
        _NOT_KEPT.add((host.name, agent_path(host)))


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


# ---- reply shapes --------------------------------------------------------------------------


def shape_problems(value: Any, expected: Any, where: str) -> list[str]:
    """Say where `value` lacks a key its TypedDict declares (nested ones too) or has the
    wrong kind of value; an empty list when it fits."""
    if expected is Any:
        return []
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(expected)
        if value is None and type(None) in options:
            return []
        tried = [shape_problems(value, o, where) for o in options if o is not type(None)]
        return [] if any(not t for t in tried) else tried[0]
    if typing.is_typeddict(expected):
        if not isinstance(value, dict):
            return [f"{where} is not an object"]
        hints = _hints(expected)
        problems = [f"{where}.{key} is missing" for key in sorted(_required(expected) - set(value))]
        for key, item in value.items():
            if key in hints:
                problems += shape_problems(item, hints[key], f"{where}.{key}")
        return problems
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where} is not an object"]
        item_type = typing.get_args(expected)[1]
        return [p for k, v in value.items() for p in shape_problems(v, item_type, f"{where}.{k}")]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where} is not a list"]
        item_type = typing.get_args(expected)[0]
        return [
            p for i, v in enumerate(value) for p in shape_problems(v, item_type, f"{where}[{i}]")
        ]
    if expected is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    return [] if ok else [f"{where} is {type(value).__name__}, not {expected.__name__}"]


@cache
def _hints(typed_dict: type) -> dict[str, Any]:
    return typing.get_type_hints(typed_dict, vars(proto))


@cache
def _required(typed_dict: type) -> frozenset[str]:
    return frozenset(getattr(typed_dict, "__required_keys__", frozenset()))
