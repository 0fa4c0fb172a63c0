"""What one agent call costs the host: the CPU of `python -S -c BOOTSTRAP FOLDER DIGEST CALL ARGS`
(remote/bootstrap.py), the process a one-shot call starts on every host it asks.

The bundle is unpacked once into a private temporary state_dir, as UNPACK does on a host; then
each contender runs --runs times, in rotating order, with the host's python (--python, default
/usr/bin/python3, the test hosts' own), and the CPU of each process (getrusage of the waited
child) is taken. Contenders:

  python      `python -S -c pass`: the interpreter's own start, the floor of any call
  check       the bootstrap's folder and manifest check, nothing imported from the bundle
  <call>      a real call answered from an empty state_dir (runs, status, release, stop,
              probe: the calls a launch, `status` and `stop` make on each host), as the
              client sends it; `status, site` the same status call with the host's
              site-packages (without bootstrap.PYTHON_FLAGS), as calls were run before

With --against REV, the same calls of the agent as it was at git revision REV (its
`deployctl/remote/` modules, bundled and unpacked the same way) run in the same rotation, so
the two are compared side by side on one machine's one stretch of time.

Medians in milliseconds of CPU; a table on stdout and benchmarks/results/agent_call.json.
Run: python benchmarks/agent_call.py [--runs 40] [--python /usr/bin/python3] [--against REV]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "agent_call.json"
sys.path.insert(0, str(ROOT))

from deployctl import agent  # noqa: E402 - needs the path
from deployctl.remote import bootstrap, protocol, wire  # noqa: E402


def calls(state_dir: str) -> dict[str, tuple[str, dict[str, object]]]:
    """Each measured call's name on the wire and its arguments."""
    return {
        "runs": (protocol.RUNS.name, {"state_dir": state_dir}),
        "status": (
            protocol.STATUS.name,
            {
                "state_dir": state_dir,
                "deployment": None,
                "run": None,
                "tail_bytes": 0,
                "metrics_bytes": 0,
            },
        ),
        "release": (
            protocol.RELEASE.name,
            {"state_dir": state_dir, "deployment": None, "token": "t"},
        ),
        "stop": (
            protocol.STOP.name,
            {
                "state_dir": state_dir,
                "deployment": None,
                "timeout": 1.0,
                "run": None,
                "first_signal": wire.FIRST_SIGNAL_LEADER,
            },
        ),
        "probe": (protocol.PROBE.name, {"state_dir": state_dir, "paths": [], "hunks": {}}),
    }


def child_cpu_ms(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:  # a call answered with an error (exit 1) is not timed
        raise SystemExit(f"{argv[:2]}... failed ({done.returncode}): {done.stdout[-500:]!r}")
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return spent * 1000


def modules_at(revision: str) -> dict[str, bytes]:
    """The agent's modules (file name → text) at a git revision of this checkout."""
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", revision, "deployctl/remote/"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return {
        Path(path).name: subprocess.run(
            ["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        for path in listing
        if path.endswith(".py")
    }


def unpacked(python: str, state_dir: str, bundle: bytes) -> tuple[str, str]:
    """Unpack `bundle` under `state_dir` as a host would: (its folder, its manifest's digest)."""
    folder = f"{state_dir}/{wire.AGENT_DIR}/{hashlib.sha256(bundle).hexdigest()}"
    subprocess.run([python, "-c", bootstrap.UNPACK, folder], input=bundle, check=True)
    return folder, agent.manifest_digest_of(bundle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--against", metavar="REV", help="also the agent at this git revision")
    opts = parser.parse_args()
    state_dir = tempfile.mkdtemp(prefix="agent-call-")
    bundles = {"": agent.agent_bundle()}
    if opts.against:
        bundles[f" @{opts.against}"] = agent.bundle_of(modules_at(opts.against))
    try:
        folder, digest = unpacked(opts.python, state_dir, bundles[""])
        check_only = bootstrap.BOOTSTRAP.split("sys.path.insert")[0]
        flags = bootstrap.PYTHON_FLAGS  # as the client runs a call
        contenders = {
            "python": [opts.python, *flags, "-c", "pass"],
            "check": [opts.python, *flags, "-c", check_only, folder, digest],
        }
        for suffix, bundle in bundles.items():
            folder, digest = unpacked(opts.python, state_dir, bundle)
            for label, (call, args) in calls(state_dir).items():
                contenders[label + suffix] = [
                    opts.python, *flags, "-c", bootstrap.BOOTSTRAP, folder, digest, call,
                    json.dumps(args),
                ]  # fmt: skip
        # What the flags save: the status call as it was run with the host's site-packages.
        site = contenders["status"].copy()
        del site[1 : 1 + len(flags)]
        contenders["status, site"] = site
        samples: dict[str, list[float]] = {label: [] for label in contenders}
        for argv in contenders.values():  # once each first: bytecode written, caches warm
            child_cpu_ms(argv)
        order = list(contenders)
        for round_ in range(opts.runs):
            for label in order[round_ % len(order) :] + order[: round_ % len(order)]:
                samples[label].append(child_cpu_ms(contenders[label]))
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    table = {label: round(statistics.median(values), 2) for label, values in samples.items()}
    print(f"one agent call's CPU on the host ({opts.python}), median of {opts.runs} runs, ms")
    for label, value in table.items():
        print(f"  {label:<20} {value:7.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "python": opts.python,
                "runs": opts.runs,
                "against": opts.against,
                "median_cpu_ms": table,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
