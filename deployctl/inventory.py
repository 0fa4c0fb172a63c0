"""Ansible-format YAML inventories: groups, ranges, variable precedence, host patterns."""

from __future__ import annotations

import fnmatch
import ipaddress
import math
import os
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployctl.errors import InventoryError
from deployctl.text import is_number

# deployctl's own settings, below every inventory level.
DEFAULT_VARS: dict[str, Any] = {
    "python": "python3",
    "launch_module": "sglang.launch_server",
    "log_dir": "~/deployctl/logs",
    "state_dir": "~/.deployctl",
    "port": 30000,
    "bind_host": "127.0.0.1",
    "tp": 8,
}
CONNECTION_TYPES = ("ssh", "local")
LOCALHOST = "localhost"
_SECRET_WORDS = {
    "token",
    "pass",
    "password",
    "passwords",
    "passwd",
    "passphrase",
    "secret",
    "secrets",
    "apikey",
    "credential",
    "credentials",
}
# `api_key`, `api-key`, `wandb_key`, `HF_KEY`: a name whose last word is "key" holds one;
# `ssh_key_file`, `key_path` name where one is.
_KEY_NAME = re.compile(r"(?:^|[_\-.])key\Z", re.IGNORECASE)
# The shortest value masked: shorter ones would mask innocent parts of a command.
_MIN_SECRET = 4
MASK = "********"
_RANGE = re.compile(r"\[([^\]:]*):([^\]:]*)(?::(\d+))?\]")
_SECTION_KEYS = {"hosts", "vars", "children"}


def is_secret_name(name: str) -> bool:
    """Tell whether a variable name looks like it holds a secret."""
    words = set(re.split(r"[_\-.]", name.lower()))
    # "tokens" alone is a list of them; `max_tokens` and `num_draft_tokens` are counts.
    whole = name.lower() == "tokens"
    return whole or bool(words & _SECRET_WORDS) or bool(_KEY_NAME.search(name))


def flag_secrets(words: Sequence[Any]) -> list[str]:
    """The values that follow secret-looking flags in argv-like words.

    `["--api-key", "sk-1"]` and `["--hf-token=hf_2"]` give "sk-1" and "hf_2".
    """
    found = []
    for i, word in enumerate(words):
        text = str(word)
        if not text.startswith("-"):
            continue
        name, eq, value = text.lstrip("-").partition("=")
        if not is_secret_name(name):
            continue
        if eq:
            found.append(value)
        elif i + 1 < len(words) and not str(words[i + 1]).startswith("-"):
            found.append(str(words[i + 1]))
    return [v for v in found if len(v) >= _MIN_SECRET]


def mask_secrets(variables: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy with secret-looking variables masked, in nested mappings too."""
    return {k: _masked(str(k), v) for k, v in variables.items()}


def _masked(name: str, value: Any) -> Any:
    if is_secret_name(name) and value not in (None, ""):
        return MASK
    if isinstance(value, Mapping):
        return mask_secrets(value)
    if isinstance(value, list):
        hidden = sorted(set(flag_secrets(value)), key=len, reverse=True)  # ["--api-key", "sk-1"]
        return [mask_values(v, hidden) if isinstance(v, str) else _masked(name, v) for v in value]
    return value


def mask_values(text: str, secrets: Sequence[str]) -> str:
    """Replace every secret value inside `text` with the mask (longest secrets first)."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def secret_values(variables: Mapping[str, Any]) -> tuple[str, ...]:
    """Return the values held under secret-looking names at any depth, longest first."""
    found: set[str] = set()

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, secret or is_secret_name(str(key)))
        elif isinstance(value, list):
            found.update(flag_secrets(value))
            for item in value:
                walk(item, secret)
        elif (
            secret and not isinstance(value, (bool, type(None))) and len(str(value)) >= _MIN_SECRET
        ):
            found.add(str(value))

    walk(variables, False)
    return tuple(sorted(found, key=lambda v: (-len(v), v)))


