"""`survey`: what `deployctl init` reads of a host in one call — every Python that has SGLang
(found without importing it) with its patch states, the TCP ports in use, model folders on
disk, the Slurm client. GPUs and their links are read beside it (nvidia-smi)."""

from __future__ import annotations

import getpass
import glob
import json
import os
import shutil
import socket
import subprocess

from .locks import machine_identity
from .patches import dist_version, probe_install
from .protocol import FoundPython, ProbeArgs, SurveyReply

# Where Pythons with SGLang usually live: the PATH's, venvs in the home folder (one or two
# levels down), conda and uv environments, /opt. A glob finds each; more than MAX_PYTHONS
# are not looked at (each is started once).
PYTHON_NAMES = ("python3", "python")
PYTHON_GLOBS = (
    "~/*/bin/python3",
    "~/.*/bin/python3",
    "~/*/*/bin/python3",
    "~/*/envs/*/bin/python3",
    "~/.conda/envs/*/bin/python3",
    "/opt/*/bin/python3",
    "/opt/*/envs/*/bin/python3",
    "/usr/local/bin/python3",
    "/usr/bin/python3",
)
MAX_PYTHONS = 40
PYTHON_TIMEOUT = 10.0  # seconds for one interpreter to say what it is
# Where models are usually kept: folders holding a config.json, at most MAX_MODELS.
MODEL_GLOBS = (
    "~/models/*/config.json",
    "~/.cache/huggingface/hub/models--*/snapshots/*/config.json",
    "/models/*/config.json",
    "/data/models/*/config.json",
    "/mnt/models/*/config.json",
    "/opt/models/*/config.json",
)
MAX_MODELS = 50
# Run by each interpreter found: its prefix, version and the folder SGLang would be imported
# from (found, not imported: SGLang's __init__ needs torch and takes seconds).
WHAT_PYTHON = (
    "import importlib.util, json, sys\n"
    "try:\n"
    "    spec = importlib.util.find_spec('sglang')\n"
    "except Exception:\n"
    "    spec = None\n"
    "where = list(spec.submodule_search_locations or []) if spec else []\n"
    "print(json.dumps({'prefix': sys.prefix, 'version': sys.version.split()[0],"
    " 'package': where[0] if where else None}))\n"
)


def candidate_pythons() -> list[str]:
    """Interpreter paths to ask, PATH's first, each once."""
    found: list[str] = []
    for name in PYTHON_NAMES:
        path = shutil.which(name)
        if path:
            found.append(path)
    for pattern in PYTHON_GLOBS:
        found += sorted(glob.glob(os.path.expanduser(pattern)))
    unique = list(dict.fromkeys(p for p in found if os.access(p, os.X_OK)))
    return unique[:MAX_PYTHONS]


def ask_python(path: str, args: ProbeArgs) -> tuple[str, FoundPython] | None:
    """(its environment's prefix, what it is); None: it did not answer as a Python does."""
    try:
        done = subprocess.run(
            # As the server would be started: the user's environment, from the home folder.
            [path, "-c", WHAT_PYTHON],
            check=False,
            cwd=os.path.expanduser("~"),
            capture_output=True,
            text=True,
            timeout=PYTHON_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        prefix, version, package = answer["prefix"], answer["version"], answer["package"]
    except (OSError, subprocess.SubprocessError, ValueError, LookupError, TypeError):
        return None
    found: FoundPython = {"python": path, "version": str(version), "sglang": None}
    if isinstance(package, str):
        site = os.path.dirname(package)
        install = {"version": dist_version(site, "sglang"), "site": site, "python": path}
        found["sglang"] = probe_install(install, args)  # type: ignore[arg-type]
    return str(prefix), found


def pythons(args: ProbeArgs) -> list[FoundPython]:
    """Every interpreter found, one per environment (a venv's python and python3 are one)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:  # each starts in 50 ms to seconds
        answers = list(pool.map(lambda path: ask_python(path, args), candidate_pythons()))
    by_prefix: dict[str, FoundPython] = {}
    for answer in answers:
        if answer is not None and answer[0] not in by_prefix:
            by_prefix[answer[0]] = answer[1]
    return list(by_prefix.values())


def listening_ports() -> list[int]:
    """TCP ports something listens on (state 0A in /proc/net/tcp and tcp6), sorted."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cells = row.split()
            if len(cells) > 3 and cells[3] == "0A" and ":" in cells[1]:
                ports.add(int(cells[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def model_folders() -> list[str]:
    found: list[str] = []
    for pattern in MODEL_GLOBS:
        found += sorted(os.path.dirname(p) for p in glob.glob(os.path.expanduser(pattern)))
    return found[:MAX_MODELS]


def cmd_survey(args: ProbeArgs) -> SurveyReply:
    return {
        "hostname": socket.gethostname(),
        "user": getpass.getuser(),
        "pythons": pythons(args),
        "ports": listening_ports(),
        "models": model_folders(),
        "sbatch": shutil.which("sbatch"),
        "machine": machine_identity(),
    }
