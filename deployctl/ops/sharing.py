"""Deployments sharing a GPU: allowed only when each one on it caps its memory with
`mem_fraction_static` and the caps add up to at most SHARED_GPU_BOUND. Everything here is
decided on this side, from the plans, the live runs' records and one nvidia-smi answer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from deployctl.deployments import describe_gpus
from deployctl.facts import GpuState
from deployctl.remote.protocol import LiveRun
from deployctl.remote.server_argv import CommandValues
from deployctl.remote.wire import shares_gpus

# The most of one GPU's memory the deployments sharing it may take together. SGLang's own
# default on a large GPU is about 0.88 for one server: what is left over is the CUDA
# contexts' and the activations', which each sharer needs again.
SHARED_GPU_BOUND = 0.9
FRACTION = "mem_fraction_static"  # as SGLang names the option


@dataclass(frozen=True)
class GpuUser:
    """One deployment on a machine's GPUs, as sharing sees it."""

    name: str  # as messages name it: `alpha/r1` (`alpha` for a host's single server)
    gpus: list[int] | None  # None: every GPU of the host; []: none (a router)
    fraction: float | None  # its mem_fraction_static; None: not set (it takes what SGLang does)
    run: str = ""  # a live run's id; "": one of this launch

    @property
    def label(self) -> str:
        """`alpha/r1 (run r1_baseline_v1)`."""
        return f"{self.name} (run {self.run})" if self.run else self.name


def command_fraction(values: CommandValues) -> float | None:
    """The `--mem-fraction-static` the server takes from its command (whoever wrote it: the
    template, `extra_args`, `--set`; the last given, by any spelling SGLang accepts); None
    when it gives none or not a number."""
    value = values.get(FRACTION)
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def fraction_problem(values: CommandValues) -> str | None:
    """Say why the command's `--mem-fraction-static` is not a fraction SGLang can use."""
    given = values.last(FRACTION)
    if given is None:
        return None
    fraction = command_fraction(values)
    if fraction is None or not 0 < fraction < 1:
        value = values.get(FRACTION)
        return f"{given.option} {value!r} is not a fraction of GPU memory (above 0, below 1)"
    return None


def _on(user: GpuUser, gpu: int | None) -> bool:
    return user.gpus != [] and (user.gpus is None or gpu is None or gpu in user.gpus)


def _sum_text(users: Sequence[GpuUser]) -> str:
    """`0.6 (alpha/p) + 0.6 (alpha/d) = 1.2`."""
    parts = " + ".join(
        f"{u.fraction:g} ({u.name}{f', run {u.run}' if u.run else ''})" for u in users
    )
    return f"{parts} = {sum(u.fraction or 0 for u in users):.4g}"


def unset_problem(users: Sequence[GpuUser]) -> str | None:
    """Who, of deployments that share a GPU, does not set its fraction: `alpha/r3 sets no
    mem_fraction_static`."""
    unset = [u.label for u in users if u.fraction is None]
    if not unset:
        return None
    verb = "sets" if len(unset) == 1 else "set"
    return f"{' and '.join(unset)} {verb} no mem_fraction_static"


def over_bound(users: Sequence[GpuUser], machine: str) -> str | None:
    """The first GPU that the users (one machine's, each with its fraction) would fill past
    SHARED_GPU_BOUND, said in one line; None when every shared GPU fits."""
    explicit: Sequence[int | None] = sorted({i for u in users if u.gpus for i in u.gpus})
    # A user on every GPU is on each listed one; with none listed, all are on every GPU.
    for gpu in explicit or [None]:
        on = [u for u in users if _on(u, gpu)]
        if len(on) < 2:
            continue
        total = sum(u.fraction or 0 for u in on)
        if round(total, 9) > SHARED_GPU_BOUND:  # 0.34 + 0.56 is 0.9, not 0.9000000000000001
            where = describe_gpus(None if gpu is None else [gpu])
            return (
                f"{where} of {machine} would hold {_sum_text(on)} of its memory; at most "
                f"{SHARED_GPU_BOUND:g} when deployments share a GPU"
            )
    return None


SHARE_HINT = (
    f"give deployments on one host disjoint `gpus`, or set mem_fraction_static on each one that "
    f"shares a GPU, at most {SHARED_GPU_BOUND:g} in all on each GPU"
)


def live_user(run: LiveRun, host: str) -> GpuUser:
    """A live run of the host, named as a plan of it would be."""
    name = f"{host}/{run['deployment']}" if run["deployment"] else host
    return GpuUser(name, run["gpus"], run.get("mem_fraction_static"), run["id"])


def sharing_live(users: Sequence[LiveRun], gpus: list[int] | None) -> list[LiveRun]:
    """The live runs on any of `gpus`."""
    return [r for r in users if shares_gpus(gpus, r["gpus"])]


def shared_gpu_problems(
    machine: str,
    me: GpuUser,
    siblings: Sequence[GpuUser],
    sharers: Sequence[LiveRun],
    state: GpuState,
    max_used_mib: int,
) -> list[str] | None:
    """Preflight of a deployment that starts beside live runs of ours on its GPUs (`sharers`,
    every one with its fraction): the GPUs they hold need room for this one's fraction (and
    its `siblings`', started by the same launch) instead of being clean; any other process on
    them is still refused. None when this is no sharing (today's clean check applies)."""
    if me.fraction is None or not sharers:
        return None
    if any(r.get("mem_fraction_static") is None for r in sharers):
        return None  # refused as a GPU held by another deployment
    ours = {pid for r in sharers for pid in r["members"]}
    problems = []
    for gpu in state.gpus:
        if me.gpus is not None and gpu.index not in me.gpus:
            continue
        where = f"{describe_gpus([gpu.index])} of {machine}"
        foreign = sorted({p.pid for p in state.processes if p.gpu_uuid == gpu.uuid} - ours)
        held = [r for r in sharers if r["gpus"] is None or gpu.index in r["gpus"]]
        if foreign:
            # Memory someone else took may be given back or grow at any moment: a shared GPU
            # holds deployctl's runs only, as an unshared one holds none.
            pids = ", ".join(map(str, foreign))
            problems.append(f"{where} is not clean: PIDs {pids} that are not our runs hold memory")
        elif not held and gpu.memory_used_mib > max_used_mib:
            problems.append(
                f"{where} is not clean: {gpu.memory_used_mib} MiB in use with no process listed"
            )
        if not held:
            continue
        starting = [me, *(s for s in siblings if _on(s, gpu.index))]
        wanted = sum(s.fraction or 0 for s in starting)
        need = math.ceil(wanted * gpu.memory_total_mib)
        free = gpu.memory_total_mib - gpu.memory_used_mib
        if free < need:
            who = f"{me.name} needs mem_fraction_static {me.fraction:g}"
            if len(starting) > 1:  # the same launch's sharers start at once: all need room
                who = f"{' and '.join(s.name for s in starting)}, starting together, need {_sum_text(starting)}"
            problems.append(
                f"{where} has {free} MiB free; {who} of its {gpu.memory_total_mib} MiB ({need} MiB)"
            )
    return problems
