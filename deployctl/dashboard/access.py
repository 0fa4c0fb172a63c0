"""Who may read the dashboard: loopback by default, a token for any other address.

The token lives in a file only its owner can read (`deployctl dashboard --new-token F`
writes one); every request, the event stream included, must carry it, and it is compared in
constant time. Pure file and string checks: no web framework here.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from deployctl.deployments import is_loopback
from deployctl.errors import UsageError
from deployctl.inventory import LOCALHOST

# 32 random bytes, URL-safe: what `--new-token` writes.
TOKEN_BYTES = 32
# A shorter token is guessable; one written by hand must be at least this long.
TOKEN_MIN_CHARS = 20
COOKIE = "deployctl_dashboard"


def new_token(path: Path) -> str:
    """Write a fresh token to `path` (mode 0600), never over an existing file."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UsageError(
            f"--new-token {path}: the file exists",
            hint="name a new file, or use it with --token-file",
        ) from None
    except OSError as exc:
        raise UsageError(f"--new-token {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


def read_token(path: Path) -> str:
    """The token in `path`, refused unless the file is ours and private."""
    try:
        info = path.lstat()
    except OSError as exc:
        raise UsageError(f"--token-file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"--token-file {path} is not a regular file")
    if info.st_uid != os.getuid():
        raise UsageError(f"--token-file {path} belongs to another user")
    if info.st_mode & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        raise UsageError(
            f"--token-file {path} can be read by others (mode {mode:o})",
            hint=f"chmod 600 {path}",
        )
    token = path.read_text(encoding="utf-8", errors="replace").strip()
    if len(token) < TOKEN_MIN_CHARS or any(c.isspace() for c in token):
        raise UsageError(
            f"--token-file {path} does not hold a token ({TOKEN_MIN_CHARS}+ characters, one word)",
            hint="write one with deployctl dashboard --new-token FILE",
        )
    return token


def check_bind(bind: str, token: str | None) -> None:
    """Refuse an address other machines reach unless a token guards it."""
    if token is None and not is_loopback(bind):
        raise UsageError(
            f"--bind {bind} is reachable from other machines: it needs --token-file",
            hint="deployctl dashboard --new-token FILE writes one; or keep --bind 127.0.0.1",
        )


def allowed_hosts(bind: str, allow: Iterable[str]) -> frozenset[str]:
    """The names a request may call the server by: the bound address, `localhost`, and the
    names the user allows (`--allow-host`)."""
    return frozenset(n.strip().strip("[]").lower() for n in (bind, LOCALHOST, *allow))


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    """Whether a `Host` header (`name`, `name:port`, `[v6]:port`) names the server. A page
    that rebinds its own domain to this address sends its own name: refused."""
    if not header:
        return False
    name = header.strip().lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    return name.rstrip(".") in names


def token_matches(given: str | None, token: str) -> bool:
    """Constant-time comparison: how long it takes says nothing of how much matched."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())
