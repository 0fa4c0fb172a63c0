"""Ansible-format inventories: ranges, precedence, host patterns, errors, where they come from."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from deployctl import project
from deployctl.errors import InventoryError, UsageError
from deployctl.inventory import (
    DEFAULT_VARS,
    LOCALHOST,
    MASK,
    Inventory,
    expand_host_range,
    load_inventory,
    resolve_inventory,
)


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write {relative path: YAML text} under root; return the path of the first file."""
    paths = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        paths.append(path)
    return paths[0]


def load(root: Path, inventory: str, **extra: str) -> Inventory:
    return load_inventory(write_tree(root, {"inv.yml": inventory, **extra}))


def host_names(inv: Inventory) -> list[str]:
    return list(inv.hosts)


# --- host ranges -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu[01:08]", [f"gpu0{i}" for i in range(1, 9)]),
        ("gpu[1:3]", ["gpu1", "gpu2", "gpu3"]),
        ("gpu[08:11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("node[a:c]", ["nodea", "nodeb", "nodec"]),
        ("h[1:9:2]", ["h1", "h3", "h5", "h7", "h9"]),
        (
            "rack[1:2]-gpu[a:b].lan",
            ["rack1-gpua.lan", "rack1-gpub.lan", "rack2-gpua.lan", "rack2-gpub.lan"],
        ),
        ("plain-host", ["plain-host"]),
    ],
)
def test_host_range_expands_like_ansible(pattern: str, expected: list[str]) -> None:
    assert expand_host_range(pattern) == expected


@pytest.mark.parametrize("pattern", ["gpu[08:01]", "node[c:a]", "h[1:5:0]", "x[a:3]", "x[ab:cd]"])
def test_empty_or_mixed_host_range_is_an_error(pattern: str) -> None:
    with pytest.raises(InventoryError, match=r"host range"):
        expand_host_range(pattern)


def test_range_inside_a_group_gives_every_host_the_group_and_its_vars(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        all:
          hosts:
            head:
          children:
            h200:
              hosts:
                h200-a[01:03]:
                  rack: r7
              vars:
                gpu: H200
        """,
    )
    assert host_names(inv) == ["head", "h200-a01", "h200-a02", "h200-a03"]
    assert inv.groups["h200"] == ["h200-a01", "h200-a02", "h200-a03"]
    assert inv.groups["ungrouped"] == ["head"]
    for name in ("h200-a01", "h200-a02", "h200-a03"):
        assert inv.hosts[name].vars["gpu"] == "H200"
        assert inv.hosts[name].vars["rack"] == "r7"
    assert "gpu" not in inv.hosts["head"].vars


# --- variable precedence ---------------------------------------------------------------------

# One variable per step of Ansible's order (checked against ansible-inventory 2.19):
#   DEFAULT_VARS < all: vars < parent vars: < child vars: < group_vars/all
#   < group_vars/parent < group_vars/child < inventory host vars < host_vars/<host>
# Variable v<N> is set by every level from 0 up to N, so it must hold level N's value.
LEVELS = [
    "default",
    "all_inline",
    "parent_inline",
    "child_inline",
    "group_vars_all",
    "group_vars_parent",
    "group_vars_child",
    "host_inline",
    "host_vars_file",
]


def _vars_at(level: int) -> dict[str, str]:
    """The variables that the given level sets: v<N> for every N >= level."""
    return {f"v{n}": LEVELS[level] for n in range(level, len(LEVELS))}


def _yaml_block(values: dict[str, str], indent: int) -> str:
    pad = " " * indent
    return "\n".join(f"{pad}{k}: {v}" for k, v in values.items())


@pytest.fixture
def precedence_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Inventory:
    for key, value in _vars_at(0).items():
        monkeypatch.setitem(DEFAULT_VARS, key, value)
    inventory = (
        "all:\n  vars:\n"
        + _yaml_block(_vars_at(1), 4)
        + "\n  children:\n    parent:\n      vars:\n"
        + _yaml_block(_vars_at(2), 8)
        + "\n      children:\n        child:\n          vars:\n"
        + _yaml_block(_vars_at(3), 12)
        + "\n          hosts:\n            h1:\n"
        + _yaml_block(_vars_at(7), 14)
        + "\n"
    )
    child_vars = _vars_at(6)
    half = len(child_vars) // 2
    items = list(child_vars.items())
    files = {
        "inv.yml": inventory,
        "group_vars/all.yml": _yaml_block(_vars_at(4), 0),
        # .yaml suffix is read as well as .yml
        "group_vars/parent.yaml": _yaml_block(_vars_at(5), 0),
        # a folder of several files is merged
        "group_vars/child/10-first.yml": _yaml_block(dict(items[:half]), 0),
        "group_vars/child/20-second.yaml": _yaml_block(dict(items[half:]), 0),
        "group_vars/child/ignored.txt": "v8: not-yaml-suffix",
        "host_vars/h1.yml": _yaml_block(_vars_at(8), 0),
    }
    return load_inventory(write_tree(tmp_path, files))


@pytest.mark.parametrize(("level", "name"), list(enumerate(LEVELS)))
def test_each_precedence_level_beats_the_ones_below(
    precedence_inventory: Inventory, level: int, name: str
) -> None:
    assert precedence_inventory.hosts["h1"].vars[f"v{level}"] == name


def test_group_vars_all_beats_a_child_group_inline_vars_as_in_ansible(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        all:
          children:
            h200:
              vars:
                port: 31000
              hosts:
                h1:
        """,
        **{"group_vars/all.yml": "port: 32000\n"},
    )
    assert inv.hosts["h1"].vars["port"] == 32000


