"""The launcher seam: outside the launcher modules, no code asks which launcher a run uses.

Read with `ast`, as test_layers reads imports: each question is a branch on something only
one launcher has (a run's Slurm `job`, `settings.slurm`, `is_job`) or on the launcher's
kind. The launchers answer verbs instead (deployctl/launchers/, remote/launchers.py)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import cast

import pytest

from deployctl import launchers
from deployctl.errors import DeployctlError
from deployctl.remote import launchers as host_launchers
from deployctl.remote.files import CallFailed
from deployctl.remote.protocol import RunRecord
from tests.sources import parse_file

PACKAGE = Path(__file__).resolve().parent.parent / "deployctl"

# The launcher modules, client side (every module of deployctl/launchers/) and host side:
# the only places that know each launcher.
LAUNCHER_MODULES = {
    *(p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "launchers").rglob("*.py")),
    "remote/launchers.py",
    "remote/placements.py",
    "remote/processes.py",
    "remote/slurm_jobs.py",
}
# What is left, each question (`module: code`) with why; a third launcher reads these too.
ALLOWED: dict[str, str] = {
    # A start names its launcher to the host, which starts it with that one: passed, not asked.
    "ops/runs.py: plan.launcher.kind": "the start's launcher, told to the host",
}

# Attributes only one launcher has.
ONE_LAUNCHER_ATTRIBUTES = {"is_job", "slurm"}
LAUNCHER_KINDS = {"LaunchKind"}
LAUNCHER_CLASSES = {"ProcessLauncher", "SlurmJobLauncher", "JobWatch", "ProcessWatch"}


def is_job_value(node: ast.AST) -> bool:
    """`x.job`, `x["job"]`, `x.get("job")`: a run's Slurm job."""
    if isinstance(node, ast.Attribute):
        return node.attr == "job"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "job"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        first = node.args[0] if node.args else None
        return node.func.attr == "get" and isinstance(first, ast.Constant) and first.value == "job"
    return False


def names_one_launcher(node: ast.AST) -> bool:
    """`plan.is_job`, `settings.slurm`, a launcher's class (an isinstance test)."""
    if isinstance(node, ast.Attribute):
        return node.attr in ONE_LAUNCHER_ATTRIBUTES
    return isinstance(node, ast.Name) and node.id in LAUNCHER_CLASSES


def is_launch_kind(node: ast.AST) -> bool:
    """`LaunchKind.X`: asks something only in a comparison (a default names one, asking none)."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in LAUNCHER_KINDS
    )


def is_kind_of_launcher(node: ast.AST) -> bool:
    """`<…launcher…>.kind`, `settings.launcher`: which launcher it is."""
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr == "kind" and "launcher" in ast.unparse(node.value):
        return True
    return node.attr == "launcher" and "settings" in ast.unparse(node.value)


def questions(tree: ast.AST) -> list[tuple[int, str]]:
    """Each place that asks which launcher a run uses: (line, the code)."""
    found: list[ast.AST] = []
    tests: list[ast.AST] = []
    for node in ast.walk(tree):
        if names_one_launcher(node) or is_kind_of_launcher(node):
            found.append(node)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            membership = any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            asks_key = isinstance(node.left, ast.Constant) and node.left.value == "job"
            asks_kind = any(is_job_value(o) or is_launch_kind(o) for o in operands)
            if (membership and asks_key) or asks_kind:
                found.append(node)
        elif isinstance(node, ast.If | ast.IfExp | ast.While | ast.Assert):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests += node.ifs
        elif isinstance(node, ast.BoolOp):
            tests += node.values
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            tests.append(node.operand)
    found += [t for t in tests if is_job_value(t)]
    seen = {(getattr(n, "lineno", 0), ast.unparse(n)) for n in found}
    return sorted(seen)


def launcher_questions() -> dict[str, list[tuple[int, str]]]:
    asked = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in LAUNCHER_MODULES:
            continue
        found = questions(parse_file(path))
        found = [(line, code) for line, code in found if f"{name}: {code}" not in ALLOWED]
        if found:
            asked[name] = found
    return asked


@pytest.mark.heavy
def test_no_code_outside_the_launchers_asks_which_launcher_a_run_uses() -> None:
    asked = launcher_questions()
    lines = [f"{name}:{line}: {code}" for name, found in asked.items() for line, code in found]
    assert not lines, "ask the launcher (deployctl/launchers/) instead:\n" + "\n".join(lines)


def test_the_count_sees_each_kind_of_question() -> None:
    # A branch of each kind, as the code had them before the seam: each one is counted.
    branches = [
        "if plan.is_job: pass",
        "x = 1 if host.settings.slurm else 2",
        'if "job" in run: pass',
        'if doc["job"] is not None: pass',
        "ok = [r for r in rs if r.value.job]",
        'job = run.get("job") or None',
        "if plan.launcher.kind is LaunchKind.SLURM_JOB: pass",
        "slurm = kind == LaunchKind.SLURM_JOB",
        'if host.settings.launcher == "slurm": pass',
        "if isinstance(launcher, SlurmJobLauncher): pass",
    ]
    for code in branches:
        assert questions(ast.parse(code)), code
    # Reading the launcher's verbs, or passing a job along, asks nothing.
    calm = [
        "pinned = plan.launcher.host_gpus(host)",
        'head = job_head(reply["job"])',
        "default = LaunchKind.PROCESS",
    ]
    for code in calm:
        assert not questions(ast.parse(code)), code


def test_the_launcher_modules_exist_and_each_allowed_question_is_still_asked() -> None:
    for name in LAUNCHER_MODULES:
        assert (PACKAGE / name).is_file(), name
    for allowed in ALLOWED:  # one that went away leaves the list
        name, _, code = allowed.partition(": ")
        asked = questions(parse_file(PACKAGE / name))
        assert code in {c for _, c in asked}, allowed


# Which launcher started a run, read from its record alike on both sides of the wire.
OLD_JOB = {"id": "r1", "job": {"id": "42"}}  # a Slurm job's record from before `launcher`


@pytest.mark.parametrize(
    ("record", "kind"),
    [
        ({"id": "r1", "launcher": "slurm", "job": {"id": "42"}}, "slurm"),
        (OLD_JOB, "slurm"),
        ({"id": "r1", "launcher": "ssh"}, "ssh"),
        ({"id": "r1", "pid": 7}, "ssh"),  # a process group's record from before `launcher`
    ],
    ids=["slurm", "older slurm", "process", "older process"],
)
def test_both_sides_route_a_record_to_the_launcher_that_started_it(
    record: dict[str, object], kind: str
) -> None:
    assert launchers.launcher_of(record).kind == kind
    assert host_launchers.launcher_of(cast(RunRecord, record)).kind == kind


def test_a_record_of_a_launcher_this_side_lacks_is_refused_not_taken_for_a_process() -> None:
    record = {"id": "r1", "launcher": "unit", "job": {"id": "unit-1"}}
    with pytest.raises(DeployctlError, match=r"started by launcher 'unit'") as error:
        launchers.launcher_of(record)
    assert error.value.hint and "ssh" in error.value.hint
    with pytest.raises(CallFailed, match=r"no launcher 'unit'"):
        host_launchers.launcher_of(cast(RunRecord, record))
