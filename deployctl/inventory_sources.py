"""Reading inventory sources the way Ansible does: YAML, INI, script-format JSON, folders of
sources, several `-i`, and dynamic sources (scripts, plugin configs) through `ansible-inventory`.

Every reader fills one `InventoryData` (Ansible's in-memory inventory: groups in creation
order, each with its vars, direct hosts and child groups; hosts with their inline vars);
`deployctl.inventory.build` then merges variables in Ansible's precedence.
"""

from __future__ import annotations

import ast
import io
import itertools
import json
import math
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployctl.errors import InventoryError
from deployctl.text import fast_safe_loader, is_number

ANSIBLE_EXTRA = "pip install 'deployctl[ansible]'"
# What Ansible skips in a folder used as an inventory (INVENTORY_IGNORE_EXTS and always-ignored names).
IGNORED_EXTENSIONS = (
    ".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry",
)  # fmt: skip
IGNORED_NAMES = {"host_vars", "group_vars", "vars_plugins"}
VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")
YAML_EXTENSIONS = (".yml", ".yaml", ".json")
_SECTION_KEYS = {"hosts", "vars", "children"}
# `host:22`, `gpu[01:04]:22`, `[::1]:22`; an unbracketed IPv6 address has no port.
_HOST_PORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])+):(\d+)\Z")
_BRACKETED_PORT = re.compile(r"^\[([^\]]+)\]:(\d+)\Z")
_INI_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_INI_GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")
DYNAMIC_TIMEOUT = 300.0  # seconds; $DEPLOYCTL_INVENTORY_TIMEOUT sets it
MAX_HOST_RANGE = 100_000  # names one host pattern may expand to


@dataclass
class Group:
    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    hosts: dict[str, None] = field(default_factory=dict)  # direct members, an ordered set
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Vaulted:
    """A value encrypted with ansible-vault, decrypted once every source is read."""

    ciphertext: str
    where: str


@dataclass
class VaultOptions:
    """Ansible's own vault options, passed through to ansible-vault and ansible-inventory."""

    password_files: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        words: list[str] = []
        for path in self.password_files:
            words += ["--vault-password-file", path]
        for vault_id in self.ids:
            words += ["--vault-id", vault_id]
        return words


class InventoryData:
    """Groups and hosts as the sources declare them, before variables are merged."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.groups: dict[str, Group] = {"all": Group("all"), "ungrouped": Group("ungrouped")}
        self.add_child("all", "ungrouped")
        self.host_vars: dict[str, dict[str, Any]] = {}  # inline vars; its order is the hosts'
        self.vars_dirs: list[Path] = []  # where group_vars/ and host_vars/ are looked for
        self.current: Path | None = None  # the file being read
        self.origin: dict[str, Path] = {}  # the file that first named each host

    def add_group(self, name: str) -> Group:
        if not isinstance(name, str) or not name:
            raise InventoryError(f"{self.source}: invalid group name {name!r}")
        return self.groups.setdefault(name, Group(name))

    def add_child(self, parent: str, child: str) -> None:
        if child == "all":
            raise InventoryError(f"{self.source}: 'all' cannot be a child group of {parent!r}")
        upper, lower = self.add_group(parent), self.add_group(child)
        if parent in lower.parents:  # a group has few parents; a parent may have thousands
            return
        if child == parent or parent in self.descendants(child):
            raise InventoryError(
                f"{self.source}: adding group {child!r} as child to {parent!r} "
                "creates a recursive dependency loop"
            )
        upper.children.append(child)
        lower.parents.append(parent)

    def descendants(self, name: str) -> list[str]:
        """Child groups breadth first, each once, in declaration order."""
        found: dict[str, None] = {}
        level = self.groups[name].children
        while level:
            fresh = [g for g in level if g not in found and g != name]
            found.update(dict.fromkeys(fresh))
            level = [c for g in fresh for c in self.groups[g].children]
        return list(found)

    def add_host(
        self, name: str, group: str | None, variables: dict[str, Any], port: int | None = None
    ) -> None:
        """Add a host (or more of it); a `host:port` entry's port counts only where the host
        is first named, and the entry's own `ansible_port` wins over it, as in Ansible."""
        if not isinstance(name, str) or not name:
            raise InventoryError(f"{self.source}: invalid host name {name!r}")
        if name not in self.host_vars:
            self.host_vars[name] = {} if port is None else {"ansible_port": port}
            if self.current is not None:
                self.origin[name] = self.current
        self.host_vars[name].update(variables)
        if group is not None:
            self.add_group(group).hosts[name] = None

    def reconcile(self) -> None:
        """Ansible's last step: every group under `all`, hosts in no group in `ungrouped`."""
        for name, group in self.groups.items():
            if name != "all" and not group.parents:
                self.add_child("all", name)
        grouped = {
            h for n, g in self.groups.items() if n not in ("all", "ungrouped") for h in g.hosts
        }
        ungrouped = self.groups["ungrouped"].hosts
        for host in self.host_vars:
            if host in grouped:
                ungrouped.pop(host, None)
            else:
                ungrouped[host] = None


