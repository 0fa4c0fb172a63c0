"""Patch sets: patch.yml, one diff set per SGLang version, content hashes, flag constraints."""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployctl.errors import PatchError
from deployctl.remote.server_argv import CommandValues

PATCH_FILE = "patch.yml"
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*\Z")
_VERSION = re.compile(r"\d+(\.\d+)*\Z")
_REQUIRED_KEYS = ("name", "version", "description", "variants")


@dataclass(frozen=True)
class FlagRule:
    """A server flag a set adds, the values other flags must have, and flags it excludes."""

    flag: str
    requires: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    forbids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Variant:
    """The diffs and verify scripts for one SGLang version."""

    sglang_version: str
    diffs: tuple[Path, ...]
    verify: tuple[Path, ...]
    files: tuple[str, ...]


@dataclass(frozen=True)
class PatchSet:
    name: str
    version: str
    description: str
    requires: tuple[str, ...]
    flags: tuple[FlagRule, ...]
    variants: Mapping[str, Variant]
    folder: Path
    content_hash: str
    verified: str = ""

    @property
    def short_hash(self) -> str:
        return self.content_hash[:12]

    def variant_for(self, sglang_version: str) -> Variant:
        """Return the variant for an SGLang version, or refuse clearly."""
        variant = self.variants.get(sglang_version)
        if variant is None:
            supported = ", ".join(sorted(self.variants)) or "none"
            raise PatchError(
                f"patch set {self.name} {self.version} has no variant for SGLang {sglang_version} "
                f"(supported: {supported})",
                hint="install a supported SGLang version, or add a variant for this one",
            )
        return variant

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "hash": self.short_hash,
            "sglang_versions": sorted(self.variants),
            "description": self.description,
            "requires": list(self.requires),
            "flags": [rule.flag for rule in self.flags],
        }


def version_key(version: str) -> tuple[int, ...]:
    """Order dotted numeric versions (1.10.0 > 1.9.2)."""
    return tuple(int(part) for part in re.findall(r"\d+", version))


# `@@ -start[,count] +start[,count] @@`: a hunk and how many old and new lines it has.
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def diff_targets(text: str, source: str) -> list[str]:
    """Return the site-relative files a unified diff touches; refuse paths that escape."""
    return list(diff_hunks(text, source))


def diff_hunks(text: str, source: str) -> dict[str, int]:
    """Each file a unified diff touches (site-relative, in order) and its number of hunks."""
    hunks: dict[str, int] = {}
    current: str | None = None
    old_path: str | None = None
    old_left = new_left = 0  # lines still to come in the current hunk
    for line in text.splitlines():
        if old_left > 0 or new_left > 0:  # a hunk's body: `--- x` here is a removed line
            tag = line[:1]
            old_left -= tag in (" ", "-", "")
            new_left -= tag in (" ", "+", "")
            continue
        hunk = _HUNK.match(line)
        if hunk and current is not None:
            old_left = int(hunk.group(1) or 1)
            new_left = int(hunk.group(2) or 1)
            hunks[current] += 1
        elif line.startswith("--- "):
            old_path = line[4:].split("\t")[0].strip()
        elif line.startswith("+++ ") and old_path is not None:
            new_path = line[4:].split("\t")[0].strip()
            current = _site_relative(new_path if new_path != "/dev/null" else old_path, source)
            hunks.setdefault(current, 0)
            old_path = None
    if not hunks:
        raise PatchError(f"{source} is not a unified diff (no ---/+++ file headers)")
    return hunks


def _site_relative(path: str, source: str) -> str:
    parts = path.split("/", 1)
    if len(parts) == 2 and parts[0] in ("a", "b"):
        path = parts[1]
    normal = posixpath.normpath(path)
    if path.startswith("/") or normal.startswith("..") or "/../" in f"/{path}/" or normal == ".":
        raise PatchError(
            f"{source}: path {path!r} escapes the site-packages folder",
            hint="diff paths are relative to the folder holding sglang/, like a/sglang/srt/x.py",
        )
    return normal


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise PatchError(f"{where} must be a list of strings")
    return tuple(str(v) for v in value)


def _flag_rules(value: Any, where: str) -> tuple[FlagRule, ...]:
    if not value:
        return ()
    if not isinstance(value, dict):
        raise PatchError(f"{where}: flags must be a mapping of flag → rules")
    rules = []
    for flag, raw in value.items():
        body = raw or {}
        if not str(flag).startswith("--") or not isinstance(body, dict):
            raise PatchError(
                f"{where}: flag {flag!r} must start with -- and map to requires/forbids"
            )
        requires = body.get("requires") or {}
        if not isinstance(requires, dict):
            raise PatchError(f"{where}: {flag}.requires must map flags to allowed values")
        rules.append(
            FlagRule(
                str(flag),
                {str(k): _strings(v, f"{where}: {flag}.requires.{k}") for k, v in requires.items()},
                _strings(body.get("forbids"), f"{where}: {flag}.forbids"),
            )
        )
    return tuple(rules)