def test_group_vars_folder_files_merge_in_name_order(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        all:
          children:
            g:
              hosts:
                h1:
        """,
        **{
            "group_vars/g/b.yml": "x: from-b\ny: from-b\n",
            "group_vars/g/a.yml": "x: from-a\nz: from-a\n",
        },
    )
    assert {k: inv.hosts["h1"].vars[k] for k in "xyz"} == {
        "x": "from-b",
        "y": "from-b",
        "z": "from-a",
    }


def test_host_vars_file_with_yaml_suffix_is_read(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        "all:\n  hosts:\n    h1:\n      x: inline\n",
        **{"host_vars/h1.yaml": "x: file\n"},
    )
    assert inv.hosts["h1"].vars["x"] == "file"


def test_defaults_apply_when_the_inventory_sets_nothing(tmp_path: Path) -> None:
    inv = load(tmp_path, "all:\n  hosts:\n    h1:\n")
    assert {k: inv.hosts["h1"].vars[k] for k in DEFAULT_VARS} == DEFAULT_VARS


def test_host_in_two_groups_is_listed_once_and_gets_both_groups_vars(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        all:
          children:
            zeta:
              vars: {shared: zeta, only_zeta: 1}
              hosts:
                h1:
            alpha:
              vars: {shared: alpha, only_alpha: 2}
              hosts:
                h1:
                h2:
        """,
    )
    assert host_names(inv) == ["h1", "h2"]
    h1 = inv.hosts["h1"].vars
    assert (h1["only_zeta"], h1["only_alpha"]) == (1, 2)
    # Same depth: Ansible applies groups by name, so the later name wins.
    assert h1["shared"] == "zeta"
    assert [h.name for h in inv.select("zeta")] == ["h1"]
    assert [h.name for h in inv.select("alpha")] == ["h1", "h2"]
    assert inv.groups["ungrouped"] == []


# --- connection variables and describe() -----------------------------------------------------


