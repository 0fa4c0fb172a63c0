"""A kept agent: one process that answers calls read from stdin until its client goes.

The front ends that poll (`top`, `watch`, the dashboard) start it once per host over their
open connection (`python -S -c BOOTSTRAP FOLDER DIGEST --session`) instead of a Python process
per call. It first prints a ready line (`REPLY_MARK` + {"session": bundle hash, "pid": …}), then
answers each request line, one at a time, with one reply line:

    request  {"call": NAME, "args": {...}, "probes": {NAME: COMMAND} or null, "timeout": S}
    reply    REPLY_MARK {"reply": the call's reply or {"error", "code"},
                         "probes": {NAME: {"exit_code", "output", "stderr"}} or null}

The probes (shell commands: the GPU query of a status) run first, each as `sh -c`, as a
one-shot call runs them beside the agent. Only the calls in SESSION_CALLS are answered
here: they read, never change.

It ends as soon as stdin ends: its client closed it, or the client or its connection died
(sshd then closes the pipes), even while a call hangs on a wedged file system, so it never
outlives its client. A probe that runs past the timeout is killed with its process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

from .gpus import gpus_answer
from .handlers import error, handle, handler, write_reply
from .wire import ECHO, GPUS_COMMAND, SESSION_CALLS

if TYPE_CHECKING:
    from .measures import EchoReply

# The process groups of the probes now running: ended with us.
_running: list[int] = []
_answered = [0]
_LONGEST = 86400.0  # a probe timeout beyond this (or not a number) is the default's


def serve(bundle: str) -> None:
    """Answer request lines until stdin ends; then end at once. Never returns: every end
    is `os._exit`, as an interpreter's own shutdown could stall on the reader thread."""
    requests: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=_read_requests, args=(requests,), daemon=True).start()
    try:
        # The calls' modules imported now, right after the bootstrap checked the folder, not
        # at their first call, perhaps hours into a `top`.
        for call in sorted(SESSION_CALLS - {ECHO}):
            handler(call)
        _write({"session": bundle, "pid": os.getpid()})
        while True:
            _write(_request(requests.get()))
            _answered[0] += 1
    except BaseException:  # a bug of ours: end, and let the client start another
        _end(1)


def _request(line: bytes) -> dict[str, Any]:
    """One request line's reply line; a malformed request is answered, never fatal."""
    try:
        request = json.loads(line)
        call, args = request["call"], request["args"]
        probes = request.get("probes") or {}
        timeout = float(request.get("timeout") or 60)
        if not isinstance(call, str) or not isinstance(probes, dict):
            raise TypeError("call must be a name and probes an object")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        return {"reply": error(f"a malformed session request: {exc}", "agent"), "probes": None}
    timeout = timeout if 0 < timeout <= _LONGEST else 60.0  # NaN too
    ran = {str(name): _probe(str(command), timeout) for name, command in probes.items()}
    return {"reply": _answer(call, args), "probes": ran}


def _read_requests(requests: queue.Queue[bytes]) -> None:
    """Queue each request line; at EOF (the client went), end the process now."""
    try:
        for line in sys.stdin.buffer:
            if line.strip():
                requests.put(line)
    except OSError:
        pass
    _end(0)


def _end(code: int) -> None:
    for group in _running:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    os._exit(code)


def _answer(call: str, args: Any) -> Any:
    if call == ECHO:
        return _echo()
    if call not in SESSION_CALLS:
        return error(f"{call!r} is not answered by a kept agent", "agent")
    return handle(call, args)


def _probe(command: str, timeout: float) -> dict[str, Any]:
    """A probe's answer; the GPU query from NVML where it answers (no process started)."""
    answer = gpus_answer() if command == GPUS_COMMAND else None
    if answer is not None:
        return {"exit_code": 0, "output": answer, "stderr": ""}
    try:
        return _run_probe(command, timeout)
    except (OSError, ValueError) as exc:  # no /bin/sh, no process left to start
        return {"exit_code": 126, "output": "", "stderr": f"the probe did not start: {exc}"}


def _run_probe(command: str, timeout: float) -> dict[str, Any]:
    """Run one probe as a one-shot call's shell would; one that hangs (a wedged nvidia-smi)
    is killed at `timeout` and reported, and the session goes on."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    _running.append(proc.pid)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=5)
            code, err = 124, err + f"killed after {timeout:g}s".encode()
    finally:
        if proc.poll() is None:  # ended by anything else: its group goes with it
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        _running.remove(proc.pid)
    return {
        "exit_code": code,
        "output": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
    }


def _echo() -> EchoReply:
    """The floor's trivial answer, with what this process costs so far."""
    rss = 0
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
    except OSError:
        pass
    times = os.times()
    return {"pid": os.getpid(), "rss_kib": rss, "cpu_s": times.user + times.system,
            "answered": _answered[0]}  # fmt: skip


def _write(document: Any) -> None:
    if not write_reply(document):
        _end(0)