@dataclass(frozen=True)
class Host:
    """One inventory host with its merged variables; with `deployment`, one server on it
    (see deployments.py), whose variables are the host's with the deployment's over them."""

    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    deployment: str | None = None

    @property
    def label(self) -> str:
        """How results name it: the host, or `host/deployment`."""
        return self.name if self.deployment is None else f"{self.name}/{self.deployment}"

    @property
    def connection(self) -> str:
        return str(self.vars.get("ansible_connection", "ssh"))

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host", self.name))

    @property
    def port(self) -> int | None:
        port = self.vars.get("ansible_port")
        return None if port is None else int(port)

    @property
    def user(self) -> str | None:
        user = self.vars.get("ansible_user")
        return None if user is None else str(user)

    @property
    def key_file(self) -> str | None:
        key = self.vars.get("ansible_ssh_private_key_file")
        return None if key is None else os.path.expanduser(str(key))

    def describe(self) -> dict[str, Any]:
        """Return the JSON shape of `deployctl hosts`, secrets masked."""
        return {
            "address": self.address,
            "port": self.port if self.port is not None else (None if self.is_local else 22),
            "user": self.user,
            "connection": self.connection,
            "vars": mask_secrets(self.vars),
        }

    @property
    def is_local(self) -> bool:
        return self.connection == "local"


@dataclass
class _Group:
    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    hosts: dict[str, None] = field(default_factory=dict)  # an ordered set
    children: list[str] = field(default_factory=list)
    parents: set[str] = field(default_factory=set)


@dataclass
class Inventory:
    """Hosts in inventory order, and group membership for patterns."""

    hosts: dict[str, Host]
    groups: dict[str, list[str]]
    source: str

    def select(self, pattern: str | None) -> list[Host]:
        """Return hosts matching an Ansible-style pattern; error when none match."""
        pattern = "all" if pattern is None else pattern.strip()
        terms = split_pattern(pattern)
        if not terms:
            # `-H "$UNSET"` must not mean the whole fleet: that takes `all` or `*`.
            raise InventoryError(
                f"empty host pattern {pattern!r}",
                hint="name hosts or groups; select every host with -H all",
            )
        positives = [t for t in terms if not t.startswith(("!", "&"))]
        selected = set(self.hosts) if not positives else set()
        for term in positives:
            selected |= self._match_term(term, pattern)
        for term in terms:
            if term.startswith("!"):
                selected -= self._match_term(term[1:], pattern)
            elif term.startswith("&"):
                selected &= self._match_term(term[1:], pattern)
        chosen = [host for name, host in self.hosts.items() if name in selected]
        if not chosen:
            raise InventoryError(
                f"host pattern {pattern!r} matches no host in {self.source}",
                hint="see the hosts and groups with `deployctl hosts`",
            )
        return chosen

    def _match_term(self, term: str, pattern: str) -> set[str]:
        if term in ("all", "*"):
            return set(self.hosts)
        if term in self.groups:
            return set(self.groups[term])
        if term in self.hosts:
            return {term}
        if any(ch in term for ch in "*?["):
            hosts = {h for h in self.hosts if fnmatch.fnmatchcase(h, term)}
            for group in fnmatch.filter(self.groups, term):
                hosts |= set(self.groups[group])
            if hosts:
                return hosts
        raise InventoryError(
            f"host pattern {pattern!r}: no host or group named {term!r} in {self.source}",
            hint="see the hosts and groups with `deployctl hosts`",
        )


def split_pattern(pattern: str) -> list[str]:
    """Split a host pattern into terms on commas and colons; an IPv6 address stays whole."""
    terms: list[str] = []
    for part in (p.strip() for p in pattern.split(",")):
        if _is_ipv6(part.lstrip("!&")):
            terms.append(part)
        else:
            terms += [t.strip() for t in part.split(":") if t.strip()]
    return terms


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def builtin_inventory() -> Inventory:
    """Return the fallback inventory: this machine through the local connection."""
    host = Host(LOCALHOST, {**DEFAULT_VARS, "ansible_connection": "local"})
    return Inventory({LOCALHOST: host}, {"all": [LOCALHOST], "ungrouped": [LOCALHOST]}, "built-in")


def expand_host_range(name: str) -> list[str]:
    """Expand Ansible host ranges: gpu[01:08], node[a:c], h[1:9:2]."""
    match = _RANGE.search(name)
    if match is None:
        return [name]
    start, end, stride_text = match.group(1), match.group(2), match.group(3)
    if not end:  # Ansible refuses `gpu[01:]`; it reads `gpu[:3]` as gpu0 to gpu3
        raise InventoryError(f"host range {name!r} has no end")
    start = start or "0"
    stride = int(stride_text) if stride_text else 1
    head, tail = name[: match.start()], name[match.end() :]
    if is_number(start) and is_number(end):
        width = len(start) if start.startswith("0") and len(start) > 1 else 0
        if int(end) < int(start) or stride < 1:
            raise InventoryError(f"host range {name!r} is empty")
        items = [str(i).zfill(width) for i in range(int(start), int(end) + 1, stride)]
    elif len(start) == 1 and len(end) == 1 and start.isalpha() and end.isalpha():
        letters = string.ascii_letters
        lo, hi = letters.index(start), letters.index(end)
        if hi < lo or stride < 1:
            raise InventoryError(f"host range {name!r} is empty")
        items = list(letters[lo : hi + 1 : stride])
    else:
        raise InventoryError(f"host range {name!r} is not numeric or alphabetic")
    return [expanded for item in items for expanded in expand_host_range(head + item + tail)]


