"""Run Ansible's own command-line tools (test_inventory_ansible's oracle) without paying for
their import each time.

A tool spends most of a short run importing Ansible (~0.5 s of CPU). A server process does
what the tool's console script does first, `from ansible.cli.X import main`, then forks one
child per command; the child runs that `main` with the command's argv, stdin on /dev/null and
stdout and stderr on files. That is the script's own code on the same arguments, from the
state right after its import and the set-up of Ansible's collection loader (the first step of
every tool's `CLI.run`, the same for every run here). Ansible reads its configuration (the
environment, an ansible.cfg in the working folder) at import, so there is one server per
tool, environment and folder.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# The module each console script (the venv's bin/ansible*) takes `main` from.
TOOLS = {
    "ansible": "ansible.cli.adhoc",
    "ansible-inventory": "ansible.cli.inventory",
    "ansible-vault": "ansible.cli.vault",
}
# pytest names the running test in the environment; Ansible never reads it.
PER_TEST = {"PYTEST_CURRENT_TEST"}

SERVER = """
import atexit, importlib, json, os, sys, threading, traceback, warnings
main = importlib.import_module(sys.argv[1]).main
# What each tool's `CLI.run` does first, done once: the collection loader set up (no tool run
# here names a collections path, so it is the same for every run) and ansible.builtin's
# routing table read; `CLI.run`'s own setup then finds it done, and says so in a warning.
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader()
importlib.import_module("ansible_collections.ansible.builtin")
warnings.filterwarnings("ignore", "AnsibleCollectionFinder has already been configured")
assert threading.active_count() == 1  # a fork copies only the thread that forks
requests = os.fdopen(0, "rb", buffering=0)
while line := requests.readline():
    request = json.loads(line)
    child = os.fork()
    if child == 0:
        code = 250
        atexit._clear()  # the server's own handlers (its local tmp folder) run when it ends
        try:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(os.open(request["stdout"], os.O_WRONLY), 1)
            os.dup2(os.open(request["stderr"], os.O_WRONLY), 2)
            sys.argv = request["argv"]
            main()
            code = 0
        except SystemExit as exc:  # as the interpreter would exit with it
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
        finally:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status, usage = os.wait4(child, 0)
    reply = [os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime]
    os.write(1, (json.dumps(reply) + "\\n").encode())
"""

# CPU seconds of every tool run this process had run by a server (tests/cpu_profile.py adds
# them to the test's: they are the server's children, so in no rusage of the test's process).
cpu_seconds = 0.0

_servers: dict[tuple[str, str, tuple[tuple[str, str], ...]], subprocess.Popen[bytes]] = {}


def _server(tool: str, env: dict[str, str], cwd: str) -> subprocess.Popen[bytes]:
    key = (tool, cwd, tuple(sorted(env.items())))
    if key not in _servers:
        _servers[key] = subprocess.Popen(
            [sys.executable, "-c", SERVER, TOOLS[tool]],
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
    return _servers[key]


@atexit.register
def _stop_servers() -> None:
    for server in _servers.values():
        assert server.stdin is not None
        server.stdin.close()  # the server ends at the end of its requests
        server.wait()


def run_tool(
    argv: list[str], *, env: dict[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run an Ansible tool as `subprocess.run(argv, capture_output=True, text=True)` does."""
    wanted = {k: v for k, v in (os.environ if env is None else env).items() if k not in PER_TEST}
    server = _server(Path(argv[0]).name, wanted, os.getcwd())
    assert server.stdin is not None and server.stdout is not None
    with tempfile.TemporaryDirectory(prefix="ansible-tool-") as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        out.touch()
        err.touch()
        request = {"argv": [str(a) for a in argv], "stdout": str(out), "stderr": str(err)}
        server.stdin.write((json.dumps(request) + "\n").encode())
        server.stdin.flush()
        reply = server.stdout.readline()
        assert reply, f"the server for {argv[0]} died running {argv}"
        code, cpu = json.loads(reply)
        global cpu_seconds
        cpu_seconds += cpu
        done = subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())
    if check:
        done.check_returncode()
    return done
