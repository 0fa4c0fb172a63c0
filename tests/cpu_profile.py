"""Where the suite's CPU goes, per test: `pytest -p tests.cpu_profile --cpu-profile DIR ...`.

A test's CPU is its process's, that of every child it waited for, and that of the CLI runs
and Ansible tool runs the fork servers made for it (tests/cli_server.py, tests/ansible_tools.py:
the servers' children, so in no rusage of the test's process), from its setup to its
teardown. Each process (an xdist worker, or the only one) writes DIR/<worker>.json; the
process that ran the session (the controller, with xdist) merges them into DIR/cpu.json: every
test, each file's sum, and the total of the tests against the whole session's (the
difference: collection, imports, session fixtures).
"""

from __future__ import annotations

import json
import resource
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import ansible_tools, cli_server

_rows: dict[str, tuple[float, float, float]] = {}  # nodeid: CPU s, wall s, start (epoch s)
_started = 0.0


def cpu_now(children: bool = True) -> float:
    """CPU seconds of this process, its waited-for children and the CLI and Ansible runs
    forked for it."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime + cli_server.cpu_seconds + ansible_tools.cpu_seconds
    if children:
        waited = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += waited.ru_utime + waited.ru_stime
    return total


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-profile", metavar="DIR", help="write per-test CPU seconds to DIR")


def pytest_configure(config: pytest.Config) -> None:
    global _started
    _started = cpu_now()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, wall, start = cpu_now(), time.perf_counter(), time.time()
    yield
    _rows[item.nodeid] = (cpu_now() - cpu, time.perf_counter() - wall, start)


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = session.config.getoption("--cpu-profile")
    if not folder:
        return
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
    # xdist's controller: its children are the workers, whose own parts count them.
    controller = worker == "main" and bool(getattr(session.config.option, "numprocesses", 0))
    mine = {"session_cpu_s": cpu_now(children=not controller) - _started, "tests": _rows}
    (out / f"{worker}.json").write_text(json.dumps(mine))
    if worker == "main":  # the controller (or the only process): merge every process's part
        merge(out)


def merge(out: Path) -> None:
    parts = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "cpu.json"]
    tests = {nodeid: row for part in parts for nodeid, row in part["tests"].items()}
    by_file: Counter[str] = Counter()
    for nodeid, (cpu, *_) in tests.items():
        by_file[nodeid.split("::")[0]] += cpu
    merged = {
        "session_cpu_s": sum(p["session_cpu_s"] for p in parts),
        "tests_cpu_s": sum(cpu for cpu, *_ in tests.values()),
        "by_file": dict(by_file.most_common()),
        "tests": tests,
    }
    (out / "cpu.json").write_text(json.dumps(merged, indent=1))
