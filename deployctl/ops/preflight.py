"""Preflight: may this plan start on its host? One round trip reads the host (its lock,
GPUs, live runs, ports, SGLang, patch sets, paths), then every check of PREFLIGHT_CHECKS
judges a plan against what was read. Rendering and placement are ops/plan.py's."""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from deployctl import agent
from deployctl.connection import Connection
from deployctl.deployments import (
    describe_gpus,
)
from deployctl.errors import DeployctlError
from deployctl.facts import GpuState, ProbeOutput, parse_gpus_command
from deployctl.findings import Findings
from deployctl.launchers import launcher_of
from deployctl.ops.flags import (
    FlagReport,
    checked_argv,
    flag_report,
)
from deployctl.ops.gpus import DEFAULT_MAX_USED_MIB, GpuReport, gpu_report
from deployctl.ops.patch import PatchFacts, SetState, hunk_marks, parse_patch_facts, set_state
from deployctl.ops.plan import (
    IB_DEVICES,
    ONE_MACHINE_HINT,
    Plan,
    Role,
    deployment_words,
    routing_check,
)
from deployctl.ops.router import Select, router_of
from deployctl.ops.sharing import (
    SHARE_HINT,
    live_user,
    over_bound,
    shared_gpu_problems,
    sharing_live,
    unset_problem,
)
from deployctl.ops.skew import SKEW_HINT, Software, skew_problem, software_of
from deployctl.patchset import (
    PatchSet,
)
from deployctl.remote.protocol import (
    ClientIdentity,
    LiveRun,
    PreflightArgs,
    PreflightReply,
    ReleaseArgs,
)
from deployctl.remote.wire import GPUS_COMMAND, shares_gpus

# How long a lock may be held when the holder says nothing shorter; past its expiry it is
# stale even when its owner cannot be checked (another machine).
LOCK_STALE_AFTER = 6 * 3600
# The launch's op when deployments of it share a GPU: their locks on it are held together
# (remote/locks.py's SHARING_OP; a test keeps the two the same).
SHARING_OP = "launch sharing GPUs"


def client_identity(
    op: str, hold_for: float = LOCK_STALE_AFTER, launch: str = "", target: str = ""
) -> ClientIdentity:
    """Who takes the host lock, and until when it may hold it at most; `launch` and
    `target`: which launch command takes it, for which of its targets."""
    client: ClientIdentity = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "user": getpass.getuser(),
        "op": op,
        "expires": time.time() + hold_for,
    }
    if launch:
        client["launch"] = launch
        client["target"] = target
    return client


@dataclass
class Preflight(Findings):
    """One host's answer to 'may we start here?', with the lock when we hold it."""

    plan: Plan
    flags: FlagReport | None = None  # what the host's SGLang says of the command
    gpus: GpuReport | None = None
    next_log: str = ""
    next_version: int = 1
    lock_token: str | None = None
    model_mla: bool | None = None  # its model uses MLA (None: its config could not be read)
    software: Software | None = None  # its SGLang and patch sets (None: SGLang not read)


def preflight_args(
    plan: Plan, break_lock: str | None = None, hold_for: float = LOCK_STALE_AFTER, launch: str = ""
) -> PreflightArgs:
    host = plan.host
    return {
        "state_dir": host.settings.state_dir,
        "deployment": host.deployment,
        "gpus": plan.gpus,
        "paths": sorted(
            {f for s in plan.needed_sets for v in s.variants.values() for f in v.files}
        ),
        "hunks": hunk_marks(plan.needed_sets),
        "port": plan.port,
        "also_ports": {str(p): a for p, a in sorted(plan.extra_port_addresses.items())},
        "bind_host": plan.bind_host,
        "check_paths": plan.check_paths(),
        "module": plan.launch_module,
        "log_dir": host.settings.log_dir,
        "log_stem": plan.rendered.log_stem,
        "client": client_identity(
            SHARING_OP if sharing_siblings(plan) else "launch", hold_for, launch, plan.host.label
        ),
        "break_lock": break_lock,
        "server_argv": None
        if plan.role is Role.ROUTER
        else checked_argv(host, plan.launcher.checked_form(plan.rendered.argv)),
        # Whether the pair's TP may differ (MLA models only) is read from its config.
        "model": plan.check_paths()[0] if plan.pd_role and plan.check_paths() else None,
    }


