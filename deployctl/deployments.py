"""Deployments: the servers a host runs, each on its own GPUs, port, logs and records.

A host's `deployments` variable maps a name to variables that override the host's for that
server (template, model, tp, port, `gpus`, `env`, …). A host without it has one implicit
deployment (`Host.deployment is None`), so a single server per host needs no new words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deployctl.errors import InventoryError, UsageError
from deployctl.inventory import Host, check_env, merge_layers
from deployctl.text import is_number

NAME = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
# Variables a deployment may not change: how its host is reached, and the table itself.
_FIXED = ("ansible_", "deployments")


def check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise InventoryError(
            f"{where}: deployment name {name!r} is not allowed",
            hint="names are lower-case letters, digits and -, starting with a letter or digit",
        )
    return name


def deployment_targets(hosts: Iterable[Host], chosen: str | None = None) -> list[Host]:
    """Every deployment of the hosts (or only `chosen`), each as a Host with its variables.

    Bad tables fail here, for every host, before any host is touched.
    """
    if chosen is not None and not NAME.match(chosen):
        raise UsageError(
            f"--deployment {chosen!r} is not a deployment name",
            hint="names are lower-case letters, digits and -",
        )
    targets: list[Host] = []
    has_tables = False
    for host in hosts:
        table = host.vars.get("deployments")
        if table is None:
            gpu_set(host)
            if chosen is None:
                targets.append(host)
            continue
        has_tables = True
        where = f"host {host.name}"
        if not isinstance(table, Mapping) or not table:
            raise InventoryError(f"{where}: deployments must be a mapping of name: variables")
        base = {k: v for k, v in host.vars.items() if k != "deployments"}
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
            target = Host(host.name, merge_layers([base, overrides or {}], here), name)
            gpu_set(target)
            if chosen is None or name == chosen:
                targets.append(target)
    if chosen is not None and not targets:
        where = "the selected hosts" if has_tables else "the selected hosts (none has deployments)"
        raise UsageError(
            f"no deployment {chosen!r} on {where}",
            hint="see each host's `deployments` with deployctl hosts",
        )
    return targets


def gpu_set(host: Host) -> list[int] | None:
    """The host's `gpus` as indices in the order given (the server's device order), or None
    for every GPU. A list, a comma-separated string or one index."""
    value = host.vars.get("gpus")
    if value is None:
        return None
    items: Sequence[Any]
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        items = [value]
    indices = []
    for item in items:
        if isinstance(item, bool) or not is_number(str(item)):
            raise InventoryError(
                f"{_where(host)}: gpus {value!r} is not a list of GPU indices",
                hint="e.g. gpus: [0, 1, 2, 3]",
            )
        indices.append(int(item))
    if not indices:
        raise InventoryError(f"{_where(host)}: gpus is empty", hint="e.g. gpus: [0, 1, 2, 3]")
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        raise InventoryError(f"{_where(host)}: gpus lists GPU {repeated[0]} twice")
    return indices


def server_env(host: Host, variables: Mapping[str, Any]) -> dict[str, str]:
    """The server's own environment: `env`, and with `gpus` the CUDA variables that pin the
    server to those GPUs, numbered as nvidia-smi numbers them (PCI bus order)."""
    env = check_env(variables.get("env"), _where(host))
    indices = gpu_set(Host(host.name, dict(variables), host.deployment))
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
