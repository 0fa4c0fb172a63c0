"""Patch sets: patch.yml, one diff set per SGLang version, content hashes, flag constraints."""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployctl.errors import PatchError
from deployctl.project import PATCH_FILE, patch_set_folders
from deployctl.remote.patch_types import BlockMark, HunkMark
from deployctl.remote.server_argv import CommandValues
from deployctl.text import load_yaml

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
class FileHashes:
    """A file's sha256 in the release (`original`) and with only this set applied (`patched`);
    None: the file does not exist then."""

    original: str | None
    patched: str | None


@dataclass(frozen=True)
class Variant:
    """The diffs and verify scripts for one SGLang version; its hunks per file, and each
    file's hashes from hashes.json (None: none shipped, or made for other diffs)."""

    sglang_version: str
    diffs: tuple[Path, ...]
    verify: tuple[Path, ...]
    files: tuple[str, ...]
    sections: tuple[tuple[Path, tuple[FileDiff, ...]], ...] = ()
    hashes: Mapping[str, FileHashes] | None = None

    def hunks(self, path: str) -> list[Hunk]:
        """The hunks of every diff that touch one file, in the order they apply."""
        return [h for _, files in self.sections for f in files if f.path == path for h in f.hunks]

    def marks(self) -> dict[str, list[HunkMark]]:
        """Each file's hunks as the host looks for them (remote.patches.hunk_states)."""
        return {
            path: [
                {"before": block_mark(h.before), "after": block_mark(h.after)}
                for h in self.hunks(path)
            ]
            for path in self.files
        }


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
    counts: dict[str, int] = {}
    for section in parse_diff(text, source):
        counts[section.path] = counts.get(section.path, 0) + len(section.hunks)
    return counts


@dataclass(frozen=True)
class Hunk:
    """One hunk: the lines it expects (context and removed) and the lines it leaves (context
    and added), without their line ends, and its text as written (header included)."""

    before: tuple[str, ...]
    after: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class FileDiff:
    """One file's part of a unified diff: its header lines as written, and its hunks."""

    path: str
    head: str
    hunks: tuple[Hunk, ...]


def parse_diff(text: str, source: str) -> list[FileDiff]:
    """Split a unified diff into its files and hunks; refuse paths that escape."""
    sections: list[FileDiff] = []
    path: str | None = None
    head = ""
    hunks: list[Hunk] = []
    pending: list[str] = []  # lines outside any hunk, since the last hunk or file header
    body: list[str] = []  # the current hunk's lines, header first
    old_path: str | None = None
    old_left = new_left = 0  # lines still to come in the current hunk

    def close_hunk() -> None:
        if body:
            before = tuple(_content(ln) for ln in body[1:] if ln[:1] in (" ", "-", "\n", ""))
            after = tuple(_content(ln) for ln in body[1:] if ln[:1] in (" ", "+", "\n", ""))
            hunks.append(Hunk(before, after, "".join(body)))
            body.clear()

    def close_file() -> None:
        close_hunk()
        if path is not None:
            sections.append(FileDiff(path, head, tuple(hunks)))
            hunks.clear()

    for line in text.splitlines(keepends=True):
        if old_left > 0 or new_left > 0:  # a hunk's body: `--- x` here is a removed line
            tag = line[:1]
            old_left -= tag in (" ", "-", "\n", "")
            new_left -= tag in (" ", "+", "\n", "")
            body.append(line)
            continue
        if line.startswith("\\") and body:  # `\ No newline at end of file`, after a hunk
            body.append(line)
            continue
        hunk = _HUNK.match(line)
        if hunk and path is not None:
            close_hunk()
            old_left = int(hunk.group(1) or 1)
            new_left = int(hunk.group(2) or 1)
            body.append(line)
        elif line.startswith("--- "):
            close_hunk()
            old_path = line[4:].split("\t")[0].strip()
            pending.append(line)
        elif line.startswith("+++ ") and old_path is not None:
            close_file()
            new_path = line[4:].split("\t")[0].strip()
            path = _site_relative(new_path if new_path != "/dev/null" else old_path, source)
            head = "".join([*pending, line])
            pending.clear()
            old_path = None
        else:
            close_hunk()
            pending.append(line)
    close_file()
    if not sections:
        raise PatchError(f"{source} is not a unified diff (no ---/+++ file headers)")
    return sections


