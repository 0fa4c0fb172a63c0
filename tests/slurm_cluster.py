"""A real Slurm cluster for the tests: munged, slurmctld and two slurmd "nodes" on this machine.

Everything (conf, state, spool, logs, munge's key and socket) lives under one base folder.
Both nodes are this machine, each with a loopback address and a slurmd port of its own, and
two GPUs each as gres backed by character devices under the base folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.sshd_hosts import address_block, free_port, sh

CLUSTER_NAME = "dctlab"
# The sshd lab uses 127.B.0.2 … 127.B.1.x; the nodes sit past it, in the same worker's block.
NODE_ADDRESSES = {"n1": f"127.{address_block()}.3.1", "n2": f"127.{address_block()}.3.2"}
GPUS_PER_NODE = 2
START_TIMEOUT_S = 30.0
# Job states after which slurmctld runs nothing more for the job.
FINISHED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
JOB_FIELDS = ("id", "user", "state", "reason", "nodes", "name")
# The name goes last: it is the one field that may hold the separator.
SQUEUE_FORMAT = "%i|%u|%T|%r|%N|%j"


@dataclass
class SlurmCluster:
    """A running cluster: its folders, daemons and the SLURM_CONF that reaches it."""

    base: Path
    conf: Path
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        return self.base / "log"

    def env(self) -> dict[str, str]:
        """Our environment with SLURM_CONF naming this cluster's slurm.conf."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (sinfo, scontrol, …) against this cluster."""
        return sh(*argv, check=check, env=self.env(), timeout=30)

    def node_states(self) -> dict[str, str]:
        """Map node name to sinfo's short state (idle, alloc, mix, drain, down*, …)."""
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld knows, finished ones included (for MinJobAge)."""
        out = self.run("squeue", "--states=all", "--noheader", f"--format={SQUEUE_FORMAT}").stdout
        return [
            dict(zip(JOB_FIELDS, line.split("|", len(JOB_FIELDS) - 1), strict=True))
            for line in out.splitlines()
            if line.strip()
        ]

    def job(self, job_id: str) -> dict[str, str]:
        """One job as `jobs()` lists it."""
        found = [j for j in self.jobs() if j["id"] == job_id]
        assert found, f"slurmctld does not know job {job_id}: {self.jobs()}"
        return found[0]

    def active_jobs(self) -> list[dict[str, str]]:
        return [j for j in self.jobs() if j["state"] not in FINISHED_STATES]

    def job_processes(self) -> dict[int, str]:
        """Map pid to command line of every non-root process a job of this cluster started."""
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid == 0:
                    continue
                stat = Path(f"/proc/{entry}/stat").read_text()
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
            if stat[stat.rindex(")") + 2] == "Z":  # a zombie runs nothing (init reaps late)
                continue
            # slurmstepd puts SLURM_CONF into every job's environment.
            if f"SLURM_CONF={self.conf}".encode() in environ and any(
                v.startswith(b"SLURM_JOB_ID=") for v in environ
            ):
                found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
        return found

    def cancel_all(self, timeout: float = 30.0) -> list[str]:
        """Cancel every job of every user; wait until none is active and no job process is
        left. Return what was still left at the deadline (those processes are then killed)."""
        active = self.active_jobs()
        if active:
            self.run("scancel", *[j["id"] for j in active], check=False)
        deadline = time.monotonic() + timeout
        while True:
            active = self.active_jobs()
            processes = self.job_processes()
            if not active and not processes:
                return []
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        for pid in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return [
            *(f"job {j['id']} of {j['user']} {j['state']} ({j['name']})" for j in active),
            *(f"process {pid} {cmd}" for pid, cmd in processes.items()),
        ]


def write_config(base: Path, hostname: str) -> Path:
    """Write slurm.conf and gres.conf under base; return slurm.conf's path."""
    ports = {"ctld": free_port("0.0.0.0"), **{n: free_port("0.0.0.0") for n in NODE_ADDRESSES}}
    nodes = []
    gres = []
    for name, address in NODE_ADDRESSES.items():
        devices = base / "dev" / name
        devices.mkdir(parents=True)
        for index in range(GPUS_PER_NODE):
            # gres.conf refuses plain files; /dev/null's numbers make a harmless device.
            sh("mknod", devices / f"nvidia{index}", "c", "1", "3")
        # More CPUs and memory than this machine has: config_overrides lets slurmd say so.
        nodes.append(
            f"NodeName={name} NodeAddr={address} NodeHostname={hostname} Port={ports[name]}"
            f" CPUs=16 RealMemory=65536 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        )
        gres.append(f"NodeName={name} Name=gpu File={devices}/nvidia[0-{GPUS_PER_NODE - 1}]")
    for folder in ("state", "spool", "log", "run"):
        (base / folder).mkdir()
    conf = base / "slurm.conf"
    conf.write_text(
        f"""\
ClusterName={CLUSTER_NAME}
SlurmctldHost={hostname}(127.0.0.1)
SlurmctldPort={ports["ctld"]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base / "munge" / "munge.socket"}
StateSaveLocation={base / "state"}
SlurmdSpoolDir={base / "spool"}/slurmd-%n
SlurmctldPidFile={base / "run"}/slurmctld.pid
SlurmdPidFile={base / "run"}/slurmd-%n.pid
SlurmctldLogFile={base / "log"}/slurmctld.log
SlurmdLogFile={base / "log"}/slurmd-%n.log
SlurmdParameters=config_overrides
# linuxproc, not cgroup (shared by every cluster on the machine): a process that leaves its
# job's process tree (setsid, its parent gone) outlives scancel; cancel_all() finds it.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
ReturnToService=2
# Finished jobs stay in squeue --states=all for 5 minutes; scancel's SIGKILL follows in 5 s.
MinJobAge=300
KillWait=5
# sbatch's job starts within a second (the default lets the scheduler wait 3 s).
SchedulerParameters=batch_sched_delay=0
GresTypes=gpu
# A job in `urgent` preempts jobs of the other partitions, which Slurm requeues.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# Without slurmdbd plain sacct says accounting is disabled; `sacct --completion` reads this.
JobCompType=jobcomp/filetxt
JobCompLoc={base / "log"}/jobcomp.txt
{chr(10).join(nodes)}
PartitionName=gpu Nodes={",".join(NODE_ADDRESSES)} Default=YES MaxTime=UNLIMITED State=UP
PartitionName=debug Nodes=n2 MaxTime=UNLIMITED State=UP
PartitionName=urgent Nodes={",".join(NODE_ADDRESSES)} PriorityTier=2 MaxTime=UNLIMITED State=UP
"""
    )
    (base / "gres.conf").write_text("\n".join(gres) + "\n")
    return conf


def start_munge(base: Path) -> subprocess.Popen[bytes]:
    """Start a munged of our own, as the munge user, its key and socket under base/munge."""
    folder = base / "munge"
    folder.mkdir()
    key = folder / "munge.key"
    sh("mungekey", "--create", f"--keyfile={key}")
    # munged wants its key and folders its own, the socket's folder searchable by all.
    sh("chown", "-R", "munge:munge", folder)
    folder.chmod(0o755)
    socket_path = folder / "munge.socket"
    proc = subprocess.Popen(
        [
            "munged",
            "--foreground",
            f"--socket={socket_path}",
            f"--key-file={key}",
            f"--pid-file={folder / 'munged.pid'}",
            f"--seed-file={folder / 'munged.seed'}",
            f"--log-file={folder / 'munged.log'}",
        ],
        # Our own child (not runuser's), so that we reap it: this machine's init reaps late.
        user="munge",
        group="munge",
        extra_groups=[],
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "munged.log", "ab"),  # noqa: SIM115 - lives with the process
    )
    deadline = time.monotonic() + 10
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"munged did not start: {tail(folder / 'munged.log')}")
        time.sleep(0.05)
    return proc


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


