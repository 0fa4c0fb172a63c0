"""Each choice is declared once (`deployctl/choices.py`), and each presentation helper too:
read with `ast`, so a copy fails here before it drifts from the original."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from deployctl.choices import BenchTool, Keep, ThresholdMode
from tests.sources import parse_file

PACKAGE = Path(__file__).resolve().parent.parent / "deployctl"


def sources() -> list[tuple[Path, ast.Module]]:
    return [(p, parse_file(p)) for p in sorted(PACKAGE.rglob("*.py"))]


def strings(node: ast.expr) -> frozenset[str] | None:
    """The values of a literal tuple, list or set of two or more strings, else None."""
    if not isinstance(node, ast.Tuple | ast.List | ast.Set) or len(node.elts) < 2:
        return None
    values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
    if len(values) != len(node.elts) or not all(isinstance(v, str) for v in values):
        return None
    return frozenset(values)


def enum_values(node: ast.ClassDef) -> frozenset[str]:
    return frozenset(
        stmt.value.value
        for stmt in node.body
        if isinstance(stmt, ast.Assign)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


# Left for issue 40 item 6, which types the tune record (its phases) in the host protocol:
# `plot` draws records and cannot import `ops.tune` (it loads the whole client).
KNOWN_COPIES = {"plot.py:TUNE_PHASES"}


@pytest.mark.heavy
def test_each_choice_is_one_enum_and_no_constant_spells_it_again() -> None:
    enums: dict[frozenset[str], list[str]] = defaultdict(list)
    constants: list[tuple[str, frozenset[str]]] = []
    for path, tree in sources():
        where = path.relative_to(PACKAGE).as_posix()
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id.endswith("Enum") for b in node.bases
            ):
                values = enum_values(node)
                if len(values) > 1:
                    enums[values].append(f"{where}:{node.name}")
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                found = strings(node.value)
                if found is not None:
                    constants.append((f"{where}:{ast.unparse(target)}", found))
    assert enums, "no enum found"
    copies = {tuple(names) for names in enums.values() if len(names) > 1}
    assert not copies, f"one choice declared as several enums: {copies}"
    spelled = [
        (name, enums[values])
        for name, values in constants
        if values in enums and name not in KNOWN_COPIES
    ]
    assert not spelled, f"a constant spells an enum's values again: {spelled}"


def test_the_cli_offers_the_declared_choices() -> None:
    import typer.main

    from deployctl.cli import app

    root: Any = typer.main.get_command(app)

    def choices(command: str, flag: str) -> list[str]:
        [param] = [p for p in root.commands[command].params if flag in p.opts]
        return list(param.type.choices)

    assert choices("tune", "--keep") == [str(c) for c in Keep]
    assert choices("tune", "--threshold-mode") == [str(c) for c in ThresholdMode]
    assert choices("bench", "--tool") == [str(c) for c in BenchTool]


@pytest.mark.heavy
def test_presentation_defines_each_helper_once() -> None:
    # Two helpers of one name in present/ (two `duration_text`) write one thing two ways.
    defined: dict[str, list[str]] = defaultdict(list)
    for path, tree in sources():
        if path.parent.name == "present":
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                    defined[node.name].append(path.name)
    assert defined, "no presentation module found"
    twice = {name: where for name, where in defined.items() if len(where) > 1}
    assert not twice, twice
