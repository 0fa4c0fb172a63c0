"""What one `top` refresh of 4 hosts costs, against a fresh `status --metrics` of them.

Starts 4 real sshd test hosts (tests.sshd_hosts.start_lab; needs root and openssh-server),
launches the stand-in with metrics on each, then, side by side in one run:

  fresh    `deployctl status --metrics --json` as a new process (imports, SSH handshakes,
           one status round trip per host), wall time per call
  refresh  one round of `top` (deployctl.ops.rounds.metrics_rounds, what `top` runs between
           its sleeps) over connections kept open, timed in this process; it also reads a
           shorter log tail than `status` (16 KiB against 256 KiB)

Medians of --rounds samples (default 15). Run: python benchmarks/top_refresh.py. JSON goes
to benchmarks/results/top_refresh.json (git-ignored). Client and hosts share this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.sshd_hosts import STANDIN, free_port, sh, start_lab, stop_lab  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NAMES = ["t1", "t2", "t3", "t4"]


def time_refreshes(inventory: str, rounds: int) -> list[float]:
    """Seconds per `top` round after the first (which opens the connections)."""
    from deployctl.connection import ConnectOptions
    from deployctl.crash import load_catalog
    from deployctl.fanout import Fleet
    from deployctl.inventory import load_inventory
    from deployctl.ops.rounds import metrics_rounds

    hosts = list(load_inventory(Path(inventory)).hosts.values())
    times: list[float] = []
    with Fleet(hosts, ConnectOptions()) as fleet:
        began = time.monotonic()
        for results in metrics_rounds(fleet, load_catalog(), 0, rounds + 1, sleep=lambda _: None):
            assert all(r.value and r.value.metrics for r in results), results.failed
            times.append(time.monotonic() - began)
            began = time.monotonic()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="deployctl-top-", dir="/tmp"))
    base.chmod(0o755)
    lab = start_lab(base / "lab", NAMES)
    home = base / "client"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPLOYCTL_", "SSH_AUTH"))}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))

    def deployctl(*argv: str) -> list[str]:
        return [sys.executable, "-m", "deployctl", *argv]

    try:
        host_vars = {}
        for name in NAMES:
            host = lab.hosts[name]
            shutil.copy(STANDIN, host.home / STANDIN.name)
            (host.home / "model").mkdir()
            sh("chown", "-R", f"{host.user}:{host.user}", host.home)
            host.set_gpus("clean", 1)
            host_vars[name] = {
                "launch_module": "sglang_standin", "template": "baseline", "tp": 1,
                "model_path": str(host.home / "model"), "bind_host": host.address,
                "port": free_port(host.address), "log_dir": "~/logs",
            }  # fmt: skip
        inv = str(lab.inventory(base / "inv.yml", NAMES, host_vars))
        subprocess.run(deployctl("launch", "-i", inv), env=env, cwd=home, check=True)
        fresh = []
        for _ in range(args.rounds):
            began = time.monotonic()
            subprocess.run(
                deployctl("status", "--metrics", "--json", "-i", inv),
                env=env, cwd=home, check=True, capture_output=True,
            )  # fmt: skip
            fresh.append(time.monotonic() - began)
        refresh = time_refreshes(inv, args.rounds)
        subprocess.run(deployctl("stop", "-i", inv), env=env, cwd=home, capture_output=True)
    finally:
        stop_lab(lab)
    result = {
        "hosts": len(NAMES),
        "rounds": args.rounds,
        "load": os.getloadavg(),
        "fresh_status_metrics_s": round(statistics.median(fresh), 3),
        "top_refresh_s": round(statistics.median(refresh), 3),
        "ratio": round(statistics.median(fresh) / statistics.median(refresh), 1),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "top_refresh.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