def test_ssh_connection_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/op")
    inv = load(
        tmp_path,
        """
        all:
          hosts:
            gpu01:
              ansible_host: 10.1.2.3
              ansible_port: 2222
              ansible_user: sglang
              ansible_ssh_private_key_file: ~/.ssh/fleet
            gpu02:
              ansible_port: "2200"
        """,
    )
    one, two = inv.hosts["gpu01"], inv.hosts["gpu02"]
    assert (one.address, one.port, one.user, one.key_file, one.connection) == (
        "10.1.2.3",
        2222,
        "sglang",
        "/home/op/.ssh/fleet",
        "ssh",
    )
    assert not one.is_local
    assert (two.address, two.port, two.user, two.key_file) == ("gpu02", 2200, None, None)


def test_local_connection(tmp_path: Path) -> None:
    inv = load(tmp_path, "all:\n  hosts:\n    box:\n      ansible_connection: local\n")
    box = inv.hosts["box"]
    assert box.is_local
    assert box.connection == "local"
    assert box.describe()["port"] is None


def test_describe_has_the_json_shape_of_deployctl_hosts(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        all:
          hosts:
            gpu01:
              ansible_host: 10.1.2.3
              ansible_user: sglang
              model_path: /m
        """,
    )
    doc = inv.hosts["gpu01"].describe()
    assert json.loads(json.dumps(doc)) == doc
    assert set(doc) == {"address", "port", "user", "connection", "vars"}
    assert (doc["address"], doc["port"], doc["user"], doc["connection"]) == (
        "10.1.2.3",
        22,
        "sglang",
        "ssh",
    )
    assert doc["vars"]["model_path"] == "/m"
    assert doc["vars"]["tp"] == DEFAULT_VARS["tp"]


@pytest.mark.parametrize(
    ("name", "masked"),
    [
        ("hf_token", True),
        ("api_key", True),
        ("ansible_password", True),
        ("ansible_ssh_pass", True),
        ("ansible_become_password", True),
        ("db_secret", True),
        ("speculative_num_draft_tokens", False),
        ("max_tokens", False),
        ("ansible_ssh_private_key_file", False),
        ("model_path", False),
        ("api-key", True),
        ("secrets", True),
        ("tokens", True),
        ("passphrase", True),
        ("wandb_key", True),
        ("OPENAI_API_KEY", True),
        ("key_path", False),
        ("monkey", False),
        ("HF_TOKEN", True),
        ("Api_Key", True),
        ("DB_PASSWORD", True),
        ("Credentials", True),
    ],
)
def test_describe_masks_secret_looking_variables(tmp_path: Path, name: str, masked: bool) -> None:
    inv = load(tmp_path, f"all:\n  hosts:\n    h1:\n      {name}: value-1234\n")
    shown = inv.hosts["h1"].describe()["vars"][name]
    assert shown == (MASK if masked else "value-1234")
    # The host keeps the real value; only the description is masked.
    assert inv.hosts["h1"].vars[name] == "value-1234"


def test_describe_masks_secrets_in_lists_at_any_depth(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n    h:\n      extra_args: ['--api-key', 'sk-live-1234', '--tp', '8',"
        " '--hf-token=hf_abcdef']\n      nested: [[{password: hunter22}], [{ok: visible}]]\n"
    )
    shown = load_inventory(inv).select("h")[0].describe()["vars"]
    assert shown["extra_args"] == ["--api-key", MASK, "--tp", "8", f"--hf-token={MASK}"]
    assert shown["nested"] == [[{"password": MASK}], [{"ok": "visible"}]]


def test_describe_leaves_an_empty_secret_visible_as_empty(tmp_path: Path) -> None:
    inv = load(tmp_path, "all:\n  hosts:\n    h1:\n      hf_token: ''\n")
    assert inv.hosts["h1"].describe()["vars"]["hf_token"] == ""


# --- host patterns ---------------------------------------------------------------------------

FLEET = """
all:
  hosts:
    head:
  children:
    h200:
      hosts:
        h200-a[01:03]:
    rtx6000:
      hosts:
        rtx-b[01:02]:
    canary:
      hosts:
        h200-a01:
        rtx-b01:
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Inventory:
    return load(tmp_path, FLEET)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (None, ["head", "h200-a01", "h200-a02", "h200-a03", "rtx-b01", "rtx-b02"]),
        ("all", ["head", "h200-a01", "h200-a02", "h200-a03", "rtx-b01", "rtx-b02"]),
        ("*", ["head", "h200-a01", "h200-a02", "h200-a03", "rtx-b01", "rtx-b02"]),
        ("head", ["head"]),
        ("h200", ["h200-a01", "h200-a02", "h200-a03"]),
        ("ungrouped", ["head"]),
        ("rtx-b02,head", ["rtx-b02", "head"]),
        ("h200:rtx6000", ["h200-a01", "h200-a02", "h200-a03", "rtx-b01", "rtx-b02"]),
        (" h200 , rtx-b01 ", ["h200-a01", "h200-a02", "h200-a03", "rtx-b01"]),
        ("h200-a0*", ["h200-a01", "h200-a02", "h200-a03"]),
        ("*-b0?", ["rtx-b01", "rtx-b02"]),
        ("rtx*", ["rtx-b01", "rtx-b02"]),
        ("can*", ["h200-a01", "rtx-b01"]),
        ("h200:!h200-a02", ["h200-a01", "h200-a03"]),
        ("all:!canary", ["head", "h200-a02", "h200-a03", "rtx-b02"]),
        ("!canary", ["head", "h200-a02", "h200-a03", "rtx-b02"]),
        ("h200:&canary", ["h200-a01"]),
        ("h200:rtx6000:&canary:!rtx-b01", ["h200-a01"]),
        ("all,!h200,!rtx*", ["head"]),
    ],
)
def test_host_pattern_selects_in_pattern_order(
    fleet: Inventory, pattern: str | None, expected: list[str]
) -> None:
    assert [h.name for h in fleet.select(pattern)] == expected


