"""Quoting for values that reach a POSIX shell."""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def quote(value: object) -> str:
    """Quote one value for the shell; a leading `~/` stays unquoted so it expands to $HOME."""
    text = str(value)
    if text == "~":
        return "~"
    if text.startswith("~/"):
        rest = text[2:]
        return "~/" + shlex.quote(rest) if rest else "~/"
    return shlex.quote(text)


def join(argv: Iterable[object]) -> str:
    """Join arguments into one shell command line, each quoted."""
    return " ".join(quote(arg) for arg in argv)
