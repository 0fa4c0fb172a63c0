"""Every error type users see, each with a hint that says how to fix it, and a stable code."""

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


class BusyError(DeployctlError):
    """Another deployctl holds what this command needs (a router's rollout lock)."""

    code = "busy"


class PreflightError(DeployctlError):
    """A host is not ready for a launch."""

    code = "preflight"


class ServerError(DeployctlError):
    """The server did not come up: it crashed, died or was not ready in time."""

    code = "server"


class AgentError(DeployctlError):
    """The host agent could not run, or answered something that is not its protocol."""

    code = "agent"


class HostError(DeployctlError):
    """The host could not do what was asked: a missing home, a state folder that is a file…"""

    code = "host"


class MissingLogError(DeployctlError):
    """The log file does not exist (yet, or any more) on the host."""

    code = "missing_log"


class ParseError(DeployctlError):
    """Probe output that does not have the expected shape, or a probe that failed."""

    code = "parse"


class MetricsError(DeployctlError):
    """A /metrics page that is not Prometheus text."""

    code = "parse"


class LocalFileError(DeployctlError):
    """A file or folder on the control machine could not be written: no such folder, a full disk…"""

    code = "local_file"


class UnsafeProjectError(DeployctlError):
    """A project file that another user could have written: deployctl would run it."""

    code = "unsafe_project"


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


def error_codes() -> list[str]:
    """Every `code` a failure can carry in `--json`: each error type's here, then "internal"."""
    found: list[type[DeployctlError]] = [DeployctlError]
    for kind in found:  # grows while it is walked: subclasses of subclasses too
        found += [sub for sub in kind.__subclasses__() if sub.__module__ == __name__]
    return [*dict.fromkeys(kind.code for kind in found), INTERNAL]