@pytest.mark.parametrize("pattern", ["nosuch", "h200:&rtx6000", "zz*", "all:!all", "h200,typo"])
def test_pattern_matching_nothing_is_an_error_naming_the_pattern(
    fleet: Inventory, pattern: str
) -> None:
    with pytest.raises(InventoryError) as info:
        fleet.select(pattern)
    assert repr(pattern) in str(info.value)
    assert info.value.hint


@pytest.mark.parametrize("pattern", ["", " ", ",", " , ", ":", ",:,"])
def test_an_empty_pattern_selects_nothing_and_says_how_to_select_all(
    fleet: Inventory, pattern: str
) -> None:
    # `stop -H "$UNSET_VARIABLE"` must never mean the whole fleet.
    with pytest.raises(InventoryError, match="empty host pattern") as info:
        fleet.select(pattern)
    assert "-H all" in (info.value.hint or "")
    assert fleet.select(None) == fleet.select("all") == fleet.select("*")


def test_pattern_error_names_the_term_that_matched_nothing(fleet: Inventory) -> None:
    with pytest.raises(InventoryError, match=r"no host or group named 'typo'"):
        fleet.select("h200,typo")


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"is empty"),
        ("# only a comment\n", r"is empty"),
        ("- all\n- h1\n", r"top level must be a mapping, not list"),
        ("all:\n  hosts: [h1, h2]\n", r"all\.hosts must be a mapping, not list"),
        ("all:\n  hosts:\n    h1: 10.0.0.1\n", r"all\.hosts\.h1 must be a mapping, not str"),
        ("all:\n  host:\n    h1:\n", r"all has unknown key\(s\) host"),
        (
            "all:\n  children:\n    g:\n      hosts: {h1: }\n      varz: {x: 1}\n",
            r"all\.children\.g has unknown key\(s\) varz",
        ),
        ("all:\n  vars:\n    x: 1\n", r"defines no hosts"),
        ("all:\n  hosts:\n    h1: {ansible_port: 0}\n", r"ansible_port 0 is not a port"),
        ("all:\n  hosts:\n    h1: {ansible_port: 70000}\n", r"ansible_port 70000 is not a port"),
        ("all:\n  hosts:\n    h1: {ansible_port: abc}\n", r"ansible_port 'abc' is not a port"),
        ("all:\n  hosts:\n    h1: {ansible_port: true}\n", r"ansible_port True is not a port"),
        (
            "all:\n  hosts:\n    h1: {ansible_connection: winrm}\n",
            r"host h1: ansible_connection 'winrm' is not supported",
        ),
    ],
)
def test_bad_inventory_is_an_inventory_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "inv.yml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InventoryError, match=message) as info:
        load_inventory(path)
    assert str(path) in str(info.value)


