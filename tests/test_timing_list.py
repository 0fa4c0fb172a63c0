"""scripts/timing-series runs the tests listed in scripts/timing-tests.txt: one id that names
no test makes pytest run none of them (a whole series of empty runs)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.heavy
def test_every_listed_timing_test_exists() -> None:
    lines = (ROOT / "scripts" / "timing-tests.txt").read_text(encoding="utf-8").splitlines()
    ids = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert ids
    defined: dict[str, set[str]] = {}  # each file's functions, the file parsed once
    missing = []
    for node in ids:
        path, _, name = node.partition("::")
        if path not in defined:
            file = ROOT / path
            tree = ast.parse(file.read_text(encoding="utf-8")) if file.is_file() else None
            found = ast.walk(tree) if tree is not None else iter(())
            defined[path] = {n.name for n in found if isinstance(n, ast.FunctionDef)}
        if name.split("[")[0] not in defined[path]:
            missing.append(node)
    assert not missing, f"scripts/timing-tests.txt names no such test: {missing}"