def sharing_siblings(plan: Plan) -> bool:
    """Whether deployments of the plan's launch share its GPUs (each with its fraction:
    plan_launch refused the others)."""
    return bool(plan.siblings) and plan.mem_fraction is not None


def is_stale(holder: Mapping[str, Any]) -> bool:
    """A lock is stale when its owner here is dead, or when its time is up.

    A record without a usable pid and expiry was not written by any deployctl (they all
    write both), and nothing would ever end it: it is stale too.
    """
    try:
        pid, expires = int(holder["pid"]), float(holder["expires"])
    except (KeyError, TypeError, ValueError):
        return True
    if pid <= 0 or time.time() > expires:
        return True
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _preflight_call(
    plan: Plan, conn: Connection, break_lock: str | None, hold_for: float, launch: str
) -> tuple[dict[str, ProbeOutput], PreflightReply]:
    return agent.call_beside(
        plan.host,
        conn,
        {"gpus": GPUS_COMMAND},
        agent.PREFLIGHT,
        preflight_args(plan, break_lock, hold_for, launch),
    )


def run_preflight(
    plan: Plan,
    conn: Connection,
    max_used_mib: int,
    hold_for: float = LOCK_STALE_AFTER,
    beside: str | None = None,
    replacing: bool = False,
    launch: str = "",
    select: Select | None = None,
) -> Preflight:
    """Check one host in one round trip (two when a stale lock must be cleared). `beside`: a
    live run of the deployment the new one may start beside (a job's successor).
    `replacing`: the deployment's run still serves and is stopped only if this passes, so
    what it holds (its GPUs, its ports, itself as a live run) is checked after the stop.
    `launch`: the launch command's id; a lock that very launch holds is never broken.
    `select`: the inventory, where a worker's router is found (None: routing not checked)."""
    outputs, doc = _preflight_call(plan, conn, None, hold_for, launch)
    lock = doc["lock"]
    holder = lock["holder"] or {}
    ours = bool(launch) and holder.get("launch") == launch
    if not lock["acquired"] and not ours and (is_stale(holder) or _orphaned(holder)):
        outputs, doc = _preflight_call(plan, conn, holder.get("token"), hold_for, launch)
        lock = doc["lock"]
    if lock["token"] is not None:
        _HELD.add(lock["token"])
    facts = HostFacts(doc, outputs["gpus"], max_used_mib, beside, replacing, launch, select)
    return judge(plan, facts)


@dataclass(frozen=True)
class HostFacts:
    """What a host's preflight call read, and how this launch asks: what each check reads
    beside its plan."""

    reply: PreflightReply
    gpus_probe: ProbeOutput  # nvidia-smi's, asked beside the call
    max_used_mib: int = DEFAULT_MAX_USED_MIB
    beside: str | None = None  # see run_preflight
    replacing: bool = False
    launch: str = ""
    select: Select | None = None

    @cached_property
    def live(self) -> list[LiveRun]:
        """The host's live runs, less the one the new run may start beside."""
        return [r for r in self.reply["live_runs"] if r["id"] != self.beside]

    @cached_property
    def gpu_state(self) -> GpuState | str:
        """The host's GPUs, or why nvidia-smi's answer cannot be read (read only when asked:
        a router's host may have no nvidia-smi)."""
        probe = self.gpus_probe
        try:
            return parse_gpus_command(probe.exit_code, probe.output, probe.stderr)
        except DeployctlError as exc:
            return exc.message

    @cached_property
    def patches(self) -> PatchFacts:
        return parse_patch_facts(self.reply)


