"""The literal-anchor pre-filter: what finds, at str.find speed, the lines worth parsing."""

from __future__ import annotations

import re
from collections.abc import Sequence

# Lines the scanner must always see, whatever the catalog says: a traceback's header, and the
# mark of an exception Python ignored (its traceback is not a crash).
TB_HEADER = "Traceback (most recent call last):"
IGNORED_MARK = "Exception ignored in"


def build_triggers(patterns: Sequence[str]) -> tuple[str | re.Pattern[str], ...]:
    """Return what finds every line worth a closer look: literals where possible, else regexes.

    Each rule is reduced to a literal it cannot match without, searched with str.find at GB/s
    (CPython's re runs an alternation of literals at ~20 MB/s); rules with no such literal are
    searched whole.
    """
    literals = {TB_HEADER, IGNORED_MARK}
    whole: list[re.Pattern[str]] = []
    for pattern in patterns:
        anchors = _literal_anchors(pattern)
        if anchors is None:
            # Rules are searched in a line's message, so drop a leading ^ for the text search.
            bare = re.sub(r"^(\(\?[aiLmsux]+\))?\^", r"\1", pattern)
            try:
                whole.append(re.compile(bare, re.MULTILINE))
            except re.error:
                whole.append(re.compile(r"[^\n]"))  # unknowable: look at every line
        else:
            literals.update(anchors)
    return (*sorted(literals), *whole)


def find(trigger: str | re.Pattern[str], text: str, pos: int, end: int) -> int:
    if isinstance(trigger, str):
        return text.find(trigger, pos, end)
    m = trigger.search(text, pos, end)
    return -1 if m is None else m.start()


_QUANTIFIER = re.compile(r"\{\d*(?:,\d*)?\}")


def _literal_anchors(pattern: str) -> list[str] | None:
    """Return literals of which every match of `pattern` contains one, or None if unknown."""
    if re.match(r"\(\?[aiLmsux]*[ix]", pattern):
        return None  # case-insensitive or verbose: literals do not hold
    alternatives: list[list[str]] = [[]]
    run: list[str] = []
    depth = 0
    i, n = 0, len(pattern)

    def close() -> None:
        if run and depth == 0:
            alternatives[-1].append("".join(run))
        run.clear()

    while i < n:
        c = pattern[i]
        literal: str | None = None
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            i += 2
            if nxt and not nxt.isalnum():
                literal = nxt
            else:
                close()
                continue
        elif c == "[":
            close()
            i = _skip_class(pattern, i)
            continue
        elif c == "(":
            close()
            depth += 1
            i += 1
            continue
        elif c == ")":
            close()
            depth -= 1
            i += 1
            continue
        elif c == "|":
            close()
            if depth == 0:
                alternatives.append([])
            i += 1
            continue
        elif c in "?*{":
            m = _QUANTIFIER.match(pattern, i) if c == "{" else None
            if c != "{" or m is not None:
                if run:
                    run.pop()  # the quantified character may be absent
                close()
                i = m.end() if m is not None else i + 1
                continue
            literal = c
            i += 1
        elif c in "+.^$":
            close()  # `+` keeps the character but ends the run; the rest match no literal
            i += 1
            continue
        else:
            literal = c
            i += 1
        if depth == 0:
            run.append(literal)
    close()
    if depth != 0:
        return None
    anchors: list[str] = []
    for alternative in alternatives:
        best = max(alternative, key=len, default="")
        if len(best) < 3:
            return None
        anchors.append(best)
    return anchors


def _skip_class(pattern: str, i: int) -> int:
    """Return the index just past the character class starting at `pattern[i]`."""
    j = i + 1
    if pattern[j : j + 1] == "^":
        j += 1
    if pattern[j : j + 1] == "]":
        j += 1
    while j < len(pattern):
        if pattern[j] == "\\":
            j += 2
            continue
        if pattern[j] == "]":
            return j + 1
        j += 1
    return len(pattern)