def _as_mapping(value: Any, where: str, source: str) -> dict[str, Any]:
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


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (the last would silently win,
    dropping the first's hosts)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{path} is not UTF-8 text") from exc
    except OSError as exc:
        raise InventoryError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise InventoryError(f"{path}:{where}: malformed YAML: {problem}") from exc


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.groups: dict[str, _Group] = {"all": _Group("all"), "ungrouped": _Group("ungrouped")}
        self.host_vars: dict[str, dict[str, Any]] = {}
        self.host_order: list[str] = []

    def group(self, name: str) -> _Group:
        return self.groups.setdefault(name, _Group(name))

    def parse_group(self, name: str, body: Any, where: str) -> None:
        body = _as_mapping(body, where, self.source)
        unknown = set(body) - _SECTION_KEYS
        if unknown:
            raise InventoryError(
                f"{self.source}: {where} has unknown key(s) {', '.join(sorted(unknown))}",
                hint="a group holds only hosts:, vars: and children:",
            )
        group = self.group(name)
        group.vars.update(_as_mapping(body.get("vars"), f"{where}.vars", self.source))
        hosts = _as_mapping(body.get("hosts"), f"{where}.hosts", self.source)
        for pattern, host_body in hosts.items():
            variables = _as_mapping(host_body, f"{where}.hosts.{pattern}", self.source)
            for host in expand_host_range(pattern):
                if host not in self.host_vars:
                    self.host_order.append(host)
                self.host_vars.setdefault(host, {}).update(variables)
                group.hosts[host] = None
        children = _as_mapping(body.get("children"), f"{where}.children", self.source)
        for child, child_body in children.items():
            if child == "all":
                raise InventoryError(f"{self.source}: {where}: 'all' cannot be a child group")
            if child not in group.children:
                group.children.append(child)
            self.group(child).parents.add(name)
            self.parse_group(child, child_body, f"{where}.children.{child}")


def _group_depths(groups: dict[str, _Group], source: str) -> dict[str, int]:
    depths: dict[str, int] = {}

    def depth(name: str, trail: tuple[str, ...]) -> int:
        if name in trail:
            raise InventoryError(f"{source}: group {name!r} is its own ancestor")
        if name not in depths:
            parents = groups[name].parents or ({"all"} if name != "all" else set())
            depths[name] = (
                0 if name == "all" else 1 + max(depth(p, (*trail, name)) for p in parents)
            )
        return depths[name]

    for name in groups:
        depth(name, ())
    return depths


def _vars_dir_files(folder: Path, name: str) -> Iterator[Path]:
    """Yield group_vars/<name>.yml (or .yaml, or no suffix) and group_vars/<name>/*.yml."""
    for candidate in (folder / name, folder / f"{name}.yml", folder / f"{name}.yaml"):
        if candidate.is_file():
            yield candidate
        elif candidate.is_dir():
            try:
                found = sorted(p for p in candidate.iterdir() if p.suffix in (".yml", ".yaml"))
            except OSError as exc:
                raise InventoryError(f"cannot read {candidate}: {exc.strerror}") from None
            yield from found


def _vars_from_dir(folder: Path, name: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for path in _vars_dir_files(folder, name):
        merged.update(_as_mapping(_load_yaml(path), "the file", str(path)))
    return merged


def load_inventory(path: Path) -> Inventory:
    """Parse an Ansible YAML inventory with its group_vars/ and host_vars/ folders."""
    try:
        return _load_inventory(path)
    except RecursionError:
        raise InventoryError(f"{path}: groups or values are nested too deeply") from None


def _load_inventory(path: Path) -> Inventory:
    if path.is_dir():
        raise InventoryError(f"inventory {path} is a folder, not a YAML file")
    if not path.exists():
        raise InventoryError(f"inventory {path} does not exist")
    data = _load_yaml(path)
    source = str(path)
    top = _as_mapping(data, "the top level", source)
    if not top:
        raise InventoryError(f"{source} is empty", hint="start it with `all:` and `hosts:`")
    parser = _Parser(source)
    for name, body in top.items():
        parser.parse_group(name, body, name)
        if name != "all":
            parser.groups[name].parents.add("all")
    for name, group in parser.groups.items():
        if name != "all" and not group.parents:
            group.parents.add("all")
    grouped = {
        h for n, g in parser.groups.items() if n not in ("all", "ungrouped") for h in g.hosts
    }
    for host in parser.host_order:
        if host not in grouped:
            parser.groups["ungrouped"].hosts[host] = None
    parser.groups["ungrouped"].parents.add("all")
    if not parser.host_order:
        raise InventoryError(f"{source} defines no hosts")
    return _resolve(parser, path.parent)


def _members(groups: dict[str, _Group], name: str) -> dict[str, None]:
    found = dict(groups[name].hosts)
    for child in groups[name].children:
        found.update(_members(groups, child))
    return found


def _resolve(parser: _Parser, folder: Path) -> Inventory:
    groups = parser.groups
    depths = _group_depths(groups, parser.source)
    members = {name: _members(groups, name) for name in groups}
    membership = {name: list(hosts) for name, hosts in members.items()}
    membership["all"] = list(parser.host_order)
    # Ansible's order: all, then groups by depth (ties by name); every group's inventory-file
    # vars before any group_vars/ file, so group_vars/all.yml beats a child group's vars:.
    ordered = sorted((g for g in groups if g != "all"), key=lambda g: (depths[g], g))
    group_files = {g: _vars_from_dir(folder / "group_vars", g) for g in ["all", *ordered]}
    hosts: dict[str, Host] = {}
    for name in parser.host_order:
        mine = [g for g in ordered if name in members[g]]
        layers = [
            DEFAULT_VARS,
            groups["all"].vars,
            *(groups[g].vars for g in mine),
            group_files["all"],
            *(group_files[g] for g in mine),
            parser.host_vars[name],
            _vars_from_dir(folder / "host_vars", name),
        ]
        hosts[name] = Host(name, merge_layers(layers, f"{parser.source}: host {name}"))
        _check_host(hosts[name], parser.source)
    return Inventory(hosts, membership, parser.source)


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def merge_layers(layers: Sequence[Mapping[str, Any]], where: str) -> dict[str, Any]:
    """Merge variable layers, later ones winning, as Ansible does; `env` merges key by key
    (a host's `env` adds to its group's instead of replacing it)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            is_env = key == "env"
            merged[key] = {**merged.get("env", {}), **check_env(value, where)} if is_env else value
    return merged


def check_env(value: Any, where: str) -> dict[str, str]:
    """An `env` mapping as the server will get it: valid names, values as text."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InventoryError(f"{where}: env must be a mapping of NAME: value")
    env: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise InventoryError(
                f"{where}: env name {name!r} is not a variable name",
                hint="names are letters, digits and _, not starting with a digit",
            )
        if isinstance(item, Mapping | list) or item is None:
            raise InventoryError(f"{where}: env {name} must be a single value, not {item!r}")
        env[name] = ("true" if item else "false") if isinstance(item, bool) else str(item)
    return env


def _check_host(host: Host, source: str) -> None:
    if host.connection not in CONNECTION_TYPES:
        raise InventoryError(
            f"{source}: host {host.name}: ansible_connection {host.connection!r} is not supported",
            hint="use ssh (the default) or local",
        )
    port = host.vars.get("ansible_port")
    if port is not None and (
        isinstance(port, bool) or not is_number(str(port)) or not 1 <= int(port) <= 65535
    ):
        raise InventoryError(
            f"{source}: host {host.name}: ansible_port {port!r} is not a port number"
        )
    for name in ("connect_timeout", "command_timeout"):
        value = host.vars.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = 0.0
        if isinstance(value, bool) or not 0 < seconds < math.inf:
            raise InventoryError(
                f"{source}: host {host.name}: {name} {value!r} is not a number of seconds"
            )


def resolve_inventory(explicit: Path | None, project_default: Path | None) -> Inventory:
    """Load -i, else $DEPLOYCTL_INVENTORY, else the project's default, else built-in localhost."""
    if explicit is not None:
        return load_inventory(explicit)
    env = os.environ.get("DEPLOYCTL_INVENTORY")
    if env:
        return load_inventory(Path(env))
    if project_default is not None:
        return load_inventory(project_default)
    return builtin_inventory()
