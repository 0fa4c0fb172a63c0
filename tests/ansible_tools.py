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

Ansible's answers are also recorded (tests/data/ansible_runs.json), so the fast tier does not
pay ~15 s of CPU for them each time. DEPLOYCTL_TEST_ANSIBLE says what a run does:

  replay (default)  the recorded answer to the same command on the same files is used; a
                    command with none runs, with a warning
  live              every command runs and its answer must be the one recorded (a missing
                    one fails too): ./scripts/test, so CI checks each recording against Ansible
  record            every command runs and its answer is recorded (added to the file, or
                    replacing the one of the same key), with -n 0:
                    `DEPLOYCTL_TEST_ANSIBLE=record .venv/bin/python -m pytest -n 0
                    -m "not lab or heavy" tests/test_inventory_*.py` (delete the file first to
                    drop the answers no test asks for any more)

A command's key is Ansible's version, the tool, its arguments and ANSIBLE_* settings, and
every file and folder in the test's temporary folder (names, executable bits, contents), with
that folder, this checkout and the venv's python written as placeholders, so a key and its
answer are the same in any clone and any run. A command that names no test's folder always
runs, and so does ansible-vault: it encrypts with a new salt each time, or changes a file (so
a command after it in the same folder has a new key each run, and fails in live mode).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
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
    """Run an Ansible tool as `subprocess.run(argv, capture_output=True, text=True)` does, or
    give its recorded answer (see the module's docstring)."""
    wanted = {k: v for k, v in (os.environ if env is None else env).items() if k not in PER_TEST}
    key = _recording_key(argv, wanted)
    done = _run(argv, wanted) if key is None else _recorded_run(argv, wanted, *key)
    if check:
        done.check_returncode()
    return done


def _recorded_run(
    argv: list[str], env: dict[str, str], key: str, folder: str
) -> subprocess.CompletedProcess[str]:
    recorded = None if MODE == "record" else _recordings().get(key)
    if recorded is not None and MODE == "replay":
        return _restored(argv, recorded, folder)
    if MODE == "live" and recorded is None:
        raise AssertionError(f"{_unrecorded(argv, env)}: record it (see {__name__})")
    if MODE == "replay":  # said, so that a test that gave up its recording is seen
        warnings.warn(f"{_unrecorded(argv, env)}: Ansible runs", stacklevel=3)
    done = _run(argv, env)
    answer = _placeheld(done, folder)
    if recorded is not None and _compared(argv, answer) != _compared(argv, recorded):
        raise AssertionError(
            f"Ansible's answer to {argv} is not the one recorded: record it again (see "
            f"{__name__})\nrecorded: {recorded}\nnow:      {answer}"
        )
    _answered[key] = answer
    return done


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    server = _server(Path(argv[0]).name, env, os.getcwd())
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
        return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())


# ---- recorded answers ---------------------------------------------------------------------

RECORDINGS = Path(__file__).parent / "data" / "ansible_runs.json"
MODE = os.environ.get("DEPLOYCTL_TEST_ANSIBLE", "replay")
if MODE not in ("replay", "live", "record"):
    raise ValueError(f"DEPLOYCTL_TEST_ANSIBLE={MODE!r}: replay, live or record")
if MODE == "record" and "PYTEST_XDIST_WORKER" in os.environ:
    raise ValueError("DEPLOYCTL_TEST_ANSIBLE=record writes one file: run pytest with -n 0")
CHECKOUT = str(Path(__file__).resolve().parent.parent)
# Written as placeholders in keys and answers, the python before the checkout (the venv's
# python is usually in the checkout; an inventory script's #! line names it).
PLACES = {"<python>": sys.executable, "<checkout>": CHECKOUT}
FOLDER_MARK = "<test-folder>"

# The run's temporary folder (conftest.py sets it): a test's own folder is the one in it that
# a command names.
base_temp: Path | None = None
_loaded: dict[str, dict[str, object]] | None = None
_answered: dict[str, dict[str, object]] = {}  # this run's answers, by key (written by record)


