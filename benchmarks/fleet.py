"""deployctl across N real sshd hosts against parallel OpenSSH (the floor) and Ansible ad-hoc.

Starts N real sshd test hosts on loopback (tests.sshd_hosts.start_lab: needs root and
openssh-server), each with its own login user whose shell (/bin/sh) reads no rc files, a fake
nvidia-smi that answers 8 GPUs from pre-rendered output without starting a process, and its own
hard-linked copy of a virtualenv with the real SGLang 0.5.23 wheel (so `patch audit` reads a
real install). Then, for each N, it times cold, complete invocations, as a user pays them:

  floor     OpenSSH's ssh to all N at once (`ssh … &` per host, then `wait`; ControlMaster off)
            running the very remote command deployctl sends for that read
  deployctl `deployctl gpus|status|patch audit --json` at its default --forks (interpreter
            start-up included); `--forks 8,16,…` also times `gpus` at each of those
  ansible   `ansible all -m shell -a GPUS_COMMAND -f N -o`, pipelining on, ControlMaster off,
            interpreter_python set (no discovery); ansible-core from PyPI in its own venv

The contenders take turns within each round (the order rotates), after one untimed warm-up
round; the figure is the median of the rounds. It also times `deployctl --help` (median of 11).

Run: python benchmarks/fleet.py [--hosts 8,32,64] [--rounds 5]
Results: a table on stdout and benchmarks/results/fleet.json. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deployctl.agent import agent_bundle, agent_hash  # noqa: E402 - needs the path above
from deployctl.connection import Connection  # noqa: E402
from deployctl.inventory import load_inventory  # noqa: E402
from deployctl.ops.gpus import check_gpus  # noqa: E402
from deployctl.ops.patch import audit_host  # noqa: E402
from deployctl.ops.runs import run_status  # noqa: E402
from deployctl.patchset import load_patch_sets  # noqa: E402
from deployctl.project import SHIPPED_DATA  # noqa: E402
from deployctl.remote.bootstrap import UNPACK  # noqa: E402
from deployctl.remote.wire import AGENT_DIR, GPUS_COMMAND  # noqa: E402
from tests.sglang_wheel import build_template, install_on  # noqa: E402
from tests.sshd_hosts import SSHLab, TestHost, sh, start_lab, stop_lab  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# Kept between runs (outside the tree): only the first run installs their dependencies.
ANSIBLE_VENV = Path("/tmp/deployctl-bench-ansible")
DEPLOYCTL_VENV = Path("/tmp/deployctl-bench-venv")
GPUS_PER_HOST = 8
PATCHES = ["spec-disable", "sm120-support"]
X25519 = ("-o", "KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org")
TIMEOUT = 600.0
HELP_RUNS = 11
CLK_TCK = os.sysconf("SC_CLK_TCK")  # /proc's CPU times are in these ticks


# ---- hosts --------------------------------------------------------------------------------


def host_names(count: int) -> list[str]:
    # Host names fl00…; start_lab gives each lab login users of its own (d<lab>-fl00…).
    return [f"fl{i:02d}" for i in range(count)]


def cached_nvidia_smi(host: TestHost) -> None:
    """Replace the replaying fake with one that prints pre-rendered output (no fork, no bash)."""
    host.set_gpus("clean", GPUS_PER_HOST)
    smi = host.bin / "nvidia-smi"
    answers = {}
    for option in ("--query-gpu=", "--query-compute-apps="):
        query = next(w for w in GPUS_COMMAND.split() if w.startswith(option))
        answers[option] = sh(smi, query, "--format=csv").stdout
    smi.write_text(
        "#!/bin/sh\n# Benchmark fake: answers from a cache; printf is a shell builtin.\n"
        'case "$1" in\n'
        + "".join(f"{opt}*) printf %s {shlex.quote(text)} ;;\n" for opt, text in answers.items())
        + '*) echo "fake nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;\nesac\n'
    )
    smi.chmod(0o755)


def setup_hosts(base: Path, count: int, sglang: bool) -> tuple[SSHLab, dict[str, str]]:
    """Start the hosts; return the lab and each host's python."""
    started = time.monotonic()
    lab = start_lab(base, host_names(count))
    template = build_template(base) if sglang else None
    pythons = {}
    for name, host in lab.hosts.items():
        cached_nvidia_smi(host)
        pythons[name] = install_on(host, template) if template else "/usr/bin/python3"
        # deployctl keeps its agent on each host, unpacked; the other contenders run that copy.
        folder = host.home / ".deployctl" / AGENT_DIR / agent_hash()
        unpack = [sys.executable, "-c", UNPACK, str(folder)]
        subprocess.run(unpack, input=agent_bundle(), check=True)
        sh("chown", "-R", f"{host.user}:{host.user}", host.home / ".deployctl")
    log(f"{count} hosts ready in {time.monotonic() - started:.1f} s")
    return lab, pythons


