"""deployctl's own modules parsed with `ast` once per test process: the tests that read the
code (layers, one home, choices, error codes, launcher questions) each parsed every module
again, ~0.25 s of CPU a time. Trees are shared: read them, never change them."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def _parsed(source: str) -> ast.Module:
    return ast.parse(source)


def parse_file(path: Path) -> ast.Module:
    """`ast.parse` of the file as it is now (the cache is keyed by its text)."""
    return _parsed(path.read_text(encoding="utf-8"))
