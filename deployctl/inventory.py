"""Ansible inventories as deployctl uses them: hosts with merged variables, host patterns,
the group tree, secret masking. Reading the sources is inventory_sources.py's job."""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployctl.errors import InventoryError
from deployctl.inventory_sources import (
    Group,
    InventoryData,
    VarsFolder,
    Vaulted,
    VaultedText,
    VaultOptions,
    Vaults,
    collect_vaulted,
    expand_host_range,
    is_templated,
    read_sources,
)
from deployctl.masking import MASK, flag_secrets, is_secret_name, long_enough, mask_text
from deployctl.settings import (
    DEFAULT_VARS,
    PREFIX,
    ForeignValue,
    Misspelling,
    Settings,
    check_env,
    check_settings,
    host_warnings,
)
from deployctl.text import is_number

__all__ = ["DEFAULT_VARS", "VaultOptions", "check_env", "expand_host_range"]

CONNECTION_TYPES = ("ssh", "local")
LOCALHOST = "localhost"


def mask_secrets(variables: Mapping[str, Any], values: Sequence[str] = ()) -> dict[str, Any]:
    """Return a copy with secret-looking (and vaulted) variables masked, in nested mappings
    too; `values` (longest first): secret texts to mask wherever else they appear, e.g. in
    a variable a template built from a secret."""
    return {k: _masked(str(k), v, values) for k, v in variables.items()}


def _masked(name: str, value: Any, values: Sequence[str]) -> Any:
    if (is_secret_name(name) and value not in (None, "")) or isinstance(value, VaultedText):
        return MASK
    if isinstance(value, Mapping):
        return mask_secrets(value, values)
    if isinstance(value, list):
        flagged = set(flag_secrets(value)) | set(values)  # ["--api-key", "sk-1"]
        hidden = sorted(flagged, key=len, reverse=True)
        return [
            mask_text(v, hidden) if isinstance(v, str) else _masked(name, v, values) for v in value
        ]
    if isinstance(value, str):
        return mask_text(value, values)
    return value


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
        elif (secret or isinstance(value, VaultedText)) and not isinstance(
            value, (bool, type(None))
        ):
            found.add(str(value))

    walk(variables, False)
    return tuple(sorted(long_enough(list(found)), key=lambda v: (-len(v), v)))


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
        """The SSH port (`ansible_port`); the server's port is `settings.server_port`."""
        port = self.vars.get("ansible_port")
        return None if port is None else int(port)

    @property
    def settings(self) -> Settings:
        """deployctl's own variables of this host, typed: `state_dir`, `server_port`, …"""
        where = f"host {self.name}"
        return Settings(
            self.vars,
            where if self.deployment is None else f"{where}, deployment {self.deployment}",
        )

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
            "vars": mask_secrets(self.vars, secret_values(self.vars)),
        }

    @property
    def is_local(self) -> bool:
        return self.connection == "local"


@dataclass(frozen=True)
class GroupNode:
    """One group of the tree: its child groups and its own hosts, in declaration order."""

    children: list[str]
    hosts: list[str]


