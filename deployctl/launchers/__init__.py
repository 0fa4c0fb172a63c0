"""The launcher seam (client side): one registry of launchers, each answering the verbs of
`base.Launcher`, and the one place that says which launcher a host or a run has.

A third launcher is a module here (its class), a member of `LaunchKind`, a line in
`LAUNCHERS`, and its host side in deployctl/remote/ (remote/launchers.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployctl.choices import LaunchKind
from deployctl.launchers.base import Launcher, Lease, ServerCommand
from deployctl.launchers.process import ProcessLauncher
from deployctl.launchers.slurm import SlurmJobLauncher
from deployctl.settings import Settings

__all__ = [
    "LAUNCHERS",
    "LaunchKind",
    "Launcher",
    "Lease",
    "ServerCommand",
    "launcher_for",
    "launcher_of",
]

# The process launcher last: it owns any run no other launcher claims (older records too).
LAUNCHERS: dict[LaunchKind, Launcher] = {
    LaunchKind.SLURM_JOB: SlurmJobLauncher(),
    LaunchKind.PROCESS: ProcessLauncher(),
}


def launcher_for(settings: Settings) -> Launcher:
    """The launcher a host's servers start with (its `launcher` setting)."""
    return LAUNCHERS[LaunchKind(settings.launcher)]


def launcher_of(run: Mapping[str, Any] | None) -> Launcher:
    """The launcher that started a recorded (or live) run; no run: the process launcher's
    verbs, which add nothing."""
    if run is None:
        return LAUNCHERS[LaunchKind.PROCESS]
    return next(launcher for launcher in LAUNCHERS.values() if launcher.owns(run))
