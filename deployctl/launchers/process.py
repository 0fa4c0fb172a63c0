"""The process launcher (`launcher: ssh`): the server is a process group on the host, started
over SSH; its host side is remote/processes.py. Every verb is the base's: a server on the
host itself, with no placement."""

from __future__ import annotations

from deployctl.choices import LaunchKind
from deployctl.launchers.base import Launcher


class ProcessLauncher(Launcher):
    kind = LaunchKind.PROCESS
