"""Does the host's own SGLang accept the command? Its option names are read on the host (the
agent's argv_check: the installation's declarations, else its parser); this turns the
findings into preflight problems, warnings and hints."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deployctl import agent
from deployctl.connection import Connection
from deployctl.errors import PreflightError
from deployctl.fanout import Fleet, FleetResult, HostResult
from deployctl.inventory import Host
from deployctl.patchset import PatchSet
from deployctl.remote.protocol import ArgvCheck, CheckArgsArgs, SglangInstall
from deployctl.remote.server_argv import CommandValues
from deployctl.render import RenderedCommand

ROUTER_MODULE = "sglang_router.launch_router"


def runs_router(argv: Sequence[str]) -> bool:
    """Does the command start SGLang's router (`python -m sglang_router.launch_router`)?"""
    return any(a == "-m" and b == ROUTER_MODULE for a, b in itertools.pairwise(argv))


def server_argv(argv: Sequence[str], module: str = "sglang.launch_server") -> list[str] | None:
    """The server's own arguments: what follows `-m MODULE` (wherever a wrapper such as
    `numactl -m 0` puts it) or SGLang's own `sglang serve`; None for another launcher."""
    words = list(argv)
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == module:
            return words[i + 2 :]
    for i in range(len(words) - 1):
        if words[i].rsplit("/", 1)[-1] == "sglang" and words[i + 1] == "serve":
            return words[i + 2 :]
    return None


def checked_argv(host: Host, argv: Sequence[str]) -> list[str] | None:
    """What the agent checks; None when the host's `check_flags` is off (a launcher of its
    own that takes other flags) or the launcher is not one deployctl recognises."""
    if not host.settings.check_flags:
        return None
    return server_argv(argv, host.settings.launch_module)


# Options whose value deployctl also takes from the inventory, where it has no command to
# read (status, watch, a router's workers, metrics targets, the other side of a pair): the
# variable that sets each. Given twice with different values, the server would take the
# last and those the variable.
FROM_INVENTORY = {
    "model_path": "model_path",
    "tp_size": "tp",
    "port": "port",
    "host": "bind_host",
    "nnodes": "nodes",
    "node_rank": "node_rank",
    "dist_init_addr": "dist_init_addr",
    "disaggregation_mode": "role",
    "disaggregation_bootstrap_port": "bootstrap_port",
    "disaggregation_transfer_backend": "transfer_backend",
}


def check_reading(values: CommandValues) -> None:
    """Refuse a server command that gives an option deployctl also takes from the inventory
    twice, with different values: the server would run with one, deployctl with the other."""
    for dest, variable in FROM_INVENTORY.items():
        each = values.each(dest)
        differing = [g for g in each if g.values != each[0].values]
        if differing:
            first, last = each[0], differing[-1]
            raise PreflightError(
                f"{last.option} is given twice ({first.shown}, then {last.shown}): SGLang "
                f"would take the last, while deployctl also reads `{variable}`",
                hint=f"set `{variable}` (in the inventory, or --set {variable}=…) and give "
                "the flag once",
            )


@dataclass
class FlagReport:
    """The check's findings as deployctl says them: problems refuse, warnings do not."""

    method: str
    note: str = ""
    options: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)


def flag_report(
    host: Host,
    check: ArgvCheck,
    sglang: SglangInstall,
    patch_sets: Mapping[str, PatchSet],
    reported: Sequence[str] = (),
) -> FlagReport:
    """Say what the host's SGLang would refuse. `reported`: flags whose missing patch set a
    problem already names (one problem per cause)."""
    report = FlagReport(check["method"], check["note"], check["options"], check["seconds"])
    which = f"SGLang {sglang.get('version') or '(unknown version)'} on {host.name}"
    adds = {rule.flag: s.name for s in patch_sets.values() for rule in s.flags}
    for finding in check["findings"]:
        flag = finding["flag"]
        if flag in reported:
            continue
        if finding["level"] == "warning":
            report.warnings.append(f"{finding['message']} ({which})")
            continue
        message = f"{finding['message']} ({which})"
        if flag in adds and not finding["candidates"]:
            message += f"; patch set {adds[flag]} adds it"
            report.hints.append(f"deployctl patch apply {adds[flag]} -H {host.name}")
        report.problems.append(message)
    return report


@dataclass
class CheckedCommand:
    """`render --check`: the command and what the host's SGLang says of it."""

    rendered: RenderedCommand
    flags: FlagReport

    @property
    def ok(self) -> bool:
        return not self.flags.problems


def check_command(
    host: Host, conn: Connection, rendered: RenderedCommand, patch_sets: Mapping[str, PatchSet]
) -> CheckedCommand:
    """Ask the host's SGLang about one rendered command (one round trip; nothing starts)."""
    args: CheckArgsArgs = {"server_argv": checked_argv(host, rendered.argv)}
    reply = agent.call(host, conn, agent.CHECK_ARGS, args)
    return CheckedCommand(rendered, flag_report(host, reply["check"], reply["sglang"], patch_sets))


def check_commands(
    fleet: Fleet, rendered: FleetResult[RenderedCommand], patch_sets: Mapping[str, PatchSet]
) -> FleetResult[CheckedCommand]:
    """Check every command that rendered; a host that failed to render keeps its error."""
    commands = {r.host.label: r.value for r in rendered if r.value is not None}
    checked = fleet.run(
        lambda host, conn: check_command(host, conn, commands[host.label], patch_sets),
        [r.host for r in rendered if r.value is not None],
    )
    by_label = {r.host.label: r for r in checked}
    return FleetResult(
        by_label.get(r.host.label) or HostResult(r.host, exception=r.exception) for r in rendered
    )
