"""Files deployctl writes on the control machine: whole or not at all, and a failure is one
line for the user (a missing folder, a folder in the way, a full disk), never a traceback."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path

from deployctl.errors import LocalFileError

HINT = "check that the folder exists and is writable, and that its disk has room"


def _failed(path: Path, exc: OSError) -> LocalFileError:
    return LocalFileError(f"cannot write {path}: {exc.strerror or exc}", hint=HINT)


def _scratch_name(path: Path) -> Path:
    # Hidden, beside the target (a rename never crosses filesystems) and unique per writer.
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def check_folder(path: Path) -> None:
    """Refuse a path whose folder does not exist, before any work is done for it."""
    if not path.parent.is_dir():
        raise LocalFileError(
            f"cannot write {path}: folder {path.parent} does not exist",
            hint="create the folder first, or choose another path",
        )


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create `path` (it must not exist) holding `data`, on disk; removed again on failure."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())  # a full disk may only say so here
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def write_file(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Replace `path` with `data` whole: readers see the old file or the new one, and on any
    failure the old file stays and nothing is left beside it (`mode` before the umask)."""
    if path.is_symlink():  # a managed dotfile or config: replace what the link points at
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise LocalFileError(
            f"cannot write {path}: it is a folder", hint="give a file name, not a folder"
        )
    check_folder(path)
    tmp = _scratch_name(path)
    try:
        _write_new(tmp, data, mode)
        try:
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise _failed(path, exc) from None


def write_folder(path: Path, files: Mapping[str, bytes]) -> None:
    """Create folder `path` (absent or empty) holding `files` (relative names), whole or not
    at all: they are written beside it first, then renamed into place."""
    check_folder(path)
    tmp = _scratch_name(path)
    try:
        try:
            tmp.mkdir()
            for name, data in files.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                _write_new(tmp / name, data, 0o666)
            os.rename(tmp, path)  # replaces an empty folder, refuses anything else
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except OSError as exc:
        raise _failed(path, exc) from None


def append_file(path: Path, data: bytes) -> None:
    """Append `data` to `path` (created if absent, with its folder, private): all of it or,
    on a failure, nothing — the file is cut back to its old length."""
    existed = path.exists()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as exc:
        raise _failed(path, exc) from None
    try:
        size = os.fstat(fd).st_size
        try:
            written = 0
            while written < len(data):  # a short write is followed by the error itself
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except OSError:
            if existed:
                os.ftruncate(fd, size)
            else:
                path.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise _failed(path, exc) from None
    finally:
        os.close(fd)
