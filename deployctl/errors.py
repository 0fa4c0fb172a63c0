"""The one error type users see, with a hint that says how to fix it."""

from __future__ import annotations


class DeployctlError(Exception):
    """A failure explained to the user: one-line message plus an optional hint."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(DeployctlError):
    """Bad options or arguments on the command line."""


class InventoryError(DeployctlError):
    """The inventory file or a host pattern is wrong."""


class TemplateError(DeployctlError):
    """A launch template is missing or cannot be rendered."""


class ConnectError(DeployctlError):
    """A host could not be reached or refused us."""


class HostKeyError(ConnectError):
    """A host's SSH key is unknown or has changed."""


class CommandTimeoutError(DeployctlError):
    """A remote command did not finish in time."""


class CommandError(DeployctlError):
    """A remote command exited non-zero."""


class PatchError(DeployctlError):
    """A patch set is malformed, unsupported or failed to apply."""


class PreflightError(DeployctlError):
    """A host is not ready for a launch."""
