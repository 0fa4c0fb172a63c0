"""deployctl's own variables: one declaration, the docs' table (docs/guides/inventories.md),
typed access, typo warnings. The generated reference covering each is tests/test_docs_reference.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deployctl import inventory, settings
from deployctl.errors import InventoryError
from deployctl.inventory import Host, load_inventory
from deployctl.settings import (
    DEFAULT_VARS,
    SETTINGS,
    TEMPLATE_VARIABLES,
    Misspelling,
    Settings,
    misspelling,
)
from tests.conftest import CLI

REPO = Path(__file__).resolve().parent.parent
PACKAGE_DATA = REPO / "deployctl" / "data"
INVENTORIES_PAGE = REPO / "docs" / "guides" / "inventories.md"
# What render adds to every template's context besides the host's variables.
RENDER_CONTEXT = {"inventory_hostname", "deployment", "template", "threshold"}


def documented_table(text: str | None = None) -> dict[str, str]:
    """The docs' table of deployctl's own variables: name → default cell."""
    if text is None:
        text = INVENTORIES_PAGE.read_text(encoding="utf-8")
    lines = text.splitlines()
    start = lines.index("deployctl's own settings are ordinary variables:") + 2
    assert lines[start].startswith("| variable | default |"), lines[start]
    found: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        names_cell, default_cell, _meaning = line.strip("|").split(" | ", 2)
        names = re.findall(r"`([^`]+)`", names_cell)
        assert names_cell.strip() == ", ".join(f"`{n}`" for n in names), line
        if len(names) == 1:
            defaults = [default_cell.strip()]
        elif default_cell.strip() == "—":
            defaults = ["—"] * len(names)
        else:
            defaults = default_cell.strip().split(", ")
        assert len(defaults) == len(names), line
        for name, default in zip(names, defaults, strict=True):
            assert name not in found, f"{name} is in the table twice"
            found[name] = default
    return found


# --- the declaration and the docs ------------------------------------------------------------


def test_the_docs_table_lists_exactly_the_declared_settings_with_their_defaults() -> None:
    table = documented_table()
    assert sorted(table) == sorted(SETTINGS)
    assert {n: table[n] for n in SETTINGS} == {n: s.default_text for n, s in SETTINGS.items()}


def test_the_table_is_read_cell_by_cell_so_a_drifted_default_shows() -> None:
    table = documented_table()
    assert table["port"] == "`30000`" and table["gpus"] == "every GPU"
    assert table["connect_timeout"] == "`10`" and table["nnodes"] == "`1`"
    assert table["node_hosts"] == "—"
    page = INVENTORIES_PAGE.read_text(encoding="utf-8")
    drifted = page.replace("`8`, `30000`, `127.0.0.1`", "`8`, `30001`, `127.0.0.1`")
    assert documented_table(drifted)["port"] != SETTINGS["port"].default_text


def test_default_vars_are_the_layered_settings_and_still_importable_from_inventory() -> None:
    assert inventory.DEFAULT_VARS is DEFAULT_VARS
    assert {n: s.default for n, s in SETTINGS.items() if s.layered} == DEFAULT_VARS
    assert set(DEFAULT_VARS) == {
        "python", "launch_module", "log_dir", "state_dir", "port", "bind_host", "tp",
        "router_metrics_port", "bootstrap_port", "transfer_backend", "request_timeout",
    }  # fmt: skip
    assert DEFAULT_VARS["port"] == 30000 and DEFAULT_VARS["tp"] == 8


def test_the_declared_timeouts_and_reply_limit_are_the_connections_defaults() -> None:
    from deployctl import connection

    assert SETTINGS["connect_timeout"].default == connection.DEFAULT_CONNECT_TIMEOUT
    assert SETTINGS["command_timeout"].default == connection.DEFAULT_COMMAND_TIMEOUT
    assert SETTINGS["max_reply_mib"].default == connection.DEFAULT_MAX_REPLY_MIB
    assert [n for n, s in SETTINGS.items() if s.type is float] == [
        "mem_fraction_static",
        "connect_timeout",
        "command_timeout",
    ]


def test_every_setting_has_a_type_and_one_line_of_help() -> None:
    for setting in SETTINGS.values():
        assert setting.type in (str, int, float, bool, list, dict), setting.name
        assert setting.help and "\n" not in setting.help, setting.name
        if setting.default is not None:
            # float accepts an int default (`10` seconds)
            assert isinstance(setting.default, setting.type) or setting.type is float


def template_variables() -> set[str]:
    """Every variable the shipped templates read."""
    import jinja2
    import jinja2.meta

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(PACKAGE_DATA / "templates")))
    found: set[str] = set()
    for path in (PACKAGE_DATA / "templates").glob("*.j2"):
        ast = env.parse(path.read_text(encoding="utf-8"))
        found |= jinja2.meta.find_undeclared_variables(ast)
    return found


def test_the_template_variables_are_what_the_shipped_templates_read() -> None:
    read = template_variables()
    assert "speculative_num_steps" in read and "mem_fraction_static" in read
    assert read <= set(SETTINGS) | TEMPLATE_VARIABLES | RENDER_CONTEXT, read - set(SETTINGS)
    assert read >= TEMPLATE_VARIABLES, TEMPLATE_VARIABLES - read


# --- typed access ----------------------------------------------------------------------------


def test_typed_access_reads_the_hosts_values_and_falls_back_to_the_declared_defaults() -> None:
    bare = Host("gpu01", {"ansible_port": 2222})
    assert bare.port == 2222  # the SSH port
    assert bare.settings.server_port == 30000  # the server's
    assert (bare.settings.state_dir, bare.settings.log_dir) == ("~/.deployctl", "~/deployctl/logs")
    assert (bare.settings.python, bare.settings.tp, bare.settings.nnodes) == ("python3", 8, 1)
    assert bare.settings.dist_port == 20000
    assert bare.settings.template is None and bare.settings.check_flags is True
    assert bare.settings.command_timeout is None and bare.settings.known_hosts_file is None

    set_ = Host("gpu01", {"port": "30001", "tp": 4, "state_dir": Path("/s"), "template": "x"})
    assert set_.settings.server_port == 30001 and set_.settings.tp == 4
    assert set_.settings.state_dir == "/s" and set_.settings.template == "x"
    timed = Host("gpu01", {"command_timeout": 3, "connect_timeout": "2.5", "check_flags": False})
    assert timed.settings.command_timeout == 3.0 and timed.settings.connect_timeout == 2.5
    assert timed.settings.check_flags is False


def test_a_value_of_the_wrong_type_names_host_deployment_and_variable() -> None:
    with pytest.raises(
        InventoryError,
        match=r"^host gpu01, deployment qwen: deployctl_dist_port 'x' is not a port number",
    ):
        _ = Host("gpu01", {"deployctl_dist_port": "x"}, "qwen").settings.dist_port
    with pytest.raises(
        InventoryError, match=r"^host gpu01: deployctl_command_timeout 'soon' is not a number"
    ):
        _ = Host("gpu01", {"deployctl_command_timeout": "soon"}).settings.command_timeout
    with pytest.raises(InventoryError, match=r"^host gpu01: port 99999 is not a port number"):
        _ = Host("gpu01", {"port": 99999}).settings.server_port  # a number: deployctl's


def test_a_deployment_reads_its_own_values_over_its_hosts(tmp_path: Path) -> None:
    from deployctl.deployments import deployment_targets

    path = tmp_path / "inv.yml"
    path.write_text(
        "all:\n  hosts:\n    h1:\n      tp: 4\n"
        "      deployments: {a: {port: 30001}, b: {port: 30002, template: eagle3}}\n"
    )
    a, b = deployment_targets(load_inventory(path).hosts.values())
    assert (a.settings.server_port, a.settings.tp, a.settings.template) == (30001, 4, None)
    assert (b.settings.server_port, b.settings.template) == (30002, "eagle3")


def test_loaded_hosts_read_their_inventory_values(tmp_path: Path) -> None:
    path = tmp_path / "inv.yml"
    path.write_text("all:\n  vars: {port: 31000}\n  hosts:\n    h1: {ansible_port: 2200}\n")
    host = load_inventory(path).hosts["h1"]
    assert (host.port, host.settings.server_port) == (2200, 31000)


# --- what looks like a typo ------------------------------------------------------------------

TYPOS = {
    "log-dir": "log_dir",
    "logdir": "log_dir",
    "Log_Dir": "log_dir",
    "LOG_DIR": "log_dir",
    "log_dri": "log_dir",
    "state_dirs": "state_dir",
    "stat_dir": "state_dir",
    "statedir": "state_dir",
    "tp_size": "tp",
    "tensor_parallel_size": "tp",
    "TP": "tp",
    "pyton": "python",
    "launch-module": "launch_module",
    "launch_modul": "launch_module",
    "bind-host": "bind_host",
    "ports": "port",
    "known_host_file": "known_hosts_file",
    "connection_timeout": "connect_timeout",
    "command_timeouts": "command_timeout",
    "treshold_mode": "threshold_mode",
    "draft_model_pth": "draft_model_path",
    "modelpath": "model_path",
    "templates": "template",
    "dist-port": "dist_port",
    "n_nodes": "nnodes",
}


@pytest.mark.parametrize(("name", "meant"), TYPOS.items())
def test_a_mistyped_setting_names_the_setting(name: str, meant: str) -> None:
    assert misspelling(name) == meant


def sglang_option_names() -> list[str]:
    """Every option of the real SGLang 0.5.23 server, as the variable a template would use."""
    options = REPO / "tests" / "data" / "sglang" / "sglang-0.5.23-options.json"
    return [o["dest"] for o in json.loads(options.read_text(encoding="utf-8"))["options"]]


def test_no_sglang_option_name_is_taken_for_a_typo_but_the_aliases() -> None:
    names = sglang_option_names()
    assert len(names) > 500 and "speculative_num_steps" in names
    flagged = {n: misspelling(n) for n in names if misspelling(n) is not None}
    # SGLang's name for tensor parallelism is the one alias among its options.
    assert flagged == {"tp_size": "tp"}


OWN_VARIABLES = [
    *sorted(TEMPLATE_VARIABLES),
    *SETTINGS,
    "gpu",  # the shipped example's label: `gpu: H200`
    "GPU",
    "deployment",  # `deployment: staging`, a setting's singular
    "node",
    "patch",
    "check_flag",
    "tps",
    "envs",
    "python3",
    "python_version",
    "grpc_port",
    "my_port",
    "http_port",
    "server_port",
    "enable_mfu_metrics",
    "log_level",
    "logs",
    "state",
    "model",
    "draft_model",
    "models_root",
    "template_dir",
    "region",
    "rack",
    "owner",
    "env_name",
    "environment",
    "conda_env",
    "work_dir",
    "data_dir",
    "hf_token",
    "api_key",
    "timeout",
    "ansible_python_interpreter",
    "ansible_become",
    "ansible_ssh_common_args",
    "inventory_hostname",
]


@pytest.mark.parametrize("name", OWN_VARIABLES)
def test_settings_template_ansible_and_own_variables_are_no_typo(name: str) -> None:
    assert misspelling(name) is None


# --- warnings collected on the inventory -----------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text(text, encoding="utf-8")
    return path


TYPO_INVENTORY = """\
all:
  vars:
    logdir: /data/logs
  hosts:
    h200-a01:
      log-dir: /tmp/logs
      tp_size: 8
      mem_fraction_static: 0.8
      speculative_num_steps: 3
      draft_model_path: /d
      ansible_python_interpreter: /usr/bin/python3
      gpu: H200
      owner: ml-infra
      deployments:
        qwen: {Log_Dir: /q, port: 30001, tp: 4}
    h200-a02:
      state_dirs: /state
