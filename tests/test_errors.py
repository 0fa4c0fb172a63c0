"""Every `--json` error code is declared in errors.py and explained in the docs' table
(docs/reference/output.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import deployctl
from deployctl import errors
from tests.sources import parse_file

CODES_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "output.md"
PACKAGE = Path(deployctl.__file__).parent
DATA = PACKAGE / "data"
TABLE_HEAD = "| code | the host failed because |"


def documented_codes() -> list[str]:
    """The codes in the docs' table, in its order."""
    lines = CODES_PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(TABLE_HEAD) + 2  # past the head and its |---| line
    codes = []
    for line in lines[start:]:
        match = re.match(r"\| `([a-z_]+)` \| \S", line)
        if not match:
            break
        codes.append(match.group(1))
    return codes


def test_the_docs_explain_every_code_and_no_other() -> None:
    listed = documented_codes()
    assert len(listed) == len(set(listed)), "a code is listed twice"
    assert sorted(listed) == sorted(errors.error_codes())


def test_the_code_list_holds_the_json_contract() -> None:
    codes = errors.error_codes()
    assert len(codes) == len(set(codes))
    # Codes that scripts read today; renaming one breaks them.
    for code in ("connect", "host_key", "timeout", "agent", "patch", "preflight", "internal"):
        assert code in codes
    assert errors.error_code(errors.HostKeyError("x")) == "host_key"
    assert errors.error_code(KeyError("x")) == errors.INTERNAL


def error_types_elsewhere() -> dict[str, object]:
    """Every class outside errors.py that derives, through any chain of bases, from an error
    type: "module.Class" → the `code` it sets (None when it sets none).

    Read from the source with `ast`, not imported, so modules of an extra that is not
    installed (the dashboard's starlette) are read too.
    """
    known = {kind.__name__ for kind in all_error_types()}
    classes: list[tuple[str, ast.ClassDef]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if DATA in path.parents or path == Path(errors.__file__):
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        tree = parse_file(path)
        classes += [(module, n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    found: dict[str, object] = {}
    grew = True
    while grew:  # a subclass of a subclass found here is found in the next round
        grew = False
        for module, node in classes:
            name = f"{module}.{node.name}"
            if name not in found and known.intersection(map(base_name, node.bases)):
                found[name] = class_code(node)
                known.add(node.name)
                grew = True
    return found


def all_error_types() -> list[type[errors.DeployctlError]]:
    found: list[type[errors.DeployctlError]] = [errors.DeployctlError]
    for kind in found:
        found += kind.__subclasses__()
    return found


def base_name(base: ast.expr) -> str:
    """`ConnectError` for both `ConnectError` and `errors.ConnectError`."""
    if isinstance(base, ast.Attribute):
        return base.attr
    return base.id if isinstance(base, ast.Name) else ""


def class_code(node: ast.ClassDef) -> object:
    for statement in node.body:
        if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if any(isinstance(t, ast.Name) and t.id == "code" for t in targets):
                try:
                    return ast.literal_eval(statement.value)
                except ValueError:  # not a literal: name it, so the check below fails on it
                    return ast.unparse(statement.value)
    return None


@pytest.mark.heavy
def test_no_error_type_outside_errors_py_brings_a_code_of_its_own() -> None:
    elsewhere = error_types_elsewhere()
    assert "deployctl.connection._DroppedError" in elsewhere  # the reading finds what is there
    codes = {kind.code for kind in all_error_types()}
    codes |= {code for code in elsewhere.values() if code is not None}
    assert codes <= set(errors.error_codes()), (
        f"codes errors.py lacks: {codes - set(errors.error_codes())}"
    )
    public_elsewhere = [name for name in elsewhere if not name.rsplit(".", 1)[1].startswith("_")]
    assert public_elsewhere == []
