"""Multi-node launch and watch over real sshd hosts and the stand-in server.

Starts 8 real sshd test hosts (tests.sshd_hosts.start_lab; needs root and openssh-server) and
runs one stand-in server (startup_s 1.0, one TP rank per node) across the first N of them as
one multi-node deployment, for N = 2, 4, 8:

  launch    `deployctl launch --json` wall time, split into
            before start  launch began → the first node's server process started
            start spread  first node started → last node started
            ready lag     rank 0's /health first answered 200 (watched every 5 ms from here)
                          → deployctl exited
            overhead      total - (rank 0 ready - last node started): what deployctl adds
                          beyond the stand-in's own start, which should not grow with N
            client cpu    CPU seconds the deployctl process used (getrusage of children)
            machine cpu   CPU seconds this whole machine spent during the launch (/proc/stat):
                          the hosts' sshd, agents and servers share the client's two cores
  watch     N = 2 only: rank 1 crashes 1.5 s after ready (crash=after_ready); the time from
            its crash line reaching the log (a 2 ms watcher) until every process of the old
            group on every node is gone, with `deployctl watch --interval 0.5` running; rank 0
            is told not to die of the lost peer on its own (peer_loss_s 60), so what ends the
            group is watch's stop

Medians of --rounds (default 3). Run: python benchmarks/multinode.py. JSON goes to
benchmarks/results/multinode.json (git-ignored). Client and hosts share this machine's CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from tests.sshd_hosts import STANDIN, SSHLab, free_port, sh, start_lab, stop_lab  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NAMES = [f"n{i}" for i in range(1, 9)]


def deployctl(home: Path, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPLOYCTL_", "SSH_AUTH"))}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-m", "deployctl", *args], env=env, text=True, cwd=home, **kwargs
    )


def prepare(
    lab: SSHLab, names: list[str], knobs: dict[str, dict[str, Any]], path: Path
) -> dict[str, int]:
    """Give the nodes the stand-in and a model folder; write the group inventory."""
    ports, host_vars = {}, {}
    for name in names:
        host = lab.hosts[name]
        host.kill_processes()
        shutil.rmtree(host.home / "logs", ignore_errors=True)
        shutil.rmtree(host.home / ".deployctl" / "runs", ignore_errors=True)
        shutil.copy(STANDIN, host.home / STANDIN.name)
        (host.home / "model").mkdir(exist_ok=True)
        settings = {"startup_s": 1.0, "drain_s": 0, **knobs.get(name, {})}
        (host.home / "model" / "standin.json").write_text(json.dumps(settings))
        (host.home / "model" / "standin-argv.jsonl").unlink(missing_ok=True)
        sh("chown", "-R", f"{host.user}:{host.user}", host.home)
        host.set_gpus("clean", 1)
        ports[name] = free_port(host.address)
        host_vars[name] = {
            "launch_module": "sglang_standin", "template": "baseline", "tp": 1, "log_dir": "~/logs",
            "model_path": str(host.home / "model"), "bind_host": host.address, "port": ports[name],
        }  # fmt: skip
    lab.inventory(path, names, host_vars)
    document = yaml.safe_load(path.read_text())
    kimi = {"nodes": "group", "tp": len(names), "dist_port": free_port(lab.hosts[names[0]].address)}
    document["all"]["children"] = {
        "group": {"hosts": dict.fromkeys(names), "vars": {"deployments": {"kimi": kimi}}}
    }
    path.write_text(yaml.safe_dump(document))
    return ports


def first_200(url: str, stop: threading.Event, found: list[float]) -> None:
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=0.2) as reply:
                if reply.status == 200:
                    found.append(time.time())
                    return
        except OSError:
            pass
        time.sleep(0.005)


def started_at(lab: SSHLab, name: str) -> float:
    lines = (lab.hosts[name].home / "model" / "standin-argv.jsonl").read_text().splitlines()
    return float(json.loads(lines[-1])["time"])


def launch_once(lab: SSHLab, home: Path, count: int, base: Path) -> dict[str, float]:
    names = NAMES[:count]
    inv = base / f"inv{count}.yml"
    ports = prepare(lab, names, {}, inv)
    url = f"http://{lab.hosts[names[0]].address}:{ports[names[0]]}/health"
    stop, found = threading.Event(), []
    watcher = threading.Thread(target=first_200, args=(url, stop, found), daemon=True)
    watcher.start()
    cpu_before, busy_before = _child_cpu(), _busy_jiffies()
    began = time.time()
    proc = deployctl(
        home, "launch", "-i", str(inv), "--json", "--timeout", "60", stdout=subprocess.PIPE
    )
    out, _ = proc.communicate(timeout=120)
    ended = time.time()
    client_cpu, machine_cpu = _child_cpu() - cpu_before, (_busy_jiffies() - busy_before) / 100
    stop.set()
    if proc.returncode != 0 or not found:
        raise SystemExit(f"launch of {count} nodes failed: {out[-2000:]}")
    starts = [started_at(lab, n) for n in names]
    ready = found[0]
    result = {
        "total_s": ended - began,
        "before_start_s": min(starts) - began,
        "start_spread_s": max(starts) - min(starts),
        "ready_lag_s": ended - ready,
        "server_start_s": ready - max(starts),
        "client_cpu_s": client_cpu,
        "machine_cpu_s": machine_cpu,
    }
    result["overhead_s"] = result["total_s"] - result["server_start_s"]
    deployctl(home, "stop", "-i", str(inv)).wait(60)
    return result


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _busy_jiffies() -> int:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def watch_once(lab: SSHLab, home: Path, base: Path) -> float:
    names = NAMES[:2]
    inv = base / "watch.yml"
    knobs = {"n1": {"peer_loss_s": 60}, "n2": {"crash": "after_ready", "crash_after_s": 1.5}}
    prepare(lab, names, knobs, inv)
    proc = deployctl(
        home, "launch", "-i", str(inv), "--json", "--timeout", "60", stdout=subprocess.PIPE
    )
    out, _ = proc.communicate(timeout=120)
    doc = json.loads(out)
    groups = [doc["hosts"][n]["deployments"]["kimi"]["pid"] for n in names]
    old = {int(p) for g in groups for p in sh("pgrep", "-g", str(g), check=False).stdout.split()}
    log = lab.hosts["n2"].home / "logs" / "kimi_baseline_v1.log"
    watch = deployctl(home, "watch", "-i", str(inv), "--interval", "0.5", stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while "Scheduler hit an exception" not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise SystemExit("the crash line never reached the log")
        time.sleep(0.002)
    crash_at = time.time()
    while any(Path(f"/proc/{p}").exists() for p in old):
        if time.monotonic() > deadline + 60:
            raise SystemExit("watch did not stop the group within 60 s")
        time.sleep(0.002)
    gone = time.time()
    watch.send_signal(signal.SIGINT)
    watch.wait(30)
    deployctl(home, "stop", "-i", str(inv)).wait(60)
    return gone - crash_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="deployctl-multinode-", dir="/tmp"))
    base.chmod(0o755)
    lab = start_lab(base / "lab", NAMES)
    home = base / "client"
    home.mkdir()
    try:
        launches: dict[int, list[dict[str, float]]] = {2: [], 4: [], 8: []}
        for _ in range(args.rounds):
            for count, samples in launches.items():  # sizes interleaved: load drift hits all
                samples.append(launch_once(lab, home, count, base))
        crashes = [watch_once(lab, home, base) for _ in range(args.rounds)]
    finally:
        stop_lab(lab)
    medians = {
        count: {key: round(statistics.median(r[key] for r in rounds), 3) for key in rounds[0]}
        for count, rounds in launches.items()
    }
    result = {
        "rounds": args.rounds,
        "load": os.getloadavg(),
        "launch_medians": medians,
        "watch_crash_to_group_stopped_s": {
            "median": round(statistics.median(crashes), 3),
            "all": [round(c, 3) for c in crashes],
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "multinode.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
