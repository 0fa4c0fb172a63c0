"""Run `python -m deployctl` for the tests without paying for Python's start and deployctl's
imports each time (~0.15-0.25 s of CPU per run, ~250 runs in the fast tier).

A server process imports deployctl's CLI once and forks one child per command. The child is
made what a fresh `python -m deployctl ARGS` started by `subprocess.run` would be: the caller's
stdin and two pipes as its fds 0-2 (passed over a unix socket with SCM_RIGHTS), the caller's
environment, working folder and umask, `sys.argv` and `sys.path[0]` as `-m` sets them,
`__main__` run by runpy as `-m` runs it, the exit status and exit path of the interpreter.
The server only imports and builds typer's commands (it never runs a command), so each child
starts from the state right after import, with all of deployctl's caches empty but the
command tree; a fork copies no state of an earlier command.

What Python reads once at its start (the `PYTHON*` variables, the locale, `TZ`; and typer's
`TYPER_*` at import) is the server's: there is one server per value of those, so a test that
sets one gets a server started with it. The server is a fresh interpreter started with
`subprocess.Popen`, so its children have a fresh interpreter's signal dispositions, and they
stay in the caller's process group and session, as a `subprocess.run` child does.

For synchronous runs only: a test that signals the CLI, or reads it while it runs, starts a
real process (`CLI.popen`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _deployctl_modules() -> tuple[str, ...]:
    """Every module of deployctl but `__main__` (which runs the CLI), by its file."""
    names = []
    for path in sorted((REPO / "deployctl").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] != "__main__":
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return tuple(names)


# The modules the server imports: every module of deployctl (a command's own modules are
# ~0.1 s of CPU of a run that imports them) and the libraries it imports when a command runs,
# but matplotlib (`plot` only; it reads its settings at import). None of them reads the
# environment or the working folder at import but typer and invoke (`TYPER_*`, `INVOKE_*`:
# the server's key).
PRELOAD = (
    *_deployctl_modules(),
    "fabric",
    "jinja2.nativetypes",
    "jinja2.sandbox",
    "paramiko",
    "rich.box",
    "rich.console",
    "rich.live",
    "rich.table",
    "rich.text",
    "yaml",
)
# What the interpreter (or a preloaded module) reads from the environment once, at its start.
STARTUP_PREFIXES = ("PYTHON", "LC_", "TYPER_", "_TYPER_", "INVOKE_")
STARTUP_NAMES = frozenset({"LANG", "LANGUAGE", "TZ"})
# Read by typer only when it completes a command line, in the command: a server per value of
# these (one per line completed) would pay the imports again for nothing.
RUN_TIME_NAMES = frozenset(
    {"_TYPER_COMPLETE_ARGS", "_TYPER_COMPLETE_FISH_ACTION", "_TYPER_COMPLETE_WORD_TO_COMPLETE"}
)

SERVER = r"""
import atexit, builtins, gc, importlib, json, os, runpy, selectors, signal, socket, sys, tempfile
import threading
import types

for name in sys.argv[2:]:
    importlib.import_module(name)
# Typer's click commands, as a command's first step builds them (from the code and `_TYPER_*`)
sys.modules["deployctl.cli.session"].command_tree()
# What is imported is never garbage: out of every collection, a child's collections neither
# walk it nor copy its pages (~4-7 ms of CPU less per run; gc.freeze exists for this).
gc.freeze()
assert threading.active_count() == 1  # a fork copies only the thread that forks
control = socket.socket(fileno=int(sys.argv[1]))
selector = selectors.DefaultSelector()
selector.register(control, selectors.EVENT_READ)


def run_cli(request, reply, fds):
    # What is the server's (its sockets, its selector) is closed, not left to the command.
    reply.close()
    for key in list(selector.get_map().values()):
        if key.fileobj is not control:
            key.data[1].close()
            os.close(key.fd)
    selector.close()
    control.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)  # inheritable, as a child's standard fds are
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from this environment, as a fresh process would
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        stream.reconfigure(line_buffering=os.isatty(fd))  # stderr writes through anyway
    sys.path[0] = os.getcwd()  # -m puts the working folder first
    sys.argv = ["-m", *request["args"]]
    # -m runs in the __main__ the interpreter made at its start, not in this script's
    main = sys.modules["__main__"] = types.ModuleType("__main__")
    main.__annotations__, main.__builtins__ = {}, builtins
    code = 1
    try:
        runpy._run_module_as_main(request["module"])  # what `python -m MODULE` runs
        code = 0
    except SystemExit as exc:  # as the interpreter exits with it
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException as exc:  # printed as the interpreter prints it: from runpy's frame on
        exc.with_traceback(exc.__traceback__.tb_next)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        if isinstance(exc, KeyboardInterrupt):
            code = -signal.SIGINT
    threading._shutdown()  # the interpreter waits for non-daemon threads, then atexit
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        code = 120  # the interpreter's status when its last flush fails
    if code == -signal.SIGINT:  # an uncaught Ctrl-C ends the process by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def answer(reply, line):
    try:
        reply.sendall(line)
    except OSError:  # the caller stopped waiting (its timeout): the server goes on
        pass


