"""The Slurm launcher's host side: a run is a batch job submitted from this login node, its
state asked of slurmctld (squeue, else sacct), ended by scancel."""

from __future__ import annotations

import os
import time

from .files import fail, marked_stopping, read_json, state_path, write_atomic, write_json
from .placements import ACTIVE_JOB_STATES, SLURM, STEP_DRAINS, STOP_SIGNAL
from .wire import SHUTDOWN_CUT, SHUTDOWN_DRAINED, answers_at, placement_ref

# The types for the checker only, and `re` and `subprocess` imported where a Slurm run needs
# them: every status call imports this module (files.py says why).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .protocol import (
        LiveRunOrigin,
        Placement,
        PlacementRef,
        PollArgs,
        RunRecord,
        StartArgs,
        StopReply,
    )

SQUEUE_FORMAT = "%i|%T|%r|%N|%L"
# The longest a query of slurmctld may take before the job's state counts as unknown.
SLURM_TIMEOUT = 30.0
# The least time between two queries of one job inside one poll: slurmctld serves everyone.
SLURM_QUERY_EVERY = 0.5


def which(command: str) -> str | None:
    """Where PATH finds an executable `command` (as shutil.which, whose import brings three
    compressors: ~6 ms of every preflight's start)."""
    for folder in filter(None, os.environ.get("PATH", os.defpath).split(os.pathsep)):
        path = os.path.join(folder, command)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def slurm(*argv: str) -> tuple[int, str]:
    """Run a Slurm client command: its exit status and its output (stderr after stdout)."""
    import subprocess

    try:
        done = subprocess.run(
            list(argv), check=False, capture_output=True, text=True, timeout=SLURM_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except FileNotFoundError:
        return 127, f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not answer within {SLURM_TIMEOUT:.0f} s"
    return done.returncode, (done.stdout + done.stderr).strip()


def parse_slurm_duration(text: str) -> float | None:
    """Seconds in squeue's `[days-]hours:minutes:seconds` (or `minutes:seconds`); None for
    UNLIMITED, NOT_SET, INVALID and anything else that is no duration."""
    import re

    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_squeue(text: str, job_id: str) -> Placement | None:
    """The job's line of `squeue --format=SQUEUE_FORMAT --noheader`; None when absent."""
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5 or fields[0] != job_id:
            continue
        _, state, reason, nodelist, left = fields
        running = state in ACTIVE_JOB_STATES and state != "PENDING"
        return {
            "id": job_id,
            "state": state,
            "reason": "" if reason in ("None", "(null)") else reason,
            "nodes": [nodelist] if nodelist and nodelist != "(null)" else [],
            "head": "",
            "time_left": parse_slurm_duration(left) if running else None,
            "exit_code": "",
        }
    return None


def parse_sacct(text: str, job_id: str) -> Placement | None:
    """The job's last line of `sacct [--completion] -X -n -P -o JobID,State,ExitCode,NodeList`
    (the completion log has a line per start of a requeued job); None when absent. sacct
    writes `CANCELLED by 1000`: the state is the first word."""
    found: Placement | None = None
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or fields[0] != job_id:
            continue
        _, state, exit_code, nodelist = fields
        found = {
            "id": job_id,
            "state": state.split()[0] if state.split() else "UNKNOWN",
            "reason": "",
            "nodes": [nodelist] if nodelist not in ("", "None assigned", "(null)") else [],
            "head": "",
            "time_left": None,
            "exit_code": exit_code,
        }
    return found


def parse_node_address(text: str) -> str:
    """`NodeAddr=` of `scontrol show node NAME`; "" when it has none."""
    import re

    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", text)
    return match.group(1) if match else ""


def query_job(job_id: str, known: Placement | None) -> Placement:
    """The job's state now: squeue, else sacct, else what its record last knew (UNKNOWN if
    nothing did). Its node list is expanded and its head node's address looked up."""
    code, out = slurm("squeue", f"--jobs={job_id}", "--states=all", "--noheader",
                      f"--format={SQUEUE_FORMAT}")  # fmt: skip
    if code and "Invalid job id" not in out:
        # slurmctld did not answer: that says nothing of the job, which must not be taken
        # for dead (and restarted beside itself).
        last = out.splitlines()[-1] if out else f"exit status {code}"
        fail(f"squeue failed on the login node: {last}", "host")
    found = parse_squeue(out, job_id) if code == 0 else None
    # Forgotten by slurmctld (MinJobAge): accounting, else the job completion log, which a
    # cluster without accounting (slurmdbd) may keep.
    for source in ([], ["--completion"]):
        if found is None:
            code, out = slurm("sacct", *source, f"--jobs={job_id}", "-X", "-n", "-P",
                              "--format=JobID,State,ExitCode,NodeList")  # fmt: skip
            found = parse_sacct(out, job_id) if code == 0 else None
    if found is None:
        if known is not None and known["state"] not in ACTIVE_JOB_STATES:
            return known  # ended, and forgotten since: its record remembers how
        # Ended some way nobody kept. Where it ran stays known: a router lists it at its head.
        last = f"last seen {known['state']}; " if known is not None else ""
        unknown: Placement = {
            "id": job_id, "state": "UNKNOWN",
            "reason": f"{last}Slurm no longer knows the job and keeps no record of its end",
            "nodes": known["nodes"] if known else [], "head": known["head"] if known else "",
            "time_left": None, "exit_code": "",
        }  # fmt: skip
        return unknown
    if found["nodes"]:
        if known is not None and known["nodes"] and known["head"]:
            found["nodes"], found["head"] = known["nodes"], known["head"]
        else:
            code, out = slurm("scontrol", "show", "hostnames", found["nodes"][0])
            names = out.split() if code == 0 and out else found["nodes"]
            found["nodes"] = names
            code, out = slurm("scontrol", "show", "node", names[0])
            found["head"] = (parse_node_address(out) if code == 0 else "") or names[0]
    if found["state"] not in ACTIVE_JOB_STATES and not found["exit_code"]:
        code, out = slurm("scontrol", "show", "job", job_id)
        import re

        match = re.search(r"(?:^|\s)ExitCode=(\S+)", out) if code == 0 else None
        found["exit_code"] = match.group(1) if match else ""
    return found


def job_alive(job: Placement) -> bool:
    return job["state"] in ACTIVE_JOB_STATES


def remember_job(state_dir: str, run_id: str, job: Placement) -> None:
    """Keep the job's state in its run's record when it changed (its end, its nodes)."""
    path = state_path(state_dir, "runs", run_id + ".json")
    record = read_json(path)
    if isinstance(record, dict) and record.get("job") != job:
        write_json(path, dict(record, job=job), mode=0o600)


def submit_job(args: StartArgs, run_id: str, log_path: str) -> RunRecord:
    """sbatch the batch script, logging to the run's (new, empty) log; the run's record."""
    runs = state_path(args["state_dir"], "runs")
    os.makedirs(runs, exist_ok=True)
    script = os.path.join(runs, run_id + ".sbatch")
    write_atomic(script, (args["script"] or "").encode(), mode=0o600)
    code, out = slurm(
        "sbatch", "--parsable", f"--job-name={run_id}", f"--output={log_path}",
        "--open-mode=append", f"--chdir={os.path.expanduser('~')}", script,
    )  # fmt: skip
    job_id = out.splitlines()[-1].split(";")[0].strip() if code == 0 and out else ""
    if not job_id.isdigit():
        # Nothing was started: the empty log and the script are ours to take back.
        for path in (log_path, script):
            try:  # noqa: SIM105 - contextlib's import would cost every status call ~3 ms
                os.unlink(path)
            except OSError:
                pass
        last = out.splitlines()[-1] if out else f"exit status {code}"
        fail(f"sbatch refused the job: {last}", "host")
    job: Placement = {
        "id": job_id, "state": "PENDING", "reason": "", "nodes": [], "head": "",
        "time_left": None, "exit_code": "",
    }  # fmt: skip
    # pid, pgid and sid 0: no process here is the run's (run_members is never asked).
    record: RunRecord = {
        **args["run"],  # type: ignore[typeddict-item]  # no stop marks yet
        "job": job,
        "id": run_id,
        "log": log_path,
        "pid": 0,
        "pgid": 0,
        "sid": 0,
        "started_at": time.time(),
        "status": "running",
    }  # fmt: skip
    return record


def stop_job(state_dir: str, run: RunRecord, timeout: float) -> tuple[Placement, str | None]:
    """Ask the job's server to drain (STOP_SIGNAL to its steps: its step supervisor SIGTERMs
    the server's main process), cancel it outright after `timeout`, and wait until Slurm
    says it has ended. The job as it ended, and whether it drained or was cut (None: it
    was pending)."""
    known = run["job"]
    job = query_job(known["id"], known)
    script = state_path(state_dir, "runs", run["id"] + ".sbatch")
    try:
        with open(script, encoding="utf-8", errors="replace") as handle:
            drains = STEP_DRAINS in handle.read()
    except OSError:
        drains = False
    shutdown: str | None = None
    if job["state"] == "PENDING":
        slurm("scancel", job["id"])
    elif job_alive(job):
        # An older script's step dies of STOP_SIGNAL: SIGTERM every process of it, as then.
        signal_name = STOP_SIGNAL if drains else "TERM"
        slurm("scancel", f"--signal={signal_name}", job["id"])
        shutdown = SHUTDOWN_DRAINED if drains else SHUTDOWN_CUT
    deadline = time.monotonic() + timeout
    cancelled = job["state"] == "PENDING"
    while job_alive(job):
        if not cancelled and time.monotonic() >= deadline:
            slurm("scancel", job["id"])  # TERM again, then KILL after the cluster's KillWait
            cancelled, shutdown = True, SHUTDOWN_CUT
        if time.monotonic() >= deadline + 120:
            break
        time.sleep(0.25)
        job = query_job(job["id"], job)
    remember_job(state_dir, run["id"], job)
    return job, shutdown


def stop_job_run(state_dir: str, run: RunRecord, timeout: float) -> StopReply:
    """cmd_stop for a run that is a Slurm job: scancel, then the record as cmd_stop keeps it."""
    record = state_path(state_dir, "runs", run["id"] + ".json")
    was = query_job(run["job"]["id"], run["job"])
    if job_alive(was) and run["status"] == "running":
        run = marked_stopping(run, timeout, job=was)
        write_json(record, run, mode=0o600)
    began = time.monotonic()
    job, shutdown = stop_job(state_dir, run, timeout) if job_alive(was) else (was, None)
    kept: RunRecord = read_json(record) or run
    run = {**kept, "job": job}
    if run["status"] == "running":
        run = {**run, "status": "stopped", "stopped_at": time.time()}
    write_json(record, run, mode=0o600)
    took = round(time.monotonic() - began, 3) if shutdown is not None else None
    return {"run": run, "ended": [], "killed": [], "left": [], "placement": job,
            "shutdown": shutdown, "shutdown_s": took}  # fmt: skip


class JobWatch:
    """One poll's look at a job: slurmctld asked at most every SLURM_QUERY_EVERY seconds; it
    answers at its head node, and serves only while RUNNING."""

    def __init__(self, args: PollArgs) -> None:
        self.args = args
        ref = args["placement"]
        self.record = state_path(ref["state_dir"], "runs", ref["run"] + ".json")
        recorded = read_json(self.record)
        known = recorded.get("job") if isinstance(recorded, dict) else None
        self.placement: Placement | None = known
        self.first, self.asked = known, 0.0

    def look(self) -> tuple[list[int], bool, str, bool]:
        """Its members (none here), whether it lives, where it answers, whether it may
        serve now."""
        if time.monotonic() >= self.asked + SLURM_QUERY_EVERY:
            self.placement = query_job(self.args["placement"]["id"], self.placement)
            self.asked = time.monotonic()
        job = self.placement
        assert job is not None
        alive = job_alive(job)
        return (
            [],
            alive,
            answers_at(self.args["bind_host"], job),
            alive and job["state"] == "RUNNING",
        )

    def end(self) -> None:
        """Keep what changed of the job (its end, its nodes) in the run's record."""
        if self.placement is not None and _changed(self.first, self.placement):
            ref = self.args["placement"]
            remember_job(ref["state_dir"], ref["run"], self.placement)


def _changed(before: Placement | None, now: Placement) -> bool:
    """Worth writing to the record: anything but the time left, which changes every second."""
    if before is None:
        return True
    return {**before, "time_left": None} != {**now, "time_left": None}


class SlurmJobLauncher:
    """Servers as Slurm batch jobs from this login node (`launcher: slurm`)."""

    kind = SLURM

    def placement_ref(self, state_dir: str, run: RunRecord) -> PlacementRef | None:
        return placement_ref(self.kind, state_dir, run, run["job"])

    def facts(self) -> dict[str, str | None]:
        return {"sbatch": which("sbatch")}

    def start(self, args: StartArgs, run_id: str, log_path: str, log_fd: int) -> RunRecord:
        os.close(log_fd)  # sbatch's job appends to it
        return submit_job(args, run_id, log_path)

    def watch(self, args: PollArgs) -> JobWatch:
        return JobWatch(args)

    def liveness(self, run: RunRecord) -> tuple[list[int], bool, LiveRunOrigin]:
        """Its members (none here: they are on its nodes), whether it lives, its job."""
        job = query_job(run["job"]["id"], run["job"])
        return [], job_alive(job), {"placement": job["id"]}

    def stop(self, state_dir: str, run: RunRecord, timeout: float, first_signal: str) -> StopReply:
        return stop_job_run(state_dir, run, timeout)
