"""What both ends of the wire use at run time: the markers on a call's output, the names
deployctl keeps on a host, the GPU query, the stop's modes, the kept agent's calls and the pure
helpers both sides share. The typed declarations (each call's arguments and reply, the call
table) are in `protocol`, which the host imports only for the type checker: this module
imports nothing, as each one-shot call's Python pays for every import at its start
(`typing` and the TypedDicts' classes cost a status call 15 ms of ~60).

Everything deployctl keeps on a host lives under `state_dir` (default ~/.deployctl), laid
out here and nowhere else:

    agent/                                mode 0700, the login user's
    agent/<sha256>/                       the agent's bundle, unpacked (mode 0700), named by
                                          the hash of the bundle; its modules and their
                                          __pycache__ under deployctl_remote/
    agent/<sha256>/manifest               "<sha256>  <path>" per module: checked before each
                                          import (with every part's owner and mode)
    agent/<sha256>/complete               the folder's name, written last: it is complete
    agent/<sha256>.py                     (older deployctl: the agent as one file)
    lock                                  held while a launch changes the host
    tune-lock[-<deployment>]              held while a tune replaces the deployment's runs
    runs/<run-id>.json                    one record per launch (run id = log name); kept
    runs/<run-id>.cmd                     the unmasked command, mode 0600, for restart
    runs/<run-id>.env                     the server's own environment (JSON), mode 0600
    runs/current                          id of the host's current run
    patches/sites/<key>/<set>.json        what is applied now to one SGLang installation (key:
                                          sha256 of its site-packages path): version, hash,
                                          files, sha256s (patches/<set>.json: the same, as
                                          written before records were kept per installation)
    patches/.lock                         serialises patch changes (flock, dies with us)
    router-locks/<deployment>             serialises the rollouts through one router (flock,
                                          held by a `hold` call until its client goes; the
                                          holder's identity as JSON inside)
    tunes/<n>.json                        one record per tune, numbered, never overwritten
    canaries/<n>.json                     one record per canary of a router on this host,
                                          numbered; rewritten only while it runs
    patches/history/<set>-<id>-<why>.json records of reverted, replaced or gone applies
    patches/backups/<set>/<id>/<relpath>  originals saved by one apply; never overwritten
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .protocol import Placement, PlacementRef, PollArgs, RunRecord
    from .routing import RouterWorker

AGENT_DIR = "agent"
# Written last into an unpacked bundle's folder, holding the folder's name (the hash).
BUNDLE_COMPLETE = "complete"
# Printed (with exit status AGENT_MISSING_EXIT), then why, when the bundle's folder must not
# be run: absent (BUNDLE_ABSENT), incomplete, damaged, or open to others than its owner.
AGENT_MISSING = "@@deployctl-agent-missing@@"
BUNDLE_ABSENT = "absent"
AGENT_MISSING_EXIT = 97
# Starts the line that holds a reply: what a login prints (motd, an rc file) is never read.
REPLY_MARK = "@@deployctl-reply@@ "

# The GPUs' state: nvidia-smi's two queries in one probe (a missing nvidia-smi is exit 127).
# A kept agent answers it through NVML where the library loads (remote/gpus.py).
GPU_QUERY = (
    "nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,"
    "temperature.gpu,compute_cap,driver_version --format=csv"
)
GPU_APPS_QUERY = (
    "nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv"
)
GPUS_COMMAND = (
    "command -v nvidia-smi >/dev/null 2>&1 || { echo 'nvidia-smi: command not found'; exit 127; }; "
    f"{GPU_QUERY} && echo @@apps && {GPU_APPS_QUERY}"
)

# The longest a stop's agent takes past its drain timeout: SIGTERM to the group, then SIGKILL
# (each up to 10 s); the client's round trip allows as much.
STOP_MARGIN_S = 30.0

# How a stop begins. SGLang drains on SIGTERM to its main process: it finishes the requests
# it runs, then ends its own children; a SIGTERM to every process at once kills the
# schedulers under it and cuts those requests. A node > 0 of a multi-node server has no
# drain of its own (its main process dies of SIGTERM and takes its schedulers along, which
# breaks rank 0's collectives): its schedulers end when rank 0's drain shuts them down.
FIRST_SIGNAL_LEADER = "leader"  # SIGTERM the run's main process only
FIRST_SIGNAL_NONE = "none"  # signal nothing; the run ends when its rank 0 ends it
FIRST_SIGNAL_GROUP = "group"  # no drain: SIGTERM the whole group at once (a failed server)

# How a run ended under a stop: by itself after the first signal (what it ran finished), or
# cut at the timeout (its whole group signalled).
SHUTDOWN_DRAINED = "drained"
SHUTDOWN_CUT = "cut"

LOCK_PREFIX = "lock"
POINTER = "current"
ROUTER_LOCKS = "router-locks"

# ---- the kept agent (remote/kept_agent.py) ------------------------------------------------

SESSION = "--session"  # the call name that starts a kept agent instead of answering a call
# A trivial answer through a kept agent: the floor a round's cost is measured against.
ECHO = "echo"
# What a kept agent answers (by name; protocol.CALLS declares them): the calls that only read,
# which front ends repeat every round.
SESSION_CALLS = frozenset({"status", "runs", "bench_results", "tune_records", "read", "probe",
                           "workers", ECHO})  # fmt: skip


# ---- pure helpers both sides use ----------------------------------------------------------


def shares_gpus(first: list[int] | None, second: list[int] | None) -> bool:
    """Do two GPU sets share a GPU? None stands for every GPU of the host; [] for none (a
    router's)."""
    if first == [] or second == []:
        return False
    return first is None or second is None or bool(set(first) & set(second))


def placement_ref(launcher: str, state_dir: str, run: RunRecord, placed: Placement) -> PlacementRef:
    """What a poll of a placed run needs to ask its launcher about it (the launchers say
    which runs are placed, on each side of the wire)."""
    return {"launcher": launcher, "id": placed["id"], "state_dir": state_dir, "run": run["id"]}


def answers_at(bind_host: str, placed: Placement | None) -> str:
    """Where a run's server answers, from the host that launched it: a placed run at its
    head's address ("" until it is known), a process on the host at its `bind_host`."""
    return placed["head"] if placed is not None else bind_host


def poll_args(
    run: RunRecord, ref: PlacementRef | None, offset: int, limit: int, wait: float
) -> PollArgs:
    """What a poll of `run` asks: its processes (or its placement, `ref`), its log
    from `offset` (negative: the last `limit` bytes), its health; waiting up to `wait`
    seconds for a change."""
    args: PollArgs = {
        "pgid": run["pgid"],
        "sid": run["sid"],
        "log": run["log"],
        "port": run["port"],
        "bind_host": run["bind_host"],
        "offset": offset,
        "limit": limit,
        "wait": wait,
    }
    if "starttime" in run:
        args["starttime"] = run["starttime"]
    if ref is not None:
        args["placement"] = ref
    return args


def url_key(url: str) -> str:
    """A worker URL as compared with another: a router lists the URL it was given, and a hand
    fix or another tool may have given ours with a trailing slash or another case of scheme
    and host. Matching uses this; a change to the router uses the router's own spelling."""
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text.rstrip("/")
    netloc, slash, path = rest.partition("/")
    return f"{scheme.lower()}://{netloc.lower()}{(slash + path).rstrip('/')}"


def listed_as(workers: list[RouterWorker], url: str) -> list[RouterWorker]:
    """The router's entries for `url`, however the router spells it."""
    key = url_key(url)
    return [w for w in workers if url_key(w["url"]) == key]