def test_malformed_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "inv.yml"
    path.write_text("all:\n  hosts:\n    h1: {a: 1\n    h2:\n", encoding="utf-8")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(str(path))
    assert "malformed YAML" in message
    assert "line 4" in message


def test_malformed_group_vars_file_names_that_file(tmp_path: Path) -> None:
    path = write_tree(
        tmp_path,
        {"inv.yml": "all:\n  hosts:\n    h1:\n", "group_vars/all.yml": "x: [1, 2\n"},
    )
    with pytest.raises(InventoryError, match=r"group_vars/all\.yml: line \d+: malformed YAML"):
        load_inventory(path)


def test_group_vars_file_that_is_a_list_is_an_error(tmp_path: Path) -> None:
    path = write_tree(
        tmp_path, {"inv.yml": "all:\n  hosts:\n    h1:\n", "host_vars/h1.yml": "- x\n"}
    )
    with pytest.raises(InventoryError, match=r"host_vars/h1\.yml: the file must be a mapping"):
        load_inventory(path)


def test_inventory_folder_without_inventory_files_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"holds no inventory file"):
        load_inventory(tmp_path)


def test_missing_inventory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"does not exist") as info:
        load_inventory(tmp_path / "nope.yml")
    assert "nope.yml" in str(info.value)


# --- where the inventory comes from ----------------------------------------------------------


def _one_host_inventory(path: Path, host: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"all:\n  hosts:\n    {host}:\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("explicit", "env", "project_default", "expected"),
    [
        (True, True, True, "explicit-host"),
        (False, True, True, "env-host"),
        (False, False, True, "project-host"),
        (False, False, False, LOCALHOST),
        (True, False, False, "explicit-host"),
    ],
)
def test_resolve_inventory_precedence(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    explicit: bool,
    env: bool,
    project_default: bool,
    expected: str,
) -> None:
    explicit_path = _one_host_inventory(tmp_path / "explicit.yml", "explicit-host")
    env_path = _one_host_inventory(tmp_path / "env.yml", "env-host")
    project_path = _one_host_inventory(tmp_path / "inventories" / "default.yml", "project-host")
    if env:
        monkeypatch.setenv("DEPLOYCTL_INVENTORY", str(env_path))
    else:
        monkeypatch.delenv("DEPLOYCTL_INVENTORY", raising=False)
    inv = resolve_inventory(
        explicit_path if explicit else None, project_path if project_default else None
    )
    assert host_names(inv) == [expected]


def test_empty_env_variable_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYCTL_INVENTORY", "")
    project_path = _one_host_inventory(tmp_path / "default.yml", "project-host")
    assert host_names(resolve_inventory(None, project_path)) == ["project-host"]


def test_env_inventory_that_is_missing_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEPLOYCTL_INVENTORY", str(tmp_path / "gone.yml"))
    with pytest.raises(InventoryError, match=r"gone\.yml does not exist"):
        resolve_inventory(None, None)


def test_builtin_inventory_is_localhost_over_the_local_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DEPLOYCTL_INVENTORY", raising=False)
    inv = resolve_inventory(None, None)
    (host,) = inv.select("all")
    assert host.name == LOCALHOST
    assert host.is_local
    assert host.vars["python"] == DEFAULT_VARS["python"]
    assert inv.source == "built-in"


# --- the project folder ----------------------------------------------------------------------