# ---- host names: ports and ranges ------------------------------------------------------------


def host_pattern(pattern: str, source: str) -> tuple[list[str], int | None]:
    """The hosts a host entry names and the port it gives them: `gpu[01:04]:2222`."""
    text = pattern.strip()
    port: int | None = None
    for form in (_BRACKETED_PORT, _HOST_PORT):
        match = form.match(text)
        if match:
            text, port = match.group(1), int(match.group(2))
            break
    if port is None and text.endswith(":") and not text.endswith("::"):
        raise InventoryError(
            f"{source}: invalid host pattern {pattern!r}: ending in ':' is not allowed, "
            "this character is reserved to provide a port"
        )
    try:
        names = expand_host_range(text)
    except InventoryError as exc:
        raise InventoryError(f"{source}: {exc.message}", hint=exc.hint) from None
    if "---" in names:
        raise InventoryError(f"{source}: invalid host pattern {pattern!r}: is this a YAML file?")
    return names, port


def expand_host_range(name: str) -> list[str]:
    """Expand Ansible host ranges: gpu[01:08], node[a:c], h[1:9:2]; at most MAX_HOST_RANGE
    names, counted before any is made (`h[0:99999999]` is a typo, not a fleet)."""
    parts: list[str] = []  # text, then each range's items, in turn
    choices: list[list[str] | range] = []
    widths: list[int] = []
    rest = name
    while "[" in rest:  # Ansible takes the first `[` and the first `]`, wherever that is
        opening, closing = rest.index("["), rest.find("]")
        if closing < opening:
            what = "with no ']' after it" if closing == -1 else "after a ']'"
            raise InventoryError(
                f"host pattern {name!r} has a '[' {what}",
                hint="a host range is [begin:end] (gpu[01:08]); an INI section is [group]",
            )
        items, width = _range_items(name, rest[opening + 1 : closing])
        parts.append(rest[:opening])
        choices.append(items)
        widths.append(width)
        rest = rest[closing + 1 :]
    count = 1
    for items in choices:  # len() of a range past sys.maxsize overflows; this does not
        count *= (
            (items.stop - items.start - 1) // items.step + 1
            if isinstance(items, range)
            else len(items)
        )
    if count > MAX_HOST_RANGE:
        raise InventoryError(
            f"host range {name!r} names {count} hosts, more than {MAX_HOST_RANGE}",
            hint="check the range's bounds; split a larger fleet over several patterns",
        )
    texts = [
        [str(i).zfill(w) for i in items] if isinstance(items, range) else items
        for items, w in zip(choices, widths, strict=True)
    ]
    return [
        "".join(p + item for p, item in zip(parts, picked, strict=True)) + rest
        for picked in itertools.product(*texts)
    ]


def _range_items(name: str, inside: str) -> tuple[list[str] | range, int]:
    """One range's items (numbers as a `range`, not yet made) and their zero-padded width."""
    bounds = inside.split(":")
    if len(bounds) not in (2, 3):
        raise InventoryError(f"host range {name!r} must be begin:end or begin:end:step")
    start, end = bounds[0] or "0", bounds[1]
    if not end:  # Ansible refuses `gpu[01:]`; it reads `gpu[:3]` as gpu0 to gpu3
        raise InventoryError(f"host range {name!r} has no end")
    stride_text = bounds[2] if len(bounds) == 3 else "1"
    if not is_number(stride_text) or int(stride_text) < 1:
        raise InventoryError(f"host range {name!r} has a step that is not a positive number")
    stride = int(stride_text)
    if is_number(start) and is_number(end):
        width = len(start) if start.startswith("0") and len(start) > 1 else 0
        if width and len(end) != width:
            raise InventoryError(f"host range {name!r} must give begin and end the same width")
        if int(end) < int(start):
            raise InventoryError(f"host range {name!r} is reversed (begin > end)")
        return range(int(start), int(end) + 1, stride), width
    if len(start) == 1 and len(end) == 1 and start.isalpha() and end.isalpha():
        letters = string.ascii_letters
        lo, hi = letters.index(start), letters.index(end)
        if hi < lo:
            raise InventoryError(f"host range {name!r} is reversed (begin > end)")
        return list(letters[lo : hi + 1 : stride]), 0
    raise InventoryError(f"host range {name!r} mixes letters and numbers or is not a single letter")


