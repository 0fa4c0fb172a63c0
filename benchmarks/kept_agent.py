"""What a polling round (`top`, the dashboard) costs with a kept agent per host, against one
Python process per call, and against the floor of the same hosts echoing through kept agents.

Sets up N real sshd hosts on loopback as fleet.py does (setup_hosts: one login user each with
/bin/sh, fleet.py's cheap fake nvidia-smi answering 8 H200 GPUs, the agent unpacked; no
server runs, so each status answers "no run" with its GPUs). Then, in this process, three
fleets over connections kept open, their order rotating every round:

  per call   a `top` round as before the kept agent: metrics_round, one Python per host
  kept       the same round through one kept agent per host (Fleet.keep_agents)
  no GPUs    the kept round without the GPU query (what a host whose NVML answers it costs,
             about: remote/gpus.py; the lab's hosts have no NVML, so nvidia-smi's fake runs)
  floor      each host's kept agent answers `echo` (no status read, no GPU query)

For each: the round's wall time, this process's CPU per round (the client), and the remote
CPU per host per round: the CPU seconds of every process of the hosts' login users and of
their sshd sessions (utime+stime, children included: /proc/PID/stat), read before and after
each round, over N. Medians of --rounds.

Then the kept agent's resident memory over --long-rounds `top` rounds of --long-hosts hosts
(echo answers it at rounds 10 and the last).

Then what the bootstrap's check of the bundle folder (every part the user's own and not open
to others, each module's sha256 against the manifest: remote/bootstrap.py) costs, on
--manifest-hosts hosts over --manifest-rounds rounds (each round's median wall time, and the
hosts' mean CPU per host), with the check and with a bootstrap that skips it (the same script
with `unsound` not called), side by side:

  kept status   a `top` round through kept agents (the check ran once, at each agent's start)
  kept echo     the floor round through kept agents
  one-shot      a `runs` call per host, one Python per call: the check runs in each
  agent start   a kept agent started anew on each host and its first echo (the check runs once)
  check alone   `unsound()` itself in the host's Python: wall and CPU ms per call

Run: python benchmarks/kept_agent.py [--hosts 32,128,256] [--rounds 10] (needs root and
openssh-server); --manifest-only for the check's figures alone. Results: a table on stdout and
benchmarks/results/kept_agent.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fleet import CLK_TCK, setup_hosts  # noqa: E402

from deployctl import agent  # noqa: E402
from deployctl.connection import Connection, ConnectOptions  # noqa: E402
from deployctl.crash.catalog import default_catalog  # noqa: E402
from deployctl.fanout import Fleet  # noqa: E402
from deployctl.inventory import Host, load_inventory  # noqa: E402
from deployctl.ops.rounds import TOP_TAIL_BYTES, metrics_round  # noqa: E402
from deployctl.remote import bootstrap  # noqa: E402
from deployctl.remote.measures import EchoArgs  # noqa: E402
from deployctl.remote.protocol import (  # noqa: E402
    ECHO,
    RUNS,
    RunsArgs,
    StatusArgs,
    StatusReply,
)
from tests.sshd_hosts import SSHLab, stop_lab  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def remote_cpu_s(uids: set[int], users: tuple[bytes, ...]) -> float:
    """CPU seconds so far of the hosts' side: their users' processes and their sshd sessions
    (children that were waited for included)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid not in uids:
                cmdline = Path(entry.path, "cmdline").read_bytes()
                if not cmdline.startswith(b"sshd") or not any(u in cmdline for u in users):
                    continue
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / CLK_TCK


def echo_round(fleet: Fleet) -> None:
    args: EchoArgs = {}
    results = fleet.run(lambda host, conn: agent.through_kept_agent(host, conn, ECHO, args))
    assert all(r.value is not None for r in results), [r.error for r in results]


