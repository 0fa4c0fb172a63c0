"""How deployctl's host-count work grows, up to 5,000 hosts, and its start-up medians.

Part 1, growth. For each --sizes fleet (default 1250, 2500, 5000 hosts) it writes the
inventory of inventory_load.py (racks of 8 as ranges, pods, group vars at every level, a
templated variable) with every host at a closed loopback port, then times, as new
processes, medians of --rounds:

  hosts     `deployctl hosts --json`: inventory resolution and rendering every host
  render    `deployctl render --json`: the launch command of every host from its template
  dry-run   `deployctl launch --dry-run --json --forks 64`: the fan-out and its result
            rendering; each host's connection is refused at once (nothing listens there)

Per host, each figure should stay flat as the fleet grows: the table gives microseconds
per host and the ratio of the largest fleet's to the smallest's (about 1.0 for linear work,
2.0 or more for quadratic work across a 4x range).

Part 2, start-up: `deployctl --help` and `deployctl render -H ONE` on an 8-host inventory,
medians of 11.

Everything runs through the `deployctl` console script of /tmp/deployctl-bench-venv, where
this tree is installed afresh as a user's `pip install` would (fleet.ensure_deployctl_venv).

JSON goes to benchmarks/results/scale.json (git-ignored).
Run: python benchmarks/scale.py [--sizes 1250,2500,5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from fleet import ensure_deployctl_venv  # noqa: E402 - needs the path above
from inventory_load import write_fleet  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STARTUP_RUNS = 11


def closed_port() -> int:
    """A loopback port nothing listens on: connecting there is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fleet(root: Path, hosts: int, port: int) -> Path:
    root.mkdir()
    path = write_fleet(root, hosts)["yaml"]
    (root / "group_vars" / "all.yml").write_text(
        f"ansible_host: 127.0.0.1\nansible_port: {port}\n", encoding="utf-8"
    )
    return path


def timed(argv: list[str], rounds: int, ok: tuple[int, ...] = (0,)) -> float:
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, check=False)
        samples.append(time.perf_counter() - began)
        if done.returncode not in ok:
            raise SystemExit(f"{argv[1:3]} exited {done.returncode}: {done.stderr[-500:]!r}")
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1250,2500,5000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    port = closed_port()
    rows = []
    with tempfile.TemporaryDirectory(prefix="deployctl-scale-") as scratch:
        cli = [str(ensure_deployctl_venv(Path(scratch)) / "bin" / "deployctl")]
        for hosts in sizes:
            inventory = str(fleet(Path(scratch) / str(hosts), hosts, port))
            commands = {
                "hosts": ([*cli, "hosts", "--json", "-i", inventory], (0,)),
                "render": ([*cli, "render", "--json", "-i", inventory], (0,)),
                "dry-run": (
                    [*cli, "launch", "--dry-run", "--json", "--forks", "64", "-i", inventory],
                    (1,),  # every host refused: exit 1, one error per host
                ),
            }
            row = {"hosts": hosts // 8 * 8}
            for name, (argv, ok) in commands.items():
                row[f"{name}_s"] = round(timed(argv, args.rounds, ok), 3)
            rows.append(row)
            print(row, flush=True)
        small = str(fleet(Path(scratch) / "small", 8, port))
        startup = {
            "cli": cli,
            "help_s": round(timed([*cli, "--help"], STARTUP_RUNS), 3),
            "render_one_s": round(
                timed([*cli, "render", "-i", small, "-H", "gpu-r0000-01"], STARTUP_RUNS), 3
            ),
        }
    first, last = rows[0], rows[-1]
    growth = {
        name: round((last[f"{name}_s"] / last["hosts"]) / (first[f"{name}_s"] / first["hosts"]), 2)
        for name in ("hosts", "render", "dry-run")
    }
    print(f"{'hosts':>6} " + " ".join(f"{n + ' s':>10} {'µs/host':>8}" for n in growth))
    for row in rows:
        cells = [
            f"{row[f'{n}_s']:>10.3f} {row[f'{n}_s'] / row['hosts'] * 1e6:>8.0f}" for n in growth
        ]
        print(f"{row['hosts']:>6} " + " ".join(cells))
    print(f"per-host growth {first['hosts']} -> {last['hosts']} hosts: {growth}")
    print(f"deployctl --help {startup['help_s']} s, render one host {startup['render_one_s']} s")
    RESULTS.mkdir(exist_ok=True)
    out = {"rounds": args.rounds, "rows": rows, "per_host_growth": growth, "startup": startup}
    (RESULTS / "scale.json").write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
