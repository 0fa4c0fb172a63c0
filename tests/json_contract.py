"""The --json contract: check what deployctl printed against its command's shipped schema.

`check_output` is what the CLI runner calls after every run with `--json`; it fails the test
with the path in the document and the validator's message.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import IO, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

SCHEMAS = Path(__file__).resolve().parent.parent / "deployctl" / "data" / "schemas"
# Output that is JSON without --json: Prometheus's file_sd list (unless written with -o).
ALWAYS_JSON = {"metrics-targets"}
# A flag (or flags, all given) that changes the document → the variant in the schema's $defs
# it must match; the first that matches is taken.
VARIANTS: dict[str, dict[str, str]] = {
    "hosts": {"--graph": "graph", "": "inventory"},
    "render": {"--check": "checked", "": "rendered"},
    "crash": {"--file": "local", "": "fleet"},
    "bench": {"--compare": "comparison", "--suggest-threshold": "suggestion", "": "sweep"},
    "tune": {
        "--live --report": "liveReported",
        "--report": "reported",
        "--dry-run": "planned",
        "--live": "tuneLive",
        "": "tuned",
    },
}
# Commands that print one document per line (JSON lines), each checked on its own.
JSON_LINES: dict[str, Callable[[Sequence[str]], bool]] = {
    "top": lambda args: "--once" not in args,
    "watch": lambda args: True,
    # `logs --crash` without --follow prints one crash-scan document.
    "logs": lambda args: "--crash" not in args or bool({"-f", "--follow"} & set(args)),
}


def command_name(args: Sequence[str]) -> str:
    """The command as its schema file is named: `status`, `patch-list`, …"""
    grouped = args[0] in ("patch", "router") and len(args) > 1
    return f"{args[0]}-{args[1]}" if grouped else args[0]


def checked(args: Sequence[str]) -> bool:
    """Whether the run's stdout is a JSON contract to check."""
    return "--json" in args or (bool(args) and command_name(args) in ALWAYS_JSON)


@cache
def schema_of(command: str) -> dict[str, Any]:
    """The command's shipped schema."""
    path = SCHEMAS / f"{command}.json"
    assert path.exists(), f"no schema for deployctl {command}: {path}"
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


def validator(args: Sequence[str]) -> Draft202012Validator:
    """A validator for the command's document, narrowed to the variant its flags ask for."""
    command = command_name(args)
    schema = schema_of(command)
    variants = VARIANTS.get(command)
    if variants is not None:
        flag = next((f for f in variants if f and all(w in args for w in f.split())), "")
        chosen = {"$ref": f"#/$defs/{variants[flag]}"}
        schema = {**schema, "anyOf": [chosen, {"$ref": "#/$defs/failure"}]}
    return Draft202012Validator(schema)


def problem(document: Any, check: Draft202012Validator) -> str | None:
    """The most relevant validation error, as `at $.path: message`; None when valid."""
    error = best_match(check.iter_errors(document))
    if error is None:
        return None
    # Under anyOf/oneOf the deepest error says what is wrong.
    while error.context:
        error = best_match(error.context)
    path = "$" + "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in error.path)
    return f"at {path}: {error.message}"


def check_document(args: Sequence[str], document: Any) -> None:
    """Fail unless the document matches its command's schema."""
    found = problem(document, validator(args))
    schema = f"data/schemas/{command_name(args)}.json"
    assert found is None, f"deployctl {' '.join(args)}: the document breaks {schema} {found}"


def outcomes(document: Any) -> Iterator[dict[str, Any]]:
    """Every `{"ok", "error", "code"}` entry in a document: the whole, a host, a deployment."""
    if isinstance(document, dict):
        if {"ok", "error", "code"} <= document.keys():
            yield document
        for value in document.values():
            yield from outcomes(value)
    elif isinstance(document, list):
        for value in document:
            yield from outcomes(value)


def check_agreement(args: Sequence[str], returncode: int, document: Any) -> None:
    """Fail unless `ok`, `error` and `code` agree with each other and with the exit status:
    a failed entry says why and with which code, an ok one carries neither, and a run that
    exited 0 has no failed entry (exit 1 may also mean dirty GPUs or a missing patch)."""
    command = f"deployctl {' '.join(args)}"
    for entry in outcomes(document):
        if entry["ok"]:
            assert entry["error"] is None and entry["code"] is None, f"{command}: ok with {entry}"
        else:
            assert entry["error"] and entry["code"], f"{command}: failed without why: {entry}"
            assert returncode != 0, f"{command}: exit 0 with a failed entry: {entry}"
    if isinstance(document, dict) and "ok" in document and "error" in document:
        assert document["ok"] == (returncode == 0), (
            f"{command}: ok={document['ok']}, exit {returncode}"
        )


def check_line(args: Sequence[str], line: str) -> None:
    """Check one line of a JSON-lines command's output."""
    if line.strip():
        check_document(args, json.loads(line))


def check_output(args: Sequence[str], returncode: int, stdout: str) -> None:
    """Check a finished run's stdout: one document, or (JSON lines) one per line."""
    if returncode not in (0, 1) or not stdout.strip() or not checked(args):
        return
    if is_json_lines(args):
        for line in stdout.splitlines():
            check_line(args, line)
    else:
        document = json.loads(stdout)
        check_document(args, document)
        check_agreement(args, returncode, document)


def is_json_lines(args: Sequence[str]) -> bool:
    """Whether the command prints one document per line."""
    lines = JSON_LINES.get(command_name(args))
    return lines is not None and lines(args)


class _ReadLines:
    """A JSON-lines stdout: each line a test reads is checked as it is read."""

    def __init__(self, stream: IO[str], args: Sequence[str]) -> None:
        self._stream = stream
        self._args = args
        self.read_from = False

    def readline(self, size: int = -1) -> str:
        line = self._stream.readline(size)
        self.read_from = True
        if line.endswith("\n"):
            check_line(self._args, line)
        return line

    def __iter__(self) -> Iterator[str]:
        while line := self.readline():
            yield line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class CheckedPopen(subprocess.Popen[str]):
    """A deployctl process whose --json output is checked: what `communicate` returns, and
    for JSON lines also each line read with `stdout.readline()`."""

    def __init__(self, argv: Sequence[str], **options: Any) -> None:
        super().__init__(argv, **options)
        self.deployctl_args = list(argv[3:])  # after python -m deployctl
        self._lines: _ReadLines | None = None
        args = self.deployctl_args
        if self.stdout is not None and checked(args) and is_json_lines(args):
            self._lines = _ReadLines(self.stdout, args)
            self.stdout = self._lines  # type: ignore[assignment]

    def communicate(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        out, err = super().communicate(*args, **kwargs)
        # After a line-by-line read the rest may start inside a line still in the reader's
        # buffer: those lines were checked as read, the rest is not checked.
        unread = self._lines is None or not self._lines.read_from
        if isinstance(out, str) and self.returncode is not None and unread:
            check_output(self.deployctl_args, self.returncode, out)
        return out, err
