"""deployctl's own host variables, each declared once: its type, default and meaning.

The inventory merges the `layered` defaults (`DEFAULT_VARS`) below every level, so `hosts`
and templates see them; the rest apply where they are read. Every setting is also spelt
`deployctl_NAME`, which wins; a bare name whose value does not fit the setting's type is the
user's own variable. `Settings` reads a host's variables with their types (call sites never
see the spellings), `check_settings` refuses what deployctl cannot use, and `misspelling`
says which setting a stray variable looks like a typo of. The docs' table of variables is
checked against `SETTINGS` by a test.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from deployctl.choices import (
    LAUNCH_KINDS,
    TRANSFER_BACKENDS,
    LaunchKind,
    PdRole,
    ThresholdMode,
    spelled,
)
from deployctl.errors import InventoryError
from deployctl.text import is_number

# Every setting's own spelling: `deployctl_env` is deployctl's even where `env` is someone
# else's (Ansible's convention for a tool's variables). It wins over the bare name.
PREFIX = "deployctl_"


@dataclass(frozen=True)
class Setting:
    """One of deployctl's own variables."""

    name: str
    type: type  # what its value is: str, int, float, bool, list or dict
    help: str
    default: Any = None  # None: no default
    # The default as the docs' table words it when it is worked out where it is used.
    shown_default: str = ""
    # The default is the bottom layer of every host's variables (shown by `hosts`).
    layered: bool = False
    # A number's bounds (both included; `above`: the least it must exceed).
    least: float | None = None
    most: float | None = None
    above: float | None = None
    below: float | None = None  # the most it must stay under
    # What a right value is, as messages say it; by default from the type.
    wanted: str = ""
    # A text's allowed values, or the pattern it must match (whole).
    choices: Collection[str] = ()
    pattern: str = ""

    @property
    def what(self) -> str:
        """What a right value is: `a port number (1-65535)`."""
        return self.wanted or _WANTED[self.type]

    @property
    def default_text(self) -> str:
        """The default as the docs' table (docs/guides/inventories.md) writes it."""
        if self.shown_default:
            return self.shown_default
        if self.default is None:
            return "—"
        if isinstance(self.default, bool):
            return "`true`" if self.default else "`false`"
        return f"`{self.default}`"