def bench_size(lab: SSHLab, inventory: Path, rounds: int) -> dict[str, Any]:
    hosts = load_inventory(inventory).select(None)
    catalog = default_catalog()
    uids = {int(h.home.stat().st_uid) for h in lab.hosts.values()}
    users = tuple(h.user.encode() for h in lab.hosts.values())
    names = ("per call", "kept", "no GPUs", "floor")
    fleets = {name: Fleet(hosts, ConnectOptions(), forks=32) for name in names}
    for name in names[1:]:
        fleets[name].keep_agents()

    def top_round(fleet: Fleet) -> Callable[[], None]:
        def run() -> None:
            results = metrics_round(fleet, catalog, within=60)
            assert results.ok, [r.error for r in results if r.error][:3]

        return run

    def status_only() -> None:
        def read(host: Host, conn: Connection) -> StatusReply:
            args: StatusArgs = {"state_dir": host.settings.state_dir, "deployment": None,
                                "run": None, "tail_bytes": TOP_TAIL_BYTES, "metrics_bytes": 0}  # fmt: skip
            return agent.call(host, conn, agent.STATUS, args)

        results = fleets["no GPUs"].run(read)
        assert results.ok, [r.error for r in results if r.error][:3]

    steps = {
        "per call": top_round(fleets["per call"]),
        "kept": top_round(fleets["kept"]),
        "no GPUs": status_only,
        "floor": lambda: echo_round(fleets["floor"]),
    }
    try:
        for step in steps.values():  # connections opened, agents started: not measured
            step()
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in steps}
        order = list(steps)
        for index in range(rounds):
            for name in order[index % 4 :] + order[: index % 4]:
                cpu0 = remote_cpu_s(uids, users)
                began, client0 = time.perf_counter(), time.process_time()
                steps[name]()
                wall, client = time.perf_counter() - began, time.process_time() - client0
                cpu1 = remote_cpu_s(uids, users)
                samples[name].append((wall, (cpu1 - cpu0) / len(hosts), client))
    finally:
        for fleet in fleets.values():
            fleet.close()
    result: dict[str, Any] = {"hosts": len(hosts), "rounds": rounds}
    for name, values in samples.items():
        result[name] = {
            "round_s": round(statistics.median(v[0] for v in values), 3),
            "remote_cpu_ms_per_host": round(1000 * statistics.median(v[1] for v in values), 2),
            "client_cpu_s": round(statistics.median(v[2] for v in values), 3),
        }
    for name in ("kept", "no GPUs"):
        ratio = result[name]["round_s"] / result["floor"]["round_s"]
        result[name]["vs_floor"] = round(ratio, 2)
    return result


def memory_over_rounds(inventory: Path, rounds: int) -> dict[str, Any]:
    """The kept agents' RSS (KiB, the largest host's) after 10 rounds and after `rounds`."""
    hosts = load_inventory(inventory).select(None)
    catalog = default_catalog()
    seen: dict[int, int] = {}
    args: EchoArgs = {}
    with Fleet(hosts, ConnectOptions(), forks=32) as fleet:
        fleet.keep_agents()
        for index in range(1, rounds + 1):
            assert metrics_round(fleet, catalog, within=60).ok
            if index in (10, rounds):
                echoes = fleet.run(
                    lambda host, conn: agent.through_kept_agent(host, conn, ECHO, args)
                )
                seen[index] = max(r.value[0]["rss_kib"] for r in echoes if r.value)
    return {"hosts": len(hosts), "rounds": rounds, "rss_kib": seen}


# The bootstrap with its check of the folder skipped: what a round cost before the check.
CHECK_CALL = "why = unsound(sys.argv[1], sys.argv[2])"
UNCHECKED = bootstrap.BOOTSTRAP.replace(CHECK_CALL, 'why = ""')
assert UNCHECKED != bootstrap.BOOTSTRAP, "the bootstrap no longer calls unsound() so"
CHECKED = bootstrap.BOOTSTRAP


