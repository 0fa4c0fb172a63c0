"""`deployctl init`: read the hosts a user already has, each in one round trip, and write the
inventory that launches on them — groups by GPU model and SGLang version, the deployments the
GPUs' links suggest, and what was found as comments."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deployctl import agent
from deployctl.connection import Connection
from deployctl.errors import DeployctlError, ParseError, UsageError
from deployctl.facts import TOPOLOGY_COMMAND, Gpu, Topology, parse_gpus_command, parse_topology
from deployctl.fanout import Fleet, FleetResult
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.localfiles import write_file
from deployctl.ops.patch import parse_patch_facts, probe_args, set_state
from deployctl.patchset import PatchSet
from deployctl.remote.protocol import SurveyReply
from deployctl.remote.wire import GPUS_COMMAND
from deployctl.text import load_yaml

FIRST_PORT = 30000  # SGLang's default port: the first a deployment is given, when free
# `user@address`, `user@address:port`, `address:port`, `[v6 address]:port`; else an SSH name.
_SPEC = re.compile(
    r"(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<addr>[^:@\s]+))(?::(?P<port>\d+))?\Z"
)
_GROUP_WORD = re.compile(r"[^a-z0-9]+")


def host_of(spec: str) -> Host:
    """The host a command-line word names: an SSH name (as ~/.ssh/config knows it), or
    `[user@]address[:port]`; named in the inventory by its name or address."""
    match = _SPEC.match(spec.strip())
    if not spec.strip() or match is None:
        raise UsageError(f"{spec!r} is not a host", hint="give an SSH name or user@address[:port]")
    address = match.group("v6") or match.group("addr")
    given: dict[str, Any] = {}
    if match.group("user"):
        given["ansible_user"] = match.group("user")
    if match.group("port"):
        given["ansible_port"] = int(match.group("port"))
    name = address
    if given or match.group("v6"):
        given["ansible_host"] = address
        name = address if "ansible_port" not in given else f"{address}_{given['ansible_port']}"
    return Host(name.replace(":", "_"), {**DEFAULT_VARS, **given})


def hosts_of(specs: Sequence[str], known: Iterable[str] = ()) -> list[Host]:
    """The hosts named, each once; one the inventory already has is a usage error."""
    hosts = [host_of(s) for s in specs]
    names = [h.name for h in hosts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"named twice: {', '.join(twice)}")
    there = sorted(set(names) & set(known))
    if there:
        raise UsageError(
            f"already in the inventory: {', '.join(there)}",
            hint="init adds hosts; edit the inventory to change one it has",
        )
    return hosts


# ---- what a host said ----------------------------------------------------------------------


@dataclass(frozen=True)
class FoundSglang:
    python: str
    python_version: str
    version: str | None
    site: str
    patches: dict[str, str]  # patch set → its state on this installation


@dataclass(frozen=True)
class Deployment:
    """A server the host's GPUs suggest: these GPUs, joined by NVLink or one NUMA node."""

    name: str
    gpus: list[int]
    tp: int
    port: int
    why: str


@dataclass(frozen=True)
class HostSurvey:
    host: Host
    hostname: str
    user: str
    gpus: list[Gpu]
    gpu_error: str | None
    topology: Topology | None
    topology_error: str | None
    pythons: list[tuple[str, str]]  # every interpreter found: (path, Python version)
    sglang: list[FoundSglang]
    ports: list[int]
    models: list[str]
    sbatch: str | None
    machine: str

    @property
    def chosen(self) -> FoundSglang | None:
        """The installation a server would use: the newest SGLang, the first found of equals."""
        if not self.sglang:
            return None
        return max(self.sglang, key=lambda s: version_key(s.version))  # the first of equals

    @property
    def gpu_model(self) -> str | None:
        names = sorted({g.name for g in self.gpus})
        return " + ".join(names) if names else None

    def deployments(self) -> list[Deployment]:
        """One server per NVLink island (or NUMA node, with no NVLink), on a power-of-two
        number of its GPUs; each on the first port from 30000 that nothing listens on."""
        if not self.gpus:
            return []
        indexes = sorted(g.index for g in self.gpus)
        islands = [indexes]
        if self.topology is not None and set(self.topology.numa) == set(indexes):
            islands = self.topology.islands()
        taken = set(self.ports)
        found = []
        for island in islands:
            tp = 1 << (len(island).bit_length() - 1)
            port = next(p for p in range(FIRST_PORT, 65536) if p not in taken)
            taken.add(port)
            gpus = island[:tp]
            name = f"gpus-{gpus[0]}" if tp == 1 else f"gpus-{gpus[0]}-{gpus[-1]}"
            why = self._why(island) if len(islands) > 1 or self.topology else "every GPU"
            if island[tp:]:
                why += f"; GPUs {island[tp:]} left out (TP is a power of two)"
            found.append(Deployment(name, gpus, tp, port, why))
        return found

    def _why(self, island: list[int]) -> str:
        """What joins the island's GPUs: NVLink (which), else one NUMA node."""
        assert self.topology is not None
        links = {ln for (a, b), ln in self.topology.links.items() if a in island and b in island}
        nvlink = sorted(ln for ln in links if ln.startswith("NV"))
        said = [f"NVLink ({', '.join(nvlink)})" if nvlink else "no NVLink"]
        numa = {self.topology.numa.get(g) for g in island}
        if len(numa) == 1 and None not in numa:
            said.append(f"NUMA node {numa.pop()}")
        return ", ".join(said)


