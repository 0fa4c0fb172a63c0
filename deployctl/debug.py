"""Keep the traceback of a bug in a file, so the user sees one line and can still report it."""

from __future__ import annotations

import os
import secrets
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from deployctl import __version__
from deployctl.errors import LocalFileError
from deployctl.localfiles import write_file


def debug_dir() -> Path:
    """$DEPLOYCTL_DEBUG_DIR, else $XDG_STATE_HOME/deployctl, else ~/.local/state/deployctl."""
    explicit = os.environ.get("DEPLOYCTL_DEBUG_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "deployctl"


def write_debug_file(failures: Sequence[tuple[str | None, BaseException]]) -> Path:
    """Write each failure's traceback (host, or None for the command itself) to a new file."""
    parts = [f"deployctl {__version__}, pid {os.getpid()}, {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"]
    for host, exc in failures:
        where = f"on host {host}" if host else "in the command"
        text = "".join(traceback.format_exception(exc))
        parts.append(f"---- {where}\n{text}")
    data = ("\n".join(parts) + "\n").encode()
    name = f"debug-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}.log"
    failed: LocalFileError | None = None
    for folder in (debug_dir(), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        try:
            # Private (tracebacks may hold values), a new name, and whole or not there at all.
            write_file(folder / name, data, mode=0o600)
        except LocalFileError as exc:  # a full disk: try the next folder
            failed = exc
            continue
        return folder / name
    raise failed or LocalFileError("no folder to write the debug file to")
