"""Slurm as a launcher: a login node's deployments run as batch jobs (`launcher: slurm`).

The server command is the one the template renders; this module wraps it in the batch
script that `sbatch` is given: `#SBATCH` lines from the host's `slurm_*` settings, the
deployment's `env`, a check on every allocated node that its GPUs are clean and the port is
free, then one `srun` step per node running the server. A multi-node server
(`slurm_nodes` > 1) reads its node rank inside the step, where `$SLURM_NODEID` is that
node's (the batch shell's is 0 on every node), and meets at the first allocated node.
Pure: the agent submits the script and reads the job's state (deployctl/remote/slurm_jobs.py).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from deployctl.errors import TemplateError
from deployctl.remote.placements import ACTIVE_JOB_STATES, STEP_DRAINS
from deployctl.remote.protocol import Placement
from deployctl.settings import Settings
from deployctl.shell import quote

# Words the step's own shell expands: the template renders them as plain text.
NODE_RANK = "${SLURM_NODEID}"
HEAD_ADDRESS = "${DEPLOYCTL_HEAD_ADDR}"
_EXPANDED = (NODE_RANK, HEAD_ADDRESS)
_MARKERS = re.compile("(" + "|".join(map(re.escape, _EXPANDED)) + ")")
# What the flag check (which never runs the command) sees in their place.
_CHECKED_AS = {NODE_RANK: "0", HEAD_ADDRESS: "127.0.0.1"}

# Run on every node before the server: its GPUs clean (those Slurm gave the step) and the
# server's port free on its address (the node's NodeAddr when it binds every address).
# argv: the most MiB a clean GPU may show, the bind address, the port.
JOB_PREFLIGHT = """\
import os, re, socket, subprocess, sys
most, bind, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
def ask(*argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return done.returncode, done.stdout + done.stderr
code, out = ask("nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
if code:
    sys.exit(f"[deployctl] nvidia-smi failed on node {node}: {out.strip()}")
given = os.environ.get("CUDA_VISIBLE_DEVICES")
mine = None if given is None else {g.strip() for g in given.split(",")}
dirty = []
for line in out.splitlines():
    index, _, used = (f.strip() for f in line.partition(","))
    if (mine is None or index in mine) and used.isdigit() and int(used) > most:
        dirty.append(f"[deployctl] GPU {index} on node {node} is not clean: {used} MiB in use")
if dirty:
    sys.exit("\\n".join(dirty))
if bind in ("", "0.0.0.0", "::"):
    found = re.search(r"NodeAddr=(\\S+)", ask("scontrol", "show", "node", node)[1])
    bind = found.group(1) if found else "0.0.0.0"
with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET) as sock:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
    except OSError as exc:
        sys.exit(f"[deployctl] port {port} on node {node} is in use ({exc})")
print(f"[deployctl] node {node}: GPUs {given or 'all'} clean, port {port} free", flush=True)
"""
# The server's step on each node runs the server under this supervisor (the host's python),
# which makes a stop SGLang's drain. A stop is `scancel --signal=USR2` (STOP_SIGNAL), which
# every process of the step gets: the server and its children ignore it (started with it
# ignored, which a program keeps), and the supervisor, on node 0 only, SIGTERMs the server's
# main process alone, which drains (its requests finish) and ends its children; a node > 0
# follows its rank 0 (SGLang's ShutdownReq ends its schedulers). A stop, or SIGTERM to the
# whole step (the stop's `scancel` at its timeout), ends the step 0 whatever the server's exit
# (SGLang ends a drain by SIGKILLing itself, 137), so Slurm records the job COMPLETED, not
# FAILED (a time limit or a preemption record their own states). argv: the server's command.
STEP_SUPERVISOR = """\
import os, signal, subprocess, sys
stopping = False
def stop(signum, frame):
    global stopping
    stopping = True
    if signum == signal.SIGUSR2 and os.environ.get("SLURM_NODEID", "0") == "0":
        server.send_signal(signal.SIGTERM)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
server = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGUSR2, stop)
signal.signal(signal.SIGTERM, stop)
code = server.wait()
code = code if code >= 0 else 128 - code
if stopping:
    node = os.environ.get("SLURMD_NODENAME", "")
    print(f"[deployctl] the server on node {node} was stopped (exit {code})", flush=True)
    sys.exit(0)
sys.exit(code)
"""
# The line that opens each start of the job in its log (a requeued job starts again, in the
# same log).
JOB_STARTS = "[deployctl] job "
# States of a job that waits to (re)start or to go on: its server is not up, and nothing in
# the log (a requeued job's earlier start) is a crash of it.
WAITING_JOB_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESV_DEL_HOLD"}
)
# Heredoc delimiters of the script's two programs.
_CHECK_END = "DEPLOYCTL_CHECK"
_STEP_END = "DEPLOYCTL_STEP"


def template_context(settings: Settings) -> dict[str, Any]:
    """What a multi-node job's template sees in place of the SSH nodes' variables."""
    nodes = settings.slurm_nodes
    if not settings.slurm or nodes < 2:
        return {}
    return {
        "nnodes": nodes,
        "node_rank": NODE_RANK,
        "dist_init_addr": f"{HEAD_ADDRESS}:{settings.dist_port}",
    }


def checked_form(argv: Sequence[str]) -> list[str]:
    """The command as the flag check sees it: each word the step expands given a value."""
    return [_MARKERS.sub(lambda m: _CHECKED_AS[m.group(0)], word) for word in argv]


def step_word(word: str) -> str:
    """One word for the step's shell: quoted, except the words it must expand itself."""
    parts = [p for p in _MARKERS.split(word) if p]
    return "".join(f'"{p}"' if p in _EXPANDED else quote(p) for p in parts) or "''"