def manifest_cost(lab: SSHLab, inventory: Path, rounds: int) -> dict[str, Any]:
    """Each step with the bundle check and without it (see the docstring): the round's
    median wall ms, and the hosts' mean CPU ms per host per round (remote_cpu_s: steadier than
    wall time on a busy machine; a mean, as /proc counts whole 10 ms ticks)."""
    hosts = load_inventory(inventory).select(None)
    catalog = default_catalog()
    uids = {int(h.home.stat().st_uid) for h in lab.hosts.values()}
    users = tuple(h.user.encode() for h in lab.hosts.values())
    kept = {"with": Fleet(hosts, ConnectOptions(), forks=32),
            "without": Fleet(hosts, ConnectOptions(), forks=32)}  # fmt: skip
    shots = {"with": Fleet(hosts, ConnectOptions(), forks=32),
             "without": Fleet(hosts, ConnectOptions(), forks=32)}  # fmt: skip

    def using(which: str) -> None:
        bootstrap.BOOTSTRAP = CHECKED if which == "with" else UNCHECKED

    def kept_status(which: str) -> None:
        assert metrics_round(kept[which], catalog, within=60).ok

    def one_shot(which: str) -> None:
        def runs(host: Host, conn: Connection) -> object:
            args: RunsArgs = {"state_dir": host.settings.state_dir}
            return agent.call(host, conn, RUNS, args)

        results = shots[which].run(runs)
        assert results.ok, [r.error for r in results if r.error][:3]

    def agent_start(which: str) -> None:
        for conn in (kept[which].connection(host) for host in hosts):
            for each in list(conn.kept.values()):  # ended: the next call starts another
                each.close()
        echo_round(kept[which])

    steps: dict[str, Callable[[str], None]] = {
        "kept status": kept_status,
        "kept echo": lambda which: echo_round(kept[which]),
        "one-shot": one_shot,
        "agent start": agent_start,
    }
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {
        step: {"with": [], "without": []} for step in steps
    }
    try:
        for which in ("with", "without"):  # connections opened, agents started: not measured
            using(which)
            kept[which].keep_agents()
            for step in steps.values():
                step(which)
        for index in range(rounds):
            for name, step in steps.items():
                for which in ("with", "without")[:: 1 if index % 2 else -1]:
                    using(which)
                    cpu0 = remote_cpu_s(uids, users)
                    began = time.perf_counter()
                    step(which)
                    wall = time.perf_counter() - began
                    cpu = (remote_cpu_s(uids, users) - cpu0) / len(hosts)
                    samples[name][which].append((wall, cpu))
    finally:
        using("with")
        for fleet in [*kept.values(), *shots.values()]:
            fleet.close()
    result: dict[str, Any] = {"hosts": len(hosts), "rounds": rounds}
    for name, pair in samples.items():
        result[name] = {
            which: {
                "round_ms": round(1000 * statistics.median(v[0] for v in values), 2),
                "host_cpu_ms": round(1000 * statistics.mean(v[1] for v in values), 2),
            }
            for which, values in pair.items()
        }
    result["check alone"] = check_alone(lab, hosts[0])
    return result


def check_alone(lab: SSHLab, host: Host) -> dict[str, float]:
    """`unsound()` on a host's unpacked folder, in that host's Python: wall and CPU ms per
    call (medians of 20 runs of 50 calls each)."""
    test_host = lab.hosts[host.name]
    folder = test_host.home / ".deployctl" / "agent" / agent.agent_hash()
    script = (
        "import hashlib, os, stat, statistics, sys, time\n" + bootstrap._UNSOUND + "runs = []\n"
        "for _ in range(20):\n"
        "    began, cpu = time.perf_counter(), time.process_time()\n"
        "    for _ in range(50):\n"
        "        assert not unsound(sys.argv[1], sys.argv[2])\n"
        "    runs.append(((time.perf_counter() - began) / 50, (time.process_time() - cpu) / 50))\n"
        "print(statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))\n"
    )
    out = test_host.as_user(
        f"{host.settings.python} -c {shlex.quote(script)} {folder} {agent.manifest_digest()}"
    ).stdout
    wall, cpu = (round(1000 * float(v), 3) for v in out.split())
    return {"wall_ms": wall, "cpu_ms": cpu}