# ---- the remote commands deployctl sends ----------------------------------------------------


class RecordingConnection(Connection):
    """Records the commands an operation sends instead of sending them."""

    def __init__(self, name: str) -> None:
        super().__init__(name, 1.0)
        self.commands: list[str] = []

    def _exec(
        self, command: str, stdin: bytes | None, timeout: float, shown: str
    ) -> tuple[int, bytes, bytes]:
        self.commands.append(command)
        return 1, b"", b""


def remote_commands(inventory: Path) -> dict[str, dict[str, str]]:
    """For each read and host, the one shell command deployctl sends (taken from the ops)."""
    sets = load_patch_sets([SHIPPED_DATA / "patches"])
    operations: dict[str, Callable[[Any, Connection], object]] = {
        "gpus": lambda host, conn: check_gpus(host, conn),
        "status": lambda host, conn: run_status(host, conn, {}),  # type: ignore[arg-type]
        "audit": lambda host, conn: audit_host(host, conn, sets, []),
    }
    commands: dict[str, dict[str, str]] = {}
    for read, operation in operations.items():
        for host in load_inventory(inventory).select(None):
            conn = RecordingConnection(host.name)
            # The recorder answers nothing useful, so the operation fails after sending.
            with contextlib.suppress(Exception):
                operation(host, conn)
            if len(conn.commands) != 1:
                raise RuntimeError(f"{read} sent {len(conn.commands)} commands to {host.name}")
            commands.setdefault(read, {})[host.name] = conn.commands[0]
    return commands


# ---- contenders -------------------------------------------------------------------------------


@dataclass
class Contender:
    """One way to do one read across the N hosts: a command line and a check of its output."""

    name: str
    argv: list[str]
    check: Callable[[subprocess.CompletedProcess[str]], None]
    cwd: Path
    env: dict[str, str]


