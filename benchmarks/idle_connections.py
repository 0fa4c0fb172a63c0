"""What kept SSH connections cost the client while idle (between `top`/`watch` rounds).

Starts N real sshd test hosts (tests.sshd_hosts.start_lab; needs root and openssh-server),
opens one connection to each through deployctl's Fleet (one command per host), then measures
this process's CPU while every connection sits idle for --seconds. Side by side in one run,
for each N:

  deployctl   the transport deployctl uses (its thread checks itself once a second)
  paramiko    paramiko's own Transport, whose thread wakes every 0.1 s

Medians of --rounds idle periods. Run: python benchmarks/idle_connections.py [--hosts 64,256].
JSON goes to benchmarks/results/idle_connections.json (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import deployctl.connection as connection  # noqa: E402 - needs the path above
from deployctl.fanout import Fleet  # noqa: E402
from deployctl.inventory import load_inventory  # noqa: E402
from tests.sshd_hosts import start_lab, stop_lab  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def idle_cpu(inventory: Path, seconds: float, rounds: int) -> list[float]:
    """Percent of one core this process used per idle period, all hosts connected."""
    hosts = load_inventory(inventory).select(None)
    samples = []
    with Fleet(hosts, connection.ConnectOptions()) as fleet:
        results = fleet.run(lambda host, conn: conn.run("true").check(host.name))
        if not results.ok:
            raise RuntimeError(f"connecting failed: {results.failed}")
        for _ in range(rounds):
            before, start = os.times(), time.monotonic()
            time.sleep(seconds)
            after, wall = os.times(), time.monotonic() - start
            cpu = (after.user - before.user) + (after.system - before.system)
            samples.append(100 * cpu / wall)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", default="64,256", help="comma list of fleet sizes")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one idle period")
    parser.add_argument("--rounds", type=int, default=3, help="idle periods per contender")
    args = parser.parse_args()
    sizes = [int(n) for n in args.hosts.split(",")]
    import paramiko

    contenders = {"deployctl": connection._transport_class(), "paramiko": paramiko.Transport}
    base = Path(tempfile.mkdtemp(prefix="deployctl-idle-", dir="/tmp"))
    names = [f"ic{i:03d}" for i in range(max(sizes))]
    lab = start_lab(base, names)
    results: list[dict[str, Any]] = []
    try:
        for count in sizes:
            inventory = lab.inventory(base / f"inventory-{count}.yml", names[:count], {})
            row: dict[str, Any] = {"hosts": count}
            for name, transport in contenders.items():
                connection._transport_class = lambda transport=transport: transport  # type: ignore[misc]
                samples = idle_cpu(inventory, args.seconds, args.rounds)
                row[name] = {"median_pct_of_core": round(statistics.median(samples), 2)}
                print(f"{count} hosts, {name}: {row[name]['median_pct_of_core']} % of a core")
            results.append(row)
    finally:
        stop_lab(lab)
        shutil.rmtree(base, ignore_errors=True)
    result = {
        "benchmark": "idle_connections",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "seconds": args.seconds,
        "rounds": args.rounds,
        "results": results,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "idle_connections.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