def test_find_project_walks_up_from_a_nested_folder(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    (root / "templates").mkdir(parents=True)
    _one_host_inventory(root / "inventories" / "default.yml", "project-host")
    nested = root / "notes" / "2026" / "nov"
    nested.mkdir(parents=True)
    found = project.find_project(nested)
    assert found.root == root.resolve()
    assert found.search_dirs("templates") == [
        root.resolve() / "templates",
        project.SHIPPED_DATA / "templates",
    ]
    assert found.default_inventory() == root.resolve() / "inventories" / "default.yml"


def test_find_project_stops_at_the_nearest_project(tmp_path: Path) -> None:
    (tmp_path / "outer" / "patches").mkdir(parents=True)
    inner = tmp_path / "outer" / "inner"
    (inner / "inventories").mkdir(parents=True)
    (inner / "deep").mkdir()
    assert project.find_project(inner / "deep").root == inner.resolve()


def test_find_project_explicit_folder_wins_over_walking_up(tmp_path: Path) -> None:
    (tmp_path / "here" / "templates").mkdir(parents=True)
    other = tmp_path / "other"
    other.mkdir()
    assert project.find_project(tmp_path / "here", explicit=other).root == other.resolve()


def test_find_project_explicit_folder_that_is_missing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"does not exist"):
        project.find_project(tmp_path, explicit=tmp_path / "missing")


def test_find_project_falls_back_to_shipped_data(tmp_path: Path) -> None:
    if any(project.is_project_dir(p) for p in (tmp_path, *tmp_path.parents)):
        pytest.skip("an ancestor of the temporary folder looks like a project")
    found = project.find_project(tmp_path)
    assert found.root is None
    assert found.search_dirs("templates") == [project.SHIPPED_DATA / "templates"]
    assert found.default_inventory() is None
    assert (project.SHIPPED_DATA / "templates" / "baseline.j2").is_file()


def test_shipped_data_folder_is_never_taken_for_a_project() -> None:
    found = project.find_project(project.SHIPPED_DATA)
    assert found.root != project.SHIPPED_DATA


def test_a_folder_without_project_parts_is_not_a_project(tmp_path: Path) -> None:
    (tmp_path / "templates.txt").write_text("")
    assert not project.is_project_dir(tmp_path)
    (tmp_path / "patches").mkdir()
    assert project.is_project_dir(tmp_path)


def test_an_unreadable_group_vars_folder_is_an_inventory_error() -> None:
    # Root reads everything: the inventory is loaded in a child that became `nobody`.
    import pwd
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="deployctl-unreadable-", dir="/tmp"))
    secret = base / "group_vars" / "all"
    try:
        base.chmod(0o755)
        (base / "inv.yml").write_text("all:\n  hosts:\n    h: {}\n")
        secret.mkdir(parents=True)
        (secret / "vars.yml").write_text("x: 1\n")
        secret.chmod(0)
        nobody = pwd.getpwnam("nobody")
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through the pipe
            try:
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                load_inventory(base / "inv.yml")
                answer = "loaded"
            except InventoryError as exc:
                answer = f"InventoryError: {exc.message}"
            except BaseException as exc:
                answer = f"{type(exc).__name__}: {exc}"
            os.write(write_end, answer.encode())
            os._exit(0)
        os.close(write_end)
        answer = os.read(read_end, 4096).decode()
        os.waitpid(child, 0)
    finally:
        secret.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)
    assert answer == f"InventoryError: cannot read {secret}: Permission denied"


def test_a_range_without_a_start_begins_at_zero_as_in_ansible() -> None:
    assert expand_host_range("gpu[:3]") == ["gpu0", "gpu1", "gpu2", "gpu3"]


def test_a_range_without_an_end_is_an_error_as_in_ansible() -> None:
    with pytest.raises(InventoryError, match=r"host range 'gpu\[01:\]' has no end"):
        expand_host_range("gpu[01:]")


def test_a_key_given_twice_is_an_error_not_lost_hosts(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  children:\n    gpus:\n      hosts: {a: {}}\n    gpus:\n      hosts: {b: {}}\n"
    )
    with pytest.raises(InventoryError, match=r"line 5: malformed YAML: duplicate key 'gpus'"):
        load_inventory(inv)


