"""Files on the host: read, write atomically, put back; the state_dir's paths."""

from __future__ import annotations

import binascii
import os
import sys
import time

from .lean import dumps_indented, loads, sha256_hex
from .wire import STOP_MARGIN_S

# The types for the checker only: `typing` and the TypedDicts' classes would cost each call's
# start ~15 ms (see wire.py); every module of the agent imports them so.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from typing import Any, NoReturn

    from .patch_types import ReadArgs, ReadReply
    from .protocol import RunRecord


_SITE_ADDED: list[bool] = []  # (not functools.cache: its import costs a status call ~1 ms)


def with_site_packages() -> None:
    """Put this python's site-packages on the path, once: the agent starts without them
    (bootstrap.PYTHON_FLAGS)."""
    if sys.flags.no_site and not _SITE_ADDED:
        import site

        site.main()
        _SITE_ADDED.append(True)


def find_package(name: str) -> ModuleSpec | None:
    """Where `import NAME` in this python finds the top-level package or module NAME, without
    importing it (None: nowhere), with the site-packages added first: where a server looks."""
    import importlib.util

    with_site_packages()
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def digest(data: bytes | None) -> str | None:
    return None if data is None else sha256_hex(data)


def sha256(path: str) -> str | None:
    return digest(read_bytes(path))


def base64_text(data: bytes) -> str:
    """`data` in base64 (binascii: the `base64` module imports `re`)."""
    return binascii.b2a_base64(data, newline=False).decode()


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return loads(handle.read())
    except (OSError, ValueError):
        return None


def write_atomic(path: str, data: bytes, mode: int | None = None) -> None:
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            mode = 0o644
    fd, tmp = _new_file(folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _new_file(folder: str) -> tuple[int, str]:
    """A new private file in `folder` (as tempfile.mkstemp, whose import would cost each
    call's start more than the whole write)."""
    while True:
        path = os.path.join(folder, f".deployctl.{os.urandom(6).hex()}")
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), path
        except FileExistsError:
            continue


def write_json(path: str, document: Any, mode: int | None = None) -> None:
    write_atomic(path, dumps_indented(document).encode(), mode)


def put_back(target: str, data: bytes | None) -> bool:
    """Give `target` its original bytes again (None: it did not exist); True when done."""
    try:
        if data is None:
            if os.path.lexists(target):
                os.unlink(target)
            return True
        try:
            write_atomic(target, data)
        except OSError:
            # A full disk has no room for a second copy: drop ours first, then write.
            mode = os.stat(target).st_mode & 0o7777
            os.unlink(target)
            write_atomic(target, data, mode)
    except OSError:
        return False
    return True


def state_path(state_dir: str, *parts: str) -> str:
    return os.path.join(os.path.expanduser(state_dir), *parts)


class CallFailed(BaseException):
    """A call's answer is an error (raised by `fail`). A BaseException, as the exit it
    replaced was: a handler's `except Exception` never swallows it."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def fail(message: str, code: str = "patch") -> NoReturn:
    """Answer with an error instead of a reply; `code` says what kind (see the client)."""
    raise CallFailed(message, code)


def cmd_read(args: ReadArgs) -> ReadReply:
    """Return the named files under `base` as base64 (None for a file that does not exist)."""
    contents: dict[str, str | None] = {}
    for path in args["paths"]:
        data = read_bytes(os.path.join(args["base"], path))
        contents[path] = None if data is None else base64_text(data)
    return {"files": contents}


def marked_stopping(run: RunRecord, timeout: float, **more: Any) -> RunRecord:
    """`run` with a stop's marks (protocol.StopMarks): begun now, ending within `timeout`
    (its drain) and the margin."""
    marks = {"stop_requested_at": time.time(), "stop_budget_s": timeout + STOP_MARGIN_S}
    return {**run, **marks, **more}  # type: ignore[typeddict-item]
