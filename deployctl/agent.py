"""The client of the host agent: run its calls on a host and check each reply's shape.

The agent is the package `deployctl/remote/`, shipped as one bundle (a deterministic zip of
its modules) named by the sha256 of its bytes. A host unpacks it once per state_dir into
`<state_dir>/agent/<sha256>/`; each call then imports it from there (with its bytecode kept)
through a short bootstrap, which first checks every part of that folder against the
manifest of the client's own bundle (remote/bootstrap.py). The bundle is sent again when that
folder is missing, incomplete, damaged or open to another user (a folder that was there is
said once), so no call carries the agent in its argv (except on a host where nothing can be
written: a full disk must not stop a `stop`; the bundle then rides in argv and is imported
from memory); one that still cannot be run after that is the host's error, naming the folder.
Every reply is checked against the call's declared reply type; a reply that lacks a key is
an error, never read as a default.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, TypeVar, cast

from deployctl.connection import DEFAULT_COMMAND_TIMEOUT, CommandResult, Connection, Held
from deployctl.errors import (
    AgentError,
    CommandError,
    ConnectError,
    HostError,
    InventoryError,
    PatchError,
)
from deployctl.facts import ProbeOutput, run_probes
from deployctl.inventory import Host
from deployctl.remote import bootstrap, wire
from deployctl.remote import protocol as proto
from deployctl.remote.protocol import (
    APPLY,
    BENCH,
    BENCH_RESULTS,
    BENCH_SAVE,
    CALLS,
    CANARY_KEEP,
    CANARY_RECORDS,
    CHECK_ARGS,
    HOLD,
    LIVE_KEEP,
    LIVE_RECORDS,
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
    SURVEY,
    TUNE_LOCK,
    TUNE_RECORDS,
    TUNE_SAVE,
    TUNE_UNLOCK,
    WORKERS,
    Call,
)  # fmt: skip
from deployctl.remote.shapes import shape_problems
from deployctl.shell import join

# The calls, as the protocol declares them: `agent.STATUS` is `protocol.STATUS`.
__all__ = [
    "APPLY",
    "BENCH",
    "BENCH_RESULTS",
    "BENCH_SAVE",
    "CALLS",
    "CANARY_KEEP",
    "CANARY_RECORDS",
    "CHECK_ARGS",
    "HOLD",
    "LIVE_KEEP",
    "LIVE_RECORDS",
    "POINT",
    "POLL",
    "PREFLIGHT",
    "PROBE",
    "READ",
    "RELEASE",
    "REVERT",
    "ROUTER",
    "RUNS",
    "START",
    "STATUS",
    "STOP",
    "SURVEY",
    "TUNE_LOCK",
    "TUNE_RECORDS",
    "TUNE_SAVE",
    "TUNE_UNLOCK",
    "WORKERS",
    "Call",
    "KeptAgent",
    "agent_bundle",
    "agent_command",
    "agent_folder",
    "agent_hash",
    "bundle_of",
    "call",
    "call_beside",
    "check_reply",
    "hold",
    "install_agent",
    "kept_agent",
    "manifest_digest",
    "note",
    "notes_held",
    "parse_reply",
    "shape_problems",
    "through_kept_agent",
    "warn",
]  # fmt: skip

REMOTE_DIR = Path(proto.__file__).resolve().parent
A = TypeVar("A", bound=Mapping[str, Any])
R = TypeVar("R")
T = TypeVar("T")
# Every entry's date: the bundle's bytes (so its hash) depend only on the modules' text.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def bundle_files() -> list[Path]:
    """The modules the bundle holds: every module of `deployctl/remote/`, by name."""
    return sorted(REMOTE_DIR.glob("*.py"))


@cache
def agent_bundle() -> bytes:
    """The agent as one zip: `deployctl_remote/<module>.py`, sorted, with fixed dates."""
    return bundle_of({path.name: path.read_bytes() for path in bundle_files()})


def bundle_of(modules: Mapping[str, bytes]) -> bytes:
    """The bundle of these modules (file name → text) of the agent's package."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name in sorted(modules):
            entry = zipfile.ZipInfo(f"{bootstrap.PACKAGE}/{name}", date_time=_ZIP_EPOCH)
            entry.compress_type = zipfile.ZIP_DEFLATED  # small enough to ride in one argument
            entry.external_attr = 0o600 << 16
            bundle.writestr(entry, modules[name], compresslevel=9)
    return buffer.getvalue()


