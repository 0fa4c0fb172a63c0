"""Mutation score of the pure modules against their fast unit tests (mutmut), per target.

Slow (minutes per module on 2 cores), so not part of CI. It mutates a copy of the committed
tree (`git archive HEAD`; with --worktree, of the working tree's files, uncommitted tests
included), never the tree itself, and merges each target's result into
benchmarks/results/mutation.json.

Run: python benchmarks/mutation.py [--worktree] [--children N] [TARGET ...]
     (default: every target below)
Needs: pip install mutmut==3.8.1 (in the same venv as the project's dev install).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "mutation.json"

# target: (modules to mutate, their fast tests: no sshd hosts, no network)
TARGETS: dict[str, tuple[list[str], list[str]]] = {
    "inventory": (["deployctl/inventory.py"], ["tests/test_inventory.py"]),
    "render": (["deployctl/render.py", "deployctl/shell.py"], ["tests/test_render.py"]),
    "facts": (["deployctl/facts.py"], ["tests/test_facts.py"]),
    "crash": (["deployctl/crash/"], ["tests/test_crash_scanner.py"]),
    "deployments": (["deployctl/deployments.py"], ["tests/test_placement.py"]),
    "metrics": (["deployctl/metrics.py"], ["tests/test_metrics_parser.py"]),
    "patchset": (["deployctl/patchset.py"], ["tests/test_patchset.py"]),
    "gpus": (["deployctl/ops/gpus.py"], ["tests/test_facts.py"]),
}
_COUNT = re.compile(r"(\d+)/(\d+)\s+🎉 (\d+) 🫥 (\d+)\s+⏰ (\d+)\s+🤔 (\d+)\s+🙁 (\d+)")


def copy_tree(work: Path, worktree: bool) -> None:
    """HEAD's files into `work`; with `worktree`, the working tree's (tracked and new)."""
    if not worktree:
        archive = subprocess.run(
            ["git", "archive", "HEAD"], cwd=REPO, check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
        return
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, work / name)


def run_target(
    name: str, modules: list[str], tests: list[str], worktree: bool = False, children: int = 2
) -> dict[str, object]:
    """Mutate `modules` in a fresh copy of the tree and run `tests` against each mutant."""
    with tempfile.TemporaryDirectory(prefix=f"deployctl-mutation-{name}-") as tmp:
        work = Path(tmp)
        copy_tree(work, worktree)
        with (work / "pyproject.toml").open("a", encoding="utf-8") as config:
            config.write(
                "\n[tool.mutmut]\n"
                f"paths_to_mutate = {json.dumps(modules)}\n"
                f"tests_dir = {json.dumps(tests)}\n"
                'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]\n'
                # The tests read the shipped templates, inventories and captures.
                'also_copy = ["inventories", "templates", "patches", "deployctl/data", "tests/data"]\n'
            )
        mutmut = [str(Path(sys.executable).parent / "mutmut")]
        started = time.monotonic()
        run = subprocess.run(
            [*mutmut, "run", "--max-children", str(children)],
            cwd=work,
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - started
        counts = _COUNT.findall(run.stdout + run.stderr)
        if not counts:
            raise SystemExit(f"{name}: mutmut gave no counts:\n{(run.stdout + run.stderr)[-2000:]}")
        _, total, killed, _, timeouts, suspicious, survived = map(int, counts[-1])
        listing = subprocess.run([*mutmut, "results"], cwd=work, capture_output=True, text=True)
        survivors = [
            line.split(":")[0].strip() for line in listing.stdout.splitlines() if "survived" in line
        ]
    return {
        "modules": modules,
        "tests": tests,
        "mutants": total,
        "killed": killed + timeouts,
        "survived": survived,
        "suspicious": suspicious,
        "score": round((killed + timeouts) / total, 3) if total else None,
        "seconds": round(seconds),
        "survivors": survivors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=", ".join(TARGETS))
    parser.add_argument("--worktree", action="store_true", help="Mutate the working tree's copy.")
    parser.add_argument("--children", type=int, default=2, help="mutmut's --max-children.")
    args = parser.parse_args()
    names = args.targets or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    results = {
        name: run_target(name, *TARGETS[name], worktree=args.worktree, children=args.children)
        for name in names
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.write_text(json.dumps({**kept, **results}, indent=2) + "\n")
    for name, result in results.items():
        print(
            f"{name:10} {result['killed']}/{result['mutants']} killed "
            f"(score {result['score']}), {result['survived']} survived, {result['seconds']} s"
        )
    print(f"survivors, by name: {RESULTS}  (show one: cd a copy; mutmut show NAME)")


if __name__ == "__main__":
    main()
