"""The typed declarations of the wire protocol between deployctl and its agent on a host
(stdlib only): each call's arguments and reply (`*Args`, `*Reply`) and the call table
(`CALLS`). The types of what is measured and kept (bench levels, tune records) are declared in
`measures`, a router's list and locks in `routing`; the markers, the names kept on a host and
the pure helpers both sides use at run time in `wire`. The host's modules import this one only
for the type checker. How the agent is shipped and run: deployctl/remote/__init__.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypedDict, TypeVar

from .measures import (
    BenchArgs,
    BenchLevel,
    BenchResultsArgs,
    BenchResultsReply,
    BenchSaveArgs,
    BenchSaveReply,
    CanaryKeepArgs,
    CanaryKeepReply,
    CanaryRecordsArgs,
    CanaryRecordsReply,
    EchoArgs,
    EchoReply,
    LiveKeepArgs,
    LiveRecordsArgs,
    LiveRecordsReply,
    TuneRecordsArgs,
    TuneRecordsReply,
    TuneSaveArgs,
    TuneSaveReply,
)  # fmt: skip
from .patch_types import (
    ApplyArgs,
    ApplyReply,
    HunkMark,
    PatchRecord,
    ReadArgs,
    ReadReply,
    RevertArgs,
    RevertReply,
)  # fmt: skip
from .routing import HoldArgs, HoldReply, RouterArgs, RouterReply, WorkersArgs


class OptionSpec(TypedDict):
    """One option of SGLang's server, as the host's flag check reads it (server_argv)."""

    dest: str
    kind: str  # flag (no value), value (one), list (several), any (a custom action)
    nargs: str | None  # "?" for an optional value, "+"/"*" for lists
    type: str | None  # int, float or str when argparse checks it; None: not checked here
    choices: list[Any] | None


class SglangInstall(TypedDict, total=False):
    version: str | None
    site: str
    python: str
    error: str


class ProbeArgs(TypedDict):
    state_dir: str
    paths: list[str]
    hunks: dict[str, dict[str, dict[str, list[HunkMark]]]]  # set → SGLang version → file


class ProbeReply(TypedDict):
    sglang: SglangInstall
    records: dict[str, PatchRecord]
    files: dict[str, str | None]
    hunks: dict[str, dict[str, list[str]]]  # set → file → per hunk: applied, missing, differs


class FoundPython(TypedDict):
    """One interpreter a survey found: its path as found, its version and, where it has
    SGLang, what `probe` would answer run with it."""

    python: str
    version: str
    sglang: ProbeReply | None


class SurveyReply(TypedDict):
    """What `deployctl init` reads of a host (GPUs and their links come beside it)."""

    hostname: str
    user: str
    pythons: list[FoundPython]
    ports: list[int]  # TCP ports something listens on
    models: list[str]  # folders holding a model's config.json
    sbatch: str | None  # where Slurm's sbatch is; None: no Slurm client
    machine: str


class _Client(TypedDict):
    host: str
    pid: int
    user: str
    op: str
    expires: float


class ClientIdentity(_Client, total=False):
    launch: str  # one launch command's id, the same for each of its targets
    target: str  # the inventory target (host or host/deployment) it is taken for


class LockReply(TypedDict):
    acquired: bool
    token: str | None
    holder: dict[str, Any] | None  # the lock file as found; its "token" is always set


class PreflightArgs(ProbeArgs):
    deployment: str | None
    gpus: list[int] | None  # None: every GPU
    port: int
    # More ports the server will listen on → the address each is bound on ("": every one).
    also_ports: dict[str, str]
    bind_host: str
    check_paths: list[str]
    module: str | None
    log_dir: str
    log_stem: str
    client: ClientIdentity
    break_lock: str | None
    server_argv: list[str] | None  # checked against the installation's options; None: not
    model: str | None  # the model folder whose config.json says whether it uses MLA


class LiveRunOrigin(TypedDict, total=False):
    origin: str | None  # the inventory that launched it; None (or absent): not recorded
    launcher: str  # the kind of launcher that started it (`ssh`, `slurm`, …)
    placement: str  # its placement's id (a Slurm job's): no members here, they are elsewhere
    mem_fraction_static: float | None  # the share of its GPUs' memory it took; None: not capped


class LiveRun(LiveRunOrigin):
    id: str
    pid: int
    deployment: str | None
    gpus: list[int] | None
    port: int
    members: list[int]


class ArgFinding(TypedDict):
    level: str  # error (refuses the launch) or warning
    flag: str
    message: str
    candidates: list[str]


class ArgvCheck(TypedDict):
    method: str  # declarations (read statically), parser (SGLang's own), none
    note: str
    options: int  # how many option names the installation has
    findings: list[ArgFinding]
    seconds: float


class CheckArgsArgs(TypedDict):
    server_argv: list[str] | None


class CheckArgsReply(TypedDict):
    sglang: SglangInstall
    check: ArgvCheck


class PreflightReply(ProbeReply):
    live_runs: list[LiveRun]  # every deployment's current run whose processes are still there
    module_found: bool
    port_free: bool
    port_error: str
    busy_ports: dict[str, str]  # of also_ports: port → why it cannot be bound
    argv_check: ArgvCheck
    paths: dict[str, bool]
    log_dir_writable: bool
    log_dir_error: str
    next_log: str
    next_version: int
    lock: LockReply
    # What each launcher tells a preflight of this host, by its own names (`sbatch`: where
    # sbatch is; None: not on the PATH).
    launcher_facts: dict[str, str | None]
    # The model's attention is MLA (its config.json has `kv_lora_rank`); None: not read.
    model_mla: bool | None
    # `<machine-id>/<boot-id>` (locks.machine_identity); "" where it cannot be read.
    machine: str


class RunShown(TypedDict, total=False):
    # Records before 0.2 lack these.
    env: dict[str, str]  # the server's environment, secrets masked
    deployment: str | None
    gpus: list[int] | None
    mem_fraction_static: float  # its --mem-fraction-static, where the command gives one
    origin: str  # the inventory that launched it (its sources' paths); older records lack it
    # Where its router lists it, as its launch computed it: a stop removes this one, whatever
    # the inventory says since. "": a Slurm job's head node's (known once it runs).
    worker_url: str


class RunInfo(RunShown):
    template: str
    threshold: int | None
    command: str  # as shown to people: secrets masked
    port: int
    bind_host: str
    tp: int
    patches: dict[str, str]
    deployctl_version: str
    started_by: str
    restart_of: str | None


class LeaderIdentity(TypedDict, total=False):
    # The leader's start time in clock ticks since boot (/proc/PID/stat field 22): with it, a
    # PID that now names another process is never taken for the run. Older records lack it.
    starttime: int


class Placement(TypedDict):
    """What a launcher reports of a server it placed besides its processes on the host (a
    Slurm job as squeue or sacct last saw it; None for a process group on the host)."""

    id: str  # the launcher's handle of it: a Slurm job's id, a unit's name
    state: str  # in the launcher's words (Slurm's PENDING, RUNNING, COMPLETED, …); UNKNOWN
    reason: str  # why it waits (Slurm's Resources, Priority, BeginTime…); "" otherwise
    nodes: list[str]  # the machines it runs on, the first one the head
    head: str  # where the server answers ("" until known; its bind_host if on the host)
    time_left: float | None  # seconds to its time limit; None: no limit, or not running
    exit_code: str  # "code:signal" once it ended; "" before


class PlacedRecord(TypedDict, total=False):
    launcher: str  # the kind of launcher that started it; older records lack it
    job: Placement  # a placed run's last known placement (the key records have always had)


class StopMarks(TypedDict, total=False):
    """What a stop writes in the record: before it signals the run, when (host time) and the
    longest it may take (a launch waiting for the run then knows why it died, and `status`
    reads it stopping, not crashed, while it is gone but not yet recorded so); once it ended,
    when. A mark older than its budget is a stop whose agent died: no longer honoured."""

    stop_requested_at: float
    stop_budget_s: float
    stopped_at: float


class RunRecord(RunInfo, LeaderIdentity, PlacedRecord, StopMarks):
    id: str
    log: str
    pid: int
    pgid: int
    sid: int
    started_at: float
    status: str  # running | stopped


class StartArgs(TypedDict):
    state_dir: str
    deployment: str | None
    log_dir: str
    log_stem: str
    command: str  # the real command, secrets included
    env: dict[str, str]  # the real environment for the server, over the login's
    min_version: int  # the log version to use at least (one N on every node of a group)
    run: RunInfo
    lock_token: str | None
    files: dict[str, str]  # path (from the home folder, or absolute) → text, written first
    launcher: str  # the kind of launcher that starts it (remote/launchers.py)
    script: str | None  # the launcher's wrapper of the command (a Slurm batch script); None: none


class PlacementRef(TypedDict):
    launcher: str  # the kind of launcher that placed it
    id: str  # its placement's id
    state_dir: str
    run: str  # the run whose record keeps its last known placement


class PlacedIdentity(TypedDict, total=False):
    placement: PlacementRef  # the run is placed by a launcher: it says if it lives, and where


class StartReply(TypedDict):
    run: RunRecord


class PollArgs(LeaderIdentity, PlacedIdentity):
    pgid: int
    sid: int
    log: str
    port: int
    bind_host: str
    offset: int  # negative: the last `limit` bytes
    limit: int
    wait: float


class PollReply(TypedDict):
    alive: bool
    members: list[int]
    health: int | None
    size: int
    data: str  # base64
    placement: Placement | None  # its launcher's report (a Slurm job's); None: a process here


class StatusArgs(TypedDict):
    state_dir: str
    deployment: str | None
    run: str | None
    tail_bytes: int
    metrics_bytes: int  # > 0: also GET /metrics from a live server, at most this much


class MetricsPage(TypedDict):
    status: int | None  # the HTTP status; None when nothing answered
    text: str


class StatusReply(PollReply):
    run: RunRecord | None
    command: str | None
    env: dict[str, str] | None
    metrics: MetricsPage | None  # asked for and the server alive


class StopArgs(TypedDict):
    state_dir: str
    deployment: str | None
    # Seconds the run has to end by itself after the first signal; then its group gets
    # SIGTERM, and SIGKILL a little later.
    timeout: float
    run: str | None  # a run of the deployment by id (a renewed job's predecessor); None: current
    first_signal: str  # FIRST_SIGNAL_LEADER, _NONE or _GROUP


class PointArgs(TypedDict):
    state_dir: str
    deployment: str | None
    run: str  # make this recorded run the deployment's current one again


class PointReply(TypedDict):
    pointed: bool  # False: no such run is recorded


class StopReply(TypedDict):
    run: RunRecord | None
    ended: list[int]
    killed: list[int]
    left: list[int]
    placement: Placement | None  # its placement as the stop left it (a Slurm job's)
    shutdown: str | None  # SHUTDOWN_DRAINED or SHUTDOWN_CUT; None: nothing of it was running
    shutdown_s: float | None  # seconds from the first signal until nothing of it was left


class ReleaseArgs(TypedDict):
    state_dir: str
    deployment: str | None
    token: str


class ReleaseReply(TypedDict):
    released: bool


class RunsArgs(TypedDict):
    state_dir: str


class RunsReply(TypedDict):
    live_runs: list[LiveRun]


class TuneLockArgs(TypedDict):
    state_dir: str
    deployment: str | None
    client: ClientIdentity
    break_lock: str | None  # the token of a stale holder to replace


# ---- the calls ----------------------------------------------------------------------------

A = TypeVar("A", bound=Mapping[str, Any])
R = TypeVar("R")


class Call(Generic[A, R]):
    """One agent call: its name on the wire, the TypedDict it takes and the one it answers.

    mypy infers a call's types from a typed value, not from a dict literal: pass a variable
    annotated with the args type, or build it with that type, e.g. `ReadArgs(base=…, paths=…)`.
    """

    __slots__ = ("args", "name", "reply", "what")

    def __init__(self, name: str, args: type[A], reply: type[R], what: str = "") -> None:
        self.name = name
        self.args = args
        self.reply = reply
        self.what = what  # what the call asks of the host, in words, for a timeout's message

    def __repr__(self) -> str:
        return f"Call({self.name!r})"

    @property
    def purpose(self) -> str:
        return f"deployctl's host agent was asked to {self.what or self.name}"


# Every call the agent answers (handlers.HANDLERS), typed by the declarations above.
# fmt: off
PROBE = Call("probe", ProbeArgs, ProbeReply, "read the host's facts (SGLang install, GPUs, ports)")
READ = Call("read", ReadArgs, ReadReply, "read files of the SGLang install")
APPLY = Call("apply", ApplyArgs, ApplyReply, "apply a patch set")
REVERT = Call("revert", RevertArgs, RevertReply, "revert a patch set")
PREFLIGHT = Call("preflight", PreflightArgs, PreflightReply,
                 "check the host before a launch (GPUs, ports, lock, log name)")
CHECK_ARGS = Call("check_args", CheckArgsArgs, CheckArgsReply,
                  "ask the host's SGLang whether it accepts the command's flags")
START = Call("start", StartArgs, StartReply, "start the server")
POLL = Call("poll", PollArgs, PollReply, "wait for the server to be ready, watching its log")
STATUS = Call("status", StatusArgs, StatusReply,
              "read the deployments' status (run records, processes, GPUs, log)")
STOP = Call("stop", StopArgs, StopReply, "stop the server and wait for its GPUs to be clean")
RELEASE = Call("release", ReleaseArgs, ReleaseReply, "release the launch lock")
POINT = Call("point", PointArgs, PointReply, "make a run the deployment's current run")
RUNS = Call("runs", RunsArgs, RunsReply, "list the deployment's runs")
BENCH = Call("bench", BenchArgs, BenchLevel, "run a benchmark level against the server")
BENCH_SAVE = Call("bench_save", BenchSaveArgs, BenchSaveReply, "keep a benchmark's results")
BENCH_RESULTS = Call("bench_results", BenchResultsArgs, BenchResultsReply,
                     "read kept benchmark results")
TUNE_SAVE = Call("tune_save", TuneSaveArgs, TuneSaveReply, "keep a tune's record")
TUNE_RECORDS = Call("tune_records", TuneRecordsArgs, TuneRecordsReply, "read kept tune records")
CANARY_KEEP = Call("canary_keep", CanaryKeepArgs, CanaryKeepReply, "keep a canary's record")
CANARY_RECORDS = Call("canary_records", CanaryRecordsArgs, CanaryRecordsReply,
                      "read kept canary records")
LIVE_KEEP = Call("live_keep", LiveKeepArgs, CanaryKeepReply, "keep a live window's record")
LIVE_RECORDS = Call("live_records", LiveRecordsArgs, LiveRecordsReply,
                    "read kept live windows")
TUNE_LOCK = Call("tune_lock", TuneLockArgs, LockReply, "take the tune lock")
TUNE_UNLOCK = Call("tune_unlock", ReleaseArgs, ReleaseReply, "release the tune lock")
ROUTER = Call("router", RouterArgs, RouterReply,
              "add or remove a router's worker, or check a worker's health from there")
# The router's list alone: a read, so a kept agent answers it (a canary checks it every round).
WORKERS = Call("workers", WorkersArgs, RouterReply, "ask the router for its workers")
# Through `hold`: it stays running, holding the lock, until its client goes.
HOLD = Call("hold", HoldArgs, HoldReply, "take a router's rollout lock")
SURVEY = Call("survey", ProbeArgs, SurveyReply,
              "read its Pythons with SGLang, patch states, ports and models")
CALLS: tuple[Call[Any, Any], ...] = (
    PROBE, READ, APPLY, REVERT, PREFLIGHT, CHECK_ARGS, START, POLL, STATUS, STOP, RELEASE, RUNS,
    BENCH, BENCH_SAVE, BENCH_RESULTS, TUNE_SAVE, TUNE_RECORDS, TUNE_LOCK, TUNE_UNLOCK, ROUTER,
    WORKERS, POINT, HOLD, CANARY_KEEP, CANARY_RECORDS, LIVE_KEEP, LIVE_RECORDS, SURVEY,
)
# fmt: on


# ---- the kept agent (remote/kept_agent.py) ------------------------------------------------


# ---- the kept agent (remote/kept_agent.py) ------------------------------------------------

# A trivial answer through a kept agent: the floor a round's cost is measured against.
ECHO = Call("echo", EchoArgs, EchoReply, "answer through the kept agent")  # wire.ECHO