@cache
def agent_hash() -> str:
    return hashlib.sha256(agent_bundle()).hexdigest()


def manifest_digest() -> str:
    """The sha256 of the manifest a host writes when it unpacks this bundle: the bootstrap
    runs only a folder whose manifest has it."""
    return manifest_digest_of(agent_bundle())


@lru_cache(maxsize=4)
def manifest_digest_of(bundle: bytes) -> str:
    """The sha256 of the manifest a host writes when it unpacks `bundle`."""
    with zipfile.ZipFile(io.BytesIO(bundle)) as unpacked:
        files = {name: unpacked.read(name) for name in unpacked.namelist()}
    return hashlib.sha256(bootstrap.manifest(files)).hexdigest()


# (host, agent folder) where the bundle could not be unpacked in this invocation.
_BUNDLE_IN_MEMORY: set[tuple[str, str]] = set()


def agent_folder(host: Host) -> str:
    """Where the host keeps this version of the agent, unpacked."""
    state_dir = host.settings.state_dir
    if not state_dir.strip():
        raise InventoryError(
            f"{host.name}: state_dir is empty", hint="set it to a folder, e.g. ~/.deployctl"
        )
    return f"{state_dir.rstrip('/')}/{wire.AGENT_DIR}/{agent_hash()}"


def agent_command(host: Host, call: str, args: Mapping[str, Any]) -> str:
    """The shell line that runs one agent call with the host's python."""
    python, folder = host.settings.python, agent_folder(host)
    if (host.name, folder) in _BUNDLE_IN_MEMORY:  # the bundle rides in argv where it cannot be kept
        carried = base64.b64encode(agent_bundle()).decode()
        script, where = bootstrap.IN_MEMORY, [carried]
    else:
        script, where = bootstrap.BOOTSTRAP, [folder, manifest_digest()]
    return join([python, *bootstrap.PYTHON_FLAGS, "-c", script, *where, call, json.dumps(args)])


def _missing(exit_code: int | None, output: str) -> str | None:
    """Why the host's bootstrap did not run the agent's folder (BUNDLE_ABSENT: there was
    none); None: it ran the call."""
    if exit_code != wire.AGENT_MISSING_EXIT:
        return None
    for line in output.splitlines():
        if line.startswith(wire.AGENT_MISSING):
            why = line[len(wire.AGENT_MISSING) :].strip()[:200]
            return "".join(c if c.isprintable() else "?" for c in why) or wire.BUNDLE_ABSENT
    return None


def _held_missing(held: Held) -> str | None:
    """As `_missing`, for a command held open: one that ended before its first reply."""
    output = held.output.decode(errors="replace")
    return _missing(wire.AGENT_MISSING_EXIT if held.ended else None, output)


def install_agent(host: Host, conn: Connection) -> None:
    """Unpack this version of the agent on the host (one round trip)."""
    folder = agent_folder(host)
    command = join([host.settings.python, *bootstrap.PYTHON_FLAGS, "-c", bootstrap.UNPACK, folder])
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
        _BUNDLE_IN_MEMORY.add((host.name, agent_folder(host)))


# (host, agent folder, why) already said in this process: a folder not run is said once
# (the calls of one command to one host may miss it at once).
_SAID: set[tuple[str, str, str]] = set()
_SAID_LOCK = threading.Lock()


