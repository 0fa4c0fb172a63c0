"""The folder deployctl keeps on each host, and nothing else: its layout lives here.

<state_dir>/                       default ~/.deployctl (host variable `state_dir`)
    lock                           held while a launch/stop/restart changes the host
    runs/<run-id>.json             one record per launch; never deleted
    runs/current                   id of the host's current run
    patches/<set>.json             what is applied now (set, version, hash, files, sha256s)
    patches/history/<set>-<id>.json   records of reverted or replaced applies
    patches/backups/<set>/<id>/<relpath>   originals saved by one apply; never overwritten
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass


@dataclass(frozen=True)
class RemoteState:
    """Paths under one host's state folder (strings: they are used on the host)."""

    root: str

    @property
    def lock(self) -> str:
        return posixpath.join(self.root, "lock")

    @property
    def runs(self) -> str:
        return posixpath.join(self.root, "runs")

    def run_record(self, run_id: str) -> str:
        return posixpath.join(self.runs, f"{run_id}.json")

    @property
    def current_run(self) -> str:
        return posixpath.join(self.runs, "current")

    @property
    def patches(self) -> str:
        return posixpath.join(self.root, "patches")

    def patch_record(self, name: str) -> str:
        return posixpath.join(self.patches, f"{name}.json")

    def patch_history(self, name: str, apply_id: str) -> str:
        return posixpath.join(self.patches, "history", f"{name}-{apply_id}.json")

    def patch_backups(self, name: str, apply_id: str) -> str:
        return posixpath.join(self.patches, "backups", name, apply_id)