def judge(plan: Plan, facts: HostFacts) -> Preflight:
    """Run every check of PREFLIGHT_CHECKS, in order, over what the host read."""
    reply = facts.reply
    result = Preflight(
        plan,
        flags=flag_reading(plan, facts),
        gpus=gpu_reading(plan, facts),
        next_log=reply["next_log"],
        next_version=reply["next_version"],
        lock_token=reply["lock"]["token"],
        model_mla=reply["model_mla"],
        software=software_of(facts.patches, plan.needed_sets),
    )
    for check in PREFLIGHT_CHECKS:
        result.add(check.run(plan, facts))
    result.hints = list(dict.fromkeys(result.hints))  # two runs in the way: one hint
    return result


# ---- the checks: each a function of a plan and its host's facts --------------------------


def check_lock(plan: Plan, facts: HostFacts) -> Findings:
    found = Findings()
    lock = facts.reply["lock"]
    if lock["acquired"]:
        return found
    holder = lock["holder"] or {}
    if facts.launch and holder.get("launch") == facts.launch:
        found.problem(same_launch_holder(plan, holder, facts.reply["machine"]), ONE_MACHINE_HINT)
    else:
        found.problem(
            f"another deployctl {holder.get('op', 'operation')} is in progress on "
            f"{plan.host.name} (pid {holder.get('pid')} on {holder.get('host')})"
        )
    return found


def check_launcher(plan: Plan, facts: HostFacts) -> Findings:
    return plan.launcher.preflight(plan.host, plan.tp, plan.bind_host, facts.reply)


def _checks_gpus(plan: Plan, facts: HostFacts) -> bool:
    """A server on this host's GPUs, whose run is not being replaced (its own GPUs are
    checked after the stop). A router needs no GPU, nor nvidia-smi."""
    return plan.launcher.checks_host and not facts.replacing and plan.role is not Role.ROUTER


def _missing_gpus(plan: Plan, state: GpuState) -> list[int]:
    have = [g.index for g in state.gpus]
    return [i for i in plan.gpus or [] if i not in have]


def gpu_reading(plan: Plan, facts: HostFacts) -> GpuReport | None:
    """The plan's GPUs as the host shows them; None where they are not checked, cannot be
    read, or are not all there."""
    if not _checks_gpus(plan, facts):
        return None  # a router's host, a job's login node: nvidia-smi's answer is not read
    state = facts.gpu_state
    if isinstance(state, str) or _missing_gpus(plan, state):
        return None
    return gpu_report(state, facts.max_used_mib, plan.gpus)


def check_gpus(plan: Plan, facts: HostFacts) -> Findings:
    """Are the plan's GPUs there, enough for its tensor parallelism, and clean (or, shared
    with live runs of ours, with room for its memory fraction)?"""
    found = Findings()
    if not _checks_gpus(plan, facts):
        return found
    state = facts.gpu_state
    if isinstance(state, str):
        found.problem(f"GPUs cannot be checked: {state}")
        return found
    host, chosen = plan.host, plan.gpus
    report = gpu_reading(plan, facts)
    if report is None:
        have = [g.index for g in state.gpus]
        missing = describe_gpus(_missing_gpus(plan, state))
        found.problem(f"{missing} not on {host.name} (it has {describe_gpus(have)})")
        return found
    sharers = gpu_sharers(plan, facts.live)
    shared = shared_gpu_problems(
        host.name, plan.gpu_user(), plan.siblings, sharers, state, facts.max_used_mib
    )
    stop_hint = f"stop what holds them (deployctl stop -H {host.name})"
    if shared is not None:
        found.problems += shared
        if shared:
            found.hints.append(f"{stop_hint} or lower mem_fraction_static")
    elif not report.clean:
        subject = "GPUs are"
        if chosen is not None:
            subject = (
                f"{describe_gpus(chosen)} of {host.name} {'is' if len(chosen) == 1 else 'are'}"
            )
        found.problem(f"{subject} not clean: {report.verdict()}", f"{stop_hint} or kill those PIDs")
    if len(report.gpus) < plan.local_tp:
        has = f"{host.name} has {len(report.gpus)}"
        if chosen is not None:
            has = f"{deployment_words(host.deployment)} has {len(chosen)} ({describe_gpus(chosen)})"
        needs = f"{plan.local_tp} GPUs"
        if plan.group is not None:
            needs += f" on each of its {host.settings.nnodes} nodes"
        found.problem(f"tensor parallelism {plan.tp} needs {needs}; {has}")
    return found