def _send_again(host: Host, conn: Connection, why: str) -> None:
    """Send the bundle after a miss; where a folder was there but could not be run (damaged,
    or open to another user), say so once."""
    _send_agent(host, conn)
    folder = agent_folder(host)
    with _SAID_LOCK:
        if why == wire.BUNDLE_ABSENT or (host.name, folder, why) in _SAID:
            return
        _SAID.add((host.name, folder, why))
    if (host.name, folder) in _BUNDLE_IN_MEMORY:
        done = "it cannot be unpacked afresh there, so each call carries it"
    else:
        done = "it was unpacked afresh"
    warn(f"{host.name}: deployctl's agent at {folder} was not run ({why}); {done}")


def _with_agent(
    host: Host,
    conn: Connection,
    run: Callable[[], T],
    missing: Callable[[T], str | None],
    discard: Callable[[T], None] = lambda _: None,
) -> T:
    """What `run` (a command through the bootstrap) gave once the host could run the agent:
    after a miss the bundle is sent again, once; a second miss is the host's error."""
    result = run()
    why = missing(result)
    if why is None:
        return result
    discard(result)
    _send_again(host, conn, why)
    result = run()
    why = missing(result)
    if why is None:
        return result
    discard(result)
    folder = agent_folder(host)
    raise AgentError(
        f"{host.name}: deployctl's agent at {folder} cannot be run even after it was sent "
        f"again: {why}",
        hint=f"look at {folder} on the host: its owner, its modes, the file system it is on",
    )


def parse_reply(
    host: Host, call: str, exit_code: int, stdout: str, stderr: str, reply_type: type[R]
) -> R:
    """Read the agent's JSON answer and check it has every key its type declares."""
    doc = _reply_document(stdout)
    detail = (stderr.strip() or stdout.strip())[-300:] or f"exit {exit_code}"
    if doc is None and f"\n{wire.REPLY_MARK}" in f"\n{stdout}":
        detail = "its reply is no JSON deployctl can read (malformed, or nested too deep)"
    return check_reply(host, call, doc, detail, reply_type)


def _reply_document(output: str) -> Any:
    """The JSON document on the output's last reply line (None: none, or not JSON, or nested
    deeper than Python can read)."""
    lines = [line for line in output.splitlines() if line.startswith(wire.REPLY_MARK)]
    try:
        return json.loads(lines[-1][len(wire.REPLY_MARK) :]) if lines else None
    except (ValueError, RecursionError):
        return None


def check_reply(host: Host, call: str, doc: Any, detail: str, reply_type: type[R]) -> R:
    """The reply if it has every key its type declares; the host's error as ours; `detail`:
    what the host printed, for an answer that is no JSON object."""
    if not isinstance(doc, dict):
        raise AgentError(f"{host.settings.python} on {host.name} failed: {detail}")
    try:  # what the host sent is read whatever its nesting: too deep is no reply of ours
        if "error" in doc:
            code, message = str(doc.get("code")), str(doc["error"])
            raise {"patch": PatchError, "host": HostError}.get(code, AgentError)(message)
        problems = shape_problems(doc, reply_type, call)
    except RecursionError:
        problems = ["it is nested too deep to read"]
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

    kept = through_kept_agent(host, conn, spec, args, timeout=timeout) if stdin is None else None
    if kept is not None:
        return kept[0]
    result = _with_agent(host, conn, run, lambda done: _missing(done.exit_code, done.stdout))
    return parse_reply(host, spec.name, result.exit_code, result.stdout, result.stderr, spec.reply)


def hold(host: Host, conn: Connection, spec: Call[A, R], args: A) -> tuple[R, Held]:
    """Run an agent call that keeps running after its reply (a lock it holds) until the
    returned `Held` is closed, or this process goes."""

    def start() -> Held:  # the command is built anew: a failed send changes it
        command = agent_command(host, spec.name, args)
        return conn.start(command, wire.REPLY_MARK.encode(), purpose=spec.purpose)

    held = _with_agent(host, conn, start, _held_missing, lambda ended: ended.close())
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

    kept = through_kept_agent(host, conn, spec, args, probes=probes)
    if kept is not None:
        return kept[1], kept[0]
    outputs = _with_agent(
        host, conn, run, lambda done: _missing(done["agent"].exit_code, done["agent"].output)
    )
    agent = outputs.pop("agent")
    return outputs, parse_reply(
        host, spec.name, agent.exit_code, agent.output, agent.stderr, spec.reply
    )


