"""Locate the user's project folder and the shipped fallbacks for its parts."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from deployctl.errors import UnsafeProjectError, UsageError

PROJECT_PARTS = ("templates", "patches", "inventories")
SHIPPED_DATA = Path(__file__).resolve().parent / "data"
# The project's default inventory: the first of these in inventories/ (a folder named
# `default` is read as a folder inventory).
DEFAULT_INVENTORY_NAMES = ("default.yml", "default.yaml", "default.ini", "default.json", "default")
TEMPLATE_SUFFIX = ".j2"
PATCH_FILE = "patch.yml"  # a folder holding one is a patch set


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
        """Return the project's default inventory, if it has one."""
        if self.root is None:
            return None
        for name in DEFAULT_INVENTORY_NAMES:
            path = self.root / "inventories" / name
            if path.exists():
                return path
        return None

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
    root = project_root(start, explicit)
    return Project(None) if root is None else trusted(root)


def project_root(start: Path, explicit: Path | None = None) -> Path | None:
    """The project folder `find_project` takes, not yet checked as `trusted` (shell
    completion reads names from it and runs nothing)."""
    if explicit is not None:
        if not explicit.is_dir():
            raise UsageError(f"project folder {explicit} does not exist")
        return explicit.resolve()
    for candidate in (start, *start.parents):
        if is_project_dir(candidate) and candidate.resolve() != SHIPPED_DATA:
            return candidate.resolve()
    return None


def template_names(search_dirs: Sequence[Path]) -> list[str]:
    """List the templates available, project ones first."""
    names: list[str] = []
    for folder in search_dirs:
        for path in sorted(folder.glob(f"*{TEMPLATE_SUFFIX}")):
            if path.stem not in names:
                names.append(path.stem)
    return names


def trusted(root: Path) -> Project:
    """Refuse a project whose folder, templates, patch sets or signatures another user can
    change (owned by someone else, or writable by others), as OpenSSH refuses such a config:
    templates become commands, and patch sets run scripts on every host."""
    for path in _project_files(root):
        problem = _unsafe(path) or (_unsafe(path.resolve()) if path.is_symlink() else None)
        if problem:
            raise UnsafeProjectError(
                f"{path} {problem}; deployctl runs what a project holds",
                hint=f"make it yours and not writable by others (chown, chmod go-w {path})",
            )
    return Project(root)


def _project_files(root: Path) -> Iterator[Path]:
    yield root
    for part in ("templates", "patches", "signatures.yml"):
        top = root / part
        if top.exists():
            yield top
            if top.is_dir():
                yield from sorted(top.rglob("*"))


def _unsafe(path: Path) -> str | None:
    """Why `path` could be changed by another user, or None (OpenSSH's secure_permissions)."""
    try:
        info = path.lstat()
    except OSError:
        return None  # gone, or a dangling link: reading it fails later, with its own error
    me = os.getuid()
    if info.st_uid not in (0, me):
        return f"is owned by {_user(info.st_uid)}"
    if stat.S_ISLNK(info.st_mode):
        return None  # a link's own mode means nothing; what it points to is checked apart
    if info.st_mode & stat.S_IWOTH:
        return "is writable by every user"
    if info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid, info.st_uid):
        return f"is writable by group {_group(info.st_gid)}"
    return None


def _private_group(gid: int, uid: int) -> bool:
    """The group holds the owner alone (a user private group, as umask 002 systems use)."""
    try:
        group, owner = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:
        return False
    return owner.pw_gid == gid and set(group.gr_mem) <= {owner.pw_name}


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def patch_set_folders(search_dirs: Sequence[Path]) -> dict[str, Path]:
    """Each patch set's name and folder, the first found of a name (a project's set shadows a
    shipped one)."""
    folders: dict[str, Path] = {}
    for base in search_dirs:
        for folder in sorted(p for p in base.iterdir() if (p / PATCH_FILE).is_file()):
            folders.setdefault(folder.name, folder)
    return folders