def _content_hash(folder: Path, files: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(set(files)):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def load_patch_set(folder: Path) -> PatchSet:
    """Read and check patches/<name>/patch.yml and the files it names."""
    folder = folder.resolve()
    source = str(folder / PATCH_FILE)
    try:
        data = yaml.safe_load((folder / PATCH_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PatchError(f"{source} does not exist") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PatchError(f"{source}: malformed YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise PatchError(f"{source} must be a mapping")
    missing = [key for key in _REQUIRED_KEYS if not data.get(key)]
    if missing:
        raise PatchError(
            f"{source} lacks required field(s): {', '.join(missing)}",
            hint="a patch.yml needs name, version, description and variants",
        )
    name, version = str(data["name"]), str(data["version"])
    if not _NAME.match(name) or name != folder.name:
        raise PatchError(f"{source}: name {name!r} must match its folder name {folder.name!r}")
    if not _VERSION.match(version):
        raise PatchError(f"{source}: version {version!r} is not dotted numbers like 1.0.0")
    if not isinstance(data["variants"], dict):
        raise PatchError(f"{source}: variants must map SGLang versions to diffs")
    files = [folder / PATCH_FILE]
    variants: dict[str, Variant] = {}
    for sglang_version, body in data["variants"].items():
        where = f"{source}: variants.{sglang_version}"
        if not isinstance(body, dict) or not body.get("diffs"):
            raise PatchError(f"{where} needs a diffs: list")
        diffs = tuple(_inside(folder, p, where) for p in _strings(body["diffs"], f"{where}.diffs"))
        verify = tuple(
            _inside(folder, p, where) for p in _strings(body.get("verify"), f"{where}.verify")
        )
        targets: list[str] = []
        for diff in diffs:
            try:
                text = diff.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise PatchError(
                    f"{diff} is not UTF-8 text (byte {exc.start})",
                    hint="SGLang's sources are UTF-8: write the diff as UTF-8",
                ) from None
            targets += [t for t in diff_targets(text, str(diff)) if t not in targets]
        files += [*diffs, *verify]
        variants[str(sglang_version)] = Variant(str(sglang_version), diffs, verify, tuple(targets))
    return PatchSet(
        name=name,
        version=version,
        description=str(data["description"]).strip(),
        requires=_strings(data.get("requires"), f"{source}: requires"),
        flags=_flag_rules(data.get("flags"), source),
        variants=variants,
        folder=folder,
        content_hash=_content_hash(folder, files),
        verified=str(data.get("verified", "")).strip(),
    )


def _inside(folder: Path, relative: str, where: str) -> Path:
    path = (folder / relative).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise PatchError(f"{where}: {relative!r} is outside the patch set folder")
    if not path.is_file():
        raise PatchError(f"{where}: {relative} does not exist")
    return path


def load_patch_sets(search_dirs: Sequence[Path]) -> dict[str, PatchSet]:
    """Load every set; a project's set shadows a shipped one of the same name."""
    sets: dict[str, PatchSet] = {}
    for base in search_dirs:
        for folder in sorted(p for p in base.iterdir() if (p / PATCH_FILE).is_file()):
            if folder.name not in sets:
                sets[folder.name] = load_patch_set(folder)
    return sets


def select_sets(available: Mapping[str, PatchSet], names: Iterable[str]) -> list[PatchSet]:
    """Return the named sets plus what they require, dependencies first."""
    ordered: list[PatchSet] = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in trail:
            raise PatchError(
                f"patch sets require each other in a cycle: {' → '.join((*trail, name))}"
            )
        if name not in available:
            raise PatchError(
                f"unknown patch set {name!r}",
                hint="available: " + (", ".join(sorted(available)) or "none"),
            )
        patch_set = available[name]
        for dependency in patch_set.requires:
            visit(dependency, (*trail, name))
        if patch_set not in ordered:
            ordered.append(patch_set)

    for name in names:
        visit(name, ())
    return ordered


def command_flags(argv: Sequence[str]) -> dict[str, str | None]:
    """Map each --flag in a command to its value (`--x=v` or `--x v`), None for a bare flag."""
    flags: dict[str, str | None] = {}
    for index, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg.partition("=")
        if sep:
            flags[name] = value
        elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            flags[name] = argv[index + 1]
        else:
            flags[name] = None
    return flags


def speculates(argv: Sequence[str]) -> bool:
    """Whether a launch command turns speculative decoding on."""
    return CommandValues(argv).has("speculative_algorithm")


def sets_for_flags(argv: Sequence[str], available: Mapping[str, PatchSet]) -> list[PatchSet]:
    """Return the sets whose flags the command uses."""
    used = command_flags(argv)
    return [s for s in available.values() if any(rule.flag in used for rule in s.flags)]


def flag_violations(argv: Sequence[str], needed: Iterable[PatchSet]) -> list[str]:
    """Say, for each broken constraint, which set, which flag and which value conflicts."""
    used = command_flags(argv)
    problems = []
    for patch_set in needed:
        for rule in patch_set.flags:
            if rule.flag not in used:
                continue
            for other, allowed in rule.requires.items():
                value = used.get(other, "<absent>")
                if value not in allowed:
                    problems.append(
                        f"{rule.flag} (patch set {patch_set.name}) needs {other} "
                        f"{' or '.join(allowed)}, but the command has {other} {value}"
                    )
            for other in rule.forbids:
                if other in used:
                    problems.append(
                        f"{rule.flag} (patch set {patch_set.name}) cannot be used with {other}"
                    )
    return problems
