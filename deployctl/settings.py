"""deployctl's own host variables, each declared once: its type, default and meaning.

The inventory merges the `layered` defaults (`DEFAULT_VARS`) below every level, so `hosts`
and templates see them; the rest apply where they are read. `Settings` reads a host's
variables with their types, and `misspelling` says which setting a stray variable looks like
a typo of. The README's table of variables is checked against `SETTINGS` by a test.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deployctl.errors import InventoryError


@dataclass(frozen=True)
class Setting:
    """One of deployctl's own variables."""

    name: str
    type: type  # what its value is: str, int, float, bool, list or dict
    help: str
    default: Any = None  # None: no default
    # The default as the README words it when it is worked out where it is used.
    shown_default: str = ""
    # The default is the bottom layer of every host's variables (shown by `hosts`).
    layered: bool = False

    @property
    def default_text(self) -> str:
        """The default as the README's table writes it."""
        if self.shown_default:
            return self.shown_default
        if self.default is None:
            return "—"
        if isinstance(self.default, bool):
            return "`true`" if self.default else "`false`"
        return f"`{self.default}`"


_DECLARED = [
    Setting("python", str, "interpreter with SGLang on the host", "python3", layered=True),
    Setting(
        "launch_module",
        str,
        "module run as `<python> -m <launch_module>`",
        "sglang.launch_server",
        layered=True,
    ),
    Setting("model_path", str, "the model the templates serve"),
    Setting("draft_model_path", str, "the EAGLE-3 draft model of the eagle3 template"),
    Setting("tp", int, "tensor parallelism (over all nodes of a multi-node one)", 8, layered=True),
    # The server's HTTP port; the SSH port is Ansible's `ansible_port` (Host.port).
    Setting("port", int, "the server's HTTP port", 30000, layered=True),
    Setting("bind_host", str, "the server's HTTP address", "127.0.0.1", layered=True),
    Setting("log_dir", str, "where `<stem>_v<N>.log` files go", "~/deployctl/logs", layered=True),
    Setting(
        "state_dir",
        str,
        "run records, patch records and backups, launch locks",
        "~/.deployctl",
        layered=True,
    ),
    Setting("patches", list, "patch sets this host should have"),
    Setting(
        "template",
        str,
        "launch template",
        shown_default="`eagle3` with `--threshold`, else `baseline`",
    ),
    Setting("env", dict, "environment variables for the server process only"),
    Setting("enable_metrics", bool, "render `--enable-metrics`", True),
    Setting(
        "threshold_mode", str, "how `--threshold N` reaches SGLang: patch or adaptive", "patch"
    ),
    Setting("check_flags", bool, "check the command's flags against the host's SGLang", True),
    Setting("deployments", dict, "name → variables: one server per entry"),
    Setting("gpus", list, "GPU indices the server may use", shown_default="every GPU"),
    Setting("nodes", str, "in a deployment: the host pattern of its nodes (multi-node)"),
    Setting(
        "node_rank",
        int,
        "a node's rank in its multi-node deployment",
        shown_default="inventory order",
    ),
    Setting(
        "dist_port", int, "rank 0's port for the other nodes of a multi-node deployment", 20000
    ),
    Setting(
        "dist_init_addr",
        str,
        "where the nodes of a multi-node deployment meet",
        shown_default="rank 0's `ansible_host`:`dist_port`",
    ),
    Setting("nnodes", int, "set by deployctl: the number of hosts `nodes` matches", 1),
    Setting("node_hosts", list, "set by deployctl: the nodes' names in rank order"),
    Setting(
        "known_hosts_file",
        str,
        "SSH host keys to verify against",
        shown_default="`~/.ssh/known_hosts`",
    ),
    Setting("connect_timeout", float, "seconds to connect", 10),
    Setting("command_timeout", float, "seconds a command may take", 120),
]
SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARED}

# deployctl's own settings, below every inventory level.
DEFAULT_VARS: dict[str, Any] = {s.name: s.default for s in _DECLARED if s.layered}

# What the shipped templates read besides settings (tests/test_settings.py checks the list):
# a host may set any of these.
TEMPLATE_VARIABLES = frozenset(
    {
        "trust_remote_code",
        "cuda_graph_max_bs",
        "disable_custom_all_reduce",
        "attention_backend",
        "enable_flashinfer_allreduce_fusion",
        "mem_fraction_static",
        "extra_args",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
    }
)
# Names people write for a setting under another project's name for it.
_ALIASES = {
    "tp_size": "tp",
    "tensor_parallel_size": "tp",
    "log_directory": "log_dir",
    "state_directory": "state_dir",
}
# difflib's ratio a name must reach to count as a typo: `log_dri` (0.86) and `stat_dir`
# (0.94) do, `log_level` (0.63) and `dist_timeout` (0.6) do not.
_TYPO_RATIO = 0.85
# Names this short are matched only by case, `-` and `_`: one letter off a short word is
# another word (`gpu` is not `gpus`, `tps` not `tp`s).
_SHORT = 4


