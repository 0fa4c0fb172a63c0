"""Small text helpers shared by the parsers and the presentation (no imports: cheap to load)."""

from __future__ import annotations


def one_line(text: str) -> str:
    """Return `text` on one line, its runs of whitespace collapsed to single spaces."""
    return " ".join(text.split())


def is_number(text: str) -> bool:
    """ASCII digits only: `str.isdigit` also accepts superscripts, which `int` refuses."""
    return text.isascii() and text.isdigit()