# ---- the kept agent: one process per host for the front ends that poll --------------------

# (host, its python, agent folder) where no agent could be kept, and until when one process
# per call answers there (a crash of the agent's, say, is not held against a host for ever).
_NO_KEPT_AGENT: dict[tuple[str, str, str], float] = {}
NO_KEPT_AGENT_FOR = 600.0  # seconds
# How long a kept agent that ended before its first answer is given for its exit status.
ENDED_STATUS_WAIT = 5.0


# Lines held while a full screen shows (notes_held); else they go to stderr at once.
_HELD_NOTES: list[list[str]] = []


def note(text: str) -> None:
    """Say that a host answers one process per call."""
    _say(f"note: {text}")


def warn(text: str) -> None:
    """Say that a host's agent could not be run as it was found."""
    _say(f"warning: {text}")


def _say(line: str) -> None:
    if _HELD_NOTES:
        _HELD_NOTES[-1].append(line)
    else:
        print(line, file=sys.stderr)


@contextlib.contextmanager
def notes_held() -> Iterator[list[str]]:
    """Hold the notes while a full screen is shown (they would garble it); then print them."""
    held: list[str] = []
    _HELD_NOTES.append(held)
    try:
        yield held
    finally:
        _HELD_NOTES.remove(held)
        for line in held:
            print(line, file=sys.stderr)