def version_key(version: str | None) -> tuple[int, ...]:
    """`0.5.17` → (0, 5, 17): a version's numbers, compared as numbers."""
    return tuple(int(n) for n in re.findall(r"\d+", version or ""))


def survey(host: Host, conn: Connection, sets: Sequence[PatchSet]) -> HostSurvey:
    """Read the host in one round trip: nvidia-smi's GPUs and links beside the agent's
    survey (its Pythons with SGLang and their patch states, ports, models, Slurm)."""
    probes = {"gpus": GPUS_COMMAND, "topology": TOPOLOGY_COMMAND}
    outputs, reply = agent.call_beside(host, conn, probes, agent.SURVEY, probe_args(host, sets))
    gpus: list[Gpu] = []
    gpu_error = topology_error = None
    topology = None
    try:
        gpus = parse_gpus_command(**vars(outputs["gpus"])).gpus
    except ParseError as exc:
        gpu_error = exc.message
    if gpus:
        try:
            topology = parse_topology(outputs["topology"].output)
        except ParseError as exc:
            topology_error = exc.message
    return HostSurvey(
        host=host,
        hostname=reply["hostname"],
        user=reply["user"],
        gpus=gpus,
        gpu_error=gpu_error,
        topology=topology,
        topology_error=topology_error,
        pythons=[(p["python"], p["version"]) for p in reply["pythons"]],
        sglang=found_sglang(reply, sets),
        ports=list(reply["ports"]),
        models=list(reply["models"]),
        sbatch=reply["sbatch"],
        machine=reply["machine"],
    )


def found_sglang(reply: SurveyReply, sets: Sequence[PatchSet]) -> list[FoundSglang]:
    found = []
    for python in reply["pythons"]:
        probe = python["sglang"]
        facts = None if probe is None else parse_patch_facts(probe)
        if facts is None or facts.site is None:
            continue
        states = {s.name: str(set_state(facts, s).state) for s in sets}
        found.append(
            FoundSglang(
                python["python"],
                python["version"],
                facts.sglang_version,
                facts.site,
                states,
            )
        )
    return found


# ---- the inventory it writes ---------------------------------------------------------------


@dataclass
class InitReport:
    """What init read of each host, and the inventory it made of it: written to `path`, or
    with `written` false not (a dry run, or no host could be read)."""

    results: FleetResult[HostSurvey]
    text: str
    path: Path
    written: bool = False
    backup: Path | None = None  # where the file `path` was is kept
    extended: Path | None = None  # the inventory the hosts were added to

    @property
    def surveys(self) -> list[HostSurvey]:
        return list(self.results.succeeded.values())

    @property
    def ok(self) -> bool:
        return not self.results.failed and bool(self.surveys)


def group_name(prefix: str, words: str) -> str:
    """An Ansible group name: lower-case words joined by `_`."""
    slug = _GROUP_WORD.sub("_", words.lower().removeprefix("nvidia ")).strip("_")
    return f"{prefix}{slug}" if slug else prefix.rstrip("_")


def groups_of(survey: HostSurvey) -> list[str]:
    model = survey.gpu_model
    chosen = survey.chosen
    by_gpu = group_name("", model) if model else "no_gpus"
    by_sglang = group_name("sglang_", chosen.version or "unknown") if chosen else "no_sglang"
    return [by_gpu if by_gpu[0].isalpha() else f"gpu_{by_gpu}", by_sglang]