while True:
    for key, _ in selector.select():
        if key.fileobj is control:
            message, fds, _, _ = socket.recv_fds(control, 1 << 22, 4)
            if not message:  # the caller ended
                sys.exit(0)
            reply = socket.socket(fileno=fds[0])
            child = os.fork()
            if child == 0:
                run_cli(json.loads(message), reply, fds[1:])
            for fd in fds[1:]:
                os.close(fd)
            answer(reply, b"%d\n" % child)
            selector.register(os.pidfd_open(child), selectors.EVENT_READ, (child, reply))
        else:
            child, reply = key.data
            selector.unregister(key.fd)
            os.close(key.fd)
            _, status, usage = os.wait4(child, 0)
            cpu = usage.ru_utime + usage.ru_stime  # the command's and what it waited for
            peak = usage.ru_maxrss  # KiB: the command's own peak, counted from the server's memory
            answer(reply, b"%d %.6f %d\n" % (os.waitstatus_to_exitcode(status), cpu, peak))
            reply.close()
"""


class Ran(subprocess.CompletedProcess[str]):
    """A forked run's result, with its peak memory (its own `ru_maxrss`, in KiB)."""

    def __init__(
        self, args: list[str], returncode: int, stdout: str, stderr: str, *, peak_kib: int
    ) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.peak_kib = peak_kib


# CPU seconds of every command this process had run by the server (each one's own and its
# waited-for children's): they are the server's children, not this process's, so a test's
# own rusage leaves them out.
cpu_seconds = 0.0


def spent_cpu_seconds() -> float:
    """CPU seconds of every CLI run this process has made so far, forked (`cpu_seconds`) or
    started (its waited-for children): a test's bound on a run's CPU reads the difference."""
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return cpu_seconds + waited.ru_utime + waited.ru_stime


_servers: dict[
    tuple[str, tuple[tuple[str, str], ...]], tuple[subprocess.Popen[bytes], socket.socket]
] = {}
_lock = threading.Lock()


def _server(env: Mapping[str, str]) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    startup = {
        k: v
        for k, v in env.items()
        if (k.startswith(STARTUP_PREFIXES) or k in STARTUP_NAMES) and k not in RUN_TIME_NAMES
    }
    key = (sys.executable, tuple(sorted(startup.items())))
    with _lock:
        if key not in _servers:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            process = subprocess.Popen(
                [sys.executable, "-c", SERVER, str(theirs.fileno()), *PRELOAD],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
            )
            theirs.close()
            _servers[key] = (process, ours)
            if len(_servers) == 1:
                atexit.register(stop_servers)
        process, control = _servers[key]
        return control, process


def stop_servers() -> None:
    """End every server: each ends when its control socket closes."""
    with _lock:
        for process, control in _servers.values():
            control.close()
            process.wait()
        _servers.clear()


def _decode(data: bytes) -> str:
    # As subprocess.run(text=True) decodes: the locale's encoding, universal newlines.
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def run(argv: Sequence[str], *, cwd: str, env: Mapping[str, str], timeout: float) -> Ran:
    """`subprocess.run([sys.executable, "-m", MODULE, *args], cwd=, env=, text=True,
    capture_output=True, timeout=)`, with the command forked from a server (MODULE is
    deployctl but for this file's own tests)."""
    if list(argv[:2]) != [sys.executable, "-m"] or len(argv) < 3:
        raise ValueError(f"not a `python -m MODULE` command line: {argv}")
    control, process = _server(env)
    if process.poll() is not None:
        raise RuntimeError(f"the CLI server ended (status {process.returncode}); see its stderr")
    reply, theirs = socket.socketpair()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    umask = os.umask(0o022)
    os.umask(umask)
    request = {
        "module": argv[2],
        "args": list(argv[3:]),
        "cwd": os.fspath(cwd),
        "env": dict(env),
        "umask": umask,
    }
    try:
        socket.send_fds(control, [json.dumps(request).encode()], [theirs.fileno(), 0, out_w, err_w])
    finally:
        for fd in (theirs.fileno(), out_w, err_w):
            os.close(fd)
        theirs.detach()
    return _collect(argv, reply, out_r, err_r, timeout)


def _collect(
    argv: Sequence[str], reply: socket.socket, out_r: int, err_r: int, timeout: float
) -> Ran:
    """Read both pipes to their end and the exit status, as `communicate` then `wait` do."""
    deadline = time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    answer = b""
    selector = selectors.DefaultSelector()
    selector.register(out_r, selectors.EVENT_READ)
    selector.register(err_r, selectors.EVENT_READ)
    selector.register(reply, selectors.EVENT_READ)
    try:
        while len(selector.get_map()) > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill(answer)
                raise subprocess.TimeoutExpired(
                    list(argv),
                    timeout,
                    _decode(b"".join(chunks[out_r])),
                    _decode(b"".join(chunks[err_r])),
                )
            for key, _ in selector.select(left):
                if key.fileobj is reply:
                    data = reply.recv(64)
                    answer += data
                    if not data:
                        selector.unregister(reply)
                    continue
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
    finally:
        selector.close()
        reply.close()
        os.close(out_r)
        os.close(err_r)
    if len(answer.split()) != 4:
        raise RuntimeError(f"the CLI server gave no exit status for {list(argv)}: did it end?")
    _, status, cpu, peak = answer.split()
    global cpu_seconds
    cpu_seconds += float(cpu)
    out, err = _decode(b"".join(chunks[out_r])), _decode(b"".join(chunks[err_r]))
    return Ran(list(argv), int(status), out, err, peak_kib=int(peak))


def _kill(answer: bytes) -> None:
    """Kill a command that ran past its timeout, as subprocess.run does (SIGKILL)."""
    lines = answer.split()
    if len(lines) == 1:  # its pid came, its status did not: it has not been reaped
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(lines[0]), signal.SIGKILL)
