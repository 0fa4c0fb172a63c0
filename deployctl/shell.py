"""Quoting for values that reach a POSIX shell."""

from __future__ import annotations

import re
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


# One piece of a POSIX-shell-like word at a time (the grammar of shlex.split(comments=True)).
_PIECE = re.compile(
    r"""(?P<space>[ \t\r\n]+)
      | (?P<continuation>\\\n)
      | (?P<comment>\#[^\n]*)
      | (?P<plain>[^ \t\r\n'"\\\#]+)
      | '(?P<single>[^']*)'
      | "(?P<double>(?:[^"\\]|\\.)*)"
      | \\(?P<escaped>.)""",
    re.VERBOSE | re.DOTALL,
)
# In double quotes a backslash escapes `"` and itself (as in shlex); before a newline it
# joins the lines (as in /bin/sh); before anything else it stays.
_DOUBLE_ESCAPE = re.compile(r'\\(["\\\n])')
_ENDS_IN_ESCAPE = re.compile(r'"(?:[^"\\]|\\.)*\\', re.DOTALL)


def split(text: str) -> list[str]:
    r"""Split shell words as `shlex.split(text, comments=True)` does, in linear time.

    shlex builds each word one character at a time (a 1 MiB value took ~15 s); this reads
    runs of characters with one regex. A `#` ends the word it is in and the rest of its line.
    Unlike shlex and like /bin/sh, a backslash-newline joins lines (outside single quotes), so
    a template's `\` line continuations add no words.
    """
    words: list[str] = []
    parts: list[str] = []
    in_word = False
    pos, end = 0, len(text)
    while pos < end:
        match = _PIECE.match(text, pos)
        if match is None:
            raise ValueError(_unclosed(text[pos:]))
        kind, pos = str(match.lastgroup), match.end()
        if kind == "continuation":
            continue
        if kind in ("space", "comment"):
            if in_word:
                words.append("".join(parts))
                parts, in_word = [], False
            continue
        value = match.group(kind)
        if kind == "double":
            value = _DOUBLE_ESCAPE.sub(_unescape, value)
        parts.append(value)
        in_word = True
    if in_word:
        words.append("".join(parts))
    return words


def _unescape(match: re.Match[str]) -> str:
    return "" if match.group(1) == "\n" else match.group(1)


def _unclosed(rest: str) -> str:
    """shlex's words for what cannot be read: an open quote, or a final lone backslash."""
    if rest[0] == "'" or (rest[0] == '"' and not _ENDS_IN_ESCAPE.fullmatch(rest)):
        return "No closing quotation"
    return "No escaped character"
