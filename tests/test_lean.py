"""The agent's JSON, SHA-256 and signals without `json`, `hashlib` and `signal` (remote/lean.py):
the same answers as those modules, and those modules where the fast path is missing."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from deployctl.remote import lean

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [
    {},
    [],
    "",
    0,
    -1,
    2**70,
    1.5,
    -0.0,
    1e300,
    None,
    True,
    {"run": {"id": "eagle3_v12", "gpus": [0, 1], "port": 30000, "env": {"A": "b"}}},
    {"text": 'quote " backslash \\ tab \t newline \n nul \x00 del \x7f'},
    {"é": "日本語 🚀", "surrogate": "\udcff"},  # a log's undecodable byte, surrogate-escaped
    {"nested": [[[[{"a": [None, False, 0.1]}]]]]},
    {"1": 1, "": ""},
]


@pytest.mark.parametrize("document", DOCUMENTS, ids=range(len(DOCUMENTS)))
def test_json_is_written_and_read_as_the_json_module_does(document: object) -> None:
    text = lean.dumps(document)
    assert text == json.dumps(document)
    assert lean.loads(text) == json.loads(text) == document
    assert lean.loads(" \n\t" + json.dumps(document, indent=2) + "\r\n ") == document
    assert lean.dumps_indented(document) == json.dumps(document, indent=2)


def test_non_finite_numbers_and_keys_as_json_writes_them() -> None:
    keyed = {1: math.inf, None: -math.inf, False: [], 2.5: {}, "s": {"t": [{}, []]}}
    assert lean.dumps(keyed) == json.dumps(keyed)
    assert lean.dumps_indented(keyed) == json.dumps(keyed, indent=2)
    with pytest.raises(TypeError):
        lean.dumps_indented({(1, 2): "a tuple is no key"})
    assert math.isnan(lean.loads("NaN"))
    assert lean.loads("[Infinity, -Infinity]") == [math.inf, -math.inf]


@pytest.mark.parametrize(
    "text", ["", "  ", "{", "[1,]", '{"a" 1}', "1 2", "nul", '"open', "{} x", "\u00a0 1"]
)
def test_what_json_refuses_is_refused_as_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        lean.loads(text)


def test_what_json_cannot_write_is_refused_as_json_refuses_it() -> None:
    for value in ({"a": {1, 2}}, {"b": b"bytes"}, object()):
        with pytest.raises(TypeError, match="is not JSON serializable"):
            lean.dumps(value)
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference"):
        lean.dumps(looped)


def test_sha256_is_hashlibs() -> None:
    for data in (b"", b"abc", bytes(range(256)) * 1000):
        assert lean.sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_a_python_without_the_c_json_gets_the_json_module() -> None:
    # A Python built without `_json` (or whose `_json` answers otherwise) still answers.
    script = (
        "import sys; sys.modules['_json'] = None; sys.modules['_sha256'] = None\n"
        "sys.modules['_sha2'] = None\n"
        "import json, hashlib; from deployctl.remote import lean\n"
        "assert lean.loads is json.loads and lean.dumps is json.dumps\n"
        "assert lean.loads(lean.dumps({'a': [1]})) == {'a': [1]}\n"
        "assert lean.sha256_hex(b'abc') == hashlib.sha256(b'abc').hexdigest()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_fast_path_imports_neither_json_nor_hashlib() -> None:
    script = (
        "import sys; from deployctl.remote import lean\n"
        "lean.loads(lean.dumps({'a': [1.5, None]})); lean.sha256_hex(b'x')\n"
        "print(sorted(m for m in ('json', 're', 'enum', 'hashlib', 'signal') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("text", ["{cut short", "[1, 2", '{"a": }', "tru", '"\\x"'])
def test_a_malformed_text_is_a_value_error_where_json_was_never_imported(text: str) -> None:
    # The C scanner raises json's error only once json.decoder is imported: on a host's
    # fresh Python it would be a SystemError (a lock file cut short was one).
    script = (
        "import sys; from deployctl.remote import lean\n"
        "try:\n    lean.loads(sys.argv[1])\nexcept ValueError as exc:\n"
        "    print('refused:', isinstance(exc, ValueError))\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", script, text], capture_output=True, text=True, cwd=ROOT
    )
    assert (done.returncode, done.stdout.strip()) == (0, "refused: True"), done.stderr
