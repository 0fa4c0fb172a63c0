"""The crash report (`CrashReport`) and the human lines that describe one crash."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deployctl.text import one_line

if TYPE_CHECKING:
    from deployctl.remote.measures import CrashRecord

_MESSAGE_CAP = 500


@dataclass(frozen=True)
class CrashReport:
    """One distinct crash found in a log, explained by the catalog signature it matched."""

    exception: str
    message: str
    file: str | None
    line: int | None
    function: str | None
    ranks: tuple[str, ...]
    log_line: int
    signature: str
    title: str
    hint: str

    def to_json(self) -> CrashRecord:
        """Return the report as a JSON-ready dict."""
        return {
            "exception": self.exception,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "ranks": list(self.ranks),
            "signature": self.signature,
            "title": self.title,
            "hint": self.hint,
            "log_line": self.log_line,
        }

    def summary(self) -> str:
        """Return one line: title, exception and a shortened message."""
        message = self.message if len(self.message) <= 160 else self.message[:159] + "…"
        if self.exception:
            return f"{self.title}: {self.exception}: {message}"
        return f"{self.title}: {message}"


def crash_lines(crash: CrashReport, whole_log: bool = True) -> list[str]:
    """Return the human lines for one crash: title, exception, frame, ranks, hint."""
    lines = [f"crash: {crash.title} [{crash.signature}]"]
    message = one_line(crash.message)
    if len(message) > _MESSAGE_CAP:
        message = message[: _MESSAGE_CAP - 1] + "…"
    lines.append(f"  {crash.exception}: {message}" if crash.exception else f"  {message}")
    if crash.file:
        where = f"{crash.file}:{crash.line}" if crash.line is not None else crash.file
        lines.append(f"  at {where}" + (f" in {crash.function}" if crash.function else ""))
    if crash.ranks:
        lines.append(f"  ranks: {format_ranks(crash.ranks)}")
    # A partial scan starts mid-log, so its line numbers count from where it started.
    lines.append(
        f"  log line {crash.log_line}"
        if whole_log
        else f"  line {crash.log_line} of the scanned tail"
    )
    lines.append(f"  hint: {one_line(crash.hint)}")
    return lines


def format_ranks(ranks: Sequence[str]) -> str:
    """Return ranks compactly: `TP0-TP7 (8)` for a run of one kind, else a list."""
    kinds = {r.rstrip("0123456789") for r in ranks}
    digits = [r[len(r.rstrip("0123456789")) :] for r in ranks]
    if len(ranks) > 2 and len(kinds) == 1 and all(d.isdigit() for d in digits):
        numbers = [int(d) for d in digits]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{ranks[0]}-{ranks[-1]} ({len(ranks)})"
    return ", ".join(ranks) + (f" ({len(ranks)})" if len(ranks) > 1 else "")
