"""Each life-cycle step is written once (read from the code, not run): the stop-then-start
(`runs.replace`), the capture and restore of what serves (`ops/serving.py`), the Ctrl-C driver
(`ops/driver.py`), the status-rounds loop (`rounds.status_rounds`) and tune's pure search."""

from __future__ import annotations

import ast
import threading
import time
from collections.abc import Iterator

from deployctl.ops.rounds import status_rounds
from tests.sources import parse_file
from tests.test_layers import PACKAGE

# Where the steps would be written again: the operations, the dashboard's collector and the
# CLI's commands.
SCANNED = ("ops", "dashboard", "cli")
# The front ends: they call a step, never write one of their own out of its parts.
FRONT_ENDS = ("cli/", "dashboard/")

# stop_live_runs: the CLI's own stop, which launch --replace once called before launching.
STOPS = {"stop_run", "stop_serving", "end_run", "stop_live_runs"}
STARTS = {"launch", "start_run"}


def sources() -> Iterator[tuple[str, ast.Module]]:
    for folder in SCANNED:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            name = path.relative_to(PACKAGE).as_posix()
            yield name, parse_file(path)


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef]:
    yield from (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))


def aliases(tree: ast.AST) -> dict[str, str]:
    """The names a module imports under another (`from m import launch as launch_runs`):
    alias → the imported name, so that the alias's calls count as the name's."""
    return {
        a.asname: a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
        if a.asname
    }


def called(node: ast.AST, renamed: dict[str, str] | None = None) -> Iterator[tuple[int, str]]:
    """(line, name) of each call in `node`: `f(...)` and `x.f(...)` are both `f`; a call of
    an alias in `renamed` is one of the name it stands for."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            func = n.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            yield n.lineno, (renamed or {}).get(name, name)


def mentioned(node: ast.AST) -> set[str]:
    """Every name `node` imports, reads or calls (`x.f` mentions `f`), aliases as the name."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.ImportFrom):
            found |= {a.name for a in n.names}
        elif isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Attribute):
            found.add(n.attr)
    return found


def stops_then_starts(tree: ast.AST) -> set[str]:
    """The functions that call a stop and, later in their text, a start."""
    found = set()
    renamed = aliases(tree)
    for function in functions(tree):
        calls = sorted(called(function, renamed))
        first_stop = min((line for line, name in calls if name in STOPS), default=None)
        if first_stop is not None and any(
            line > first_stop and name in STARTS for line, name in calls
        ):
            found.add(function.name)
    return found


def test_only_replace_stops_a_run_and_then_starts_one() -> None:
    found = {(module, f) for module, tree in sources() for f in stops_then_starts(tree)}
    assert found == {("ops/runs.py", "replace")}


def test_the_rule_sees_a_stop_then_start_written_again() -> None:
    again = ast.parse(
        "def put_back(host, conn, plans):\n"
        "    stop_run(host, conn, 30)\n"
        "    return launch(fleet, plans, catalog)\n"
    )
    assert stops_then_starts(again) == {"put_back"}


def front_end_steps(tree: ast.AST) -> set[str]:
    """The functions that use both a stop and a start: a stop-then-start of their own,
    whatever the order of their text or the names they call them by."""
    return {f.name for f in functions(tree) if mentioned(f) & STOPS and mentioned(f) & STARTS}


def test_a_front_end_never_stops_and_starts_by_itself() -> None:
    """`launch --replace` is `runs.replace`'s stop-then-start: no command stops runs and
    then launches (nor imports the two together)."""
    found = {
        (module, f)
        for module, tree in sources()
        if module.startswith(FRONT_ENDS)
        for f in front_end_steps(tree)
    }
    assert found == set()


def test_the_rules_see_the_cli_stop_then_launch_it_once_had() -> None:
    """launch --replace as it was: the CLI stopped the live runs, then launched."""
    once = ast.parse(
        "def launch(session, replace):\n"
        "    from deployctl.ops.runs import launch as launch_runs\n"
        "    from deployctl.ops.runs import stop_serving\n"
        "    with session.fleet() as fleet:\n"
        "        if replace:\n"
        "            fleet.run(lambda host, conn: stop_serving(fleet, host, conn, 30))\n"
        "        return launch_runs(fleet, plans, catalog)\n"
    )
    assert stops_then_starts(once) == {"launch"}
    assert front_end_steps(once) == {"launch"}