def test_hosts_named_by_ipv6_address_can_be_selected(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    '::1': {}\n    'fe80::1': {}\n    alpha: {}\n")
    loaded = load_inventory(inv)
    assert [h.name for h in loaded.select("::1")] == ["::1"]
    assert [h.name for h in loaded.select("fe80::1, alpha")] == ["fe80::1", "alpha"]
    assert [h.name for h in loaded.select("all,!::1")] == ["fe80::1", "alpha"]


@pytest.mark.heavy
def test_a_hundred_thousand_hosts_resolve(tmp_path: Path) -> None:
    # Membership is kept in ordered sets: this took minutes when it was quadratic.
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  children:\n    gpu:\n      hosts:\n        gpu[1:100000]:\n")
    loaded = load_inventory(inv)
    assert len(loaded.select("gpu")) == 100000
    assert [h.name for h in loaded.select("gpu,!gpu??*")] == [
        "gpu1",
        "gpu2",
        "gpu3",
        "gpu4",
        "gpu5",
        "gpu6",
        "gpu7",
        "gpu8",
        "gpu9",
    ]


def test_env_merges_key_by_key_by_ansible_precedence(tmp_path: Path) -> None:
    inv = write_tree(
        tmp_path,
        {
            "inv.yml": """
all:
  vars:
    env: {NCCL_DEBUG: WARN, KEEP: all}
  children:
    rtx:
      vars:
        env: {NCCL_P2P_DISABLE: 1, NCCL_DEBUG: INFO}
      hosts:
        rtx-b01: {env: {SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: true}}
        rtx-b02: {}
""",
            "group_vars/rtx.yml": "env: {NCCL_SOCKET_IFNAME: eth0}\n",
        },
    )
    hosts = {h.name: h for h in load_inventory(inv).select(None)}
    assert hosts["rtx-b01"].vars["env"] == {
        "NCCL_DEBUG": "INFO",
        "KEEP": "all",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "true",
    }
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in hosts["rtx-b02"].vars["env"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("{A-B: 1}", "env name 'A-B' is not a variable name"),
        ("{1X: 1}", "env name '1X' is not a variable name"),
        ("[A, B]", "env must be a mapping"),
        ("{A: {B: 1}}", "env A must be a single value"),
        ("{A: null}", "env A must be a single value"),
        ('{A: "x\\0y"}', "env A holds a NUL byte"),
    ],
)
def test_bad_env_is_an_inventory_error_before_any_host(
    tmp_path: Path, env: str, message: str
) -> None:
    inv = tmp_path / "inv.yml"
    # A bare `env` that is no mapping is someone else's variable (tests/test_settings.py).
    for name in ("deployctl_env", "env") if env.startswith("{") else ("deployctl_env",):
        inv.write_text(f"all:\n  hosts:\n    h:\n      {name}: {env}\n")
        with pytest.raises(InventoryError, match=message):
            load_inventory(inv)


def test_what_a_secret_named_parent_holds_is_secret_at_any_depth(tmp_path: Path) -> None:
    from deployctl.inventory import secret_values

    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n    h:\n      credentials: {hf: hf_nested_value, more: [{x: deep_value}]}\n"
    )
    host = load_inventory(inv).select("h")[0]
    assert host.describe()["vars"]["credentials"] == MASK
    assert {"hf_nested_value", "deep_value"} <= set(secret_values(host.vars))


def test_secret_values_are_exactly_the_secrets_longest_first() -> None:
    from deployctl.inventory import secret_values

    variables = {
        "model_path": "/models/x",  # not secret: never masked in commands
        "tp": 8,
        "pin": "abcdef",
        "api_key": "abcd",  # four characters: the shortest masked
        "password": "xyz",  # three: too short to mask without hiding innocent text
        "db_password": "abcdefgh",
        "enabled_token": True,
        "opts": ["--tp", "8", "--hf-token", "hf_tail_value"],  # a secret flag's value, last
    }
    assert secret_values(variables) == ("hf_tail_value", "abcdefgh", "abcd")