@dataclass
class Inventory:
    """Hosts, each group's members (in the order Ansible lists them) and the group tree."""

    hosts: dict[str, Host]
    groups: dict[str, list[str]]
    source: str
    tree: dict[str, GroupNode] = field(default_factory=dict)
    # A host whose templated variables do not resolve fails when selected, not before.
    broken: dict[str, InventoryError] = field(default_factory=dict)
    # Variables that look like a mistyped deployctl setting, and settings' bare names that
    # hold the user's own variables; the front end shows them.
    warnings: list[Misspelling | ForeignValue] = field(default_factory=list)
    # Which inventory this is, as run records keep it: the sources' absolute paths.
    origin: str = ""

    def select(self, pattern: str | None) -> list[Host]:
        """Return the hosts an Ansible pattern names, in pattern order; error when none match.

        As in Ansible, plain terms add hosts in the order given, then `&term` intersects and
        `!term` removes; a pattern of only exclusions starts from every host.
        """
        pattern = "all" if pattern is None else pattern.strip()
        terms = split_pattern(pattern)
        if not terms:
            # `-H "$UNSET"` must not mean the whole fleet: that takes `all` or `*`.
            raise InventoryError(
                f"empty host pattern {pattern!r}",
                hint="name hosts or groups; select every host with -H all",
            )
        positives = [t for t in terms if not t.startswith(("!", "&"))]
        chosen: dict[str, None] = {} if positives else dict.fromkeys(self.groups["all"])
        for term in positives:
            chosen.update(dict.fromkeys(self._match_term(term, pattern)))
        for term in (t for t in terms if t.startswith("&")):
            keep = set(self._match_term(term[1:], pattern))
            chosen = {h: None for h in chosen if h in keep}
        for term in (t for t in terms if t.startswith("!")):
            drop = set(self._match_term(term[1:], pattern))
            chosen = {h: None for h in chosen if h not in drop}
        if not chosen:
            raise InventoryError(
                f"host pattern {pattern!r} matches no host in {self.source}",
                hint="see the hosts and groups with `deployctl hosts`",
            )
        for name in chosen:
            if name in self.broken:
                raise self.broken[name]
        return [self.hosts[name] for name in chosen]

    def _match_term(self, term: str, pattern: str) -> list[str]:
        subscript = _SUBSCRIPT.match(term) if not term.startswith("~") else None
        if subscript is not None and term not in self.hosts:
            base, index, start, end = subscript.groups()
            hosts = self._match_term(base, pattern)
            if index is not None:
                position = int(index)
                if not -len(hosts) <= position < len(hosts):
                    raise InventoryError(
                        f"host pattern {pattern!r}: {base} has {len(hosts)} hosts, no [{index}]"
                    )
                return [hosts[position]]
            last = int(end) if end else len(hosts) - 1
            return hosts[int(start) : last + 1]
        if term in ("all", "*"):
            return self.groups["all"]
        if term in self.groups:
            return self.groups[term]
        if term in self.hosts:
            return [term]
        found: dict[str, None] = {}
        if term.startswith("~"):
            try:
                regex = re.compile(term[1:])
            except re.error as exc:
                raise InventoryError(
                    f"host pattern {pattern!r}: bad regex {term[1:]!r}: {exc}"
                ) from None
            for group in (g for g in self.groups if regex.match(g)):
                found.update(dict.fromkeys(self.groups[group]))
            found.update((h, None) for h in self.hosts if regex.match(h))
        elif any(ch in term for ch in "*?["):
            for group in fnmatch.filter(self.groups, term):
                found.update(dict.fromkeys(self.groups[group]))
            found.update((h, None) for h in self.hosts if fnmatch.fnmatchcase(h, term))
        if found:
            return list(found)
        raise InventoryError(
            f"host pattern {pattern!r}: no host or group named {term!r} in {self.source}",
            hint="see the hosts and groups with `deployctl hosts`",
        )

    def subtree(self, group: str = "all") -> dict[str, GroupNode]:
        """The group and every group under it, each once (the JSON form of --graph)."""
        self._check_group(group)
        found: dict[str, GroupNode] = {}
        pending = [group]
        while pending:
            name = pending.pop()
            if name not in found:
                found[name] = self.tree[name]
                pending.extend(reversed(self.tree[name].children))
        return found

    def _check_group(self, group: str) -> None:
        if group not in self.tree:
            raise InventoryError(
                f"no group named {group!r} in {self.source}",
                hint="--graph takes a group name; see them with `deployctl hosts --graph`",
            )

    def graph(self, group: str = "all") -> list[str]:
        """The group tree as `ansible-inventory --graph` draws it."""
        self._check_group(group)
        lines: list[str] = []

        def draw(name: str, depth: int) -> None:
            lines.append(_graph_line(f"@{name}:", depth))
            for child in self.tree[name].children:
                draw(child, depth + 1)
            if name != "all":
                lines.extend(_graph_line(host, depth + 1) for host in self.tree[name].hosts)

        draw(group, 0)
        return lines


def _graph_line(name: str, depth: int) -> str:
    return "  |" * depth + "--" + name if depth else name


# A term of a colon-separated pattern: anything but blanks, ':' and brackets, or a whole
# bracketed part (`web[0:2]` is one term).
_COLON_TERM = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
# `group[1]`, `group[-1]`, `group[0:2]` (both ends included), `group[1:]` (to the end).
_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?\d+)|(\d+):(\d*))\]$")


def split_pattern(pattern: str) -> list[str]:
    """Split a host pattern into terms: on commas when it has any (Ansible then keeps colons,
    so `a:b,c` is the terms `a:b` and `c`), else on colons outside brackets; an IPv6 address
    stays whole."""
    if "," in pattern:
        terms = [t.strip() for t in pattern.split(",")]
    elif _is_ipv6(pattern.strip().lstrip("!&")):
        terms = [pattern.strip()]
    else:
        terms = _COLON_TERM.findall(pattern)
    return [t for t in terms if t.strip(" :")]


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def builtin_inventory() -> Inventory:
    """Return the fallback inventory: this machine through the local connection."""
    host = Host(LOCALHOST, {**DEFAULT_VARS, "ansible_connection": "local"})
    tree = {"all": GroupNode(["ungrouped"], []), "ungrouped": GroupNode([], [LOCALHOST])}
    return Inventory(
        {LOCALHOST: host},
        {"all": [LOCALHOST], "ungrouped": [LOCALHOST]},
        "built-in",
        tree,
        origin="built-in",
    )


