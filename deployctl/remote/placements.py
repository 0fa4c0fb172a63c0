"""What the launchers share across the wire besides the calls' types (a declaration module,
as `protocol`): which launcher started a run, read alike on both sides, and a Slurm job's
words that its batch script (written by deployctl) and its host side (`slurm_jobs`) both
read."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SLURM = "slurm"  # the Slurm launcher's kind (`launcher: slurm`)


def launcher_kind(run: Mapping[str, object]) -> str | None:
    """The launcher that started a recorded (or live) run, by kind; None: the default's. A
    record from before records named their launcher is a Slurm job's when it has a `job`."""
    kind = run.get("launcher")
    return str(kind) if kind is not None else (SLURM if "job" in run else None)


# On a login node (`launcher: slurm`) a run is a batch job: sbatch starts it, squeue (then
# sacct, once slurmctld has forgotten it) says whether it lives, and its server answers on
# the head node. The state it ended in is kept in its record: MinJobAge purges it from
# slurmctld, and a cluster need not keep accounting.

# A stop signals a job's steps with this (`scancel --signal`); a batch script whose step
# supervisor turns it into SGLang's drain says so in this line (an older script's step would
# die of it: its job gets SIGTERM, every process at once).
STOP_SIGNAL = "USR2"
STEP_DRAINS = f"# deployctl: a stop's scancel --signal={STOP_SIGNAL} drains the server"

# States in which a job holds (or waits for) its allocation.
ACTIVE_JOB_STATES = frozenset(
    {
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
        "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
        "RESV_DEL_HOLD",
    }
)  # fmt: skip