def manifest_table(result: dict[str, Any]) -> str:
    alone = result["check alone"]
    lines = [
        f"bundle check, {result['hosts']} hosts, medians of {result['rounds']} rounds: "
        "median round wall ms / mean hosts' CPU ms per host",
        "step | with the check | without | difference",
        "---|---|---|---",
    ]
    for name in ("kept status", "kept echo", "one-shot", "agent start"):
        got, base = result[name]["with"], result[name]["without"]
        lines.append(
            f"{name} | {got['round_ms']:.1f} / {got['host_cpu_ms']:.1f} | "
            f"{base['round_ms']:.1f} / {base['host_cpu_ms']:.1f} | "
            f"{got['round_ms'] - base['round_ms']:+.1f} / "
            f"{got['host_cpu_ms'] - base['host_cpu_ms']:+.1f}"
        )
    lines.append(f"check alone | {alone['wall_ms']:.2f} / {alone['cpu_ms']:.2f} | — | —")
    return "\n".join(lines)


def table(results: list[dict[str, Any]]) -> str:
    names = ("per call", "kept", "no GPUs", "floor")
    lines = [
        "hosts | "
        + " | ".join(f"{n}: round s, remote CPU ms/host, client CPU s" for n in names)
        + " | kept / floor | no GPUs / floor",
        "---|---|---|---|---|---|---",
    ]
    for r in results:
        cells = [
            f"{r[n]['round_s']:.3f}, {r[n]['remote_cpu_ms_per_host']:.1f}, "
            f"{r[n]['client_cpu_s']:.3f}"
            for n in names
        ]
        ratios = f" | {r['kept']['vs_floor']:.2f}× | {r['no GPUs']['vs_floor']:.2f}×"
        lines.append(f"{r['hosts']} | " + " | ".join(cells) + ratios)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", default="32,128,256")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--long-hosts", type=int, default=4)
    parser.add_argument("--long-rounds", type=int, default=1000, help="0: skip")
    parser.add_argument("--manifest-hosts", type=int, default=4)
    parser.add_argument("--manifest-rounds", type=int, default=30)
    parser.add_argument("--manifest-only", action="store_true", help="the bundle check alone")
    args = parser.parse_args()
    sizes = [] if args.manifest_only else [int(n) for n in args.hosts.split(",")]
    base = Path(tempfile.mkdtemp(prefix="deployctl-kept-", dir="/tmp"))
    base.chmod(0o755)
    lab, _ = setup_hosts(base / "lab", max([*sizes, args.manifest_hosts]), sglang=False)
    results = []
    memory: dict[str, Any] = {}
    try:
        names = list(lab.hosts)[: args.manifest_hosts]
        manifest_inventory = lab.inventory(base / "inv-manifest.yml", names, command_timeout=120)
        manifest = manifest_cost(lab, manifest_inventory, args.manifest_rounds)
        print(json.dumps(manifest), flush=True)
        for size in sizes:
            names = list(lab.hosts)[:size]
            inventory = lab.inventory(base / f"inv-{size}.yml", names, command_timeout=120)
            results.append(bench_size(lab, inventory, args.rounds))
            print(json.dumps(results[-1]), flush=True)
        names = list(lab.hosts)[: args.long_hosts]
        long_inventory = lab.inventory(base / "inv-long.yml", names)
        if args.long_rounds and not args.manifest_only:
            memory = memory_over_rounds(long_inventory, args.long_rounds)
    finally:
        stop_lab(lab)
    document = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_after": os.getloadavg(),
        "sizes": results,
        "memory": memory,
        "bundle_check": manifest,
    }
    RESULTS.mkdir(exist_ok=True)
    name = "kept_agent_bundle_check.json" if args.manifest_only else "kept_agent.json"
    (RESULTS / name).write_text(json.dumps(document, indent=2) + "\n")
    if results:
        print(table(results))
        print(json.dumps(memory))
    print(manifest_table(manifest))


if __name__ == "__main__":
    main()