@dataclass
class Sample:
    wall_s: float
    client_cpu_s: float  # user+sys of the contender's processes on this side
    machine_cpu_s: float  # all processes on the machine: client, sshd, remote commands
    peak_rss_mib: float  # the contender's first process (and its waited-for children)
    peak_fds: int  # open descriptors of the first process, sampled every 10 ms


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def process_cpu_s(pid: int) -> float:
    """utime+stime of every thread of the process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def count_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # it has exited
        return 0


def run_watched(contender: Contender) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run to the end: its output, peak RSS (MiB, from wait4) and peak open descriptors."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            contender.argv, cwd=contender.cwd, env=contender.env, stdout=out, stderr=err, text=True
        )
        peak_fds = 0
        deadline = time.monotonic() + TIMEOUT
        while True:
            peak_fds = max(peak_fds, count_fds(proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{contender.name} ran past {TIMEOUT:g} s")
            time.sleep(0.01)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(contender.argv, proc.returncode, out.read(), err.read())
    return done, usage.ru_maxrss / 1024, peak_fds


def measure(contender: Contender) -> Sample:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, _ = cpu_jiffies()
    start = time.perf_counter()
    done, rss, fds = run_watched(contender)
    wall = time.perf_counter() - start
    busy1, _ = cpu_jiffies()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        contender.check(done)
    except AssertionError as exc:
        # deployctl's traceback file goes with the lab's folder: keep it in the message.
        kept = re.search(r"the traceback is in (\S+?);", done.stderr)
        trace = ""
        with contextlib.suppress(OSError):
            trace = Path(kept.group(1)).read_text()[-4000:] if kept else ""
        raise RuntimeError(
            f"{contender.name} gave a wrong answer (exit {done.returncode}): {exc}\n"
            f"stdout: {done.stdout[-1500:]}\nstderr: {done.stderr[-1500:]}\n{trace}"
        ) from None
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Sample(wall, cpu, (busy1 - busy0) / CLK_TCK, rss, fds)


def ensure_deployctl_venv(base: Path) -> Path:
    """Install this tree into a venv of its own, as a user's `pip install` would; return it.

    A plain (not editable) install, so pip compiles the bytecode, and a venv without this
    interpreter's site-packages or their .pth start-up hooks. Dependencies stay installed
    between runs; deployctl itself is installed afresh from a copy of the tree each run.
    """
    if not (DEPLOYCTL_VENV / "bin" / "python").exists():
        log(f"creating {DEPLOYCTL_VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(DEPLOYCTL_VENV)], check=True)
    source = base / "deployctl-src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "deployctl", source / "deployctl", ignore=shutil.ignore_patterns("__pycache__")
    )
    pip = [str(DEPLOYCTL_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    # First the dependencies as this tree pins them (pip changes only what no longer fits),
    # then deployctl itself afresh.
    subprocess.run([*pip, str(source)], check=True)
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(source)], check=True)
    return DEPLOYCTL_VENV


def deployctl_argv() -> list[str]:
    """The console script of the benchmark's venv."""
    return [str(DEPLOYCTL_VENV / "bin" / "deployctl")]


def dev_deployctl_argv() -> list[str]:
    """The entry point beside this interpreter (the developer's install), else `-m deployctl`."""
    entry = Path(sys.executable).with_name("deployctl")
    return [str(entry)] if entry.exists() else [sys.executable, "-m", "deployctl"]


