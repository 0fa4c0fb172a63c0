"""Keep the traceback of a bug in a file, so the user sees one line and can still report it."""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from deployctl import __version__


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
    name = f"debug-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for folder in (debug_dir(), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # Exclusive and private: never overwrite an earlier file; tracebacks may hold values.
            fd, path = tempfile.mkstemp(prefix=name + "-", suffix=".log", dir=folder)
        except OSError:
            continue
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return Path(path)
    raise OSError("no folder to write the debug file to")