def _squashed(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


_BY_SQUASHED = {_squashed(n): n for n in SETTINGS} | {_squashed(a): n for a, n in _ALIASES.items()}


def misspelling(name: str) -> str | None:
    """The setting that variable `name` looks like a mistyped form of, or None.

    Case, `-` for `_` and dropped underscores (`Log-Dir`, `logdir`), a trailing `s` too many
    (`state_dirs`), a known alias (`tp_size`), or a close spelling (`log_dri`). Never a real
    setting, template or Ansible variable, a short word (`gpu`, `tps`), a setting's singular
    (`deployment`, `node`) or a name that extends one (`python3`, `grpc_port`,
    `enable_mfu_metrics`): those are someone's own variables (`gpu: H200` is a label).
    """
    if name in SETTINGS or name in TEMPLATE_VARIABLES or name.startswith("ansible_"):
        return None
    squashed = _squashed(name)
    if squashed in _BY_SQUASHED:
        return _BY_SQUASHED[squashed]
    if len(squashed) > _SHORT and squashed.endswith("s") and squashed[:-1] in _BY_SQUASHED:
        return _BY_SQUASHED[squashed[:-1]]
    spelled = name.lower().replace("-", "_")
    if len(spelled) <= _SHORT:
        return None
    for candidate in difflib.get_close_matches(spelled, SETTINGS, n=3, cutoff=_TYPO_RATIO):
        if not _extends(spelled, candidate) and candidate != spelled + "s":
            return candidate
    return None


def _extends(name: str, setting: str) -> bool:
    """`python3`, `grpc_port`, `enable_mfu_metrics`: the setting with more to it."""
    words = set(name.split("_"))
    more = words > set(setting.split("_"))
    return name.startswith(setting) or name.endswith(setting) or more


def misspellings(variables: Mapping[str, Any]) -> dict[str, str]:
    """Each variable that looks like a mistyped setting, with the setting it looks like."""
    found = {}
    for name in variables:
        meant = misspelling(str(name))
        if meant is not None:
            found[str(name)] = meant
    return found


@dataclass(frozen=True)
class Misspelling:
    """A variable on a host (or in one of its deployments) that looks like a typo."""

    host: str  # the host, or `host/deployment` for a deployment's mapping
    variable: str
    meant: str

    @property
    def text(self) -> str:
        return (
            f"variable {self.variable!r} is not a deployctl setting; did you mean {self.meant!r}?"
        )


def host_misspellings(host: str, variables: Mapping[str, Any]) -> list[Misspelling]:
    """The mistyped-looking settings of a host and of each of its `deployments`."""
    found = [Misspelling(host, k, v) for k, v in misspellings(variables).items()]
    table = variables.get("deployments")
    if isinstance(table, Mapping):
        for name, overrides in table.items():
            if isinstance(overrides, Mapping):
                where = f"{host}/{name}"
                found += [Misspelling(where, k, v) for k, v in misspellings(overrides).items()]
    return found


class Settings:
    """A host's variables read as deployctl's settings: typed, with the declared defaults.

    `where` names the host (and deployment) in the error for a value of the wrong type.
    """

    def __init__(self, variables: Mapping[str, Any], where: str) -> None:
        self.variables = variables
        self.where = where

    def value(self, name: str) -> Any:
        """The variable as it is, or the setting's default when the host does not set it."""
        return self.variables.get(name, SETTINGS[name].default)

    def _text(self, name: str) -> str:
        return str(self.value(name))

    def _int(self, name: str) -> int:
        value = self.value(name)
        try:
            return int(value)
        except (TypeError, ValueError):
            raise InventoryError(f"{self.where}: {name} {value!r} is not a whole number") from None

    def _seconds(self, name: str) -> float | None:
        value = self.variables.get(name)
        try:
            return None if value is None else float(value)
        except (TypeError, ValueError):
            raise InventoryError(f"{self.where}: {name} {value!r} is not a number") from None

    @property
    def python(self) -> str:
        return self._text("python")

    @property
    def launch_module(self) -> str:
        return self._text("launch_module")

    @property
    def log_dir(self) -> str:
        return self._text("log_dir")

    @property
    def state_dir(self) -> str:
        return self._text("state_dir")

    @property
    def server_port(self) -> int:
        """The server's HTTP port (`port`), not the SSH port (`ansible_port`)."""
        return self._int("port")

    @property
    def bind_host(self) -> str:
        return self._text("bind_host")

    @property
    def tp(self) -> int:
        return self._int("tp")

    @property
    def nnodes(self) -> int:
        return self._int("nnodes")

    @property
    def dist_port(self) -> int:
        return self._int("dist_port")

    @property
    def template(self) -> str | None:
        """The host's `template`; None (or empty) leaves the choice to the threshold."""
        value = self.value("template")
        return str(value) if value else None

    @property
    def check_flags(self) -> bool:
        return bool(self.value("check_flags"))

    @property
    def known_hosts_file(self) -> str | None:
        value = self.value("known_hosts_file")
        return str(value) if value else None

    @property
    def connect_timeout(self) -> float | None:
        """Seconds to connect; None when the host sets none (the connect options decide)."""
        return self._seconds("connect_timeout")

    @property
    def command_timeout(self) -> float | None:
        """Seconds a command may take; None when the host sets none (the options decide)."""
        return self._seconds("command_timeout")