def block_mark(lines: Sequence[str]) -> BlockMark:
    """A run of lines as the host looks for it (remote.patches.hunk_states)."""
    anchor = max(range(len(lines)), key=lambda i: len(lines[i].strip()), default=0)
    data = "\n".join(lines).encode("utf-8", "surrogateescape")
    return {
        "lines": len(lines),
        "sha256": hashlib.sha256(data).hexdigest(),
        "anchor": anchor,
        "line": lines[anchor] if lines else "",
    }


def _content(line: str) -> str:
    """A hunk line's text: without its tag and its line end (a CR stays, as in the file)."""
    return line[1:].removesuffix("\n") if line[:1] != "\n" else ""


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
        data = load_yaml((folder / PATCH_FILE).read_text(encoding="utf-8"))
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
    shipped = read_hashes(folder)
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
        sections = []
        for diff in diffs:
            try:
                text = diff.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise PatchError(
                    f"{diff} is not UTF-8 text (byte {exc.start})",
                    hint="SGLang's sources are UTF-8: write the diff as UTF-8",
                ) from None
            parsed = tuple(parse_diff(text, str(diff)))
            sections.append((diff, parsed))
            targets += [f.path for f in parsed if f.path not in targets]
        files += [*diffs, *verify]
        version_name = str(sglang_version)
        variants[version_name] = Variant(
            version_name,
            diffs,
            verify,
            tuple(targets),
            tuple(sections),
            shipped.get(version_name, {}).get(diffs_digest(diffs)),
        )
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


HASHES_FILE = "hashes.json"


def diffs_digest(diffs: Iterable[Path | bytes]) -> str:
    """The sha256 of a variant's diffs (files, or their bytes), in order: which diffs a
    hashes.json entry was made from."""
    digest = hashlib.sha256()
    for diff in diffs:
        data = diff if isinstance(diff, bytes) else diff.read_bytes()
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


def read_hashes(folder: Path) -> dict[str, dict[str, dict[str, FileHashes]]]:
    """A set's hashes.json: SGLang version → the digest of the diffs it was made from →
    each file's hashes. A set without one has none (its files are judged hunk by hunk)."""
    source = folder / HASHES_FILE
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise PatchError(f"{source}: malformed JSON: {exc}", hint=REGENERATE_HASHES) from None
    found: dict[str, dict[str, dict[str, FileHashes]]] = {}
    try:
        for version, entry in data["variants"].items():
            files = {
                str(path): FileHashes(sums["original"], sums["patched"])
                for path, sums in entry["files"].items()
            }
            found[str(version)] = {str(entry["diffs_sha256"]): files}
    except (KeyError, TypeError, AttributeError) as exc:
        raise PatchError(
            f"{source}: not a hashes file (missing or wrong {exc})", hint=REGENERATE_HASHES
        ) from None
    return found


def hashes_document(variants: Mapping[str, tuple[str, Mapping[str, FileHashes]]]) -> str:
    """hashes.json's text: SGLang version → (the digest of its diffs, each file's hashes)."""
    body = {
        version: {
            "diffs_sha256": digest,
            "files": {
                path: {"original": sums.original, "patched": sums.patched}
                for path, sums in sorted(files.items())
            },
        }
        for version, (digest, files) in sorted(variants.items(), key=lambda v: version_key(v[0]))
    }
    document = {"about": HASHES_ABOUT, "variants": body}
    return json.dumps(document, indent=2) + "\n"


def file_hashes(
    pristine: Mapping[str, bytes | None], patched: Mapping[str, bytes | None]
) -> dict[str, FileHashes]:
    """Each file's hashes from its bytes in the release and with the set applied."""
    return {
        path: FileHashes(_sha(pristine.get(path)), _sha(data)) for path, data in patched.items()
    }


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


REGENERATE_HASHES = "regenerate it: scripts/patch-hashes --write"
HASHES_ABOUT = (
    "Each file a variant's diffs touch: its sha256 in SGLang's own wheel of that release "
    "(original) and with only this set applied (patched); null: no such file. The audit "
    "judges the files on a host by them. Generated from the diffs and the wheels by "
    "scripts/patch-hashes; used only while diffs_sha256 matches "
    "the variant's diffs."
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
    return {name: load_patch_set(folder) for name, folder in patch_set_folders(search_dirs).items()}


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