def start_cluster(base: Path) -> SlurmCluster:
    """Start munged, slurmctld and slurmd n1 and n2 under base; return once both nodes are idle."""
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)  # the lab users' sbatch reads the conf and reaches munge's socket
    conf = write_config(base, socket.gethostname())
    cluster = SlurmCluster(base, conf)
    try:
        cluster.daemons["munged"] = start_munge(base)
        commands = {
            "slurmctld": ["slurmctld", "-D", "-f", str(conf)],
            **{f"slurmd-{n}": ["slurmd", "-D", "-N", n, "-f", str(conf)] for n in NODE_ADDRESSES},
        }
        for name, argv in commands.items():
            cluster.daemons[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=open(cluster.logs / f"{name}.stderr", "ab"),  # noqa: SIM115
                env=cluster.env(),
            )
        wait_until_idle(cluster)
        # Every user's `sacct --completion` opens it for appending (the plugin's init) to read
        # it; slurmctld makes it 0644 as it starts.
        (cluster.logs / "jobcomp.txt").chmod(0o666)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def wait_until_idle(cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        exited = [n for n, p in cluster.daemons.items() if p.poll() is not None]
        if exited:
            break
        states = cluster.node_states()
        if all(states.get(n) == "idle" for n in NODE_ADDRESSES):
            return
        time.sleep(0.2)
    logs = [*sorted(cluster.logs.iterdir()), cluster.base / "munge" / "munged.log"]
    raise RuntimeError(
        f"the Slurm nodes did not come up idle (sinfo: {states}; exited: "
        f"{[n for n, p in cluster.daemons.items() if p.poll() is not None]}):\n"
        + "\n".join(f"--- {log}\n{tail(log)}" for log in logs)
    )


def stop_cluster(cluster: SlurmCluster) -> None:
    """Cancel every job, then end the daemons, munged last, and every job step left."""
    if all(p.poll() is None for p in cluster.daemons.values()) and cluster.daemons:
        cluster.cancel_all(timeout=15)
    slurm_daemons = [p for n, p in cluster.daemons.items() if n != "munged"]
    end_processes(slurm_daemons)
    # slurmstepd detaches from slurmd; ours are the ones whose spool folder is ours.
    end_pids(stepd_pids(cluster))
    if "munged" in cluster.daemons:
        end_processes([cluster.daemons["munged"]])
    cluster.daemons.clear()


def stepd_pids(cluster: SlurmCluster) -> list[int]:
    out = sh("pgrep", "-x", "slurmstepd", check=False).stdout
    ours = []
    for pid in (int(p) for p in out.split()):
        with contextlib.suppress(OSError):
            fds = os.listdir(f"/proc/{pid}/fd")
            targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
            if any(t.startswith(str(cluster.base)) for t in targets):
                ours.append(pid)
    return ours


def end_processes(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    procs = [p for p in procs if p.poll() is None]
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def end_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
