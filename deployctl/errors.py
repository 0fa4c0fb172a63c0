"""The one error type users see, with a hint that says how to fix it, and a stable code."""

from __future__ import annotations


class DeployctlError(Exception):
    """A failure explained to the user: one-line message plus an optional hint.

    `code` names the kind of failure in `--json` output; it is stable across releases.
    """

    code = "error"

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(DeployctlError):
    """Bad options or arguments on the command line."""

    code = "usage"


class InventoryError(DeployctlError):
    """The inventory file or a host pattern is wrong."""

    code = "inventory"


class TemplateError(DeployctlError):
    """A launch template is missing or cannot be rendered."""

    code = "template"


class ConnectError(DeployctlError):
    """A host could not be reached or refused us."""

    code = "connect"


class HostKeyError(ConnectError):
    """A host's SSH key is unknown or has changed."""

    code = "host_key"


class CommandTimeoutError(DeployctlError):
    """A remote command did not finish in time."""

    code = "timeout"


class CommandError(DeployctlError):
    """A remote command exited non-zero; `output` is the tail of what it said."""

    code = "command"

    def __init__(self, message: str, hint: str | None = None, output: str = "") -> None:
        super().__init__(message, hint)
        self.output = output


class PatchError(DeployctlError):
    """A patch set is malformed, unsupported or failed to apply."""

    code = "patch"


class PreflightError(DeployctlError):
    """A host is not ready for a launch."""

    code = "preflight"


# What a host's failure is called when it is not a DeployctlError: a bug, kept with its traceback.
INTERNAL = "internal"


def explain(exc: BaseException) -> tuple[str, str | None]:
    """The message and hint people see for an exception; a bug is named as one."""
    if isinstance(exc, DeployctlError):
        return exc.message, exc.hint
    return f"internal error: {type(exc).__name__}: {exc}", None


def error_code(exc: BaseException) -> str:
    """The stable `code` for an exception: its DeployctlError code, else "internal"."""
    return exc.code if isinstance(exc, DeployctlError) else INTERNAL