def test_what_serves_is_captured_and_pointed_back_at_in_one_module() -> None:
    """The relaunch plan of a recorded run is built by the capture (restart and watch
    relaunch what they just read crashed, through the same function, `relaunch_recorded`); only the
    capture module makes a run current again."""
    plans, points = set(), set()
    for module, tree in sources():
        for function in functions(tree):
            names = {name for _, name in called(function)}
            if "recorded_plan" in names:
                plans.add((module, function.name))
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr == "POINT":
                points.add(module)
    assert plans == {
        ("ops/serving.py", "capture"),
        ("ops/restart.py", "relaunch_recorded"),
    }
    assert points == {"ops/serving.py"}


def test_only_the_driver_waits_for_ctrl_c_among_rollout_and_tune() -> None:
    for module, tree in sources():
        if module.startswith(("ops/rollout", "ops/tune")):
            handled = [
                n
                for n in ast.walk(tree)
                if isinstance(n, ast.ExceptHandler)
                and isinstance(n.type, ast.Name)
                and n.type.id == "KeyboardInterrupt"
            ]
            assert not handled, module
        if module in ("ops/rollout.py", "ops/tune/tuner.py"):
            assert "drive" in {name for _, name in called(tree)}, module


def round_loops(tree: ast.AST) -> set[str]:
    """Functions with a loop that polls the fleet, or that waits out an `interval`."""
    found = set()
    for function in functions(tree):
        for loop in (n for n in ast.walk(function) if isinstance(n, ast.While | ast.For)):
            names = {name for _, name in called(loop)}
            mentions = {
                n.id if isinstance(n, ast.Name) else n.attr
                for n in ast.walk(loop)
                if isinstance(n, ast.Name | ast.Attribute)
            }
            if "poll" in names and "fleet" in mentions:
                found.add(function.name)
            if names & {"sleep", "wait"} and "interval" in mentions:
                found.add(function.name)
    return found


def test_status_rounds_are_looped_once() -> None:
    found = {(module, f) for module, tree in sources() for f in round_loops(tree)}
    assert found == {("ops/rounds.py", "status_rounds")}


def test_the_rule_sees_a_rounds_loop_written_again() -> None:
    again = ast.parse(
        "def loop(self):\n"
        "    while not self.stop.is_set():\n"
        "        self.fleet.poll(step)\n"
        "        self.stop.wait(self.interval)\n"
    )
    assert round_loops(again) == {"loop"}


def test_tunes_search_does_no_io() -> None:
    """The search decides from numbers: no connection, agent, fleet, clock or thread."""
    path = PACKAGE / "ops" / "tune" / "search.py"
    tree = parse_file(path)
    imported = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module:
            imported |= {f"{n.module}.{a.name}" for a in n.names}
        elif isinstance(n, ast.Import):
            imported |= {a.name for a in n.names}
    ours = {name for name in imported if name.startswith("deployctl")}
    types = {
        f"deployctl.remote.measures.{t}" for t in ("BenchLevel", "ObjectiveShown", "LevelFigures")
    }
    numbers = {f"deployctl.ops.bench.{f}" for f in ("per_token_ms", "spread_of", "round_figures")}
    assert ours <= numbers | types
    assert not {"time", "threading", "subprocess", "socket"} & {
        name.split(".")[0] for name in imported
    }


def test_status_rounds_pace_count_and_stop() -> None:
    now = [100.0]

    def step() -> str:  # a round that takes 1.5 s of its clock
        now[0] += 1.5
        return "r"

    waits: list[float] = []
    rounds = status_rounds(step, 5.0, 3, waits.append, clock=lambda: now[0])
    assert list(rounds) == ["r", "r", "r"]
    assert waits == [3.5, 3.5]  # less the round's time
    waits.clear()
    list(status_rounds(step, 5.0, 2, waits.append, pace=False, clock=lambda: now[0]))
    assert waits == [5.0]  # watch: a full interval after each round
    waits.clear()
    list(status_rounds(lambda: step() + step() + step() + step(), 5.0, 2, waits.append,
                       clock=lambda: now[0]))  # fmt: skip
    assert waits == [0.0]  # a round longer than the interval: the next one at once
    stop = threading.Event()
    seen = []
    started = time.monotonic()
    for result in status_rounds(lambda: len(seen), 60.0, stop=stop):
        seen.append(result)
        threading.Timer(0.2, stop.set).start()  # in the middle of the 60 s wait
    assert seen == [0]  # the wait returned at once, and no round followed
    took = time.monotonic() - started
    assert took < 10, f"took {took:.2f}s, bound 10s (the wait was 60 s)"
