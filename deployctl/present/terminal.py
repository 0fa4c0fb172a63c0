"""Building blocks for the terminal: the console, tables, JSON, the one error format."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from deployctl.errors import DeployctlError
from deployctl.text import one_line

if TYPE_CHECKING:
    from rich.console import Console

    from deployctl.crash.model import CrashReport
    from deployctl.fanout import HostResult

CRASH_MARK = "!! "
RED, RESET = "\033[31m", "\033[0m"
# C0 controls but tab, DEL, and C1 controls (0x9b is a CSI on some terminals).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def console(stderr: bool = False) -> Console:
    """Return a rich console; wide when not a terminal so lines are not wrapped."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(file=stream, width=width, highlight=False, soft_wrap=not stream.isatty())


def escaped(text: str) -> str:
    """Host text as a terminal may show it: each control character as its `\\x1b` escape.
    A log line or crash message must not set the title, clear the screen or move the
    cursor; JSON output keeps the text (JSON escapes it)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def print_json(document: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def error_text(message: str, hint: str | None = None, host: str | None = None) -> str:
    """`[host: ]error: …` and `[host: ]hint: …`, one line each: the one error format."""
    return tagged("error", message, host) + (tagged("hint", hint, host) if hint else "")


def tagged(tag: str, text: str, host: str | None = None) -> str:
    """One `[host: ]tag: text` line."""
    prefix = f"{host}: " if host else ""
    return escaped(f"{prefix}{tag}: {one_line(text)}") + "\n"


def print_error(message: str, hint: str | None = None, host: str | None = None) -> None:
    """Print an error (and its hint) on stderr."""
    sys.stderr.write(error_text(message, hint, host))
    sys.stderr.flush()


def print_bug(failures: Sequence[tuple[str | None, BaseException]], message: str = "") -> None:
    """Keep the tracebacks of bugs (per host, or None for the command) in a new debug file,
    and name it in one error line."""
    from deployctl.debug import write_debug_file

    try:
        kept = f"the traceback is in {write_debug_file(failures)}"
    except DeployctlError as exc:  # a full disk must not turn one line into a traceback
        kept = f"its traceback could not be kept ({exc})"
    hosts = [host for host, _ in failures if host]
    where = f" on {', '.join(hosts)}" if hosts else ""
    print_error(
        message or f"internal error{where}", f"a bug in deployctl; {kept}; please report it"
    )


def print_host_errors(results: Iterable[HostResult[Any]]) -> None:
    """Print each failed host's error (and hint) on stderr."""
    for result in results:
        if result.failed:
            print_error(result.error or "", result.hint, result.name)


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print a table of plain strings."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text(escaped(cell)) for cell in row))  # data, never rich markup
    console().print(table)


def print_command(out: Console, command: str) -> None:
    """Print a shell command byte for byte: rich would expand tabs and turn :name: into emoji."""
    out.file.write(command + "\n")
    out.file.flush()


def crash_lines(crash: CrashReport, whole_log: bool = True) -> list[str]:
    """A crash report as the lines people read."""
    # Loaded when a crash is shown: the crash package (and yaml) cost ~30 ms to import.
    from deployctl.crash.model import crash_lines as lines

    return [escaped(line) for line in lines(crash, whole_log)]


def duration_text(seconds: float) -> str:
    """`42 s`, `3 min 5 s`, `1 h 12 min`."""
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


# An interval whose ends are further apart than this says only that too few samples are in.
WIDE_INTERVAL = 100.0


def interval_text(low: float | None, high: float | None) -> str:
    """` [0.990, 1.070]` for a canary's ratio; ` [still wide]` while its ends are more than
    WIDE_INTERVAL times apart (at first they reach 1e40); nothing while it is unbounded."""
    if low is None or high is None:
        return ""
    if low <= 0 or high / low > WIDE_INTERVAL:
        return " [still wide]"
    return f" [{low:.3f}, {high:.3f}]"


def use_color() -> bool:
    """Colour unless the user or the terminal says no (NO_COLOR, TERM=dumb)."""
    return "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def size_text(n: int) -> str:
    """Return a byte count for people: 512 B, 21.0 KiB, 64.0 MiB, 1.0 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def print_event_text(text: str) -> None:
    """One timestamped line on stdout (watch's events)."""
    import time

    sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
    sys.stdout.flush()