def test_masking_lists_of_flags_at_their_edges() -> None:
    from deployctl.inventory import mask_secrets

    def shown(args: list[str]) -> list[str]:
        return list(mask_secrets({"extra_args": args})["extra_args"])

    # A secret inside a longer one is masked after it, so no tail of the longer one shows.
    assert shown(["--api-key", "sk-abcd", "--hf-token=sk-abcd-long"]) == [
        "--api-key", MASK, f"--hf-token={MASK}",
    ]  # fmt: skip
    # Longest first, not in text order: "zzzz" sorts after "abzzzzcd" but sits inside it.
    assert shown(["--api-key", "zzzz", "--hf-token", "abzzzzcd"]) == [
        "--api-key", MASK, "--hf-token", MASK,
    ]  # fmt: skip
    assert shown(["--tp", "8", "--api-key"]) == ["--tp", "8", "--api-key"]  # no value after it
    assert shown(["--api-key", "--tp", "8"]) == ["--api-key", "--tp", "8"]  # a flag, not a value
    assert shown(["--api-key", "abcd"]) == ["--api-key", MASK]
    assert shown(["--api-key", "abc"]) == ["--api-key", "abc"]


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--tokens", "abcdefgh"], ["--tokens", MASK]),
        (["--tokens=abcdefgh"], [f"--tokens={MASK}"]),
        (["-Xkey", "abcdefgh"], ["-Xkey", "abcdefgh"]),  # the name is all after the dashes
        (["--max-tokens", "12345"], ["--max-tokens", "12345"]),
    ],
)
def test_a_flag_is_judged_by_its_whole_name_after_the_dashes(
    args: list[str], shown: list[str]
) -> None:
    from deployctl.inventory import mask_secrets

    assert mask_secrets({"extra_args": args})["extra_args"] == shown


def test_secret_texts_are_masked_inside_nested_mappings_too() -> None:
    from deployctl.inventory import mask_secrets

    variables = {"env": {"LAUNCH": "serve --api-key sk-abcd", "inner": {"cmd": "x sk-abcd"}}}

    assert mask_secrets(variables, ["sk-abcd"]) == {
        "env": {"LAUNCH": f"serve --api-key {MASK}", "inner": {"cmd": f"x {MASK}"}}
    }


def test_url_passwords_and_pairs_in_variables_are_masked_where_they_stand() -> None:
    from deployctl.inventory import mask_secrets

    variables = {
        "db_url": "postgres://u:PASS-w0rd@db/x",
        "launch": ["serve", "env: HF_TOKEN=hf-unknown-1", "--port", "1"],
        "model": "/m/api_key_docs",
    }
    assert mask_secrets(variables) == {
        "db_url": f"postgres://u:{MASK}@db/x",
        "launch": ["serve", f"env: HF_TOKEN={MASK}", "--port", "1"],
        "model": "/m/api_key_docs",
    }


def test_hosts_sharing_variables_are_each_checked_and_warned_about(tmp_path: Path) -> None:
    # Equal variables are checked once: every host of a range still gets its own warning,
    # and a host whose variables differ is checked on its own.
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  children:\n    gpu:\n      vars:\n        treshold: 5\n"
        "      hosts:\n        gpu[1:3]:\n        odd:\n          port: 70000\n"
    )
    with pytest.raises(InventoryError, match="host odd"):
        load_inventory(inv)
    inv.write_text(
        "all:\n  children:\n    gpu:\n      vars:\n        treshold: 5\n"
        "      hosts:\n        gpu[1:3]:\n        odd:\n          port: 8000\n"
    )
    warned = [(w.host, w.variable) for w in load_inventory(inv).warnings]
    assert warned == [(f"{h}", "treshold") for h in ("gpu1", "gpu2", "gpu3", "odd")]
