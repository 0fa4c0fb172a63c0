"""Every `--json` error code is declared in errors.py and explained in the README."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import deployctl
from deployctl import errors

README = Path(__file__).resolve().parents[1] / "README.md"
TABLE_HEAD = "| code | the host failed because |"


def readme_codes() -> list[str]:
    """The codes in the README's table, in its order."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index(TABLE_HEAD) + 2  # past the head and its |---| line
    codes = []
    for line in lines[start:]:
        match = re.match(r"\| `([a-z_]+)` \| \S", line)
        if not match:
            break
        codes.append(match.group(1))
    return codes


def test_the_readme_explains_every_code_and_no_other() -> None:
    listed = readme_codes()
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


def test_no_error_type_outside_errors_py_brings_a_code_of_its_own() -> None:
    for module in pkgutil.walk_packages(deployctl.__path__, "deployctl."):
        if not module.name.endswith("__main__"):  # importing it runs the CLI
            importlib.import_module(module.name)
    found: list[type[errors.DeployctlError]] = [errors.DeployctlError]
    for kind in found:
        found += kind.__subclasses__()
    assert {kind.code for kind in found} <= set(errors.error_codes())
    public_elsewhere = [
        f"{kind.__module__}.{kind.__name__}"
        for kind in found
        if kind.__module__ != errors.__name__ and not kind.__name__.startswith("_")
    ]
    assert public_elsewhere == []
