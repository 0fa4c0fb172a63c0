"""What would start where: render each target's command, plan it, and refuse a placement
that shares a machine's GPUs, ports or state, before any host is touched. Each host's own
check is ops/preflight.py's; starting and waiting are a run's life cycle: ops/runs.py."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property, partial
from typing import Any
from urllib.parse import urlsplit

from deployctl.addresses import machine_address
from deployctl.choices import PdRole, ThresholdMode
from deployctl.deployments import (
    GroupKey,
    describe_gpus,
    group_of,
    node_rank,
    pd_wait,
)
from deployctl.disaggregation import PdRouter, PdServer, check_router, check_server
from deployctl.errors import DeployctlError, PreflightError, UsageError
from deployctl.fanout import FleetResult, attempt
from deployctl.findings import Findings
from deployctl.inventory import Host
from deployctl.launchers import Launcher, ServerCommand, launcher_for
from deployctl.ops.flags import (
    check_reading,
    command_values,
    runs_router,
)
from deployctl.ops.gpus import DEFAULT_MAX_USED_MIB
from deployctl.ops.router import (
    Select,
    WorkerKind,
    reachability_problem,
    router_of,
    workers_of,
)
from deployctl.ops.sharing import (
    SHARE_HINT,
    GpuUser,
    command_fraction,
    fraction_problem,
    over_bound,
    unset_problem,
)
from deployctl.patchset import (
    PatchSet,
    flag_violations,
    sets_for_flags,
    speculates,
)
from deployctl.project import Project
from deployctl.remote.server_argv import CommandValues
from deployctl.remote.wire import shares_gpus
from deployctl.render import RenderedCommand, TemplateSet, default_template, parse_overrides
from deployctl.settings import check_layer, overlay, own_layer
from deployctl.text import is_number


def render_commands(
    project: Project,
    hosts: Sequence[Host],
    template: str | None,
    threshold: int | None,
    set_pairs: Sequence[str],
    patch_sets: Mapping[str, PatchSet] | None = None,
    inventory_threshold: bool = True,
    threshold_mode: ThresholdMode | None = None,
) -> FleetResult[RenderedCommand]:
    """Render the launch command for each host locally; check patch-set flag constraints.

    Without `threshold`, a host's `threshold` variable is used where the command speculates
    (unless `inventory_threshold` is off: tune's unthrottled phases). `threshold_mode`
    overrides each host's, as `--set threshold_mode=…` would."""
    overrides = parse_overrides(set_pairs)
    if threshold_mode is not None:
        overrides["threshold_mode"] = threshold_mode
    reached = sorted(k for k in overrides if k.startswith("ansible_"))
    if reached:
        raise UsageError(
            f"--set cannot change how hosts are reached: {', '.join(reached)}",
            hint="set connection variables in the inventory",
        )
    templates = TemplateSet(project.search_dirs("templates"))
    # The overrides are the host's variables from here on: its log_dir, state_dir, python…
    hosts = [
        Host(host.name, overlay(host.vars, overrides, f"host {host.label}"), host.deployment)
        for host in hosts
    ]

    def render_one(host: Host) -> RenderedCommand:
        from_inventory = threshold is None and inventory_threshold
        given = host.settings.given("threshold") if from_inventory else threshold
        name = default_template(host, template, given)
        templates.check(host, name)
        # A server is never built from a default put in place of a variable that is not
        # ours, and a template never sees one.
        host.settings.require_own(skip=own_layer(overrides))
        rendered = templates.render(host, name, threshold, overrides)
        inventory_value = host.settings.threshold if from_inventory else None
        # The inventory's threshold is for servers that speculate: `-t baseline` stays plain.
        if inventory_value is not None and speculates(rendered.argv):
            rendered = templates.render(host, name, inventory_value, overrides)
        # What the command says, whoever wrote it (a template, extra_args, --set), read as
        # the server will read it.
        values = command_values(host, rendered.argv)
        # A value that is no number is said as such before any disagreement it also makes.
        problems = number_problems(host, values)
        if problems:
            raise PreflightError(problems[0], hint="fix the value in the inventory or --set")
        if not runs_router(rendered.argv):
            check_reading(host, values)
        check_layer(overrides, "--set")  # what number_problems does not see
        if patch_sets is not None:
            problems = flag_violations(rendered.argv, sets_for_flags(rendered.argv, patch_sets))
            if problems:
                raise PreflightError(
                    problems[0],
                    hint="change the template's values with --set, e.g. --set speculative_eagle_topk=1",
                )
        # What the launcher is given (a batch script), shown wherever the command is.
        script = Plan(host, rendered, []).launcher_script(masked=True)
        if script is not None:
            rendered = dataclasses.replace(rendered, launcher_script=script)
        return rendered

    return FleetResult(attempt(host, partial(render_one, host)) for host in hosts)


def number_problems(host: Host, values: CommandValues) -> list[str]:
    """Say which of the command's port and tensor parallelism is not a usable number."""
    port = str(values.get("port") or host.settings.value("port"))
    problems = []
    if not (is_number(port) and 1 <= int(port) <= 65535):
        problems.append(f"--port {port!r} is not a port number (1-65535)")
    tp, value = values.last("tp_size"), values.get("tp_size")
    if tp is not None and value is not None and not (is_number(value) and int(value) >= 1):
        problems.append(f"{tp.name} {value!r} is not a number of GPUs")
    fraction = fraction_problem(values)
    return problems + ([fraction] if fraction else [])


class Role(StrEnum):
    """What a plan's command serves, whichever launcher starts it (`Plan.launcher`): the
    two are orthogonal, a router may run as a process or as a job."""

    SERVER = "server"  # an SGLang server: GPUs, SGLang flags checked
    ROUTER = "router"  # SGLang's router: no GPU, no SGLang flags, a Prometheus port of its own


@dataclass
class Plan:
    """What will run on one host: the command, the sets it needs and where it logs."""

    host: Host
    rendered: RenderedCommand
    needed_sets: list[PatchSet]
    # The deployments of the same launch on this machine that share a GPU with it.
    siblings: list[GpuUser] = field(default_factory=list)

    @cached_property
    def values(self) -> CommandValues:
        """What its command gives the options deployctl reads, as the server will take it."""
        return command_values(self.host, self.rendered.argv)

    @property
    def port(self) -> int:
        """The server's HTTP port (the SSH port is `Host.port`)."""
        return int(self.values.get("port") or self.host.settings.server_port)

    @property
    def bind_host(self) -> str:
        return self.values.get("host") or "127.0.0.1"

    @property
    def tp(self) -> int:
        return int(self.values.get("tp_size") or 1)

    @property
    def local_tp(self) -> int:
        """The GPUs this host gives the server: its share of the tensor parallelism."""
        if self.role is Role.ROUTER:
            return 0
        return self.launcher.host_share(self.tp, self.host.settings.nnodes)

    @property
    def mem_fraction(self) -> float | None:
        """The share of each of its GPUs' memory the server takes, as its command says."""
        return command_fraction(self.values)

    def gpu_user(self) -> GpuUser:
        return GpuUser(self.host.label, self.gpus, self.mem_fraction)

    @property
    def launcher(self) -> Launcher:
        """How the server starts (`launcher`): a process on the host, a Slurm job, …"""
        return launcher_for(self.host.settings)

    def launcher_script(self, masked: bool, max_used_mib: int = DEFAULT_MAX_USED_MIB) -> str | None:
        """What the launcher is given instead of the command (a job's batch script): shown
        masked, or real for the host; None: the command runs as it is."""
        rendered = self.rendered
        server = ServerCommand(
            rendered.argv_shown if masked else rendered.argv,
            rendered.env_shown if masked else rendered.env,
            self.tp,
            self.port,
            self.bind_host,
        )
        return self.launcher.script(self.host.settings, server, max_used_mib)

    @property
    def role(self) -> Role:
        return Role.ROUTER if runs_router(self.rendered.argv) else Role.SERVER

    @property
    def kind(self) -> WorkerKind:
        """Its side of a prefill/decode pair and bootstrap port, as the command says."""
        return WorkerKind.of_values(self.values)

    @property
    def pd_role(self) -> PdRole | None:
        return self.kind.role

    @property
    def bootstrap_port(self) -> int | None:
        return self.kind.bootstrap_port

    @property
    def _listeners(self) -> dict[int, tuple[str, str]]:
        """The ports it listens on besides its server port: what each is for, and the address
        it is bound on — the server's --host (SGLang's bootstrap server binds it), the router's
        `bind_host` (its template's --prometheus-host), or every address ("": torch's
        rendezvous store on a multi-node rank 0)."""
        if self.role is Role.ROUTER:
            metrics = self.host.settings.router_metrics_port
            return {
                metrics: ("router_metrics_port, its Prometheus port", self.host.settings.bind_host)
            }
        found = {}
        if self.group and self.node_rank == 0:  # rank 0 also listens for the other nodes
            found[self.host.settings.dist_port] = ("dist_port, where the other nodes join", "")
        if self.bootstrap_port is not None and self.node_rank == 0:
            found[self.bootstrap_port] = ("bootstrap_port, where decodes fetch KV", self.bind_host)
        return found

    @property
    def extra_ports(self) -> dict[int, str]:
        """The ports it listens on besides its server port, and what each is for."""
        return {port: why for port, (why, _) in self._listeners.items()}

    @property
    def extra_port_addresses(self) -> dict[int, str]:
        """Where each of `extra_ports` is bound, so preflight checks it there: a port another
        server holds on another address of the host does not stop a bind to this one."""
        return {port: address for port, (_, address) in self._listeners.items()}

    @property
    def group(self) -> GroupKey | None:
        """The multi-node deployment this plan is one node of."""
        return group_of(self.host)

    @property
    def node_rank(self) -> int:
        return node_rank(self.host)

    @property
    def gpus(self) -> list[int] | None:
        """The GPUs the server may use (None: all of the host's; a router, or a job whose
        GPUs are on its nodes: none of this host's)."""
        return [] if self.role is Role.ROUTER else self.launcher.host_gpus(self.host)

    @property
    def launch_module(self) -> str | None:
        argv = self.rendered.argv
        return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None

    def check_paths(self) -> list[str]:
        """Paths the command needs on the host: its models, and the InfiniBand devices its
        KV transfer names (SGLang reads them from /sys/class/infiniband)."""
        values = self.values
        paths = [values.get(d) for d in ("model_path", "speculative_draft_model_path")]
        return [p for p in paths if p] + ib_device_paths(values.get("disaggregation_ib_device"))


IB_DEVICES = "/sys/class/infiniband"


def ib_device_paths(value: str | None) -> list[str]:
    """Where the host shows each device `--disaggregation-ib-device` names: a comma list
    (mlx5_0,mlx5_1), a JSON mapping of GPU to such a list, or the path of a JSON file with
    that mapping (the file itself is what must exist then)."""
    if not value:
        return []
    text = value.strip()
    if text.startswith("{"):
        try:
            mapping = json.loads(text)
        except ValueError:
            return []  # SGLang refuses it with its own words
        groups = [str(v) for v in mapping.values()] if isinstance(mapping, dict) else []
    elif "/" in text:
        return [text]
    else:
        groups = [text]
    devices = [d.strip() for g in groups for d in g.split(",") if d.strip()]
    return [f"{IB_DEVICES}/{d}" for d in dict.fromkeys(devices)]


def plan_launch(
    project: Project,
    hosts: Sequence[Host],
    template: str | None,
    threshold: int | None,
    set_pairs: Sequence[str],
    patch_sets: Mapping[str, PatchSet],
    inventory_threshold: bool = True,
    threshold_mode: ThresholdMode | None = None,
) -> list[Plan]:
    """Render and check every host's command locally; refuse before any host is touched."""
    rendered = render_commands(
        project, hosts, template, threshold, set_pairs, patch_sets, inventory_threshold,
        threshold_mode,
    )  # fmt: skip
    failed = [r for r in rendered if r.failed]
    for result in failed:
        if result.is_bug and result.exception is not None:
            raise result.exception  # a bug keeps its traceback: the CLI writes it to a file
    if failed:
        first = failed[0]
        names = ", ".join(r.name for r in failed)
        raise DeployctlError(f"{names}: {first.error}", hint=first.hint)
    plans = [
        Plan(r.host, r.value, sets_for_flags(r.value.argv, patch_sets))
        for r in rendered
        if r.value is not None
    ]
    check_placement(plans)
    note_siblings(plans)
    return plans


def deployment_words(name: str | None) -> str:
    return f"deployment {name}" if name else "the host's default deployment"


def check_placement(plans: Sequence[Plan]) -> None:
    """Refuse deployments of one launch that would share a machine's GPUs, ports or state:
    two deployments of a host, or two inventory hosts that are one machine (the nodes of a
    multi-node server placed on one box, or one address written two ways), and rank 0's
    `dist_port` as anyone's server port."""
    by_machine: dict[tuple[str, str, int], list[Plan]] = {}
    for plan in plans:
        by_machine.setdefault(machine(plan.host), []).append(plan)
    for same_machine in by_machine.values():
        for plan in same_machine:
            if plan.group is not None and plan.node_rank == 0:
                dist_port = plan.host.settings.dist_port
                taken = next((p for p in same_machine if p.port == dist_port), None)
                if taken is not None:
                    raise PreflightError(
                        f"{plan.host.label}'s dist_port {dist_port}, where the other nodes "
                        f"join, is {taken.host.label}'s server port",
                        hint="give the group a dist_port no server on that host uses",
                    )
        for first, second in itertools.combinations(same_machine, 2):
            check_state_folder(first, second)
        check_extra_ports(same_machine)
        for first, second in itertools.combinations(same_machine, 2):
            pair = f"{first.host.label} and {second.host.label}{_one_machine_note(first, second)}"
            unset = unset_problem([first.gpu_user(), second.gpu_user()])
            if shares_gpus(first.gpus, second.gpus) and unset is not None:
                raise PreflightError(
                    f"{pair} would share GPUs ({describe_gpus(first.gpus)} and "
                    f"{describe_gpus(second.gpus)}); {unset}",
                    hint=SHARE_HINT,
                )
            if first.port == second.port:
                raise PreflightError(
                    f"{pair} would share port {first.port}",
                    hint="give each deployment on a host its own `port`",
                )
        check_gpu_sums(same_machine)


def check_state_folder(first: Plan, second: Plan) -> None:
    """Refuse two inventory names of one machine that would keep one deployment in one
    state_dir: one's launch lock would lock out the other, and their runs' records collide."""
    if first.host.name == second.host.name or first.host.deployment != second.host.deployment:
        return
    if state_folder(first.host) != state_folder(second.host):
        return
    raise PreflightError(
        f"{one_machine_words([first, second])}: both would keep "
        f"{deployment_words(first.host.deployment)} in state_dir {first.host.settings.state_dir}",
        hint=ONE_MACHINE_HINT,
    )


ONE_MACHINE_HINT = (
    "list the machine once in the inventory (one host with several deployments), "
    "or give each name its own state_dir"
)


def state_folder(host: Host) -> tuple[str, str]:
    """Which folder of its machine the host's state_dir is: a `~` one is its login's."""
    path = host.settings.state_dir
    return ((host.user or "") if path.startswith("~") else "", path)


def one_machine_words(plans: Sequence[Plan]) -> str:
    """`alpha and alpha2 are one machine (127.0.5.3 and 127.1283 both reach 127.0.5.3)`."""
    names = list(dict.fromkeys(p.host.name for p in plans))
    written = list(dict.fromkeys(p.host.address for p in plans))
    where = written[0]
    if len(written) > 1:
        where = f"{' and '.join(written)} both reach {machine_name(plans[0].host)}"
    return f"{' and '.join(names)} are one machine ({where})"


def _one_machine_note(first: Plan, second: Plan) -> str:
    """` (one machine: 127.0.5.3)` for two inventory names; nothing for one host's two."""
    if first.host.name == second.host.name:
        return ""
    return f" (one machine: {machine_name(first.host)})"


def check_gpu_sums(same_machine: Sequence[Plan]) -> None:
    """Refuse one launch's deployments of one machine that would fill a GPU they share past
    the bound (check_placement refused those that share without a fraction)."""
    users = [p.gpu_user() for p in same_machine if p.launcher.checks_host]
    names = list(dict.fromkeys(p.host.name for p in same_machine))
    where = names[0]
    if len(names) > 1:  # inventory names of one machine: say so, the sum is its GPUs'
        where = f"{machine_name(same_machine[0].host)} ({' and '.join(names)}: one machine)"
    problem = over_bound(users, where) if users else None
    if problem is not None:
        raise PreflightError(problem, hint=SHARE_HINT)


def note_siblings(plans: Sequence[Plan]) -> None:
    """Tell each plan which deployments of its launch share its GPUs: its preflight needs
    room for theirs too, as they start at the same time."""
    for plan in plans:
        plan.siblings = [
            other.gpu_user() for other in plans if other is not plan and shares_a_gpu(plan, other)
        ]


def shares_a_gpu(first: Plan, second: Plan) -> bool:
    """Two plans of one machine whose GPUs overlap (a job's GPUs are on its nodes: never)."""
    return (
        first.launcher.checks_host
        and second.launcher.checks_host
        and machine(first.host) == machine(second.host)
        and shares_gpus(first.gpus, second.gpus)
    )


def check_extra_ports(same_machine: Sequence[Plan]) -> None:
    """Refuse two of one machine's deployments listening on one port besides their server
    ports (two prefills' bootstrap ports), or one such port that is a server port. A job's
    ports are on its nodes, not on the login node that submits it."""
    for on_host in (True, False):
        check_ports_of([p for p in same_machine if p.launcher.checks_host is on_host])


def check_ports_of(plans: Sequence[Plan]) -> None:
    taken: dict[int, str] = {p.port: f"{p.host.label}'s server port" for p in plans}
    for plan in plans:
        for port, why in plan.extra_ports.items():
            name = why.split(",")[0]
            other = taken.get(port)
            if other is not None:
                raise PreflightError(
                    f"{plan.host.label}'s {name} {port} is also {other}",
                    hint=f"give each deployment on a host its own {name}",
                )
            taken[port] = f"{plan.host.label}'s {name}"


def machine(host: Host) -> tuple[str, str, int]:
    """What makes two inventory hosts one machine: how and where they are reached, however
    the address is written (127.0.5.3 and 127.1283 are one)."""
    if host.is_local:
        return ("local", "", 0)
    return (host.connection, machine_address(host.address), host.port or 22)


def machine_name(host: Host) -> str:
    """The machine as messages name it: its address in standard form, or `this machine`."""
    return "this machine" if host.is_local else machine(host)[1]


def routing_check(select: Select, plan: Plan, mla: bool | None = None) -> Findings:
    """Problems, hints and warnings for a worker whose router is not in the inventory or
    could not reach it where it binds, and for a router's prefill/decode servers that do not
    make pairs (checked before anything starts). `mla`: the model uses MLA, as its host's
    preflight read it."""
    found = Findings()
    if plan.role is Role.ROUTER:
        if plan.host.settings.pd_router:
            workers = workers_of(plan.host, select)
            return check_router(plan.host.label, [pd_server(w) for w in workers])
        return found
    if plan.node_rank != 0 or plan.host.settings.router is None:
        if plan.pd_role is not None and plan.node_rank == 0:
            found.problem(
                f"{plan.host.label} is a {plan.pd_role} but names no router",
                "a prefill and its decodes meet at a router with pd: true",
            )
        return found
    try:
        router = router_of(plan.host, select)
    except DeployctlError as exc:
        found.problem(exc.message, exc.hint or None)
        return found
    if router is None:
        return found
    problem = reachability_problem(plan.host, router, plan.bind_host)
    if problem is not None:
        found.problem(
            problem,
            "bind the worker where its router reaches it (bind_host: 0.0.0.0), or set worker_url",
        )
    settings = router.settings
    if not settings.pd_router and plan.pd_role is None:
        return found  # no pair to check (and no walk over the inventory for one)
    others = [pd_server(w) for w in workers_of(router, select)]
    pd_router = PdRouter(router.label, router.address, settings.pd_router, settings.request_timeout)
    pairs = check_server(pd_server(plan.host, plan), others, pd_router, mla)
    found.add(pairs)
    return found


def pd_server(host: Host, plan: Plan | None = None) -> PdServer:
    """A worker as its router's pair checks see it: from its command when this launch plans
    it (what --set changed included), else from its settings. How long it may wait for its
    other side is read only of the planned one: only its own is checked."""
    settings = host.settings
    waits = 0.0
    if plan is None:
        role, tp, bind = settings.pd_role, settings.tp, settings.bind_host
        model, backend = str(settings.value("model_path")), settings.transfer_backend
        pp = _pp_size(settings.context().get("extra_args"))
    else:
        values = plan.values
        role, tp, bind = plan.pd_role, plan.tp, plan.bind_host
        model = str(values.get("model_path"))
        backend = str(values.get("disaggregation_transfer_backend") or "mooncake")
        pp = _pp_size(plan.rendered.argv)
        waits = pd_wait(plan.rendered.env)
    url_host = urlsplit(settings.worker_url or "").hostname or ""
    return PdServer(host.label, role, model, tp, pp, backend, host.address, bind, url_host, waits)


def _pp_size(argv: Any) -> int:
    """Pipeline parallelism as a command (or `extra_args`) sets it; 1 when it does not."""
    words = argv.split() if isinstance(argv, str) else [str(w) for w in argv or []]
    value = CommandValues(words).get("pp_size")
    return int(value) if value is not None and is_number(value) else 1


def routers_among(project: Project, targets: Sequence[Host]) -> list[Host]:
    """The targets whose command (as launch would render it) starts a router."""
    rendered = render_commands(project, targets, None, None, [])
    found = [r.host for r in rendered if r.value is not None and runs_router(r.value.argv)]
    if not found:
        raise UsageError(
            "no router among the selected deployments",
            hint="a router is a deployment with template: router",
        )
    return found