"""


def test_the_inventory_collects_one_warning_per_variable_and_host(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, TYPO_INVENTORY))
    assert inv.warnings == [
        Misspelling("h200-a01", "logdir", "log_dir"),
        Misspelling("h200-a01", "log-dir", "log_dir"),
        Misspelling("h200-a01", "tp_size", "tp"),
        Misspelling("h200-a01/qwen", "Log_Dir", "log_dir"),
        Misspelling("h200-a02", "logdir", "log_dir"),
        Misspelling("h200-a02", "state_dirs", "state_dir"),
    ]
    assert inv.warnings[2].text == (
        "variable 'tp_size' is not a deployctl setting; did you mean 'tp'?"
    )


def test_a_variable_set_at_several_levels_warns_once_per_host(tmp_path: Path) -> None:
    text = "all:\n  vars: {logdir: /a}\n  children:\n    g:\n      vars: {logdir: /b}\n"
    text += "      hosts:\n        h1: {logdir: /c}\n"
    inv = load_inventory(write(tmp_path, text))
    assert inv.warnings == [Misspelling("h1", "logdir", "log_dir")]


def test_the_shipped_inventories_give_no_warning() -> None:
    for path in (PACKAGE_DATA / "inventories").glob("*.yml"):
        assert load_inventory(path).warnings == [], path
    assert inventory.builtin_inventory().warnings == []


def test_the_inventory_layer_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load_inventory(write(tmp_path, TYPO_INVENTORY))
    assert capsys.readouterr() == ("", "")


# --- through the CLI -------------------------------------------------------------------------

EXPECTED_LINES = [
    "h200-a01: warning: variable 'logdir' is not a deployctl setting; did you mean 'log_dir'?",
    "h200-a01: warning: variable 'log-dir' is not a deployctl setting; did you mean 'log_dir'?",
    "h200-a01: warning: variable 'tp_size' is not a deployctl setting; did you mean 'tp'?",
    "h200-a01/qwen: warning: variable 'Log_Dir' is not a deployctl setting; "
    "did you mean 'log_dir'?",
    "h200-a02: warning: variable 'logdir' is not a deployctl setting; did you mean 'log_dir'?",
    "h200-a02: warning: variable 'state_dirs' is not a deployctl setting; "
    "did you mean 'state_dir'?",
]


def test_the_cli_prints_each_warning_once_on_stderr(cli: CLI) -> None:
    write(cli.cwd, TYPO_INVENTORY)
    result = cli("hosts", "-i", "inv.yml")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == EXPECTED_LINES
    assert "warning" not in result.stdout and "h200-a01" in result.stdout


def test_with_json_the_warnings_stay_on_stderr(cli: CLI) -> None:
    write(cli.cwd, TYPO_INVENTORY)
    result = cli("hosts", "-i", "inv.yml", "-H", "h200-a02", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert list(doc["hosts"]) == ["h200-a02"]
    assert doc["hosts"]["h200-a02"]["vars"]["state_dirs"] == "/state"
    assert result.stderr.splitlines() == EXPECTED_LINES


def test_a_clean_inventory_prints_no_warning(cli: CLI) -> None:
    write(cli.cwd, "all:\n  hosts:\n    h1: {gpu: H200, log_dir: /l, mem_fraction_static: 0.9}\n")
    result = cli("hosts", "-i", "inv.yml")
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_settings_module_sits_in_the_inventory_layer() -> None:
    from tests.test_layers import import_graph

    leaves = {"deployctl.errors", "deployctl.text", "deployctl.choices"}
    assert import_graph()["deployctl.settings"] <= leaves
    assert settings.__doc__


# --- every value checked once, where the settings are declared --------------------------------

BAD_VALUES = [
    # (variables of host h1, the error after `inv.yml: `)
    ({"port": 0}, "host h1: port 0 is not a port number (1-65535)"),
    ({"port": 65536}, "host h1: port 65536 is not a port number (1-65535)"),
    ({"dist_port": 99999}, "host h1: dist_port 99999 is not a port number (1-65535)"),
    (
        {"deployments": {"d": {"dist_port": "abc"}}},
        "host h1, deployment d: dist_port 'abc' is not a port number (1-65535)",
    ),
    (
        {"deployctl_dist_port": "abc"},
        "host h1: deployctl_dist_port 'abc' is not a port number (1-65535)",
    ),
    ({"tp": 0}, "host h1: tp 0 is not a number of GPUs"),
    ({"deployments": {"d": {"tp": "eight"}}}, "host h1, deployment d: tp 'eight' is not a number of GPUs"),
    ({"node_rank": -1}, "host h1: node_rank -1 is not a rank (0 or more)"),
    ({"nnodes": 0}, "host h1: nnodes 0 is not a number of nodes"),
    ({"connect_timeout": 0}, "host h1: connect_timeout 0 is not a number of seconds"),
    ({"command_timeout": -1.5}, "host h1: command_timeout -1.5 is not a number of seconds"),
    ({"deployctl_command_timeout": "soon"}, "host h1: deployctl_command_timeout 'soon' is not a number of seconds"),
    ({"gpus": [1, 1]}, "host h1: gpus lists GPU 1 twice"),
    ({"deployments": {"d": {"gpus": "0,x"}}}, "host h1, deployment d: gpus '0,x' is not a list of GPU indices"),
    ({"deployctl_gpus": []}, "host h1: deployctl_gpus is empty"),
    ({"deployctl_patches": [{"a": 1}]}, "host h1: deployctl_patches [{'a': 1}] is not a list of patch set names"),
    ({"deployctl_deployments": ["d"]}, "host h1: deployctl_deployments must be a mapping of name: variables"),
    ({"deployctl_env": "prod"}, "host h1: deployctl_env must be a mapping of NAME: value"),
    ({"deployments": {"d": {"env": "prod"}}}, "host h1, deployment d: env must be a mapping of NAME: value"),
    ({"deployctl_check_flags": "no"}, "host h1: deployctl_check_flags 'no' is not a boolean (true or false)"),
    ({"deployments": {"d": {"enable_metrics": 1}}}, "host h1, deployment d: enable_metrics 1 is not a boolean (true or false)"),
    ({"state_dir": "/a\0b"}, "host h1: state_dir holds a NUL byte"),
]  # fmt: skip


@pytest.mark.parametrize(("variables", "message"), BAD_VALUES)
def test_a_value_deployctl_cannot_use_is_one_error_naming_host_deployment_and_variable(
    tmp_path: Path, variables: dict[str, object], message: str
) -> None:
    path = write(tmp_path, json.dumps({"all": {"hosts": {"h1": variables, "h2": {}}}}))
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert caught.value.message == f"{path}: {message}"


def test_every_number_has_its_bounds_where_it_is_declared() -> None:
    bounds = {n: (s.least, s.most, s.above) for n, s in SETTINGS.items() if s.type in (int, float)}
    assert bounds == {
        "tp": (1, None, None),
        "port": (1, 65535, None),
        "node_rank": (0, None, None),
        "dist_port": (1, 65535, None),
        "nnodes": (1, None, None),
        "threshold": (1, None, None),
        "router_metrics_port": (1, 65535, None),
        "bootstrap_port": (1, 65535, None),
        "pd_timeout": (1, 7 * 24 * 3600, None),
        "request_timeout": (1, 7 * 24 * 3600, None),
        "slurm_nodes": (1, None, None),
        "slurm_gpus_per_node": (1, None, None),
        "connect_timeout": (None, 7 * 24 * 3600, 0),
        "command_timeout": (None, 7 * 24 * 3600, 0),
        "max_reply_mib": (1, 1 << 20, None),
        "mem_fraction_static": (None, None, 0),
    }
    assert {n: s.below for n, s in SETTINGS.items() if s.below is not None} == {
        "mem_fraction_static": 1
    }


def test_a_multi_node_dist_port_that_is_no_port_is_refused_before_any_host(cli: CLI) -> None:
    # Port 1 on loopback: nothing listens, so reaching for a host would fail otherwise.
    text = (
        "all:\n  children:\n    kimi:\n      hosts:\n"
        "        n1: {ansible_host: 127.0.0.1, ansible_port: 1, model_path: /m}\n"
        "        n2: {ansible_host: 127.0.0.1, ansible_port: 1, model_path: /m}\n"
        "  vars:\n    deployments: {k: {nodes: kimi, tp: 2, dist_port: VALUE}}\n"
    )
    for value, shown in (("abc", "'abc'"), ("99999", "99999")):
        write(cli.cwd, text.replace("VALUE", value))
        result = cli("launch", "-i", "inv.yml")
        assert result.returncode == 1, result.stderr
        assert result.stderr.splitlines() == [
            f"error: inv.yml: host n1, deployment k: dist_port {shown} is not a port number "
            "(1-65535)"
        ]


# --- `deployctl_NAME`: deployctl's own spelling of every setting ------------------------------


def test_the_prefixed_spelling_wins_over_the_bare_name_whatever_the_bare_holds() -> None:
    host = Host(
        "h1",
        {"port": 30001, "deployctl_port": 31000, "env": "prod", "deployctl_env": {"A": 1}},
    )
    assert host.settings.server_port == 31000 and host.settings.env == {"A": "1"}
    assert host.settings.spelling("port") == "deployctl_port"
    assert Settings(host.vars, "h1").foreign() == []  # `env` is plainly the user's
    # null in deployctl's spelling: deployctl takes the default, the bare name is left alone
    nulled = Host("h1", {"port": "web", "deployctl_port": None})
    assert nulled.settings.server_port == 30000 and Settings(nulled.vars, "h1").foreign() == []


def test_a_bare_name_that_does_not_fit_is_the_users_and_deployctl_takes_the_default() -> None:
    host = Host(
        "h1",
        {"env": "prod", "port": "web", "tp": "auto", "gpus": "all", "python": 3.11,
         "patches": {"x": 1}, "deployments": "blue", "check_flags": "no", "template": "t.j2"},
    )  # fmt: skip
    settings = host.settings
    assert (settings.env, settings.server_port, settings.tp, settings.gpus) == ({}, 30000, 8, None)
    assert (settings.python, settings.patches, settings.check_flags) == ("python3", [], True)
    assert settings.given("deployments") is None
    assert settings.template == "t.j2"  # a string: a template name, deployctl's
    assert Settings(host.vars, "h1").foreign() == [
        "python", "tp", "port", "patches", "env", "check_flags", "deployments", "gpus"
    ]  # fmt: skip
    with pytest.raises(InventoryError) as caught:
        settings.require_own()
    assert caught.value.message == (
        "host h1: python 3.11 is not text, so it is not deployctl's python"
    )
    assert caught.value.hint == (
        "if python is your own variable, set deployctl_python for deployctl's "
        "(deployctl_python: null for its default)"
    )
    settings.require_own(skip=Settings(host.vars, "h1").foreign())


def test_a_bare_name_that_fits_but_is_out_of_range_is_still_an_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="port 99999 is not a port number"):
        load_inventory(write(tmp_path, "all:\n  hosts:\n    h1: {port: 99999}\n"))


def test_the_prefixed_env_merges_key_by_key_across_levels_and_not_with_the_bare_one(
    tmp_path: Path,
) -> None:
    text = (
        "all:\n  vars:\n    env: {FROM_ALL: '1'}\n    deployctl_env: {A: 1, B: 1}\n"
        "  children:\n    g:\n      vars: {deployctl_env: {B: 2}}\n"
        "      hosts:\n        h1: {deployctl_env: {C: true}}\n        h2: {env: prod}\n"
    )
    inv = load_inventory(write(tmp_path, text))
    h1, h2 = inv.hosts["h1"], inv.hosts["h2"]
    assert h1.settings.env == {"A": "1", "B": "2", "C": "true"}  # FROM_ALL: the other spelling
    assert h1.vars["env"] == {"FROM_ALL": "1"}
    assert h2.vars["env"] == "prod" and h2.settings.env == {"A": "1", "B": "2"}
    assert inv.warnings == []  # h2's `env` is shadowed by deployctl_env: plainly the user's


def test_a_deployments_values_are_deployctls_and_win_over_both_spellings_of_the_host() -> None:
    from deployctl.deployments import deployment_targets, server_env

    table = {"a": {"port": 30001, "env": {"B": "2"}}, "b": {"deployctl_tp": 4, "tp": 2}}
    host = Host(
        "h1",
        {"deployctl_port": 31000, "port": "web", "deployctl_env": {"A": "1"}, "env": "prod",
         "deployctl_deployments": table, "deployments": "blue"},
    )  # fmt: skip
    a, b = deployment_targets([host])
    assert (a.label, a.settings.server_port, b.settings.server_port) == ("h1/a", 30001, 31000)
    assert server_env(a, a.vars) == {"A": "1", "B": "2"} and b.settings.env == {"A": "1"}
    assert b.settings.tp == 4  # the deployment's own `deployctl_tp` beats its bare `tp`
    assert "deployctl_port" not in a.vars and "deployctl_deployments" not in a.vars


def test_prefixed_spellings_are_no_typos_but_their_typos_are() -> None:
    assert all(misspelling(f"deployctl_{name}") is None for name in SETTINGS)
    assert misspelling("deployctl_logdir") == "deployctl_log_dir"
    assert misspelling("deployctl_tp_size") == "deployctl_tp"
    assert misspelling("deployctl_release") is None


def test_the_inventory_warns_once_per_host_and_foreign_variable(tmp_path: Path) -> None:
    from tests.test_inventory_ansible import FOREIGN  # run against ansible-inventory there

    inv = load_inventory(write(tmp_path, FOREIGN))
    assert [(w.host, w.variable) for w in inv.warnings] == [
        ("shared1", "port"), ("shared1", "env"), ("shared2", "port"), ("shared2", "env")
    ]  # fmt: skip
    assert inv.warnings[1].text == (
        "variable 'env' is not a mapping of NAME: value, so it is yours, not deployctl's: "
        "deployctl uses its default, and render and launch refuse the host until deployctl_env "
        "is set"
    )
    assert inv.hosts["shared1"].vars["env"] == "prod" and inv.hosts["shared1"].settings.env == {}


def test_a_template_context_sees_deployctls_values_under_the_bare_names() -> None:
    context = Settings(
        {"port": "web", "deployctl_port": 31000, "deployctl_env": None}, "h"
    ).context()
    assert context["port"] == 31000 and "env" not in context