def load_inventory(path: Path | Sequence[Path], vault: VaultOptions | None = None) -> Inventory:
    """Read inventory sources (files, folders, scripts; several merge in order) into hosts with
    their variables merged in Ansible's precedence and templates resolved."""
    paths = [path] if isinstance(path, Path) else list(path)
    try:
        data = read_sources(paths, vault or VaultOptions())
        if not data.host_vars:
            raise InventoryError(f"{data.source} defines no hosts")
        inventory = build(data, vault or VaultOptions())
    except RecursionError:
        raise InventoryError(f"{paths[0]}: groups or values are nested too deeply") from None
    inventory.origin = ", ".join(str(p.resolve()) if p.exists() else str(p) for p in paths)
    return inventory


def _depths(data: InventoryData) -> dict[str, int]:
    """Each group's depth: its longest path from `all` (Ansible's Group.depth)."""
    depths = {"all": 0}
    level = ["all"]
    while level:  # the tree has no cycles (add_child refuses them), so this ends
        nxt: dict[str, None] = {}
        for name in level:
            for child in data.groups[name].children:
                if depths.get(child, -1) < depths[name] + 1:
                    depths[child] = depths[name] + 1
                    nxt[child] = None
        level = list(nxt)
    return depths


def _hosts_of(data: InventoryData, name: str) -> list[str]:
    """A group's hosts as Ansible lists them: its own, then its descendants' breadth first."""
    found: dict[str, None] = dict(data.groups[name].hosts)
    for group in data.descendants(name):
        found.update(data.groups[group].hosts)
    return list(found)


def _priority(group: Group, source: str) -> int:
    value = group.vars.get("ansible_group_priority", 1)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InventoryError(
            f"{source}: group {group.name}: ansible_group_priority {value!r} is not a number"
        ) from None


def build(data: InventoryData, vault: VaultOptions) -> Inventory:
    """Merge each host's variables in Ansible's order and resolve templates.

    Ansible's order: `all`, then the host's groups by depth, priority and name, each group's
    inline vars before any group_vars/ file (so group_vars/all.yml beats a child group's
    inline vars), then the host's inline vars, then host_vars/. With several sources, each
    source's group_vars/ (then host_vars/) in source order, every group within one source.
    """
    depths = _depths(data)
    members = {name: _hosts_of(data, name) for name in data.groups}
    groups_of: dict[str, list[str]] = {h: [] for h in data.host_vars}
    ordered = sorted(
        (g for g in data.groups if g != "all"),
        key=lambda g: (depths[g], _priority(data.groups[g], data.source), g),
    )
    for name in ordered:
        for host in members[name]:
            groups_of[host].append(name)
    vaults = Vaults(vault)
    group_folders = [VarsFolder(d / "group_vars") for d in data.vars_dirs]
    host_folders = [VarsFolder(d / "host_vars") for d in data.vars_dirs]
    _decrypt_all_at_once(data, group_folders, host_folders, vaults)
    group_files = [{g: f.load(g, vaults) for g in f.files} for f in group_folders]
    inline_groups = {n: _group_vars(g) for n, g in data.groups.items()}
    raw: dict[str, dict[str, Any]] = {}
    for name, inline in data.host_vars.items():
        mine = groups_of[name]
        layers = [
            DEFAULT_VARS,
            inline_groups["all"],
            *(inline_groups[g] for g in mine),
            *(files["all"] for files in group_files if "all" in files),
            *(files[g] for files in group_files for g in mine if g in files),
            inline,
            *(f.load(name, vaults) for f in host_folders if name in f.files),
        ]
        raw[name] = merge_layers(layers, f"{data.source}: host {name}")
    _decrypt(raw, vaults)
    groups = {g: members[g] for g in data.groups}

    def magic(host: str) -> dict[str, Any]:
        """Ansible's magic variables for templates."""
        found: dict[str, Any] = {
            "inventory_hostname": host,
            "inventory_hostname_short": host.split(".", maxsplit=1)[0],
            "group_names": sorted(groups_of[host]),
            "groups": groups,
        }
        if host in data.origin:
            found["inventory_file"] = str(data.origin[host].absolute())
            found["inventory_dir"] = str(data.origin[host].absolute().parent)
        return found

    resolved, broken = _resolve_templates(raw, magic)
    hosts = {name: Host(name, variables) for name, variables in resolved.items()}
    # The hosts of a range share their variables: each distinct set is checked once, and read
    # for warnings once while it has none (100,000 hosts took seconds checked one by one).
    checked: set[str] = set()
    quiet: set[str] = set()
    warnings: list[Misspelling | ForeignValue] = []
    for each in hosts.values():
        key = _variables_key(each.vars)
        if each.name not in broken and (key is None or key not in checked):
            _check_host(each, data.source)  # a broken one fails when selected, on its own
            if key is not None:
                checked.add(key)
        if key is None or key not in quiet:
            found = host_warnings(each.name, each.vars)
            warnings += found
            if key is not None and not found:
                quiet.add(key)
    tree = {n: GroupNode(list(g.children), list(g.hosts)) for n, g in data.groups.items()}
    return Inventory(hosts, groups, data.source, tree, broken, warnings)