def _value(value: Any) -> str:
    """A YAML value on one line (JSON is YAML): quoted wherever it needs to be."""
    return json.dumps(value)


def _comment(text: str) -> str:
    """One comment line's text: what a host said, never a second line."""
    return " ".join(text.split())


def _key(name: str) -> str:
    return (
        name if re.fullmatch(r"[A-Za-z0-9_.-]+", name) and not name[0].isdigit() else _value(name)
    )


def facts_comments(survey: HostSurvey) -> list[str]:
    """What was found on the host, as the comments above its entry."""
    lines = [f"{survey.user}@{survey.hostname}"]
    if survey.gpus:
        memory = survey.gpus[0].memory_total_mib
        lines.append(f"GPUs: {len(survey.gpus)} x {survey.gpu_model}, {memory} MiB each")
    else:
        lines.append(f"GPUs: none read ({survey.gpu_error})")
    if survey.topology_error:
        lines.append(f"GPU links: not read ({survey.topology_error})")
    for found in survey.sglang:
        states = ", ".join(f"{k} {v}" for k, v in sorted(found.patches.items())) or "none known"
        lines.append(
            f"SGLang {found.version} with {found.python} (Python {found.python_version}),"
            f" site {found.site}; patch sets: {states}"
        )
    others = [p for p, _ in survey.pythons if p not in {s.python for s in survey.sglang}]
    if not survey.sglang:
        lines.append("SGLang: not found in any Python looked at")
    if others:
        lines.append(f"Pythons without SGLang: {', '.join(others)}")
    if survey.ports:
        lines.append(f"TCP ports in use: {', '.join(map(str, survey.ports))}")
    if survey.models:
        lines.append(f"models: {', '.join(survey.models)}")
    lines.append(
        f"Slurm: sbatch at {survey.sbatch} (launcher: slurm starts servers as jobs)"
        if survey.sbatch
        else "Slurm: none"
    )
    return [_comment(line) for line in lines]


def host_vars(survey: HostSurvey, model: str | None) -> tuple[list[str], dict[str, Any]]:
    """(comments, variables) of the host's entry: how it is reached, its Python with SGLang,
    its model, and its deployments (one: the host's own tp, gpus and port)."""
    own = {k: v for k, v in survey.host.vars.items() if k.startswith("ansible_")}
    comments: list[str] = []
    variables: dict[str, Any] = dict(own)
    if survey.chosen is not None:
        variables["python"] = survey.chosen.python
    if model is not None:
        variables["model_path"] = model
    deployments = survey.deployments()
    if len(deployments) == 1:
        only = deployments[0]
        comments.append(f"one server on GPUs {only.gpus}: {only.why}")
        variables.update(tp=only.tp, gpus=only.gpus, port=only.port)
    elif deployments:
        comments.append(f"{len(deployments)} servers, one per island of GPUs")
        variables["deployments"] = {
            d.name: {"gpus": d.gpus, "tp": d.tp, "port": d.port} for d in deployments
        }
        comments += [f"{d.name}: {d.why}" for d in deployments]
    return [_comment(c) for c in comments], variables


def shared_model(surveys: Sequence[HostSurvey]) -> str | None:
    """The one model folder every host has, if there is exactly one such."""
    common = set.intersection(*(set(s.models) for s in surveys)) if surveys else set()
    return common.pop() if len(common) == 1 else None


def host_model(survey: HostSurvey, shared: str | None) -> str | None:
    if shared is not None:
        return None
    return survey.models[0] if len(survey.models) == 1 else None


