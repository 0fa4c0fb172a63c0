"""What serves a deployment now, captured so that it can be put back: a rollout's unit whose
new configuration failed, the run tune found serving, and a Slurm job whose successor did not
take over. Capturing reads nothing new (it takes a status already read); restoring either
relaunches the captured runs with their own commands through `replace` (they were stopped), or
makes the captured run current again (it still runs) once its successor is ended.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deployctl import agent
from deployctl.connection import Connection
from deployctl.crash import Catalog
from deployctl.errors import DeployctlError
from deployctl.events import DISCARD, EventSink
from deployctl.fanout import Fleet
from deployctl.inventory import Host
from deployctl.launchers import launcher_of
from deployctl.masking import MASK, long_enough
from deployctl.ops.plan import Plan
from deployctl.ops.router import registered_url
from deployctl.ops.runs import DEFAULT_STOP_TIMEOUT, Replacement, RunStatus, end_run, replace
from deployctl.patchset import PatchSet, sets_for_flags
from deployctl.remote.protocol import PointArgs, RunRecord
from deployctl.render import RenderedCommand, command_secrets
from deployctl.shell import split


def recorded_plan(host: Host, status: RunStatus, patch_sets: Mapping[str, PatchSet]) -> Plan:
    """The plan to relaunch a recorded run with the same rendered command."""
    if status.run is None or not status.command:
        raise DeployctlError(
            f"{host.label}: no recorded run to restart", hint="deployctl launch first"
        )
    argv = split(status.command)
    # Secrets given with --set at launch are not in the inventory: find them where the
    # recorded (masked) command hides them.
    hidden = masked_values(status.run["command"], argv)
    secrets = tuple(
        sorted({*command_secrets(host.vars, argv), *hidden}, key=lambda v: (-len(v), v))
    )
    env = status.env or {}
    secrets = tuple(
        sorted({*secrets, *masked_env_values(status.run, env)}, key=lambda v: (-len(v), v))
    )
    rendered = RenderedCommand(
        status.run["template"], status.run["threshold"], argv, secrets, env, host.deployment
    )
    # The run's own GPUs, which its recorded environment pins it to, whatever the inventory
    # says now.
    # A job's GPUs are its nodes', never the login node's.
    pinned = {"gpus": status.run.get("gpus")} if launcher_of(status.run).checks_host else {}
    recorded = Host(host.name, {**host.vars, **pinned}, host.deployment)
    return Plan(recorded, rendered, sets_for_flags(argv, patch_sets))


def masked_env_values(run: RunRecord, env: Mapping[str, str]) -> list[str]:
    """The parts of the environment's values that the run record shows masked."""
    shown = run.get("env", {})
    found: list[str] = []
    for name, value in env.items():
        if value and MASK in shown.get(name, ""):
            found += _hidden_parts(shown[name], value)
    return long_enough(found)


def masked_values(shown: str, argv: Sequence[str]) -> list[str]:
    """Return the parts of `argv` that the masked command line `shown` replaced by the mask."""
    try:
        words = split(shown)
    except ValueError:
        return []
    if len(words) != len(argv):
        return []
    found: list[str] = []
    for word, real in zip(words, argv, strict=True):
        if MASK in word:
            found += _hidden_parts(word, real)
    # Shorter ones are masked where they stand (mask_text), never wherever they appear.
    return long_enough(found)


def _hidden_parts(shown: str, real: str) -> list[str]:
    """The parts of `real` that `shown` (its masked copy) replaced by the mask."""
    pattern = "(.+?)".join(re.escape(part) for part in shown.split(MASK))
    match = re.fullmatch(pattern, real, re.DOTALL)
    return list(match.groups()) if match else [real]


@dataclass(frozen=True)
class Serving:
    """One target's run as captured: the plan that relaunches it with its own command, and
    where its router lists it."""

    plan: Plan
    run: str
    port: int | None
    head: str  # the head node of the Slurm job it is; "" for a process on its host
    url: str  # the URL its router lists it by

    @property
    def host(self) -> Host:
        return self.plan.host


def capture(host: Host, status: RunStatus, patch_sets: Mapping[str, PatchSet]) -> Serving:
    """The run `status` read on `host`, as what puts it back (DeployctlError: no recorded
    command to relaunch it with)."""
    assert status.run is not None
    head = launcher_of(status.run).head(status.placement)
    return Serving(
        recorded_plan(host, status, patch_sets),
        status.run["id"],
        status.run.get("port"),
        head,
        registered_url(host, status.run, head),
    )


def relaunch(
    fleet: Fleet,
    previous: Sequence[Serving],
    catalog: Catalog,
    *,
    restart_of: Mapping[str, str],
    timeout: float,
    stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    events: EventSink = DISCARD,
    drain_timeout: float = 0.0,
    checked: bool = False,
    out_of_router: bool = False,
) -> Replacement:
    """Stop what runs in the captured runs' place and relaunch them with their own commands
    (which puts them back in their routers): `replace`, with the captured plans."""
    return replace(
        fleet, [s.plan for s in previous], catalog, restart_of=restart_of, timeout=timeout,
        stop_timeout=stop_timeout, events=events, drain_timeout=drain_timeout, checked=checked,
        out_of_router=out_of_router,
    )  # fmt: skip


def point_back(host: Host, conn: Connection, previous: Serving, stop_timeout: float) -> None:
    """End the run started beside the captured one (the host's current run), then make the
    captured run, which still runs, the deployment's current run again."""
    end_run(host, conn, stop_timeout)
    back: PointArgs = {
        "state_dir": host.settings.state_dir,
        "deployment": host.deployment,
        "run": previous.run,
    }
    agent.call(host, conn, agent.POINT, back)