# ---- YAML ------------------------------------------------------------------------------------


class _InventoryLoader(fast_safe_loader()):  # type: ignore[misc]
    """SafeLoader that refuses a key given twice in one mapping (the last would silently win,
    dropping the first's hosts) and reads Ansible's `!vault` and `!unsafe` tags."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool, type(None))):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be text, not {type(key).__name__}", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


class Unsafe(str):
    """A string Ansible never templates (`!unsafe`)."""


class VaultedText(str):
    """A decrypted vaulted value: shown masked wherever secrets are (`hosts`, `render`)."""


_TEMPLATE_MARKERS = ("{{", "{%", "{#")


def is_templated(value: Any) -> bool:
    """Tell whether a value holds a template anywhere inside it (`!unsafe` text never does)."""
    if isinstance(value, str):
        return not isinstance(value, Unsafe) and any(m in value for m in _TEMPLATE_MARKERS)
    if isinstance(value, dict):
        return any(is_templated(v) for v in value.values())
    if isinstance(value, list):
        return any(is_templated(v) for v in value)
    return False


def _vault(loader: yaml.SafeLoader, node: yaml.Node) -> Vaulted:
    return Vaulted(str(loader.construct_scalar(node)), str(node.start_mark.name))  # type: ignore[arg-type]


def _unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Unsafe:
    return Unsafe(loader.construct_scalar(node))  # type: ignore[arg-type]


_InventoryLoader.add_constructor("!vault", _vault)
_InventoryLoader.add_constructor("!unsafe", _unsafe)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{path} is not UTF-8 text") from exc
    except OSError as exc:
        raise InventoryError(f"cannot read {path}: {exc.strerror}") from exc


def parse_yaml(text: str, where: str) -> Any:
    stream = io.StringIO(text)
    stream.name = where  # marks, and so vaulted values, name the file
    loader = _InventoryLoader(stream)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        if "nesting depth" in problem:  # libyaml's limit; the Python parser's is a RecursionError
            raise InventoryError(f"{where}: groups or values are nested too deeply") from None
        raise InventoryError(f"{where}:{line}: malformed YAML: {problem}") from exc
    finally:
        loader.dispose()


def as_mapping(value: Any, where: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InventoryError(
            f"{source}: {where} must be a mapping, not {type(value).__name__}",
            hint="inventories use Ansible's YAML format: all: {hosts: {...}, children: {...}, vars: {...}}",
        )
    for key in value:
        if not isinstance(key, str):
            raise InventoryError(f"{source}: {where} has a non-string key {key!r}")
    return value


def read_yaml_inventory(data: InventoryData, top: dict[str, Any], source: str) -> None:
    """Ansible's YAML format: `group: {hosts: {...}, vars: {...}, children: {...}}`."""
    for name, body in top.items():
        _yaml_group(data, name, body, name, source)


def _yaml_group(data: InventoryData, name: str, body: Any, where: str, source: str) -> None:
    body = as_mapping(body, where, source)
    unknown = set(body) - _SECTION_KEYS
    if unknown:
        raise InventoryError(
            f"{source}: {where} has unknown key(s) {', '.join(sorted(unknown))}",
            hint="a group holds only hosts:, vars: and children:",
        )
    group = data.add_group(name)
    group.vars.update(as_mapping(body.get("vars"), f"{where}.vars", source))
    hosts = as_mapping(body.get("hosts"), f"{where}.hosts", source)
    for pattern, host_body in hosts.items():
        variables = as_mapping(host_body, f"{where}.hosts.{pattern}", source)
        names, port = host_pattern(pattern, source)
        for host in names:
            data.add_host(host, name, variables, port)
    children = as_mapping(body.get("children"), f"{where}.children", source)
    for child, child_body in children.items():
        data.add_child(name, child)
        _yaml_group(data, child, child_body, f"{where}.children.{child}", source)


