"""Deployments: the servers a host runs, each on its own GPUs, port, logs and records.

A host's `deployments` variable maps a name to variables that override the host's for that
server (template, model, tp, port, `gpus`, `env`, …). A host without it has one implicit
deployment (`Host.deployment is None`), so a single server per host needs no new words.

A deployment with `nodes: PATTERN` is one server across those hosts (multi-node): each node
is a target of its own whose variables say where it stands (`nnodes`, `node_rank`,
`dist_init_addr`, `node_hosts`); commands treat the nodes as one unit (see `group_of`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from deployctl.addresses import literal_address
from deployctl.errors import InventoryError, UsageError
from deployctl.inventory import Host
from deployctl.settings import PREFIX, Settings, check_layer, check_settings, overlay, own_layer
from deployctl.text import is_number

NAME = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
# Variables a deployment may not change: how its host is reached, and the table itself.
_FIXED = ("ansible_", "deployments", PREFIX + "deployments")
# A multi-node deployment: its name and its nodes in rank order.
GroupKey = tuple[str, tuple[str, ...]]
# What deployctl sets on each node of a multi-node deployment.
_NODE_VARS = ("node_rank", "dist_init_addr", "node_hosts")
# What a deployment's target does not take from its host, in either spelling.
_NOT_INHERITED = {"deployments", PREFIX + "deployments"}
_NOT_NODES = _NOT_INHERITED | set(_NODE_VARS) | {PREFIX + n for n in _NODE_VARS}


def check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise InventoryError(
            f"{where}: deployment name {name!r} is not allowed",
            hint="names are lower-case letters, digits and -, starting with a letter or digit",
        )
    return name


def deployment_targets(
    hosts: Iterable[Host],
    chosen: str | None = None,
    resolve: Callable[[str], list[Host]] | None = None,
) -> list[Host]:
    """Every deployment of the hosts (or only `chosen`), each as a Host with its variables;
    a multi-node deployment as one target per node, all of its nodes when any is selected.

    `resolve` turns a `nodes` pattern into the inventory's hosts. Bad tables fail here, for
    every host, before any host is touched.
    """
    if chosen is not None and not NAME.match(chosen):
        raise UsageError(
            f"--deployment {chosen!r} is not a deployment name",
            hint="names are lower-case letters, digits and -",
        )
    targets: list[Host] = []
    groups_seen: set[GroupKey] = set()
    has_tables = False
    for host in hosts:
        where = f"host {host.name}"
        # A loaded inventory is checked already (with its deployments); this host may not be.
        check_settings(host.vars, where, deployments=False)
        table = host.settings.given("deployments")
        if table is None:
            gpu_set(host)
            if chosen is None:
                targets.append(host)
            continue
        has_tables = True
        base = {k: v for k, v in host.vars.items() if k not in _NOT_INHERITED}
        for name, overrides in table.items():
            check_name(name, where)
            here = f"{where}, deployment {name}"
            if overrides is not None and not isinstance(overrides, Mapping):
                raise InventoryError(f"{here}: its variables must be a mapping")
            fixed = sorted(k for k in overrides or {} if str(k).startswith(_FIXED))
            if fixed:
                raise InventoryError(
                    f"{here}: a deployment cannot set {', '.join(map(str, fixed))}",
                    hint="set how a host is reached on the host itself",
                )
            if chosen is not None and name != chosen:
                continue
            layer = own_layer(overrides or {})
            if "nodes" in layer:
                nodes = node_targets(name, layer, resolve, here)
                key = (name, tuple(n.name for n in nodes))
                if key not in groups_seen:
                    groups_seen.add(key)
                    targets += nodes
                continue
            check_layer(layer, here)
            target = Host(host.name, overlay(base, layer, here), name)
            gpu_set(target)
            targets.append(target)
    if chosen is not None and not targets:
        where = "the selected hosts" if has_tables else "the selected hosts (none has deployments)"
        raise UsageError(
            f"no deployment {chosen!r} on {where}",
            hint="see each host's `deployments` with deployctl hosts",
        )
    return targets


def node_targets(
    name: str,
    overrides: Mapping[str, Any],
    resolve: Callable[[str], list[Host]] | None,
    where: str,
) -> list[Host]:
    """The nodes of a multi-node deployment in rank order, each with its own variables
    (`overrides`: the deployment's, each setting under its bare name)."""
    pattern = overrides["nodes"]
    if not isinstance(pattern, str) or resolve is None:
        raise InventoryError(f"{where}: nodes must be a host pattern, e.g. nodes: kimi-nodes")
    try:
        members = resolve(pattern)
    except (InventoryError, UsageError):
        raise InventoryError(f"{where}: nodes {pattern!r} matches no host") from None
    nnodes = len(members)
    given = overrides.get("nnodes")
    if given is not None and given != nnodes:
        raise InventoryError(
            f"{where}: nnodes {given!r} disagrees with nodes {pattern!r} ({nnodes} hosts)",
            hint="leave nnodes out: it is the number of hosts `nodes` matches",
        )
    ordered = ranked(members, where)
    rank0 = ordered[0]
    layer = {k: v for k, v in overrides.items() if k != "nodes"}
    tp = layer.get("tp", rank0.settings.given("tp") or 1)  # SGLang's 1 where none is set
    if isinstance(tp, bool) or not is_number(str(tp)) or int(tp) % nnodes:
        raise InventoryError(
            f"{where}: tp {tp!r} is not divisible by its {nnodes} nodes",
            hint="tp is the total over all nodes, e.g. tp: 16 on two 8-GPU nodes",
        )
    check_layer(layer, where)
    merged = Settings(overlay(_own_vars(rank0), layer, where), where)
    port = merged.dist_port
    address = merged.given("dist_init_addr") or f"{address_of(rank0)}:{port}"
    names = [n.name for n in ordered]
    targets = []
    for rank, node in enumerate(ordered):
        placed = {
            "nnodes": nnodes,
            "node_rank": rank,
            "dist_init_addr": address,
            "dist_port": port,
            "node_hosts": names,
        }
        here = f"{where}, node {node.name}"
        variables = overlay(overlay(_own_vars(node), layer, here), placed, here)
        target = Host(node.name, variables, name)
        gpu_set(target)
        targets.append(target)
    return targets


def ranked(members: Sequence[Host], where: str) -> list[Host]:
    """Nodes in rank order: inventory order, except hosts that set `node_rank` take theirs."""
    slots: list[Host | None] = [None] * len(members)
    for node in members:
        rank = node.settings.given("node_rank")
        if rank is None:
            continue
        if isinstance(rank, bool) or not is_number(str(rank)) or int(rank) >= len(members):
            raise InventoryError(
                f"{where}: node_rank {rank!r} of {node.name} is not a rank of its "
                f"{len(members)} nodes (0-{len(members) - 1})"
            )
        if slots[int(rank)] is not None:
            raise InventoryError(f"{where}: two nodes have node_rank {rank}")
        slots[int(rank)] = node
    rest = iter(n for n in members if n.settings.given("node_rank") is None)
    return [slot if slot is not None else next(rest) for slot in slots]


def group_of(host: Host) -> GroupKey | None:
    """The multi-node deployment a target is a node of, as (deployment, node names)."""
    nodes = host.settings.given("node_hosts")
    if host.deployment is None or not isinstance(nodes, list) or len(nodes) < 2:
        return None
    return host.deployment, tuple(nodes)


def node_rank(host: Host) -> int:
    """The target's rank in its multi-node deployment; 0 for a single-node one."""
    return int(host.settings.given("node_rank") or 0) if group_of(host) else 0


def _own_vars(host: Host) -> dict[str, Any]:
    return {k: v for k, v in host.vars.items() if k not in _NOT_NODES}


def address_of(host: Host) -> str:
    """How other nodes reach this one; an IPv6 address in brackets, as host:port needs."""
    address = host.address
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def prometheus_targets(
    targets: Iterable[Host], groups: Mapping[str, Sequence[str]]
) -> list[dict[str, Any]]:
    """Prometheus `file_sd` entries, one per deployment that serves metrics (rank 0 of a
    multi-node one), labelled with its host, deployment, inventory group and template."""
    entries = []
    for target in targets:
        if node_rank(target) != 0 or not target.settings.enable_metrics:
            continue
        group = next((g for g, names in groups.items() if target.name in names), "")
        labels = {
            "host": target.name,
            "deployment": target.deployment or "",
            "group": group,
            "template": target.settings.template or "baseline",
        }
        address = f"{address_of(target)}:{target.settings.server_port}"
        entries.append({"targets": [address], "labels": labels})
    return entries


_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 (bracketed or not) or a name for them: only this machine reaches it."""
    literal = literal_address(address)
    if literal is not None:  # 127.1 too: one of 127.0.0.1's spellings
        return ipaddress.ip_address(literal).is_loopback
    bare = address.strip().strip("[]").lower()
    return bare in _LOOPBACK_NAMES or bare.endswith(".localhost")


def loopback_bound(targets: Iterable[Host]) -> list[str]:
    """The deployments serving metrics whose server binds to a loopback address: Prometheus
    on another machine cannot scrape them."""
    return [
        t.label
        for t in targets
        if node_rank(t) == 0
        and t.vars.get("enable_metrics", True) is not False
        and is_loopback(str(t.vars.get("bind_host", "")))
    ]


def gpu_set(host: Host, variables: Mapping[str, Any] | None = None) -> list[int] | None:
    """The host's `gpus` (or those of `variables`, e.g. with --set over them) as indices in
    the order given (the server's device order), or None for every GPU. A list, a
    comma-separated string or one index."""
    return (host.settings if variables is None else Settings(variables, _where(host))).gpus


# SGLang's heartbeat of a decode to its prefills (its defaults, rendered so that the command
# says how long a decode may wait in all).
PD_HEARTBEAT = {
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "5.0",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
}


def pd_env(settings: Settings) -> dict[str, str]:
    """A prefill's or decode's timeouts for its other side, rendered together from
    `pd_timeout`: the bootstrap (a decode reaching a prefill) and the wait for KV."""
    if settings.pd_role is None:
        return {}
    timeout = str(settings.pd_timeout)
    return {
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": timeout,
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": timeout,
        **PD_HEARTBEAT,
    }


def pd_wait(env: Mapping[str, str]) -> float:
    """The longest a server with this environment waits for its other side before it fails a
    request: its bootstrap or waiting timeout, plus the heartbeats that find a peer gone."""

    def number(name: str, default: float) -> float:
        try:
            return float(env.get(name, default))
        except ValueError:
            return default

    waits = max(
        number("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300),
        number("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300),
    )
    beats = number("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0) * number(
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2
    )
    return waits + beats


def server_env(host: Host, variables: Mapping[str, Any]) -> dict[str, str]:
    """The server's own environment: `env` (over a prefill's or decode's timeouts), and with
    `gpus` the CUDA variables that pin the server to those GPUs, numbered as nvidia-smi
    numbers them (PCI bus order)."""
    settings = Settings(variables, _where(host))
    env = {**pd_env(settings), **settings.env}
    indices = gpu_set(host, variables)
    if indices is None:
        return env
    visible = ",".join(map(str, indices))
    if env.get("CUDA_VISIBLE_DEVICES", visible) != visible:
        raise InventoryError(
            f"{_where(host)}: env CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} "
            f"contradicts gpus {indices}",
            hint="set only gpus; deployctl sets CUDA_VISIBLE_DEVICES from it",
        )
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **env, "CUDA_VISIBLE_DEVICES": visible}


def describe_gpus(indices: Sequence[int] | None) -> str:
    """`GPU 3`, `GPUs 0,1,2,3` or `every GPU`."""
    if indices is None:
        return "every GPU"
    return ("GPUs " if len(indices) > 1 else "GPU ") + ",".join(map(str, indices))


def _where(host: Host) -> str:
    if host.deployment is None:
        return f"host {host.name}"
    return f"host {host.name}, deployment {host.deployment}"
