"""The launcher seam (client side): one registry of launchers, each answering the verbs of
`base.Launcher`, and the one place that says which launcher a host or a run has.

A third launcher is a package here (its class, a subclass of `Launcher`), its `register`
below, and its host side in deployctl/remote/ (a module and its `register` in
remote/launchers.py). Its kind is a value the `launcher` setting accepts once registered;
a member of `LaunchKind` offers it to completion and names it in the docs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployctl.choices import LAUNCH_KINDS, LaunchKind
from deployctl.errors import DeployctlError
from deployctl.launchers.base import Launcher, Lease, ServerCommand
from deployctl.launchers.process import ProcessLauncher
from deployctl.launchers.slurm import SlurmJobLauncher
from deployctl.remote.placements import launcher_kind
from deployctl.settings import Settings

__all__ = [
    "LAUNCHERS",
    "LaunchKind",
    "Launcher",
    "Lease",
    "ServerCommand",
    "launcher_for",
    "launcher_of",
    "register",
]

# By kind. The process launcher is the default: it owns any run no other launcher claims
# (older records too).
LAUNCHERS: dict[str, Launcher] = {}
DEFAULT = LaunchKind.PROCESS


def register(launcher: Launcher) -> None:
    """Make a launcher one a host's `launcher` setting may name."""
    LAUNCHERS[launcher.kind] = launcher
    if launcher.kind not in LAUNCH_KINDS:
        LAUNCH_KINDS.append(launcher.kind)


register(ProcessLauncher())
register(SlurmJobLauncher())


def launcher_for(settings: Settings) -> Launcher:
    """The launcher a host's servers start with (its `launcher` setting)."""
    return LAUNCHERS[settings.launcher]


def launcher_of(run: Mapping[str, Any] | None) -> Launcher:
    """The launcher that started a recorded (or live) run; no run: the default's verbs,
    which add nothing."""
    if run is None:
        return LAUNCHERS[DEFAULT]
    kind = launcher_kind(run) or DEFAULT
    if kind not in LAUNCHERS:
        raise DeployctlError(
            f"run {run.get('id', '?')} was started by launcher {kind!r}, which this deployctl "
            "does not have",
            hint=f"use the deployctl that started it (this one has: {', '.join(LAUNCHERS)})",
        )
    return LAUNCHERS[kind]