# ---- INI -------------------------------------------------------------------------------------


def read_ini_inventory(data: InventoryData, text: str, source: str) -> None:
    """Ansible's INI format, with its rules for sections, host lines and value types."""
    group, state = "ungrouped", "hosts"
    pending: dict[str, tuple[int, str, list[str]]] = {}  # group -> (line, state, parents)
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        where = f"{source}:{number}"
        section = _INI_SECTION.match(line)
        if section:
            group, state = section.group(1), section.group(2) or "hosts"
            if state not in ("hosts", "children", "vars"):
                raise InventoryError(
                    f"{where}: section [{group}:{state}] has unknown type {state!r}"
                )
            if group not in data.groups and state == "vars" and group not in pending:
                pending[group] = (number, "vars", [])
            data.add_group(group)
            if group in pending and state != "vars":
                _declare_pending(data, group, pending)
            continue
        if line.startswith("[") and line.endswith("]"):
            raise InventoryError(
                f"{where}: invalid section entry {line!r}",
                hint="a section is [group], [group:vars] or [group:children], with no spaces",
            )
        if state == "hosts":
            _ini_host_line(data, group, line, where)
        elif state == "vars":
            key, eq, value = line.partition("=")
            if not eq:
                raise InventoryError(f"{where}: expected key=value, got {line!r}")
            data.add_group(group).vars[key.strip()] = ini_value(value.strip())
        else:
            child_match = _INI_GROUP_NAME.match(line)
            if child_match is None:
                raise InventoryError(f"{where}: expected a group name, got {line!r}")
            child = child_match.group(1)
            if child in data.groups:
                data.add_child(group, child)
            elif child in pending:
                pending[child][2].append(group)
            else:
                pending[child] = (number, "children", [group])
    for name, (number, state, parents) in pending.items():
        if state == "vars":
            raise InventoryError(
                f"{source}:{number}: section [{name}:vars] is not valid for undefined group {name!r}"
            )
        raise InventoryError(
            f"{source}:{number}: section [{parents[-1]}:children] includes undefined group {name!r}"
        )


def _declare_pending(
    data: InventoryData, group: str, pending: dict[str, tuple[int, str, list[str]]]
) -> None:
    _, _, parents = pending.pop(group)
    for parent in parents:
        data.add_child(parent, group)
        if parent in pending and pending[parent][1] == "children":
            _declare_pending(data, parent, pending)


def _ini_host_line(data: InventoryData, group: str, line: str, where: str) -> None:
    try:
        words = shlex.split(line, comments=True)
    except ValueError as exc:
        raise InventoryError(f"{where}: cannot parse host line {line!r}: {exc}") from None
    names, port = host_pattern(words[0], where)
    variables: dict[str, Any] = {}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq:
            raise InventoryError(f"{where}: expected key=value host variable, got {word!r}")
        variables[key] = ini_value(value)
    for host in names:
        data.add_host(host, group, variables, port)


def ini_value(text: str) -> Any:
    """An INI value typed as Ansible types it: a Python literal where it is one, else text."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return _plain(value)


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: _plain(v) for k, v in value.items()}
    if value is ... or isinstance(value, complex):
        return str(value) if value is not ... else "..."
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


# ---- script-format JSON (what ansible-inventory --list and inventory scripts print) ---------


def is_script_json(top: dict[str, Any]) -> bool:
    """Tell the script format (`hosts` lists) from Ansible's YAML format."""
    return any(
        isinstance(body, list) or (isinstance(body, dict) and isinstance(body.get("hosts"), list))
        for body in top.values()
    )


def read_script_json(data: InventoryData, top: dict[str, Any], source: str) -> None:
    meta = as_mapping(top.get("_meta"), "_meta", source)
    for name, raw in top.items():
        if name == "_meta":
            continue
        body = as_mapping({"hosts": raw} if isinstance(raw, list) else raw, name, source)
        group = data.add_group(name)
        hosts = body.get("hosts") or []
        if not isinstance(hosts, list):
            raise InventoryError(f"{source}: {name}.hosts must be a list of host names")
        for host in hosts:
            data.add_host(str(host), name, {})
        group.vars.update(as_mapping(body.get("vars"), f"{name}.vars", source))
        for child in body.get("children") or []:
            data.add_child(name, str(child))
    hostvars = as_mapping(meta.get("hostvars"), "_meta.hostvars", source)
    for host, variables in hostvars.items():
        data.add_host(host, None, as_mapping(variables, f"_meta.hostvars.{host}", source))