def inventory_text(
    surveys: Sequence[HostSurvey],
    failed: dict[str, BaseException],
    when: str,
    top_group: str = "all",
) -> str:
    """The inventory of the hosts read, as YAML with comments: hosts under `top_group`'s
    children, one group by GPU model and one by SGLang version; the facts found as comments."""
    shared = shared_model(surveys)
    lines = [f"# Written by `deployctl init` on {when}, from what each host said."]
    if failed:
        lines.append("# Left out, as they could not be read:")
        lines += [f"#   {name}: {_comment(str(exc))}" for name, exc in failed.items()]
    lines.append(f"{_key(top_group)}:")
    common: list[str] = []
    if shared is not None:
        common.append(f"    model_path: {_value(shared)}  # found on every host")
    elif not any(host_model(s, None) for s in surveys):
        common.append("    # model_path: /path/to/model  # set the model the servers serve")
    if common:
        lines += ["  vars:", *common]
    groups: dict[str, list[HostSurvey]] = {}
    for survey in surveys:
        for group in groups_of(survey):
            groups.setdefault(group, []).append(survey)
    lines.append("  children:")
    written: set[str] = set()
    for group, members in groups.items():
        lines += [f"    {_key(group)}:", "      hosts:"]
        for survey in members:
            name = _key(survey.host.name)
            if survey.host.name in written:  # its variables are under its first group
                lines.append(f"        {name}:")
                continue
            written.add(survey.host.name)
            lines += [f"        # {c}" for c in facts_comments(survey)]
            comments, variables = host_vars(survey, host_model(survey, shared))
            lines += [f"        # {c}" for c in comments]
            if survey.chosen is None:
                lines.append(
                    "        # python: /path/to/python  # no SGLang found: install it, then set this"
                )
            lines.append(f"        {name}:")
            lines += [f"          {_key(k)}: {_value(v)}" for k, v in variables.items()]
    return "\n".join(lines) + "\n"


# ---- the file ------------------------------------------------------------------------------


def backup_path(path: Path, when: float) -> Path:
    """A name beside `path` that no file has: `<name>.<time>.bak` (`.bak`: no inventory
    folder reads it)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    candidate = path.with_name(f"{path.name}.{stamp}.bak")
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{stamp}-{n}.bak")
    return candidate


def top_level_groups(path: Path) -> set[str]:
    """The top-level keys of a YAML inventory file (an extension's group must be new)."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DeployctlError(f"cannot read {path} as YAML: {exc}".splitlines()[0]) from exc
    if data is not None and not isinstance(data, dict):
        raise UsageError(f"{path} is not a YAML inventory (its top level is not a mapping)")
    return set(data or {})


def extension_group(taken: set[str], when: float) -> str:
    """The top-level group the hosts added to an inventory go under: it joins nothing."""
    base = "deployctl_init_" + time.strftime("%Y%m%d_%H%M%S", time.localtime(when))
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def refuse_existing(path: Path, may_replace: bool) -> None:
    if (path.exists() or path.is_symlink()) and not may_replace:
        raise UsageError(
            f"{path} exists",
            hint="give another -o, -i to add the hosts to it, or --force to replace it"
            " (a backup is kept)",
        )


def write_inventory(path: Path, data: bytes, when: float) -> Path | None:
    """Write `data` to `path`; a file there is first copied to a backup no earlier file has,
    whose name is returned."""
    backup = None
    if path.exists():
        backup = backup_path(path, when)
        write_file(backup, path.read_bytes())
    write_file(path, data)
    return backup


YAML_SUFFIXES = (".yml", ".yaml")


def extended_file(inventories: Sequence[Path]) -> Path | None:
    """The inventory -i names for init to add hosts to: one YAML file, or none."""
    if not inventories:
        return None
    if len(inventories) > 1:
        raise UsageError("init adds hosts to one inventory: give -i once")
    path = inventories[0]
    if not path.is_file() or path.suffix not in YAML_SUFFIXES:
        raise UsageError(
            f"{path} is not a YAML inventory file",
            hint="init adds hosts to a .yml or .yaml file; for another kind, write a new "
            "file with -o and give both with -i",
        )
    return path


def output_path(extended: Path | None, output: Path | None, project_root: Path | None) -> Path:
    if output is not None:
        return output
    if extended is not None:
        return extended
    if project_root is not None:
        return project_root / "inventories" / "default.yml"
    return Path("inventory.yml")


def init_inventory(
    fleet: Fleet,
    sets: dict[str, PatchSet],
    extended: Path | None,
    path: Path,
    *,
    force: bool,
    dry_run: bool,
) -> InitReport:
    """Read every host of the fleet, then write the inventory of those read (appended to
    `extended`'s text, in a top-level group of its own, when given)."""
    refuse_existing(path, force or path == extended)
    now = time.time()
    top = extension_group(top_level_groups(extended), now) if extended else "all"
    results = fleet.run(lambda host, conn: survey(host, conn, list(sets.values())))
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(now))
    text = inventory_text(list(results.succeeded.values()), results.failed, when, top)
    report = InitReport(results, text, path, extended=extended)
    if dry_run or not report.surveys:
        return report
    old = extended.read_bytes().rstrip(b"\n") + b"\n\n" if extended else b""
    report.backup = write_inventory(path, old + text.encode(), now)
    report.written = True
    return report