def check_live_runs(plan: Plan, facts: HostFacts) -> Findings:
    if facts.replacing:  # the others' fractions do not depend on the run it replaces
        return live_share_problems(plan, facts.live)
    return live_run_problems(plan, facts.live)


def check_ports(plan: Plan, facts: HostFacts) -> Findings:
    """Its ports free on the host (a job's are on its node; a replaced run's, after its stop)."""
    found = Findings()
    if not plan.launcher.checks_host or facts.replacing:
        return found
    reply, name = facts.reply, plan.host.name
    for port, why in reply["busy_ports"].items():
        what = plan.extra_ports.get(int(port), "")
        found.problem(f"port {port} ({what}) is in use on {name} ({why})")
    if not reply["port_free"]:
        found.problem(f"port {plan.port} is in use on {name} ({reply['port_error']})")
    return found


def check_module(plan: Plan, facts: HostFacts) -> Findings:
    found = Findings()
    if not facts.reply["module_found"]:
        host = plan.host
        found.problem(
            f"{host.settings.python} on {host.name} cannot find module {plan.launch_module}",
            "set the host's `python` to the interpreter that has SGLang installed",
        )
    return found


def _bad_sets(plan: Plan, facts: HostFacts) -> list[tuple[PatchSet, SetState]]:
    """The plan's patch sets that are not good on the host (none where SGLang is not read)."""
    if facts.patches.error:
        return []
    states = [(s, set_state(facts.patches, s)) for s in plan.needed_sets]
    return [(s, state) for s, state in states if not state.good]


def check_patches(plan: Plan, facts: HostFacts) -> Findings:
    found = Findings()
    name = plan.host.name
    if plan.needed_sets and facts.patches.error:
        found.problem(facts.patches.error)
    for patch_set, state in _bad_sets(plan, facts):
        flags = ", ".join(r.flag for r in patch_set.flags)
        found.problem(
            f"{flags} needs patch set {patch_set.name}, which is {state.state} on {name}"
            + (f" ({state.detail})" if state.detail else ""),
            f"deployctl patch apply {patch_set.name} -H {name}",
        )
    return found


def flag_reading(plan: Plan, facts: HostFacts) -> FlagReport:
    """What the host's SGLang says of the command; a flag whose missing patch set the patch
    check names is left to it (one problem per cause)."""
    unpatched = [r.flag for patch_set, _ in _bad_sets(plan, facts) for r in patch_set.flags]
    sets = {s.name: s for s in plan.needed_sets}
    reply = facts.reply
    return flag_report(
        plan.host, plan.values, reply["argv_check"], reply["sglang"], sets, unpatched
    )


def check_paths(plan: Plan, facts: HostFacts) -> Findings:
    found = Findings()
    name = plan.host.name
    for path, exists in facts.reply["paths"].items():
        if exists:
            continue
        if path.startswith(IB_DEVICES + "/"):
            device = path.removeprefix(IB_DEVICES + "/")
            found.problem(
                f"InfiniBand device {device} (ib_device) is not on {name}",
                f"{IB_DEVICES} on {name} lists the devices it has",
            )
        else:
            found.problem(f"{path} does not exist on {name}")
    return found


def check_log_dir(plan: Plan, facts: HostFacts) -> Findings:
    found = Findings()
    if not facts.reply["log_dir_writable"]:
        found.problem(
            f"log folder {plan.host.settings.log_dir} is not writable: "
            f"{facts.reply['log_dir_error']}"
        )
    return found