def gpus_per_node(settings: Settings, tp: int) -> int:
    """What each node asks for: `slurm_gpus_per_node`, else its share of `tp`."""
    return settings.slurm_gpus_per_node or max(1, tp // settings.slurm_nodes)


def directives(settings: Settings, tp: int) -> list[str]:
    """The job's `#SBATCH` options, in the order sbatch documents them."""
    options = [
        f"--nodes={settings.slurm_nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={gpus_per_node(settings, tp)}",
    ]
    for name in ("partition", "account", "qos", "time"):
        value = settings.optional_text(f"slurm_{name}")
        if value is not None:
            options.append(f"--{name}={value}")
    if settings.slurm_exclusive:
        options.append("--exclusive")
    return options + settings.slurm_extra


def batch_script(
    settings: Settings,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    tp: int,
    port: int,
    bind_host: str,
    max_used_mib: int,
) -> str:
    """The batch script for one server: its command and environment as given (the real
    ones for sbatch, the masked ones for people)."""
    command = " ".join(step_word(w) for w in argv)
    server = f"exec {quote(settings.python)} -c {quote(STEP_SUPERVISOR)} {command}"
    if _STEP_END in command.splitlines():
        raise TemplateError(f"the command has a line {_STEP_END!r}, which ends its step")
    step = f"srun --ntasks-per-node=1 --gpus-per-node={gpus_per_node(settings, tp)}"
    step += " --kill-on-bad-exit=1"
    lines = ["#!/bin/bash", "# deployctl: one server as a Slurm job (see deployctl render)"]
    lines += [STEP_DRAINS]
    lines += [f"#SBATCH {option}" for option in directives(settings, tp)]
    lines += ["set -u"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    lines += [
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'DEPLOYCTL_HEAD_ADDR=$(scontrol show node "$head" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)',
        'export DEPLOYCTL_HEAD_ADDR="${DEPLOYCTL_HEAD_ADDR:-$head}"',
        f'echo "{JOB_STARTS}$SLURM_JOB_ID on $SLURM_JOB_NODELIST, head $head ($DEPLOYCTL_HEAD_ADDR)"',
        "# Every node: its GPUs clean and the port free, or the job fails here.",
        f"read -r -d '' check <<'{_CHECK_END}' || true",
        JOB_PREFLIGHT.rstrip("\n"),
        _CHECK_END,
        f'{step} {quote(settings.python)} -c "$check" {max_used_mib} {quote(bind_host)} {port} ||',
        '  { echo "[deployctl] the job preflight failed; the server was not started"; exit 1; }',
        "# The server, one step per node; the node rank is read inside the step.",
        f"read -r -d '' server <<'{_STEP_END}' || true",
        server.rstrip("\n"),
        _STEP_END,
        f'exec {step} /bin/sh -c "$server"',
    ]
    return "\n".join(lines) + "\n"


def job_words(job: Placement) -> str:
    """A Slurm job in a few words: `job 12 PENDING (Resources)`, `job 12 FAILED, exit 1:0`,
    `job 12 UNKNOWN (last seen RUNNING; …)`."""
    words = f"job {job['id']} {job['state']}"
    if job["reason"] and job["state"] in ("PENDING", "UNKNOWN"):
        words += f" ({job['reason']})"
    if job["exit_code"] and job["state"] not in ACTIVE_JOB_STATES:
        words += f", exit {job['exit_code']}"
    return words


def latest_start(log: str) -> str:
    """The part of a job's log since its latest start (the whole text when that start's first
    line is not in it): what a preempted and requeued job printed before is no crash of it."""
    lines = log.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(JOB_STARTS)]
    return "".join(lines[starts[-1] :]) if starts else log


# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds.
_TIME_LIMIT = re.compile(r"(?:(\d+)-(\d+)(?::(\d+))?(?::(\d+))?|(\d+)(?::(\d+))?(?::(\d+))?)")


def time_limit_s(text: str) -> float | None:
    """Seconds in a `slurm_time` as sbatch reads it; None for unlimited (or no time)."""
    match = _TIME_LIMIT.fullmatch(text.strip())
    if match is None:
        return None
    days, d_hours, d_minutes, d_seconds, first, second, third = (
        int(g) if g is not None else None for g in match.groups()
    )
    if days is not None:
        hours, minutes, seconds = d_hours or 0, d_minutes or 0, d_seconds or 0
    elif third is not None:
        hours, minutes, seconds = first or 0, second or 0, third
    else:  # minutes[:seconds]
        hours, minutes, seconds = 0, first or 0, second or 0
    return float((((days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds)
