"""What the agent bundle saves: a 32-host `deployctl status`, main's one-file agent vs the bundle.

BEFORE is main's tree (a `git worktree` of `--before`, default main, checked out under the
lab's folder): its agent is one file kept as `<state_dir>/agent/<sha256>.py`, read and
compiled on every call. AFTER is this tree: the `deployctl/remote/` bundle unpacked once into
`<state_dir>/agent/<sha256>/`, imported with its bytecode cached there.

Both run against the same N loopback sshd hosts (tests.sshd_hosts.start_lab: needs root and
openssh-server), each with /usr/bin/python3 as another login user. The inventory's `python`
is a wrapper that runs /usr/bin/python3 and then appends the shell's `times` (the user and
system CPU of its finished children: the agent process, from interpreter start to exit) to
`~/agent-cpu.log`: that is the remote CPU of each agent call, read from the hosts' homes
after each round. The first round of each tree is cold (the agent is sent); the timed rounds
then alternate the trees' order. Figures: medians over the rounds (a round's CPU per call:
the mean of its N calls, as `times` counts in 10 ms clock ticks).

Run: sudo .venv/bin/python benchmarks/agent_bundle.py [--hosts 32] [--rounds 7]
Results: a table on stdout and benchmarks/results/agent_bundle.json; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.sshd_hosts import SSHLab, sh, start_lab, stop_lab  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CPU_LOG = "agent-cpu.log"
# Runs the host's python, then logs its CPU: `times` prints the shell's, then its children's.
WRAPPER = f"""#!/bin/sh
/usr/bin/python3 "$@"
code=$?
times >> "$HOME/{CPU_LOG}"
exit $code
"""
_TIME = re.compile(r"(\d+)m([\d.]+)s")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def children_cpu(text: str) -> list[float]:
    """The CPU seconds (user + system) of each wrapped call in one host's log."""
    lines = [line for line in text.splitlines() if line.strip()]
    calls = []
    for line in lines[1::2]:  # every second line: the children's times
        user, system = (int(m) * 60 + float(s) for m, s in _TIME.findall(line))
        calls.append(user + system)
    return calls


def read_cpu(lab: SSHLab) -> list[float]:
    """Each agent call's CPU since the last read, on every host; the logs start afresh."""
    calls: list[float] = []
    for host in lab.hosts.values():
        path = host.home / CPU_LOG
        if path.exists():
            calls += children_cpu(path.read_text())
            path.write_text("")
    return calls


def run_status(tree: Path, inventory: Path, env: dict[str, str], work: Path) -> float:
    argv = [sys.executable, "-m", "deployctl", "status", "--json", "-i", str(inventory)]
    started = time.perf_counter()
    done = subprocess.run(
        argv, cwd=work, env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True
    )
    took = time.perf_counter() - started
    hosts = json.loads(done.stdout)["hosts"] if done.stdout.startswith("{") else {}
    if done.returncode not in (0, 1) or not hosts:
        raise SystemExit(f"{tree}: status failed: {done.stdout[-800:]} {done.stderr[-800:]}")
    return took


def agent_folders(lab: SSHLab) -> dict[str, list[str]]:
    """What each host keeps under state_dir/agent/ (one entry per version sent)."""
    return {
        name: sorted(p.name for p in (host.home / ".deployctl" / "agent").iterdir())
        for name, host in lab.hosts.items()
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--before", default="main", help="the git revision to compare with")
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dctl-bundle-"))
    base.chmod(0o755)  # the hosts' users run the wrapper in it
    before_tree = base / "before"
    sh("git", "-C", REPO, "worktree", "add", "--detach", before_tree, options.before)
    trees = {"before": before_tree, "after": REPO}
    names = [f"h{i:03d}" for i in range(options.hosts)]
    lab = start_lab(base / "lab", names)
    try:
        wrapper = base / "timed-python"
        wrapper.write_text(WRAPPER)
        wrapper.chmod(0o755)
        work = base / "work"
        (work / "home").mkdir(parents=True)
        inventory = lab.inventory(
            work / "inventory.yml", names, {n: {"python": str(wrapper)} for n in names}
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPLOYCTL_", "SSH_"))}
        env.update(HOME=str(work / "home"), LC_ALL="C.UTF-8")
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as on a host: the login's env
        results: dict[str, Any] = {"hosts": options.hosts, "rounds": options.rounds}
        for name, tree in trees.items():  # cold: the agent is sent to every host
            took = run_status(tree, inventory, env, work)
            cpu = read_cpu(lab)
            results[f"{name}_cold"] = {
                "wall_s": took,
                "agent_processes": len(cpu),
                "cpu_ms_total": sum(cpu) * 1e3,
            }
            log(f"{name} cold: {took:.2f} s, {len(cpu)} agent processes")
        walls: dict[str, list[float]] = {n: [] for n in trees}
        cpus: dict[str, list[float]] = {n: [] for n in trees}
        counts: dict[str, list[int]] = {n: [] for n in trees}
        for round_ in range(options.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                walls[name].append(run_status(trees[name], inventory, env, work))
                cpu = read_cpu(lab)
                counts[name].append(len(cpu))
                cpus[name].append(statistics.fmean(cpu) * 1e3)  # `times` counts 10 ms ticks
            log(f"round {round_ + 1}: " + ", ".join(f"{n} {walls[n][-1]:.2f} s" for n in trees))
        folders = agent_folders(lab)
        for name in trees:
            results[name] = {
                "wall_s": summary(walls[name]),
                "cpu_ms_per_call": summary(cpus[name]),
                "agent_processes_per_round": sorted(set(counts[name])),
            }
        results["agent_entries_per_host"] = sorted({len(v) for v in folders.values()})
        results["agent_entries_example"] = folders[names[0]]
    finally:
        stop_lab(lab)
        sh("git", "-C", REPO, "worktree", "remove", "--force", before_tree)
        shutil.rmtree(base, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "agent_bundle.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