def from_json_vault(value: Any, where: str) -> Any:
    """Turn ansible-inventory's `{"__ansible_vault": ...}` back into a `Vaulted` value."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_vault"}:
            return Vaulted(str(value["__ansible_vault"]), where)
        return {k: from_json_vault(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_vault(v, where) for v in value]
    return value


# ---- sources: files, folders, dynamic --------------------------------------------------------


def read_sources(paths: Iterable[Path], vault: VaultOptions, dynamic: bool = True) -> InventoryData:
    """Read every source in order into one inventory, as Ansible merges several `-i`;
    `dynamic=False` skips scripts and plugin configs (nothing is run: shell completion)."""
    sources = list(paths)
    data = InventoryData(", ".join(str(p) for p in sources))
    for path in sources:
        if not path.exists() and "," in str(path):
            for name in filter(None, (n.strip() for n in str(path).split(","))):
                names, port = host_pattern(name, "host list")
                for host in names:
                    data.add_host(host, None, {}, port)
            continue  # Ansible's host list, `-i 'h1,h2'`: hosts in no group, no vars folders
        if not path.exists():
            raise InventoryError(f"inventory {path} does not exist")
        data.vars_dirs.append(path if path.is_dir() else path.parent)
        _read_source(data, path, vault, True, dynamic)
    data.reconcile()
    return data


def _read_source(
    data: InventoryData, path: Path, vault: VaultOptions, top_level: bool, dynamic: bool
) -> None:
    if path.is_dir():
        files = list(_folder_entries(path))
        if top_level and not files:
            raise InventoryError(
                f"inventory folder {path} holds no inventory file",
                hint="a folder inventory holds YAML, INI or JSON inventories, or scripts",
            )
        for entry in files:
            _read_source(data, entry, vault, False, dynamic)
        return
    data.current = path
    if _is_script(path):
        if dynamic:
            _read_dynamic(data, path, vault, "script")
        return
    text = read_text(path)
    source = str(path)
    if path.suffix == ".ini":
        read_ini_inventory(data, text, source)
        return
    parsed = _yaml_or_none(text, source, strict=path.suffix in YAML_EXTENSIONS)
    if _only_comments(text):
        raise InventoryError(f"{source} is empty", hint="start it with `all:` and `hosts:`")
    if isinstance(parsed, dict) and "plugin" in parsed and path.suffix in (".yml", ".yaml"):
        if dynamic:
            _read_dynamic(data, path, vault, "auto")
    elif isinstance(parsed, dict):
        top = as_mapping(from_json_vault(parsed, source), "the top level", source)
        # Script-format JSON: what inventory scripts and `ansible-inventory --list` print.
        if "_meta" in top or (path.suffix == ".json" and is_script_json(top)):
            read_script_json(data, top, source)
        else:
            read_yaml_inventory(data, top, source)
    elif path.suffix in YAML_EXTENSIONS:
        as_mapping(parsed, "the top level", source)  # says what it is instead
    else:
        read_ini_inventory(data, text, source)


def _only_comments(text: str) -> bool:
    """Empty, or nothing but blank lines and comments."""
    return all(not ln.strip() or ln.lstrip().startswith(("#", ";")) for ln in text.splitlines())


def _yaml_or_none(text: str, source: str, strict: bool) -> Any:
    """The parsed YAML of a file that may be YAML or INI (no telling extension)."""
    try:
        return parse_yaml(text, source)
    except InventoryError:
        if strict:
            raise
        return None


def _listing(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError as exc:
        raise InventoryError(f"cannot read {folder}: {exc.strerror}") from None


def _folder_entries(folder: Path) -> Iterator[Path]:
    """A folder's inventory sources, sorted, skipping what Ansible skips."""
    for name in _listing(folder):
        if name.startswith(".") or name in IGNORED_NAMES or name.endswith(IGNORED_EXTENSIONS):
            continue
        yield folder / name


