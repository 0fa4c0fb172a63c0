"""Locate the user's project folder and the shipped fallbacks for its parts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deployctl.errors import UsageError

PROJECT_PARTS = ("templates", "patches", "inventories")
SHIPPED_DATA = Path(__file__).resolve().parent / "data"
DEFAULT_INVENTORY_NAME = "default.yml"


@dataclass(frozen=True)
class Project:
    """Where templates, patches and inventories are read from (project first, then shipped)."""

    root: Path | None

    def search_dirs(self, part: str) -> list[Path]:
        """Return the folders to look in for `part`, most specific first."""
        dirs = [self.root / part] if self.root is not None else []
        dirs.append(SHIPPED_DATA / part)
        return [d for d in dirs if d.is_dir()]

    def default_inventory(self) -> Path | None:
        """Return the project's default inventory file, if it has one."""
        if self.root is None:
            return None
        path = self.root / "inventories" / DEFAULT_INVENTORY_NAME
        return path if path.is_file() else None

    def user_signatures(self) -> list[Path]:
        """Return the project's own crash signature catalog, if any."""
        if self.root is None:
            return []
        path = self.root / "signatures.yml"
        return [path] if path.is_file() else []


def is_project_dir(path: Path) -> bool:
    """Tell whether `path` looks like a deployctl project folder."""
    return any((path / part).is_dir() for part in PROJECT_PARTS)


def find_project(start: Path, explicit: Path | None = None) -> Project:
    """Find the project folder: `explicit`, else walk up from `start` as git does."""
    if explicit is not None:
        if not explicit.is_dir():
            raise UsageError(f"project folder {explicit} does not exist")
        return Project(explicit.resolve())
    for candidate in (start, *start.parents):
        if is_project_dir(candidate) and candidate.resolve() != SHIPPED_DATA:
            return Project(candidate.resolve())
    return Project(None)