def _on_disk() -> dict[str, dict[str, object]]:
    return json.loads(RECORDINGS.read_text()) if RECORDINGS.exists() else {}


def _recordings() -> dict[str, dict[str, object]]:
    global _loaded
    if _loaded is None:
        _loaded = _on_disk()
    return _loaded


def _placeheld_text(text: str, folder: str) -> str:
    text = text.replace(folder, FOLDER_MARK)
    for mark, place in PLACES.items():
        text = text.replace(place, mark)
    return text


@functools.cache
def _version() -> str:
    """The answers are this ansible-core's (asked when a command is, so that a venv without
    Ansible still runs the tests that need none)."""
    return importlib.metadata.version("ansible-core")


def _settings(env: dict[str, str]) -> list[tuple[str, str]]:
    return sorted((k, v) for k, v in env.items() if k.startswith("ANSIBLE_"))


def _unrecorded(argv: list[str], env: dict[str, str]) -> str:
    """Why a command has no answer recorded, as far as can be told."""
    return (
        f"no answer to {argv} is recorded for ansible-core {_version()} with ANSIBLE_* "
        f"settings {dict(_settings(env))}"
    )


def _recording_key(argv: list[str], env: dict[str, str]) -> tuple[str, str] | None:
    """(the key, the test's folder), or None for a command that always runs: one whose
    inputs are not known (no argument names a test's folder), and ansible-vault's (it
    encrypts with a new salt each time, or changes the file it names)."""
    if base_temp is None or Path(argv[0]).name == "ansible-vault":
        return None
    named = re.search(re.escape(str(base_temp)) + r"/[^/\s]+", " ".join(map(str, argv)))
    if named is None or not Path(named.group(0)).is_dir():
        return None
    folder = named.group(0)
    digest = hashlib.sha256()
    command = [_version(), Path(argv[0]).name, *map(str, argv[1:]), _settings(env)]
    digest.update(_placeheld_text(json.dumps(command, ensure_ascii=False), folder).encode())
    for path in sorted(Path(folder).rglob("*")):  # folders too: Ansible reads a folder's names
        rel = path.relative_to(folder).as_posix()
        if not path.is_file():
            digest.update(f"\0{rel}/\0".encode())
            continue
        executable = bool(path.stat().st_mode & 0o111)
        digest.update(f"\0{rel}\0{executable}\0".encode())
        digest.update(
            _placeheld_text(path.read_text(errors="surrogateescape"), folder).encode(
                errors="surrogateescape"
            )
        )
    return digest.hexdigest(), folder


def _placeheld(done: subprocess.CompletedProcess[str], folder: str) -> dict[str, object]:
    return {
        "returncode": done.returncode,
        "stdout": _placeheld_text(done.stdout, folder),
        "stderr": _placeheld_text(done.stderr, folder),
    }


def _compared(argv: list[str], answer: dict[str, object]) -> dict[str, object]:
    """What must be the same in two answers: an ad hoc module's hosts answer in parallel, so
    its lines (one a host, with -o) in any order; everything else as it is."""
    if Path(argv[0]).name != "ansible" or "-m" not in argv:
        return answer
    return {**answer, "stdout": sorted(str(answer["stdout"]).splitlines())}


def _restored(
    argv: list[str], answer: dict[str, object], folder: str
) -> subprocess.CompletedProcess[str]:
    def text(field: str) -> str:
        written = str(answer[field]).replace(FOLDER_MARK, folder)
        for mark, place in PLACES.items():
            written = written.replace(mark, place)
        return written

    return subprocess.CompletedProcess(
        argv, int(str(answer["returncode"])), text("stdout"), text("stderr")
    )


@atexit.register
def _write_recordings() -> None:
    """This run's answers join those recorded (a run of some tests keeps the others')."""
    if MODE == "record" and _answered:
        merged = dict(sorted({**_on_disk(), **_answered}.items()))
        RECORDINGS.write_text(json.dumps(merged, indent=1, ensure_ascii=False) + "\n")