def _is_script(path: Path) -> bool:
    if not os.access(path, os.X_OK):
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def ansible_tool(name: str, purpose: str) -> str:
    """The path of one of ansible-core's programs, preferring deployctl's own environment."""
    here = str(Path(sys.executable).parent)
    found = shutil.which(name, path=os.pathsep.join([here, os.environ.get("PATH", "")]))
    if found is None:
        raise InventoryError(f"{purpose} needs ansible-core: {ANSIBLE_EXTRA}")
    return found


def dynamic_timeout() -> float:
    """Seconds an Ansible tool may take: $DEPLOYCTL_INVENTORY_TIMEOUT, else DYNAMIC_TIMEOUT."""
    text = os.environ.get("DEPLOYCTL_INVENTORY_TIMEOUT")
    if text is None:
        return DYNAMIC_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise InventoryError(
            f"$DEPLOYCTL_INVENTORY_TIMEOUT is {text!r}, not a number of seconds above 0",
            hint=f"e.g. DEPLOYCTL_INVENTORY_TIMEOUT=600, or unset it ({DYNAMIC_TIMEOUT:.0f} s)",
        )
    return seconds


def _run_ansible(
    argv: list[str], what: str, stdin: str | None = None, plugin: str | None = None
) -> str:
    """Run an Ansible tool; its failure is one line: `plugin`'s own message where it gave one."""
    timeout = dynamic_timeout()
    # A source no plugin parses fails (Ansible would warn and go on with no hosts at all).
    env = {**os.environ, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True"}
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout, env=env,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InventoryError(
            f"{what}: no answer in {timeout:g}s",
            hint="set $DEPLOYCTL_INVENTORY_TIMEOUT (seconds) to wait longer",
        ) from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        marker = f"Failed to parse inventory with '{plugin}' plugin: "
        own = [ln.split(marker, 1)[1] for ln in lines if plugin and marker in ln]
        errors = (
            own or [ln for ln in lines if "ERROR" in ln] or lines or [f"exit {done.returncode}"]
        )
        raise InventoryError(f"{what} failed: {errors[0]}")
    return done.stdout


def _read_dynamic(data: InventoryData, path: Path, vault: VaultOptions, plugin: str) -> None:
    """A script or plugin config, resolved by Ansible itself into script-format JSON
    (`--export` keeps group vars with their groups, so their precedence holds); `plugin`:
    Ansible's plugin for it, whose error is the one to show."""
    tool = ansible_tool("ansible-inventory", f"dynamic inventory {path}")
    output = _run_ansible(
        [tool, "-i", str(path), "--list", "--export", *vault.argv()],
        f"ansible-inventory -i {path}",
        plugin=plugin,
    )
    try:
        top = json.loads(output)
    except ValueError:
        raise InventoryError(f"ansible-inventory -i {path} printed no JSON") from None
    read_script_json(
        data, from_json_vault(as_mapping(top, "its output", str(path)), str(path)), str(path)
    )


# ---- group_vars/ and host_vars/ ----------------------------------------------------------------


class VarsFolder:
    """One `group_vars/` or `host_vars/` folder, listed once: name -> its files in load order."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, list[Path]] = {}
        self._read: dict[Path, tuple[str, bool, Any]] = {}  # text, vaulted, parsed (if plain)
        names = _listing(folder) if folder.is_dir() else []
        stems: dict[str, None] = {}
        for name in names:
            for ext in VARS_EXTENSIONS[1:]:
                if name.endswith(ext):
                    stems[name[: -len(ext)]] = None
            stems[name] = None
        for stem in stems:
            found = list(self._files_of(stem))
            if found:
                self.files[stem] = found

    def _files_of(self, name: str) -> Iterator[Path]:
        """The first of `name`, `name.yml`, `name.yaml`, `name.json` there is, as Ansible
        reads them: a file, or a folder read recursively."""
        for ext in VARS_EXTENSIONS:
            candidate = self.folder / f"{name}{ext}"
            if candidate.is_dir():
                yield from _vars_folder_files(candidate)
                return
            if candidate.is_file():
                yield candidate
                return

    def _file(self, path: Path) -> tuple[str, bool, Any]:
        """A file's text, whether it is vault-encrypted as a whole, and (if not) its YAML;
        read once, though both `vaulted` and `load` ask."""
        if path not in self._read:
            text = read_text(path)
            vaulted = text.lstrip().startswith("$ANSIBLE_VAULT")
            self._read[path] = (text, vaulted, None if vaulted else parse_yaml(text, str(path)))
        return self._read[path]

    def vaulted(
        self, names: Iterable[str], files: dict[str, Vaulted], values: dict[str, Vaulted]
    ) -> None:
        """Add what the files of `names` hold encrypted to `files` (whole files) and `values`
        (`!vault` values), keyed by ciphertext, so that one ansible-vault call decrypts all."""
        for name in names:
            for path in self.files.get(name, ()):
                text, vaulted, parsed = self._file(path)
                if vaulted:
                    files.setdefault(text, Vaulted(text, str(path)))
                else:
                    collect_vaulted(parsed, values)

    def plain(self, name: str) -> Iterator[Any]:
        """What the files of `name` hold, as parsed; a file encrypted as a whole is left out,
        never decrypted (shell completion reads names only)."""
        for path in self.files.get(name, ()):
            _, vaulted, parsed = self._file(path)
            if not vaulted:
                yield parsed

    def load(self, name: str, vault: Vaults) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for path in self.files.get(name, ()):
            text, vaulted, parsed = self._file(path)
            if vaulted:
                parsed = parse_yaml(vault.decrypt_text(text, str(path)), str(path))
            found = as_mapping(parsed, "the file", str(path))
            merged.update(_as_secret(found) if vaulted else found)
        return merged


def collect_vaulted(value: Any, found: dict[str, Vaulted]) -> None:
    """Add every vaulted value in `value` (nested in mappings and lists) to `found`, keyed by
    its ciphertext: each distinct one is decrypted once."""
    if isinstance(value, Vaulted):
        found.setdefault(value.ciphertext, value)
    elif isinstance(value, dict):
        for item in value.values():
            collect_vaulted(item, found)
    elif isinstance(value, list):
        for item in value:
            collect_vaulted(item, found)


def _vars_folder_files(folder: Path) -> Iterator[Path]:
    for name in _listing(folder):
        if name.startswith(".") or name.endswith("~"):
            continue
        path = folder / name
        ext = os.path.splitext(name)[1]
        if path.is_dir() and not ext:
            yield from _vars_folder_files(path)
        elif path.is_file() and (not ext or ext in YAML_EXTENSIONS):
            yield path


def _as_secret(value: Any) -> Any:
    """Every text in a vaulted file is as secret as a `!vault` value."""
    if isinstance(value, str):
        return VaultedText(value)
    if isinstance(value, dict):
        return {k: _as_secret(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_secret(v) for v in value]
    return value


# ---- vault -----------------------------------------------------------------------------------


class Vaults:
    """Decrypts vaulted values with Ansible's own ansible-vault, all in one call: each call
    costs ~0.6 s of CPU (Ansible's import), so an inventory's encrypted files and values are
    decrypted together (`decrypt_all` of everything first) and kept."""

    def __init__(self, options: VaultOptions) -> None:
        self.options = options
        self._plain: dict[str, str] = {}  # ciphertext -> its plain text

    def decrypt_text(self, ciphertext: str, where: str) -> str:
        return self.decrypt_all([Vaulted(ciphertext, where)])[0]

    def decrypt_all(self, values: list[Vaulted]) -> list[str]:
        unknown = {v.ciphertext: v for v in values if v.ciphertext not in self._plain}
        if unknown:
            plain = self._decrypt(list(unknown.values()))
            self._plain.update(zip(unknown, plain, strict=True))
        return [self._plain[v.ciphertext] for v in values]

    def _decrypt(self, values: list[Vaulted]) -> list[str]:
        tool = ansible_tool("ansible-vault", f"the vaulted value in {values[0].where}")
        if not self.options.password_files and not self.options.ids:
            raise InventoryError(
                f"{values[0].where} holds vault-encrypted values",
                hint="pass --vault-password-file FILE or --vault-id ID@SOURCE",
            )
        with tempfile.TemporaryDirectory(prefix="deployctl-vault-") as scratch:
            files = []
            for i, value in enumerate(values):
                path = Path(scratch) / str(i)
                path.write_text(value.ciphertext.strip() + "\n", encoding="utf-8")
                files.append(str(path))
            _run_ansible(
                [tool, "decrypt", *self.options.argv(), *files],
                f"ansible-vault decrypt ({values[0].where})",
            )
            return [VaultedText(Path(f).read_text(encoding="utf-8")) for f in files]