_WANTED = {
    str: "text",
    int: "a whole number",
    float: "a number of seconds",
    bool: "a boolean (true or false)",
    list: "a list",
    dict: "a mapping",
}
_WEEK = 7 * 24 * 3600
_PORT: dict[str, Any] = {"least": 1, "most": 65535, "wanted": "a port number (1-65535)"}
# Slurm's time formats (sbatch --time): minutes, m:s, h:m:s, d-h, d-h:m, d-h:m:s, unlimited.
_SLURM_TIME = r"(?i:unlimited|infinite)|\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}"
# A name Slurm takes as one word (partition, account, qos).
_ONE_WORD: dict[str, Any] = {"pattern": r"[^\s]+", "wanted": "one word, no spaces"}
# One #SBATCH word: an option, never a second line of the script.
_SBATCH_OPTION = r"-[^\n\r]*"

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
    Setting(
        "tp",
        int,
        "tensor parallelism (over all nodes of a multi-node one)",
        8,
        layered=True,
        least=1,
        wanted="a number of GPUs",
    ),
    # The server's HTTP port; the SSH port is Ansible's `ansible_port` (Host.port).
    Setting("port", int, "the server's HTTP port", 30000, layered=True, **_PORT),
    Setting("bind_host", str, "the server's HTTP address", "127.0.0.1", layered=True),
    Setting("log_dir", str, "where `<stem>_v<N>.log` files go", "~/deployctl/logs", layered=True),
    Setting(
        "state_dir",
        str,
        "run records, patch records and backups, launch locks",
        "~/.deployctl",
        layered=True,
    ),
    Setting(
        "patches", list, "patch sets this host should have", wanted="a list of patch set names"
    ),
    Setting(
        "template",
        str,
        "launch template",
        shown_default="`eagle3` with `--threshold`, else `baseline`",
    ),
    Setting(
        "env",
        dict,
        "environment variables for the server process only",
        wanted="a mapping of NAME: value",
    ),
    Setting("enable_metrics", bool, "render `--enable-metrics`", True),
    Setting(
        "threshold",
        int,
        "the `--threshold` launch uses when none is given (`tune` prints the line to add)",
        least=1,
        wanted="a batch size (1 or more)",
    ),
    Setting(
        "threshold_mode",
        str,
        f"how `--threshold N` reaches SGLang: {spelled(ThresholdMode)}",
        ThresholdMode.PATCH,
    ),
    Setting(
        "mem_fraction_static",
        float,
        "the share of each GPU's memory SGLang takes (`--mem-fraction-static`); deployments "
        "sharing a GPU must all set it",
        above=0,
        below=1,
        wanted="a fraction of GPU memory (above 0, below 1)",
    ),
    Setting("check_flags", bool, "check the command's flags against the host's SGLang", True),
    Setting(
        "deployments",
        dict,
        "name → variables: one server per entry",
        wanted="a mapping of name: variables",
    ),
    Setting(
        "gpus",
        list,
        "GPU indices the server may use",
        shown_default="every GPU",
        wanted="a list of GPU indices",
    ),
    Setting("nodes", str, "in a deployment: the host pattern of its nodes (multi-node)"),
    Setting(
        "node_rank",
        int,
        "a node's rank in its multi-node deployment",
        shown_default="inventory order",
        least=0,
        wanted="a rank (0 or more)",
    ),
    Setting(
        "dist_port",
        int,
        "rank 0's port for the other nodes of a multi-node deployment",
        20000,
        **_PORT,
    ),
    Setting(
        "dist_init_addr",
        str,
        "where the nodes of a multi-node deployment meet",
        shown_default="rank 0's `ansible_host`:`dist_port`",
    ),
    Setting(
        "nnodes",
        int,
        "set by deployctl: the number of hosts `nodes` matches",
        1,
        least=1,
        wanted="a number of nodes",
    ),
    Setting("node_hosts", list, "set by deployctl: the nodes' names in rank order"),
    Setting(
        "router",
        str,
        "in a worker: the router deployment it registers with (HOST/DEPLOYMENT, or HOST)",
        wanted="a router, e.g. edge/router",
    ),
    Setting(
        "worker_url",
        str,
        "the URL a worker's router reaches it at",
        shown_default="`http://<ansible_host>:<port>`",
        wanted="a URL, e.g. http://10.0.0.5:30000",
    ),
    Setting(
        "router_metrics_port",
        int,
        "a router's Prometheus port (two routers on one host need two)",
        29000,
        layered=True,
        **_PORT,
    ),
    Setting(
        "role",
        str,
        f"in prefill/decode disaggregation: {spelled(PdRole)} (`--disaggregation-mode`)",
        shown_default="neither: the server serves whole requests",
        choices=tuple(PdRole),
        wanted=spelled(PdRole),
    ),
    Setting(
        "bootstrap_port",
        int,
        "a prefill's KV bootstrap port, where its decodes fetch KV (unique per host)",
        8998,
        layered=True,
        **_PORT,
    ),
    Setting(
        "transfer_backend",
        str,
        "how KV moves from prefill to decode (`--disaggregation-transfer-backend`)",
        "mooncake",
        layered=True,
        choices=TRANSFER_BACKENDS,
        wanted="one of " + ", ".join(TRANSFER_BACKENDS),
    ),
    Setting(
        "ib_device",
        str,
        "InfiniBand devices for the KV transfer (`--disaggregation-ib-device`), e.g. mlx5_0,mlx5_1",
    ),
    Setting(
        "pd",
        bool,
        "in a router: route prefill/decode pairs (`--pd-disaggregation`)",
        False,
    ),
    Setting(
        "pd_timeout",
        int,
        "seconds a prefill or decode waits for its other side (SGLang's bootstrap and "
        "waiting timeouts); less than its router's `request_timeout`",
        300,
        least=1,
        most=_WEEK,
        wanted="a number of seconds",
    ),
    Setting(
        "request_timeout",
        int,
        "in a PD router: seconds a request may take (`--request-timeout-secs`)",
        1800,
        layered=True,
        least=1,
        most=_WEEK,
        wanted="a number of seconds",
    ),
    Setting(
        "launcher",
        str,
        "how servers start: `ssh` (a process on the host) or `slurm` (a job from this login node)",
        LaunchKind.PROCESS,
        choices=LAUNCH_KINDS,
        wanted=spelled(LaunchKind),
    ),
    Setting("slurm_partition", str, "the job's partition (`#SBATCH --partition`)", **_ONE_WORD),
    Setting("slurm_account", str, "the job's account", **_ONE_WORD),
    Setting("slurm_qos", str, "the job's quality of service", **_ONE_WORD),
    Setting(
        "slurm_time",
        str,
        "the job's time limit, e.g. `4:00:00` (`status` shows the time left)",
        pattern=_SLURM_TIME,
        wanted="a Slurm time limit, e.g. 4:00:00, 90 or 1-12:00:00",
    ),
    Setting(
        "slurm_nodes",
        int,
        "the job's nodes: more than 1 is one multi-node server (`tp` is the total)",
        1,
        least=1,
        wanted="a number of nodes",
    ),
    Setting(
        "slurm_gpus_per_node",
        int,
        "GPUs asked for on each node",
        shown_default="`tp` / `slurm_nodes`",
        least=1,
        wanted="a number of GPUs",
    ),
    Setting("slurm_exclusive", bool, "ask for whole nodes (`#SBATCH --exclusive`)", False),
    Setting(
        "slurm_extra",
        list,
        "more `#SBATCH` options, e.g. `[--constraint=h200]`",
        wanted="a list of sbatch options, each starting with -",
    ),
    Setting(
        "known_hosts_file",
        str,
        "SSH host keys to verify against",
        shown_default="`~/.ssh/known_hosts`",
    ),
    # At most a week: past what the system's timers take, a timeout is no timeout.
    Setting("connect_timeout", float, "seconds to connect", 10, above=0, most=_WEEK),
    Setting("command_timeout", float, "seconds a command may take", 120, above=0, most=_WEEK),
    Setting(
        "max_reply_mib",
        int,
        "MiB one command's output may take: a host that sends more is stopped there",
        64,
        least=1,
        most=1 << 20,
        wanted="a number of MiB",
    ),
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
        "extra_args",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "router_policy",
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
    if name.startswith(PREFIX):  # `deployctl_log-dir`: a typo of deployctl's own spelling
        meant = None if name[len(PREFIX) :] in SETTINGS else misspelling(name[len(PREFIX) :])
        return None if meant is None else PREFIX + meant
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
    table = Settings(variables, host).given("deployments")
    if isinstance(table, Mapping):
        for name, overrides in table.items():
            if isinstance(overrides, Mapping):
                where = f"{host}/{name}"
                found += [Misspelling(where, k, v) for k, v in misspellings(overrides).items()]
    return found


