"""What a process started as `python -m tests.cli_probe ARG...` is: printed as JSON, for
tests/test_cli_server.py to compare a forked run with a fresh one. ARG `exit:...`, `raise` or
`interrupt` ends it in that way after printing; `sleep` waits a minute; `spin` spends half a
CPU second."""

from __future__ import annotations

import functools
import importlib
import json
import os
import signal
import sys
import tempfile
import threading
import time

from tests.cli_server import PRELOAD


def caches() -> dict[str, object]:
    """Every deployctl module's state that a command fills: functools caches and module-level
    containers, as sizes."""
    state: dict[str, object] = {}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("deployctl") or module is None:
            continue
        for attr, value in sorted(vars(module).items()):
            if isinstance(value, functools._lru_cache_wrapper):
                state[f"{name}.{attr}"] = value.cache_info().currsize
            elif isinstance(value, dict | list | set) and not attr.startswith("__"):
                state[f"{name}.{attr}"] = len(value)
    return state


def probe() -> dict[str, object]:
    main = sys.modules["__main__"]
    return {
        "pid": os.getpid(),
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "umask": os.umask(0),
        "environ": dict(os.environ),
        "signals": {
            s.name: str(signal.getsignal(s))
            for s in signal.Signals
            if s not in (signal.SIGKILL, signal.SIGSTOP)
        },
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "pgrp": os.getpgrp(),
        "sid": os.getsid(0),
        "fds": sorted(os.listdir("/proc/self/fd")),
        "stdin_tty": sys.stdin.isatty(),
        "line_buffering": [sys.stdout.line_buffering, sys.stderr.line_buffering],
        "tempdir": tempfile.gettempdir(),
        "main": [main.__name__, main.__package__, os.path.basename(main.__file__)],
        "main_names": sorted(vars(main)),
        "threads": threading.active_count(),
        "caches": caches(),
    }


if __name__ == "__main__":
    for name in PRELOAD:  # what a forked run has imported, so that both report the same modules
        importlib.import_module(name)
    sys.modules["deployctl.cli.session"].command_tree()  # and built, as the server does
    print(json.dumps(probe()))
    for arg in sys.argv[1:]:
        if arg.startswith("exit:"):
            value = arg.removeprefix("exit:")
            sys.exit(int(value) if value.isdigit() else value)
        if arg == "raise":
            raise RuntimeError("the probe raised")
        if arg == "interrupt":
            raise KeyboardInterrupt
        if arg == "spin":
            began = time.process_time()
            while time.process_time() - began < 0.5:
                pass
        if arg == "sleep":
            sys.stdout.flush()
            time.sleep(60)