class KeptAgent:
    """One agent process on a host that answers calls over the connection (remote/kept_agent.py)
    until it is closed, its connection ends, or a call times out (then it is closed: the
    next call starts another)."""

    def __init__(self, host: Host, held: Held, bundle: str, pid: int) -> None:
        self.host, self.held, self.bundle = host, held, bundle
        self.python = host.settings.python  # what it runs in (Connection.kept's key)
        self.pid = pid  # its process id on the host
        self.answered = 0
        self.ended = False
        # Its exit status when it ended by itself before its first answer (None: it did not,
        # or its connection ended it): the host's python cannot keep an agent.
        self.ended_alone: int | None = None
        self._lock = threading.Lock()

    def call(
        self,
        spec: Call[A, R],
        args: A,
        probes: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[R, dict[str, ProbeOutput]]:
        """The call's checked reply, and the outputs of `probes` (shell commands) run on
        the host before it; a probe still running at half the timeout is killed there."""
        timeout = timeout or self.host.settings.command_timeout or DEFAULT_COMMAND_TIMEOUT
        late = f"{self.host.name}: no answer within {timeout:g}s: {spec.purpose}"
        request = {"call": spec.name, "args": args, "probes": probes, "timeout": timeout / 2}
        with self._lock:
            if self.ended:
                raise ConnectError(f"{self.host.name}: the kept agent has ended")
            try:
                self.held.send(json.dumps(request).encode() + b"\n")
                output = self.held.read_until(wire.REPLY_MARK.encode(), timeout, late)
            except BaseException as exc:  # a timeout, its end, Ctrl-C: no later call may read
                if isinstance(exc, ConnectError) and self.answered == 0:
                    # Read before the close: its status comes late on a busy host.
                    self.ended_alone = self.held.exit_code(wait=ENDED_STATUS_WAIT)
                self.close()  # this call's reply; the next starts a fresh agent
                raise
            self.answered += 1
        doc = _reply_document(output.decode(errors="replace"))
        malformed = AgentError(f"{self.host.name}: the kept agent's {spec.name} reply is malformed")
        if not isinstance(doc, dict) or "reply" not in doc:
            raise malformed
        reply = check_reply(self.host, spec.name, doc["reply"], "no JSON object", spec.reply)
        try:  # the reply is good: so are the probes' answers beside it
            ran = doc["probes"] or {}
            outputs = {
                name: ProbeOutput(
                    int(ran[name]["exit_code"]), ran[name]["output"], ran[name]["stderr"]
                )
                for name in probes or {}
            }
        except (KeyError, TypeError, ValueError):
            raise malformed from None
        if not all(
            isinstance(o.output, str) and isinstance(o.stderr, str) for o in outputs.values()
        ):
            raise malformed  # the parsers read them as a shell's text
        return reply, outputs

    def close(self) -> None:
        self.ended = True
        # Its stdin closed is its end (also mid-call): no need to wait for it here.
        with contextlib.suppress(Exception):
            self.held.close(wait=0)


def through_kept_agent(
    host: Host,
    conn: Connection,
    spec: Call[A, R],
    args: A,
    probes: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> tuple[R, dict[str, ProbeOutput]] | None:
    """The call answered by the host's kept agent (see KeptAgent.call); None: make it one
    process per call. A kept agent found ended is replaced once; one that ends by itself
    before its first answer means the host's python cannot keep one (a note says so)."""
    kept = kept_agent(host, conn, spec)
    if kept is None:
        return None
    first = kept.answered == 0
    try:
        return kept.call(spec, args, probes, timeout)
    except ConnectError:
        # Ended before its first answer: by itself, or with its connection (no exit status
        # comes: the error stands).
        if first and kept.ended_alone is not None:
            _cannot_keep(host, "it ended before its first answer")
            with conn.kept_lock:
                if conn.kept.get(kept.python) is kept:
                    conn.kept.pop(kept.python, None)
            return None
        if first:
            raise
    # One that had answered ended (its connection dropped and came back): once more, anew.
    again = kept_agent(host, conn, spec)
    return None if again is None else again.call(spec, args, probes, timeout)


def _cannot_keep_key(host: Host) -> tuple[str, str, str]:
    return host.name, host.settings.python, agent_folder(host)


def _cannot_keep(host: Host, why: str) -> None:
    _NO_KEPT_AGENT[_cannot_keep_key(host)] = time.monotonic() + NO_KEPT_AGENT_FOR
    note(
        f"{host.name}: {host.settings.python} cannot keep deployctl's agent running ({why}); "
        "one process per call there"
    )


def kept_agent(host: Host, conn: Connection, spec: Call[Any, Any]) -> KeptAgent | None:
    """The host's kept agent for this call, started if need be; None: one process per call
    (not a front end that polls, a call that changes something, or a host that cannot)."""
    if not conn.keeps_agent or spec.name not in wire.SESSION_CALLS:
        return None
    with conn.kept_lock:
        if _NO_KEPT_AGENT.get(_cannot_keep_key(host), 0.0) > time.monotonic():
            return None
        python = host.settings.python
        kept = conn.kept.get(python)
        if isinstance(kept, KeptAgent) and not kept.ended and kept.bundle == agent_hash():
            return kept
        if kept is not None:  # ended, or another version of deployctl's agent: a new one
            conn.kept.pop(python, None)
            kept.close()
        started = _start_kept_agent(host, conn)
        if started is not None:
            conn.kept[python] = started
        return started


def _start_kept_agent(host: Host, conn: Connection) -> KeptAgent | None:
    """Start the agent as a kept process; None (with a note) where the host's python
    answers no request stream."""
    mark = wire.REPLY_MARK.encode()

    def start() -> Held:  # the command is built anew: a failed send changes it
        command = "exec " + agent_command(host, wire.SESSION, {})
        return conn.start(command, mark, purpose="start deployctl's kept host agent")

    held = _with_agent(host, conn, start, _held_missing, lambda ended: ended.close())
    ready = _reply_document(held.output.decode(errors="replace"))
    # Its folder's name is the hash it runs; from memory its modules are "<bundle>".
    in_memory = (host.name, agent_folder(host)) in _BUNDLE_IN_MEMORY
    expected = {agent_hash(), "<bundle>"} if in_memory else {agent_hash()}
    if held.ended or not isinstance(ready, dict) or ready.get("session") not in expected:
        held.close(wait=0)
        _cannot_keep(host, f"it said: {held.output.decode(errors='replace').strip()[-200:]}")
        return None
    return KeptAgent(host, held, agent_hash(), int(ready.get("pid") or 0))