@dataclass(frozen=True)
class ForeignValue:
    """A setting's bare name holding a value of another type: the user's own variable."""

    host: str
    variable: str
    wanted: str  # what deployctl's setting would be: `a mapping of NAME: value`

    @property
    def text(self) -> str:
        own = PREFIX + self.variable
        return (
            f"variable {self.variable!r} is not {self.wanted}, so it is yours, not deployctl's: "
            f"deployctl uses its default, and render and launch refuse the host until {own} "
            "is set"
        )


def host_warnings(host: str, variables: Mapping[str, Any]) -> list[Misspelling | ForeignValue]:
    """What `hosts` and every command say about a host's variables: typos, then settings'
    names that hold someone else's values."""
    foreign = Settings(variables, host).foreign()
    found: list[Misspelling | ForeignValue] = [*host_misspellings(host, variables)]
    return found + [ForeignValue(host, name, SETTINGS[name].what) for name in foreign]


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_WHOLE = re.compile(r"\s*-?[0-9]+\s*\Z")
_HINTS = {
    "gpus": "e.g. gpus: [0, 1, 2, 3]",
    # Lower case only: a launcher that is not deployctl's must never fall back to ssh.
    "launcher": "launcher: ssh or launcher: slurm (lower case)",
    "slurm_time": "minutes (90), hours:minutes:seconds (4:00:00) or days-hours[:minutes"
    "[:seconds]] (1-12:00:00)",
    "slurm_partition": "a name as sinfo lists it, e.g. gpu",
    "slurm_account": "an account as sacctmgr lists it, e.g. ml-team",
    "slurm_qos": "a QOS as sacctmgr lists it, e.g. high",
    # Ansible inventories often have a `role` of their own.
    "role": "role: prefill or role: decode; if role is your own variable, set deployctl_role: null",
}


