"""The shipped schemas are generated from one source, tools/contract.py: the
files match it, each shape has one name and one declaration, and the shared shapes still
reject what they rejected when each file had its own copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.json_contract import SCHEMAS
from tools import contract


def shipped_defs() -> dict[str, dict[str, str]]:
    """Definition name → file → its declaration (as sorted JSON)."""
    found: dict[str, dict[str, str]] = {}
    for path in sorted(SCHEMAS.glob("*.json")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        for name, shape in schema.get("$defs", {}).items():
            found.setdefault(name, {})[path.stem] = json.dumps(shape, sort_keys=True)
    return found


def test_the_shipped_files_are_what_the_source_generates(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert contract.SCHEMAS == SCHEMAS
    if contract.main(["--check"]) != 0:
        pytest.fail(capsys.readouterr().err)


def test_a_hand_edit_fails_the_check_with_the_diff_and_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, copy)
    monkeypatch.setattr(contract, "SCHEMAS", copy)
    assert contract.main(["--check"]) == 0
    stop = copy / "stop.json"
    stop.write_text(stop.read_text(encoding="utf-8").replace('"gpus_clean",', '"gpus_ok",', 1))
    (copy / "gone.json").write_text("{}\n")
    assert contract.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert '-          "gpus_ok",\n+          "gpus_clean",' in err
    assert "stop.json (shipped)" in err and "gone.json: no command declares it" in err
    assert f"run {contract.REGENERATE}" in err
    # --write puts it back, and removes the left-over file.
    assert contract.main(["--write"]) == 0
    assert contract.main(["--check"]) == 0 and not (copy / "gone.json").exists()


def test_each_shape_has_one_name_and_each_name_one_shape() -> None:
    by_shape: dict[str, set[str]] = {}
    for name, copies in shipped_defs().items():
        assert len(set(copies.values())) == 1, f"{name} names different shapes: {sorted(copies)}"
        by_shape.setdefault(next(iter(copies.values())), set()).add(name)
    assert [sorted(names) for names in by_shape.values() if len(names) > 1] == []


def test_the_shared_shapes_are_declared_once_and_shipped_where_used() -> None:
    defs = shipped_defs()
    for name, at_least in (("failure", 21), ("schemaVersion", 21), ("crashReport", 6),
                           ("registration", 4), ("job", 6)):  # fmt: skip
        assert name in contract.DEFINITIONS and len(defs[name]) >= at_least, name


# ---- the shared shapes are not looser than the copies they replace ---------------------------

JOB = {"id": "42", "state": "RUNNING", "reason": "", "nodes": ["n1", "n2"], "head": "10.0.0.1",
       "time_left_s": 3600.0, "exit_code": ""}  # fmt: skip
CRASH = {"exception": "RuntimeError", "message": "boom", "file": None, "line": None,
         "function": None, "ranks": ["TP0"], "signature": "x", "title": "X", "hint": "h",
         "log_line": 3}  # fmt: skip
REGISTRATION = {"worker": "alpha/w1", "router": "r", "url": "http://a:1", "action": "add",
                "ok": True, "error": ""}  # fmt: skip
FAILURE = {"ok": False, "error": "no such inventory", "code": "inventory", "hint": None}
# (shape, a valid instance, the file it is checked in)
SHARED: list[tuple[str, Any, str]] = [
    ("failure", FAILURE, "stop"),
    ("schemaVersion", 1, "stop"),
    ("crashReport", CRASH, "logs"),
    ("registration", REGISTRATION, "stop"),
    ("job", JOB, "status"),
]


def shape_check(command: str, name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{command}.json").read_text(encoding="utf-8"))
    return Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": schema["$defs"]})


def broken(good: Any) -> list[tuple[str, Any]]:
    """Each required key left out, and a value of the wrong type or outside its enum."""
    if not isinstance(good, dict):
        return [("zero", 0), ("text", "1")]
    cases = [(f"no {key}", {k: v for k, v in good.items() if k != key}) for key in good]
    return [*cases, ("wrong type", {**good, next(iter(good)): [1]})]


@pytest.mark.parametrize(("name", "good", "command"), SHARED, ids=[s[0] for s in SHARED])
def test_a_shared_shape_rejects_a_missing_key_or_a_wrong_value(
    name: str, good: Any, command: str
) -> None:
    check = shape_check(command, name)
    assert not list(check.iter_errors(good))
    for what, bad in broken(good):
        assert list(check.iter_errors(bad)), f"{name}: {what} passed"


@pytest.mark.parametrize(
    ("name", "good", "command", "key", "wrong"),
    [
        ("registration", REGISTRATION, "stop", "action", "replace"),
        ("failure", FAILURE, "stop", "ok", True),
        ("job", JOB, "status", "nodes", "n1"),
    ],
)
def test_a_shared_shape_rejects_a_value_outside_its_enum_or_const(
    name: str, good: Any, command: str, key: str, wrong: Any
) -> None:
    assert list(shape_check(command, name).iter_errors({**good, key: wrong}))


def test_the_job_shape_takes_no_key_of_its_own() -> None:
    assert list(shape_check("status", "job").iter_errors({**JOB, "partition": "gpu"}))


@pytest.mark.parametrize(
    "code", ["Inventory", "no such", "", "1connect"], ids=["upper", "space", "empty", "digit"]
)
def test_an_outcome_code_keeps_its_pattern(code: str) -> None:
    entry = {"ok": False, "error": "down", "code": code}
    assert list(shape_check("stop", "stopOutcome").iter_errors(entry))
    assert not list(shape_check("stop", "stopOutcome").iter_errors({**entry, "code": "connect"}))


def test_the_tune_record_schema_takes_its_keys_from_the_protocol() -> None:
    # The record is kept on the host and declared once, as TypedDicts (remote/measures.py):
    # the schema's keys and required keys are the declaration's, and a key declared without
    # a schema (or the other way round) stops the generator.
    from deployctl.remote.measures import PhaseRecord, TuneRecord

    for name, typed in (("record", TuneRecord), ("phase", PhaseRecord)):
        shape = contract.DEFINITIONS[name]
        assert set(shape["properties"]) == typed.__required_keys__ | typed.__optional_keys__
        assert set(shape["required"]) == typed.__required_keys__, name
    properties = dict(contract.DEFINITIONS["record"]["properties"])
    del properties["narrowed"]
    with pytest.raises(TypeError, match="'narrowed'"):
        contract.declared(TuneRecord, properties)