def floor_script(
    lab: SSHLab, names: list[str], commands: dict[str, str], out: Path, *options: str
) -> str:
    """Shell text: one backgrounded `ssh` per host, then `wait`."""
    lines = []
    for name in names:
        host = lab.hosts[name]
        argv = [
            "ssh", "-F", "/dev/null", "-T",
            "-o", "ControlMaster=no", "-o", "ControlPath=none",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={lab.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "IdentitiesOnly=yes", "-i", str(lab.client_key), *options,
            "-p", str(host.port), f"{host.user}@{host.address}", commands[name],
        ]  # fmt: skip
        lines.append(f"{shlex.join(argv)} >{out / name}.out 2>{out / name}.err &")
    return "\n".join([*lines, "wait", ""])


def check_floor(out: Path, names: list[str], marker: str) -> Callable[[Any], None]:
    def check(done: subprocess.CompletedProcess[str]) -> None:
        assert done.returncode == 0, "the shell failed"
        for name in names:
            text = (out / f"{name}.out").read_text()
            assert marker in text, f"{name}: no {marker!r} in {text[-300:]!r}"
            (out / f"{name}.out").unlink()

    return check


def check_deployctl(names: list[str], read: str, sglang: bool) -> Callable[[Any], None]:
    def check(done: subprocess.CompletedProcess[str]) -> None:
        assert done.returncode in (0, 1), "deployctl failed"
        hosts = json.loads(done.stdout)["hosts"]
        assert sorted(hosts) == sorted(names), f"hosts {sorted(hosts)}"
        for name, entry in hosts.items():
            if read == "audit" and not sglang:
                assert "SGLang is not installed" in str(entry.get("error")), entry
                continue
            assert entry["ok"], f"{name}: {entry.get('error')}"
            if read == "gpus":
                assert entry["clean"] and len(entry["gpus"]) == GPUS_PER_HOST, entry
            if read == "audit":
                assert entry["sglang_version"], entry
                assert set(entry["patches"]) == set(PATCHES), entry

    return check


def check_ansible(names: list[str]) -> Callable[[Any], None]:
    def check(done: subprocess.CompletedProcess[str]) -> None:
        assert done.returncode == 0, "ansible failed"
        good = [
            ln.split(" |", 1)[0]
            for ln in done.stdout.splitlines()
            if "| CHANGED | rc=0 |" in ln and "@@apps" in ln
        ]
        assert sorted(good) == sorted(names), f"{len(good)} of {len(names)} hosts answered"

    return check


def ansible_setup(lab: SSHLab, base: Path, names: list[str], env: dict[str, str]) -> list[str]:
    """Write ansible.cfg and an INI inventory; return the ansible ad-hoc command line."""
    folder = base / "ansible"
    folder.mkdir(exist_ok=True)
    inventory = folder / f"hosts-{len(names)}.ini"
    inventory.write_text(
        "".join(
            f"{n} ansible_host={h.address} ansible_port={h.port} ansible_user={h.user} "
            f"ansible_ssh_private_key_file={lab.client_key}\n"
            for n, h in ((n, lab.hosts[n]) for n in names)
        )
    )
    ssh_args = (
        f"-F /dev/null -o ControlMaster=no -o ControlPath=none -o IdentitiesOnly=yes "
        f"-o UserKnownHostsFile={lab.known_hosts} -o GlobalKnownHostsFile=/dev/null"
    )
    config = folder / "ansible.cfg"
    config.write_text(
        "[defaults]\nhost_key_checking = True\ninterpreter_python = /usr/bin/python3\n"
        f"local_tmp = {folder / 'tmp'}\nretry_files_enabled = False\n"
        "deprecation_warnings = False\nsystem_warnings = False\n"
        f"[ssh_connection]\npipelining = True\nssh_args = {ssh_args}\n"
    )
    env.update(ANSIBLE_CONFIG=str(config), ANSIBLE_HOME=str(folder / "home"))
    return [
        str(ANSIBLE_VENV / "bin" / "ansible"), "all", "-i", str(inventory),
        "-m", "shell", "-a", GPUS_COMMAND, "-f", str(len(names)), "-o",
    ]  # fmt: skip


def ensure_ansible() -> str:
    """Install ansible-core from PyPI into its own venv (once); return its version."""
    ansible = ANSIBLE_VENV / "bin" / "ansible"
    if not ansible.exists():
        log(f"installing ansible-core into {ANSIBLE_VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run(
            [str(ANSIBLE_VENV / "bin" / "pip"), "install", "-q", "ansible-core"], check=True
        )
    out = subprocess.run([str(ansible), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0]


def python_env() -> dict[str, str]:
    """This environment, less what would steer deployctl, ssh or Ansible from outside."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DEPLOYCTL_", "SSH_AUTH", "ANSIBLE", "PYTHONPYCACHEPREFIX"))
    }


# ---- one N ------------------------------------------------------------------------------------


def bench_size(
    lab: SSHLab,
    base: Path,
    pythons: dict[str, str],
    count: int,
    rounds: int,
    sglang: bool,
    forks: list[int],
    sweep_only: bool,
) -> dict[str, Any]:
    names = host_names(count)
    work = base / f"n{count}"
    (work / "client-home").mkdir(parents=True)
    out = work / "out"
    out.mkdir()
    env = python_env()
    env.update(HOME=str(work / "client-home"), LC_ALL="C.UTF-8")
    inventory = lab.inventory(
        work / "inventory.yml",
        names,
        {n: {"python": pythons[n]} for n in names},
        patches=PATCHES,
    )
    commands = remote_commands(inventory)
    markers = {"gpus": "@@apps", "status": "rc=0", "audit": '"sglang"'}
    if not sglang:
        markers["audit"] = "SGLang is not installed"
    contenders: list[Contender] = []
    for read in ("gpus", "status", "audit"):
        script = work / f"floor-{read}.sh"
        script.write_text(floor_script(lab, names, commands[read], out))
        contenders.append(
            Contender(
                f"floor {read}", ["/bin/sh", str(script)], check_floor(out, names, markers[read]),
                work, env,
            )
        )  # fmt: skip
        sub = ["patch", "audit"] if read == "audit" else [read]
        argv = [*deployctl_argv(), *sub, "--json", "-i", str(inventory)]
        contenders.append(
            Contender(f"deployctl {read}", argv, check_deployctl(names, read, sglang), work, env)
        )
        # OpenSSH's default key exchange (sntrup761x25519) costs ~125 ms of client CPU here;
        # paramiko has no sntrup and negotiates curve25519: this floor uses the same.
        script = work / f"floor-x25519-{read}.sh"
        script.write_text(floor_script(lab, names, commands[read], out, *X25519))
        contenders.append(
            Contender(
                f"floor-x25519 {read}", ["/bin/sh", str(script)],
                check_floor(out, names, markers[read]), work, env,
            )
        )  # fmt: skip
    ansible_env = dict(env)
    ansible_argv = ansible_setup(lab, work, names, ansible_env)
    contenders.append(
        Contender("ansible gpus", ansible_argv, check_ansible(names), work, ansible_env)
    )

    gpus = next(c for c in contenders if c.name == "deployctl gpus")
    sweep = [f for f in forks if f <= count]
    if sweep_only:
        measure(gpus)  # warm-up
        return {"hosts": count, "forks": sweep_forks(count, rounds, sweep, gpus)}
    samples: dict[str, list[Sample]] = {c.name: [] for c in contenders}
    log(f"N={count}: warm-up")
    for contender in contenders:
        measure(contender)
    loads = []
    for round_no in range(rounds):
        loads.append(round(os.getloadavg()[0], 2))
        shift = round_no % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            samples[contender.name].append(measure(contender))
        log(
            f"N={count} round {round_no + 1}/{rounds} (load {loads[-1]}): "
            + ", ".join(f"{n} {s[-1].wall_s:.2f}" for n, s in samples.items())
        )
    shutil.rmtree(out, ignore_errors=True)
    result = {**summarize(count, rounds, samples), "loadavg_1m_per_round": loads}
    if sweep:
        result["forks"] = sweep_forks(count, rounds, sweep, gpus)
    return result


def sweep_forks(count: int, rounds: int, forks: list[int], gpus: Contender) -> list[dict[str, Any]]:
    """`deployctl gpus` at each --forks: wall time, peak RSS and descriptors, rounds interleaved."""
    runs = {f: Contender(gpus.name, [*gpus.argv, "--forks", str(f)], gpus.check, gpus.cwd, gpus.env)
            for f in forks}  # fmt: skip
    samples: dict[int, list[Sample]] = {f: [] for f in forks}
    failures: dict[int, list[str]] = {f: [] for f in forks}  # too many at once can fail here
    for round_no in range(rounds):
        shift = round_no % len(forks)
        for f in forks[shift:] + forks[:shift]:
            try:
                samples[f].append(measure(runs[f]))
            except RuntimeError as exc:
                failures[f].append(str(exc).split("\n", 1)[0])
        log(
            f"N={count} forks round {round_no + 1}/{rounds}: "
            + ", ".join(f"{f}: {s[-1].wall_s:.2f} s" for f, s in samples.items() if s)
            + "".join(f"; {f}: {len(e)} failed" for f, e in failures.items() if e)
        )
    return [
        {"forks": f, **(sample_stats(runs_) if runs_ else {"wall_s": None}), "failed": failures[f]}
        for f, runs_ in samples.items()
    ]


def sample_stats(runs: list[Sample]) -> dict[str, Any]:
    """Medians of the times, peaks of memory and descriptors, and every wall time."""
    return {
        "wall_s": round(statistics.median(s.wall_s for s in runs), 3),
        "client_cpu_s": round(statistics.median(s.client_cpu_s for s in runs), 3),
        "machine_cpu_s": round(statistics.median(s.machine_cpu_s for s in runs), 3),
        "peak_rss_mib": round(max(s.peak_rss_mib for s in runs), 1),
        "peak_fds": max(s.peak_fds for s in runs),
        "walls_s": [round(s.wall_s, 3) for s in runs],
    }


def summarize(count: int, rounds: int, samples: dict[str, list[Sample]]) -> dict[str, Any]:
    med = {name: sample_stats(runs) for name, runs in samples.items()}
    wall = {name: m["wall_s"] for name, m in med.items()}
    ratios = {
        f"deployctl/{floor} {read}": round(wall[f"deployctl {read}"] / wall[f"{floor} {read}"], 2)
        for floor in ("floor", "floor-x25519")
        for read in ("gpus", "status", "audit")
    }
    ratios["ansible/deployctl gpus"] = round(wall["ansible gpus"] / wall["deployctl gpus"], 2)
    return {"hosts": count, "rounds": rounds, "median": med, "ratios": ratios}


# ---- deployctl --help -------------------------------------------------------------------------


def bench_help() -> dict[str, Any]:
    """`deployctl --help` wall time for both installs, and where its start-up time goes."""
    result: dict[str, Any] = {}
    python = str(DEPLOYCTL_VENV / "bin" / "python")
    # venv: a user's pip install. dev: the editable install beside this interpreter, run in this
    # shell's environment (here PYTHONDONTWRITEBYTECODE=1, so deployctl's own sources are
    # compiled at every start, and site-packages .pth hooks run).
    for mode, argv, interpreter in (
        ("venv", deployctl_argv(), python),
        ("dev", dev_deployctl_argv(), sys.executable),
    ):
        env = python_env()
        subprocess.run([*argv, "--help"], env=env, capture_output=True, check=True)
        walls, bare = [], []
        for _ in range(HELP_RUNS):
            start = time.perf_counter()
            subprocess.run([*argv, "--help"], env=env, capture_output=True, check=True)
            walls.append(time.perf_counter() - start)
            start = time.perf_counter()
            subprocess.run([interpreter, "-c", "pass"], env=env, check=True)
            bare.append(time.perf_counter() - start)
        profile = subprocess.run(
            [interpreter, "-X", "importtime", "-m", "deployctl", "--help"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        result[mode] = {
            "argv": [*argv, "--help"],
            "median_s": round(statistics.median(walls), 3),
            "walls_s": [round(w, 3) for w in walls],
            "bare_python_median_s": round(statistics.median(bare), 3),
            "imports_ms": top_imports(profile),
        }
    return result


def top_imports(importtime: str, limit: int = 12) -> dict[str, float]:
    """The largest top-level imports (cumulative ms) from `python -X importtime` output."""
    found: dict[str, float] = {}
    for line in importtime.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if match and len(match.group(3)) <= 1:  # one space: imported by the script itself
            found[match.group(4)] = int(match.group(2)) / 1000
    return dict(sorted(found.items(), key=lambda kv: -kv[1])[:limit])


# ---- report -----------------------------------------------------------------------------------


def table(results: list[dict[str, Any]]) -> str:
    """Wall-time medians (s), one row per fleet size, then the ratios."""
    names = list(results[0]["median"])
    ratio_names = list(results[0]["ratios"])
    rows = [["N", *names, *ratio_names]]
    for r in results:
        rows.append(
            [str(r["hosts"])]
            + [f"{r['median'][n]['wall_s']:.2f}" for n in names]
            + [f"{r['ratios'][n]:.2f}" for n in ratio_names]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    )


def cpu_table(results: list[dict[str, Any]]) -> str:
    lines = ["client CPU s / whole-machine CPU s (medians):"]
    for r in results:
        cells = [
            f"{n} {m['client_cpu_s']:.2f}/{m['machine_cpu_s']:.2f}" for n, m in r["median"].items()
        ]
        lines.append(f"  N={r['hosts']}: " + "; ".join(cells))
    return "\n".join(lines)


def forks_table(results: list[dict[str, Any]]) -> str:
    lines = ["deployctl (each command, peak) RSS MiB / open descriptors; gpus against --forks:"]
    for r in results:
        cells = [
            f"{n.split()[1]} {m['peak_rss_mib']:.0f}/{m['peak_fds']}"
            for n, m in r.get("median", {}).items()
            if n.startswith("deployctl")
        ]
        if cells:
            lines.append(f"  N={r['hosts']} (default --forks): " + "; ".join(cells))
        for f in r.get("forks", []):
            if f["wall_s"] is None:
                lines.append(f"  N={r['hosts']} --forks {f['forks']}: every run failed")
                continue
            lines.append(
                f"  N={r['hosts']} --forks {f['forks']}: {f['wall_s']:.2f} s, client CPU "
                f"{f['client_cpu_s']:.2f} s, {f['peak_rss_mib']:.0f} MiB, {f['peak_fds']} fds"
                + (f", {len(f['failed'])} run(s) failed" if f["failed"] else "")
            )
    return "\n".join(lines)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hosts", default="8,32,64", help="comma list of fleet sizes")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per size (median)")
    parser.add_argument(
        "--no-sglang", action="store_true", help="skip the SGLang venv (audit then fails per host)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "fleet.json")
    parser.add_argument(
        "--forks", default="", help="also time `deployctl gpus` at these --forks (comma list)"
    )
    parser.add_argument(
        "--sweep-only", action="store_true", help="only the --forks sweep (no contenders)"
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=-10,
        help="niceness for the benchmark, inherited by its sshd hosts and contenders (0: as is)",
    )
    args = parser.parse_args()
    sizes = sorted({int(x) for x in args.hosts.split(",")})
    forks = sorted({int(x) for x in args.forks.split(",") if x})
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        sys.exit("the sshd test hosts need root and openssh-server")
    if max(sizes) > 500:  # each host is an sshd, a login user and a home on this machine
        sys.exit("at most 500 hosts (one loopback address each, from 127.0.0.2)")

    # Other work on a shared 2-core machine would land in the figures; a higher priority for
    # everything this benchmark starts (clients and hosts alike) keeps most of it out.
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    ansible_version = ensure_ansible()
    base = Path(tempfile.mkdtemp(prefix="deployctl-fleet-", dir="/tmp"))
    base.chmod(0o755)
    lab = None
    try:
        ensure_deployctl_venv(base)
        lab, pythons = setup_hosts(base, max(sizes), sglang=not args.no_sglang)
        help_result = bench_help()
        results = []
        for n in sizes:
            sglang = not args.no_sglang
            size = bench_size(lab, base, pythons, n, args.rounds, sglang, forks, args.sweep_only)
            results.append(size)
            # A long run that fails at its largest size still leaves the smaller ones.
            partial = args.output.with_suffix(".partial.json")
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if lab is not None:
            stop_lab(lab)  # sshds, the users' processes, the users, the folder
        shutil.rmtree(base, ignore_errors=True)

    doc = {
        "benchmark": "fleet",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ssh": subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip(),
            "ansible": ansible_version,
            "loadavg_at_end": os.getloadavg(),
            "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        },
        "deployctl": deployctl_argv(),
        "gpus_per_host": GPUS_PER_HOST,
        "help": help_result,
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=2) + "\n")
    compared = [r for r in results if "median" in r]
    if compared:
        print(table(compared))
        print(cpu_table(compared))
    print(forks_table(results))
    for mode in ("venv", "dev"):
        h = help_result[mode]
        print(
            f"deployctl --help ({mode}): {h['median_s']:.3f} s median of {HELP_RUNS} "
            f"(python -c pass {h['bare_python_median_s']:.3f} s); largest imports (ms): "
            + ", ".join(f"{k} {v:.0f}" for k, v in list(h["imports_ms"].items())[:6])
        )
    print(f"JSON: {args.output}")


if __name__ == "__main__":
    main()