def check_env(value: Any, where: str) -> dict[str, str]:
    """An `env` mapping as the server will get it: valid names, values as text."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InventoryError(f"{where}: env must be a mapping of NAME: value")
    env: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise InventoryError(
                f"{where}: env name {name!r} is not a variable name",
                hint="names are letters, digits and _, not starting with a digit",
            )
        if isinstance(item, Mapping | list) or item is None:
            raise InventoryError(f"{where}: env {name} must be a single value, not {item!r}")
        if "\0" in str(item):
            # No process environment can hold one: the server's start would fail on the host.
            raise InventoryError(f"{where}: env {name} holds a NUL byte")
        env[name] = ("true" if item else "false") if isinstance(item, bool) else str(item)
    return env


def gpu_indices(value: Any) -> list[int] | None:
    """`gpus` as GPU indices in the order given: a list, a comma-separated string or one
    index; None when it is none of those."""
    items: list[Any]
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        return None
    if any(isinstance(i, bool) or not is_number(str(i)) for i in items):
        return None
    return [int(i) for i in items]


def fits(setting: Setting, value: Any) -> bool:
    """Whether a value has the setting's type; under the bare name, one that does not is
    the user's own variable (`env: prod`), not deployctl's."""
    if setting.name == "gpus":
        return gpu_indices(value) is not None
    if setting.name == "patches":
        return isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        )
    if setting.name == "slurm_extra":
        return isinstance(value, list) and all(
            isinstance(v, str) and re.fullmatch(_SBATCH_OPTION, v) for v in value
        )
    if setting.type is str:
        return isinstance(value, str | os.PathLike)
    if setting.type is bool or isinstance(value, bool):
        return setting.type is bool and isinstance(value, bool)
    if setting.type is int:
        return isinstance(value, int) or (isinstance(value, str) and bool(_WHOLE.match(value)))
    if setting.type is float:
        return isinstance(value, int | float) or (isinstance(value, str) and _is_float(value))
    return isinstance(value, setting.type if setting.type is list else Mapping)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_value(setting: Setting, value: Any, where: str, spelling: str) -> None:
    """Refuse a value deployctl cannot use as the setting, in one line naming where it is
    (host, deployment) and the variable as it is spelt."""
    hint = _HINTS.get(setting.name)
    if not fits(setting, value):
        if setting.type is dict:
            raise InventoryError(f"{where}: {spelling} must be {setting.what}")
        raise InventoryError(f"{where}: {spelling} {value!r} is not {setting.what}", hint=hint)
    if setting.type in (int, float):
        number = float(value)
        if not (
            (setting.least is None or number >= setting.least)
            and (setting.most is None or number <= setting.most)
            and (setting.above is None or setting.above < number < math.inf)
            and (setting.below is None or number < setting.below)
        ):
            raise InventoryError(f"{where}: {spelling} {value!r} is not {setting.what}")
    elif setting.type is str and "\0" in str(value):
        raise InventoryError(f"{where}: {spelling} holds a NUL byte")
    elif setting.type is str and not _allowed_text(setting, str(value)):
        raise InventoryError(f"{where}: {spelling} {value!r} is not {setting.what}", hint=hint)
    elif setting.name == "env":
        check_env(value, where)
    elif setting.name == "deployments" and not value:
        raise InventoryError(f"{where}: {spelling} must be {setting.what}")
    elif setting.name == "gpus":
        indices = gpu_indices(value) or []
        if not indices:
            raise InventoryError(f"{where}: {spelling} is empty", hint=hint)
        repeated = sorted({i for i in indices if indices.count(i) > 1})
        if repeated:
            raise InventoryError(f"{where}: {spelling} lists GPU {repeated[0]} twice")


def _allowed_text(setting: Setting, value: str) -> bool:
    if setting.choices and value not in setting.choices:
        return False
    return not setting.pattern or re.fullmatch(setting.pattern, value) is not None


def check_settings(variables: Mapping[str, Any], where: str, deployments: bool = True) -> None:
    """Refuse a host's deployctl settings, and its deployments', that deployctl cannot use:
    every spelling `deployctl_NAME`, every bare name whose value has the setting's type (a
    port out of range, a negative rank), every setting a deployment sets."""
    settings = Settings(variables, where)
    for name in SETTINGS:
        settings.checked(name)
    table = settings.given("deployments")
    if deployments and isinstance(table, Mapping):
        for name, layer in table.items():
            if isinstance(layer, Mapping):  # deployment_targets refuses the other shapes
                check_layer(layer, f"{where}, deployment {name}")


def check_layer(layer: Mapping[str, Any], where: str) -> None:
    """Refuse a layer of deployctl's own values (a deployment's, `--set`'s), where every
    setting, spelt either way, is deployctl's."""
    for name, value in own_layer(layer).items():
        if name in SETTINGS and name != "deployments" and value is not None:
            check_value(SETTINGS[name], value, where, name)