def check_routing(plan: Plan, facts: HostFacts) -> Findings:
    if facts.select is None:
        return Findings()
    return routing_check(facts.select, plan, facts.reply["model_mla"])


@dataclass(frozen=True)
class Check:
    """One of preflight's checks: its name and what it checks (the docs list these)."""

    name: str
    description: str
    run: Callable[[Plan, HostFacts], Findings]


# Preflight, in the order its problems are said. "What preflight checks" in
# docs/guides/launching.md lists each one as `name`: description (tests/test_preflight.py keeps
# the two equal).
PREFLIGHT_CHECKS: tuple[Check, ...] = (
    Check(
        "lock",
        "no other deployctl holds the deployment's launch lock (a stale one is broken)",
        check_lock,
    ),
    Check(
        "launcher",
        "what its launcher needs (a Slurm job: sbatch on the login node, a "
        "bind_host its node is reached on, a tp its nodes divide)",
        check_launcher,
    ),
    Check(
        "gpus",
        "its GPUs exist, are at least its share of tp, and are clean (shared with live "
        "runs of ours: have room for its mem_fraction_static)",
        check_gpus,
    ),
    Check(
        "live runs",
        "no run of the deployment is live, and no other run holds its GPUs or its "
        "port (GPUs shared with fractions: their sum within the bound)",
        check_live_runs,
    ),
    Check(
        "ports",
        "its port, and the others it listens on (bootstrap, dist_port), are free on the host",
        check_ports,
    ),
    Check("module", "the host's `python` finds the command's module (SGLang)", check_module),
    Check(
        "patch sets", "each patch set its flags need is applied to the host's SGLang", check_patches
    ),
    Check(
        "flags",
        "the host's SGLang accepts every flag of the command (warning of those seen to crash)",
        flag_reading,
    ),
    Check("paths", "its model paths and InfiniBand devices exist on the host", check_paths),
    Check("log folder", "its log folder on the host is writable", check_log_dir),
    Check(
        "routing",
        "its router is in the inventory and reaches it; a prefill and its decodes make pairs",
        check_routing,
    ),
)


def same_launch_holder(plan: Plan, holder: Mapping[str, Any], here: str) -> str:
    """Why this launch's own lock stands in the way: another of its targets took it in the
    same state_dir, through another inventory name of this machine (or, on another machine,
    a state_dir on a filesystem they share)."""
    other = str(holder.get("target") or "another target")
    state_dir = plan.host.settings.state_dir
    if here and holder.get("machine") == here:
        other_host = other.split("/", 1)[0]
        return (
            f"{plan.host.name} and {other_host} are one machine: this launch already holds "
            f"the lock that {plan.host.label} needs in state_dir {state_dir} there, for {other}"
        )
    return (
        f"{plan.host.label} and {other} keep their state in one folder ({state_dir}, on a "
        f"filesystem their hosts share): this launch already holds the lock that "
        f"{plan.host.label} needs, for {other}"
    )


def live_run_problems(plan: Plan, live: Sequence[LiveRun]) -> Findings:
    """Refuse a deployment already running, or one whose GPUs or port another run holds."""
    found = Findings()
    host = plan.host
    select = f"-H {host.name}" + (f" -d {host.deployment}" if host.deployment else "")
    for run in live:
        if run["deployment"] == host.deployment:
            found.problem(
                f"run {run['id']} ({launcher_of(run).handle(run)}) is still running on {host.name}",
                f"stop it first (deployctl stop {select}), or launch with --replace",
            )
            continue
        # A job's scheduler places it: nothing of this host is shared.
        if not (plan.launcher.checks_host and launcher_of(run).checks_host):
            continue
        other = deployment_words(run["deployment"])
        unset = unset_problem([plan.gpu_user(), live_user(run, host.name)])
        if shares_gpus(plan.gpus, run["gpus"]) and unset is not None:
            which = f" -d {run['deployment']}" if run["deployment"] else ""
            found.problem(
                f"{other} holds {describe_gpus(run['gpus'])} on {host.name} (run {run['id']}, "
                f"pid {run['pid']}); {deployment_words(host.deployment)} needs "
                f"{describe_gpus(plan.gpus)}; {unset}",
                f"{SHARE_HINT}; or stop the other first (deployctl stop -H {host.name}{which})",
            )
        elif run["port"] == plan.port:
            found.problem(
                f"port {plan.port} on {host.name} is {other}'s (run {run['id']}, pid {run['pid']})",
                "give each deployment on a host its own `port`",
            )
    found.add(live_share_problems(plan, live))
    return found