def _group_vars(group: Group) -> dict[str, Any]:
    """A group's variables; `ansible_group_priority` is about the group, not a variable."""
    if "ansible_group_priority" not in group.vars:
        return group.vars
    return {k: v for k, v in group.vars.items() if k != "ansible_group_priority"}


def _resolve_templates(
    raw: dict[str, dict[str, Any]], magic: Callable[[str], dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], dict[str, InventoryError]]:
    if not any(is_templated(v) for variables in raw.values() for v in variables.values()):
        return raw, {}
    from deployctl.inventory_vars import resolve_hosts  # jinja2: only when a template is there

    return resolve_hosts(raw, magic)


def _decrypt_all_at_once(
    data: InventoryData,
    group_folders: list[VarsFolder],
    host_folders: list[VarsFolder],
    vaults: Vaults,
) -> None:
    """Decrypt the encrypted files the inventory loads and its encrypted values in one
    ansible-vault call (~0.6 s of CPU each; it was one per file, then one for the values).

    The files are those `build` loads (every group_vars/ file, the host_vars/ files of its
    hosts), each decrypted anyway. The values are every `!vault` one, though only those a
    host ends with were decrypted: when the call fails, the files are decrypted alone, as
    before (their error is the one to report), and the values a host ends with later."""
    files: dict[str, Vaulted] = {}
    values: dict[str, Vaulted] = {}
    for folder in group_folders:
        folder.vaulted(folder.files, files, values)
    for folder in host_folders:
        folder.vaulted(data.host_vars, files, values)
    if not files:  # the values alone: one call in `_decrypt`, of those a host ends with
        return
    collect_vaulted([g.vars for g in data.groups.values()], values)
    collect_vaulted(list(data.host_vars.values()), values)
    if values:
        try:
            vaults.decrypt_all([*files.values(), *values.values()])
            return
        except InventoryError:
            pass  # a value no host uses may be one these options cannot decrypt
    vaults.decrypt_all(list(files.values()))


def _decrypt(raw: dict[str, dict[str, Any]], vaults: Vaults) -> None:
    """Replace vaulted values by their plain text, decrypting each distinct one once."""
    found: dict[str, Vaulted] = {}
    for variables in raw.values():
        collect_vaulted(variables, found)
    if not found:
        return
    plain = dict(zip(found, vaults.decrypt_all(list(found.values())), strict=True))

    def replace(value: Any) -> Any:
        if isinstance(value, Vaulted):
            return plain[value.ciphertext]
        if isinstance(value, dict):
            return {k: replace(v) for k, v in value.items()}
        if isinstance(value, list):
            return [replace(v) for v in value]
        return value

    for name, variables in raw.items():
        raw[name] = replace(variables)


# The settings whose mappings merge key by key across levels, in either spelling.
_MERGED = ("env", PREFIX + "env")


def merge_layers(layers: Sequence[Mapping[str, Any]], where: str) -> dict[str, Any]:
    """Merge variable layers, later ones winning, as Ansible does; `env` (and
    `deployctl_env`) merges key by key: a host's adds to its group's instead of replacing it.
    A value that is no mapping (`env: prod`, the user's own variable) replaces, as in Ansible."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            below = merged.get(key)
            if key in _MERGED and isinstance(value, Mapping):
                merged[key] = {
                    **(below if isinstance(below, Mapping) else {}),
                    **check_env(value, where),
                }
            else:
                merged[key] = value
    return merged


def _variables_key(variables: Mapping[str, Any]) -> str | None:
    """Variables as exact text, to tell equal sets apart; None for values JSON cannot hold."""
    try:
        return json.dumps(variables, sort_keys=True)
    except (TypeError, ValueError):
        return None


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
    check_settings(host.vars, f"{source}: host {host.name}")


def resolve_inventory(
    explicit: Sequence[Path] | Path | None,
    project_default: Path | None,
    vault: VaultOptions | None = None,
) -> Inventory:
    """Load -i (each given, merged), else $DEPLOYCTL_INVENTORY, else the project's default,
    else built-in localhost."""
    if isinstance(explicit, Path):
        explicit = [explicit]
    if explicit:
        return load_inventory(list(explicit), vault)
    env = os.environ.get("DEPLOYCTL_INVENTORY")
    if env:
        return load_inventory([Path(p) for p in env.split(",") if p], vault)
    if project_default is not None:
        return load_inventory(project_default, vault)
    return builtin_inventory()