def _bare(key: Any) -> str | None:
    """The setting `deployctl_NAME` spells, or None."""
    text = str(key)
    name = text[len(PREFIX) :]
    return name if text.startswith(PREFIX) and name in SETTINGS else None


def own_layer(layer: Mapping[str, Any]) -> dict[str, Any]:
    """A layer whose settings are all deployctl's, each under its bare name; where both
    spellings are set, `deployctl_NAME` wins."""
    found = {str(k): v for k, v in layer.items() if _bare(k) is None}
    found.update({_bare(k) or "": v for k, v in layer.items() if _bare(k) is not None})
    return found


def overlay(variables: Mapping[str, Any], layer: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The variables with a layer of deployctl's own values over them (a deployment's,
    `--set`'s): each setting the layer sets replaces the host's, both spellings, under its
    bare name; `env` adds to the host's key by key."""
    merged = dict(variables)
    below = Settings(variables, where)
    for key, value in own_layer(layer).items():
        if key in SETTINGS:
            merged.pop(PREFIX + key, None)
        merged[key] = value
        if key == "env" and isinstance(value, Mapping):
            merged[key] = {**check_env(below.given("env"), where), **check_env(value, where)}
    return merged


class Settings:
    """A host's variables read as deployctl's settings: typed, with the declared defaults.

    `deployctl_NAME` wins over `NAME`; a bare `NAME` whose value does not have the setting's
    type is the user's own variable, and deployctl takes the default. `where` names the host
    (and deployment) in the error for a value deployctl cannot use.
    """

    def __init__(self, variables: Mapping[str, Any], where: str) -> None:
        self.variables = variables
        self.where = where

    def spelling(self, name: str) -> str | None:
        """Which variable holds deployctl's value of the setting: `deployctl_NAME` when set,
        else `NAME` when its value fits; None when neither does (the default applies)."""
        if PREFIX + name in self.variables:
            return PREFIX + name
        value = self.variables.get(name)
        return name if value is not None and fits(SETTINGS[name], value) else None

    def given(self, name: str) -> Any:
        """deployctl's value of the setting as set; None when unset, null or not deployctl's."""
        spelt = self.spelling(name)
        return None if spelt is None else self.variables[spelt]

    def value(self, name: str) -> Any:
        """deployctl's value of the setting, or its default when the host does not set one."""
        given = self.given(name)
        return SETTINGS[name].default if given is None else given

    def checked(self, name: str) -> Any:
        """The value, refused (naming host and variable) when deployctl cannot use it."""
        spelt = self.spelling(name)
        if spelt is not None and self.variables[spelt] is not None:
            check_value(SETTINGS[name], self.variables[spelt], self.where, spelt)
        return self.value(name)

    def foreign(self) -> list[str]:
        """The settings whose bare name holds the user's own variable (a value of another
        type, no `deployctl_NAME` beside it)."""
        return [
            name
            for name in SETTINGS
            if self.variables.get(name) is not None
            and PREFIX + name not in self.variables
            and not fits(SETTINGS[name], self.variables[name])
        ]

    def require_own(self, skip: Collection[str] = ()) -> None:
        """Refuse a bare setting that is the user's own variable: render and launch build the
        server from the settings and never take a default in its place (`skip`: names set
        for deployctl elsewhere, e.g. by --set)."""
        for name in (n for n in self.foreign() if n not in skip):
            raise InventoryError(
                f"{self.where}: {name} {self.variables[name]!r} is not {SETTINGS[name].what}, "
                f"so it is not deployctl's {name}",
                hint=f"if {name} is your own variable, set {PREFIX}{name} for deployctl's "
                f"({PREFIX}{name}: null for its default)",
            )

    def context(self) -> dict[str, Any]:
        """The variables as templates see them: each `deployctl_NAME` also as `NAME`."""
        found = dict(self.variables)
        for name in (n for n in SETTINGS if PREFIX + n in self.variables):
            value = self.value(name)
            if value is None:
                found.pop(name, None)
            else:
                found[name] = value
        return found

    def _text(self, name: str) -> str:
        return str(self.checked(name))

    def _int(self, name: str) -> int:
        return int(self.checked(name))

    def _seconds(self, name: str) -> float | None:
        self.checked(name)
        value = self.given(name)
        return None if value is None else float(value)

    @property
    def env(self) -> dict[str, str]:
        """The server's own environment variables (`env`), as text."""
        return check_env(self.checked("env"), self.where)

    @property
    def gpus(self) -> list[int] | None:
        """The GPU indices the server may use, in device order; None for every GPU."""
        value = self.checked("gpus")
        return None if value is None else gpu_indices(value)

    @property
    def patches(self) -> list[str]:
        """The patch sets this host should have."""
        value = self.checked("patches") or []
        return [value] if isinstance(value, str) else [str(v) for v in value]

    @property
    def enable_metrics(self) -> bool:
        return bool(self.checked("enable_metrics"))

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
        value = self.checked("template")
        return str(value) if value else None

    @property
    def threshold(self) -> int | None:
        """The inventory's `threshold`: what launch uses when `--threshold` is not given."""
        value = self.checked("threshold")
        return None if value is None else int(value)

    @property
    def check_flags(self) -> bool:
        return bool(self.checked("check_flags"))

    @property
    def router(self) -> str | None:
        """The router this worker registers with, as written (HOST/DEPLOYMENT or HOST)."""
        value = self.checked("router")
        return str(value) if value else None

    @property
    def worker_url(self) -> str | None:
        value = self.checked("worker_url")
        return str(value) if value else None

    @property
    def router_metrics_port(self) -> int:
        return self._int("router_metrics_port")

    @property
    def pd_role(self) -> PdRole | None:
        """The server's part in prefill/decode disaggregation (`role`); None: whole requests."""
        value = self.checked("role")
        return PdRole(value) if value else None

    @property
    def bootstrap_port(self) -> int:
        return self._int("bootstrap_port")

    @property
    def transfer_backend(self) -> str:
        return self._text("transfer_backend")

    @property
    def pd_timeout(self) -> int:
        return self._int("pd_timeout")

    @property
    def request_timeout(self) -> int:
        return self._int("request_timeout")

    @property
    def pd_router(self) -> bool:
        """A router that routes prefill/decode pairs (`pd`)."""
        return bool(self.checked("pd"))

    @property
    def launcher(self) -> str:
        return self._text("launcher")

    @property
    def slurm(self) -> bool:
        """The host is a Slurm login node: its servers run as jobs (`launcher: slurm`)."""
        return self.launcher == "slurm"

    def optional_text(self, name: str) -> str | None:
        value = self.checked(name)
        return str(value) if value not in (None, "") else None

    @property
    def slurm_nodes(self) -> int:
        return self._int("slurm_nodes")

    @property
    def slurm_gpus_per_node(self) -> int | None:
        value = self.checked("slurm_gpus_per_node")
        return None if value is None else int(value)

    @property
    def slurm_exclusive(self) -> bool:
        return bool(self.checked("slurm_exclusive"))

    @property
    def slurm_extra(self) -> list[str]:
        return [str(v) for v in self.checked("slurm_extra") or []]

    @property
    def known_hosts_file(self) -> str | None:
        value = self.checked("known_hosts_file")
        return str(value) if value else None

    @property
    def connect_timeout(self) -> float | None:
        """Seconds to connect; None when the host sets none (the connect options decide)."""
        return self._seconds("connect_timeout")

    @property
    def command_timeout(self) -> float | None:
        """Seconds a command may take; None when the host sets none (the options decide)."""
        return self._seconds("command_timeout")

    @property
    def max_reply_mib(self) -> int:
        return self._int("max_reply_mib")