def gpu_sharers(plan: Plan, live: Sequence[LiveRun]) -> list[LiveRun]:
    """The live runs of other deployments on the plan's GPUs of this host (a job's GPUs are
    its nodes': never this host's)."""
    if not plan.launcher.checks_host:
        return []
    others = [
        r for r in live if r["deployment"] != plan.host.deployment and launcher_of(r).checks_host
    ]
    return sharing_live(others, plan.gpus)


def live_share_problems(plan: Plan, live: Sequence[LiveRun]) -> Findings:
    """Refuse a plan whose GPUs, with the live runs and its launch's siblings sharing them,
    would be filled past the bound (each one's fraction set: live_run_problems refuses the
    others)."""
    found = Findings()
    sharers = gpu_sharers(plan, live)
    users = [plan.gpu_user(), *plan.siblings, *(live_user(r, plan.host.name) for r in sharers)]
    if not sharers or unset_problem(users) is not None:
        return found
    problem = over_bound(users, plan.host.name)
    if problem is not None:
        found.problem(problem, SHARE_HINT)
    return found


# The launch locks this process holds (their tokens). A lock of this process that is not
# among them is an orphan: its launch is over, but the host stopped answering before the
# lock was given back, or before its answer naming the lock came (tune's put-back after a
# lost connection was refused by one); a later launch of ours breaks it.
_HELD: set[str] = set()


def _orphaned(holder: Mapping[str, Any]) -> bool:
    return (
        holder.get("host") == socket.gethostname()
        and holder.get("pid") == os.getpid()
        and holder.get("token") not in _HELD
    )


def release_lock(plan: Plan, conn: Connection, token: str) -> None:
    args: ReleaseArgs = {
        "state_dir": plan.host.settings.state_dir,
        "deployment": plan.host.deployment,
        "token": token,
    }
    try:
        agent.call(plan.host, conn, agent.RELEASE, args)
    finally:
        _HELD.discard(token)  # given back, or orphaned: the launch holding it is over


def software_groups(plans: Sequence[Plan], select: Select) -> list[tuple[str, list[Plan]]]:
    """The plans that must run one SGLang and one set of patches, each group named: the
    nodes of a multi-node server, and the prefills and decodes behind one PD router (those
    this launch starts: a rollout replaces them one side at a time)."""
    found: dict[str, list[Plan]] = {}
    for plan in plans:
        if plan.group is not None:
            deployment, nodes = plan.group
            found.setdefault(f"the nodes of {deployment} ({', '.join(nodes)})", []).append(plan)
        if plan.pd_role is None or plan.host.settings.router is None:
            continue
        try:
            router = router_of(plan.host, select)
        except DeployctlError:
            continue  # routing_check says why
        if router is not None and router.settings.pd_router:
            found.setdefault(f"the servers behind router {router.label}", []).append(plan)
    return [(name, members) for name, members in found.items() if len(members) > 1]


def check_software(
    plans: Sequence[Plan], select: Select, preflights: Mapping[str, Preflight]
) -> None:
    """Refuse a group whose members' preflights read different SGLang versions or patch
    sets: one problem for the group, on its first member."""
    for name, members in software_groups(plans, select):
        read = [preflights.get(p.host.label) for p in members]
        skew = skew_problem([(r.plan.host.label, r.software) for r in read if r is not None])
        first = read[0]
        if skew is not None and first is not None:
            first.problem(f"{name} would run different SGLang or patch sets: {skew}", SKEW_HINT)
