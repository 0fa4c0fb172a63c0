"""Does the host's own SGLang accept the command? Its option names are read on the host (the
agent's argv_check: the installation's declarations, else its parser); this turns the
findings into preflight problems, warnings and hints."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deployctl import agent
from deployctl.choices import PdRole
from deployctl.connection import Connection
from deployctl.errors import PreflightError
from deployctl.fanout import Fleet, FleetResult, HostResult
from deployctl.findings import Findings
from deployctl.inventory import Host
from deployctl.patchset import PatchSet
from deployctl.remote.protocol import ArgvCheck, CheckArgsArgs, SglangInstall
from deployctl.remote.server_argv import CommandValues
from deployctl.render import ADAPTIVE_CONFIG_FLAG, ADAPTIVE_FLAG, RenderedCommand
from deployctl.text import is_number

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


def command_values(host: Host, argv: Sequence[str]) -> CommandValues:
    """The values deployctl reads from a host's command, as the program it starts will take
    them: SGLang's abbreviations only for SGLang (a router has its own parser)."""
    if runs_router(argv):
        return CommandValues(argv, abbreviations=False)
    return CommandValues(server_argv(argv, host.settings.launch_module) or argv)


def checked_argv(host: Host, argv: Sequence[str]) -> list[str] | None:
    """What the agent checks; None when the host's `check_flags` is off (a launcher of its
    own that takes other flags) or the launcher is not one deployctl recognises."""
    if not host.settings.check_flags:
        return None
    return server_argv(argv, host.settings.launch_module)


def inventory_values(host: Host) -> dict[str, tuple[str, str]]:
    """The options deployctl also takes from the host's inventory, where it has no command to
    read (status, watch, a router's workers, metrics targets, the other side of a pair): each
    one's variable and the value the template renders from it."""
    settings = host.settings
    role = settings.pd_role
    found = {
        "port": ("port", str(settings.server_port)),
        "host": ("bind_host", settings.bind_host),
        "tp_size": ("tp", str(settings.tp)),
        "disaggregation_mode": ("role", str(role or "null")),
    }
    model = settings.value("model_path")
    if model is not None:
        found["model_path"] = ("model_path", str(model))
    if role is not None:
        found["disaggregation_transfer_backend"] = ("transfer_backend", settings.transfer_backend)
    if role is PdRole.PREFILL:
        found["disaggregation_bootstrap_port"] = ("bootstrap_port", str(settings.bootstrap_port))
    return found


# A multi-node server's place among its nodes, rendered from what its launcher says (a Slurm
# step expands its own rank): given twice with different values, the server takes the last.
NODE_OPTIONS = {"nnodes": "nodes", "node_rank": "node_rank", "dist_init_addr": "dist_init_addr"}


def _same(given: str, wanted: str) -> bool:
    if is_number(given) and is_number(wanted):
        return int(given) == int(wanted)
    return given == wanted


def check_reading(host: Host, values: CommandValues) -> None:
    """Refuse a server command that gives an option deployctl also takes from the inventory
    another value than the inventory's (the server would run with one, deployctl's other
    commands with the other), or a node option twice with different values."""
    for dest, (variable, wanted) in inventory_values(host).items():
        given, value = values.last(dest), values.get(dest)
        if given is not None and value is not None and not _same(value, wanted):
            raise PreflightError(
                f"the command gives {given.option} {value} ({given.shown}) but `{variable}` is "
                f"{wanted}: the server would run with {value}, deployctl's other commands "
                f"would use {wanted}",
                hint=f"set `{variable}: {value}` in the inventory (or --set {variable}={value}) "
                "instead of giving the flag in extra_args",
            )
    for dest, variable in NODE_OPTIONS.items():
        each = values.each(dest)
        differing = [g for g in each if g.values != each[0].values]
        if differing:
            first, last = each[0], differing[-1]
            raise PreflightError(
                f"{last.option} is given twice ({first.shown}, then {last.shown}): SGLang "
                f"would take the last, while deployctl places the node by `{variable}`",
                hint="give the flag once",
            )


@dataclass
class FlagReport(Findings):
    """The check's findings as deployctl says them, and how the host's SGLang was read."""

    method: str
    note: str = ""
    options: int = 0
    seconds: float = 0.0


def flag_report(
    host: Host,
    values: CommandValues,
    check: ArgvCheck,
    sglang: SglangInstall,
    patch_sets: Mapping[str, PatchSet],
    reported: Sequence[str] = (),
) -> FlagReport:
    """Say what the host's SGLang would refuse, and warn of what it takes but was seen to
    crash on. `reported`: flags whose missing patch set a problem already names (one problem
    per cause)."""
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
    adaptive = adaptive_graph_warning(values)
    if adaptive:
        report.warnings.append(adaptive)
    return report


# SGLang's adaptive speculation with no config drafts up to this many steps (its default
# candidates are 1, 3 and 7). Seen on an H200 with 0.5.17 over --speculative-num-steps 3 and
# CUDA graphs: the capture of that state's graphs crashed the server at start (an illegal
# memory access; tests/data/real-sglang-0.5.17/adaptive-graphs-crash.log).
ADAPTIVE_DEFAULT_MAX_STEPS = 7


def adaptive_graph_warning(values: CommandValues) -> str | None:
    """Warn of SGLang's default adaptive candidates past the command's own draft steps, with
    CUDA graphs on; None otherwise."""
    if not values.has("speculative_adaptive") or values.has("speculative_adaptive_config"):
        return None
    if values.has("disable_cuda_graph"):
        return None
    steps = values.get("speculative_num_steps")
    if steps is not None and is_number(steps) and float(steps) >= ADAPTIVE_DEFAULT_MAX_STEPS:
        return None
    return (
        f"{ADAPTIVE_FLAG} without {ADAPTIVE_CONFIG_FLAG} drafts up to "
        f"{ADAPTIVE_DEFAULT_MAX_STEPS} steps, past --speculative-num-steps {steps or '(default)'}"
        "; with CUDA graphs SGLang 0.5.17 crashed capturing that state on an H200 (an "
        "illegal memory access): give a config whose candidate steps stay within "
        "--speculative-num-steps, or let deployctl write one (--threshold N with "
        "threshold_mode adaptive)"
    )


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
    values = command_values(host, rendered.argv)
    report = flag_report(host, values, reply["check"], reply["sglang"], patch_sets)
    return CheckedCommand(rendered, report)


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
