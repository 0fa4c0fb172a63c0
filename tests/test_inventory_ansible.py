"""deployctl reads every inventory Ansible reads the way Ansible reads it: the real
`ansible-inventory --list` (and `ansible -m debug` for templated variables) is the oracle.

One fleet is written in each format: YAML, INI, YAML-format `.json`, script-format JSON
(saved), a folder of mixed sources, an inventory script and several `-i`. Each has ranges,
children three levels deep, group_vars/ and host_vars/ files and folders, and templated
variables.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from deployctl import inventory_sources
from deployctl.inventory import DEFAULT_VARS, MASK, VaultOptions, load_inventory
from tests.ansible_tools import run_tool
from tests.conftest import CLI

BIN = Path(sys.executable).parent
ANSIBLE_ENV = {**os.environ, "ANSIBLE_DEPRECATION_WARNINGS": "False"}
UNDEFINED = "__undefined__"

# Templated variables, and where they are defined, for every format below.
TEMPLATED = ("model_path", "served_name", "log_dir", "gpus_total", "greeting")

YAML_FLEET = """\
all:
  vars:
    models_root: /models
    greeting: "{{ inventory_hostname }} in {{ group_names | join(',') }}"
  hosts:
    head:
      ansible_host: 10.0.0.1
  children:
    gpu:
      vars:
        tp: 8
        model_path: "{{ models_root }}/{{ model | default('qwen') }}"
        served_name: "{{ model_path | basename | lower }}"
        log_dir: "{{ data_root | default('/data') }}/logs"
        gpus_total: "{{ tp * nodes | int }}"
        nodes: "2"
      children:
        h200:
          vars:
            model: Kimi-K2
          hosts:
            h200-a[01:03]:
              ansible_user: ops
            h200-b01:2222:
          children:
            h200_canary:
              hosts:
                h200-a01:
                  canary: true
        rtx:
          hosts:
            rtx-b[a:c]:
          vars:
            tp: 4
    canary:
      hosts:
        rtx-ba:
        h200-a01:
"""

INI_FLEET = """\
# the same fleet as YAML_FLEET, in INI
head ansible_host=10.0.0.1

[gpu:children]
h200
rtx

[h200]
h200-a[01:03] ansible_user=ops
h200-b01:2222

[h200:children]
h200_canary

[h200_canary]
h200-a01 canary=True

[h200:vars]
model=Kimi-K2

[rtx]
rtx-b[a:c]

[rtx:vars]
tp=4

[canary]
rtx-ba
h200-a01

[gpu:vars]
tp=8
model_path={{ models_root }}/{{ model | default('qwen') }}
served_name={{ model_path | basename | lower }}
log_dir={{ data_root | default('/data') }}/logs
gpus_total={{ tp * nodes | int }}
nodes="2"

[all:vars]
models_root=/models
greeting={{ inventory_hostname }} in {{ group_names | join(',') }}
"""

# Beside every inventory: group_vars/ and host_vars/ as files and as folders.
VARS_FILES = {
    "group_vars/all.yml": "region: eu\ndata_root: /srv\n",
    "group_vars/h200.yml": "data_root: /nvme\nmem_fraction: 0.88\n",
    "group_vars/rtx/10-base.yml": "data_root: /ssd\nsm: 120\n",
    "group_vars/rtx/20-more.yaml": "sm: 121\nextra_args: [--enable-metrics]\n",
    "group_vars/rtx/notes.md": "not: loaded\n",
    "group_vars/canary.json": '{"canary_pct": 5}\n',
    "host_vars/h200-a01.yml": "tp: 2\nmodel: Qwen3\n",
    "host_vars/rtx-bb/main.yml": "ansible_port: 2200\n",
}


SCRIPT_DATA: dict[str, Any] = {
    "_meta": {
        "hostvars": {
            "head": {"ansible_host": "10.0.0.1"},
            "h200-a01": {"ansible_user": "ops", "canary": True},
            "h200-a02": {"ansible_user": "ops"},
            "h200-a03": {"ansible_user": "ops"},
            "h200-b01": {"ansible_port": 2222},
        }
    },
    "all": {
        "children": ["ungrouped", "gpu", "canary"],
        "vars": {
            "models_root": "/models",
            "greeting": "{{ inventory_hostname }} in {{ group_names | join(',') }}",
        },
    },
    "ungrouped": {"hosts": ["head"]},
    "gpu": {
        "children": ["h200", "rtx"],
        "vars": {
            "tp": 8,
            "model_path": "{{ models_root }}/{{ model | default('qwen') }}",
            "served_name": "{{ model_path | basename | lower }}",
            "log_dir": "{{ data_root | default('/data') }}/logs",
            "gpus_total": "{{ tp * nodes | int }}",
            "nodes": "2",
        },
    },
    "h200": {
        "hosts": ["h200-a01", "h200-a02", "h200-a03", "h200-b01"],
        "children": ["h200_canary"],
        "vars": {"model": "Kimi-K2"},
    },
    "h200_canary": {"hosts": ["h200-a01"]},
    "rtx": {"hosts": ["rtx-ba", "rtx-bb", "rtx-bc"], "vars": {"tp": 4}},
    "canary": {"hosts": ["rtx-ba", "h200-a01"]},
}

SCRIPT = f"""#!{sys.executable}
import sys
DATA = {json.dumps(SCRIPT_DATA)!r}
print("{{}}" if "--host" in sys.argv else DATA)
"""


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def make_executable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def yaml_as_json(text: str) -> str:
    import yaml

    return json.dumps(yaml.safe_load(text), indent=1)


def fleet_sources(root: Path, kind: str) -> tuple[list[Path], list[Path]]:
    """Write one fleet in the given format; return (deployctl's sources, Ansible's sources)."""
    write(root, VARS_FILES)
    if kind == "yaml":
        write(root, {"fleet.yml": YAML_FLEET})
        return [root / "fleet.yml"], [root / "fleet.yml"]
    if kind == "ini":
        write(root, {"fleet.ini": INI_FLEET})
        return [root / "fleet.ini"], [root / "fleet.ini"]
    if kind == "ini-no-extension":
        write(root, {"hosts": INI_FLEET})
        return [root / "hosts"], [root / "hosts"]
    if kind == "yaml-as-json":
        write(root, {"fleet.json": yaml_as_json(YAML_FLEET)})
        return [root / "fleet.json"], [root / "fleet.json"]
    if kind in ("script", "saved-json"):
        write(root, {"fleet.py": SCRIPT, "saved.json": json.dumps(SCRIPT_DATA, indent=1)})
        make_executable(root / "fleet.py")
        ours = root / ("fleet.py" if kind == "script" else "saved.json")
        return [ours], [root / "fleet.py"]
    if kind == "folder":
        # The YAML fleet split over two files, plus what Ansible skips in a folder.
        head, rest = YAML_FLEET.split("  children:\n", 1)
        write(
            root,
            {
                "10-head.yml": head.replace("  hosts:\n    head:", "  hosts:\n    head:"),
                "20-gpus.yml": "all:\n  children:\n" + rest,
                "README.md": "[not]\nan inventory\n",
                "old.bak": "[nope]\nghost\n",
                ".hidden.ini": "[nope]\nghost\n",
            },
        )
        return [root], [root]
    if kind == "several":
        head, rest = YAML_FLEET.split("  children:\n", 1)
        write(
            root,
            {
                "a/base.yml": head,
                "b/gpus.yml": "all:\n  children:\n" + rest,
                "b/group_vars/rtx.yml": "sm: 122\nfrom_b: true\n",
            },
        )
        # group_vars/ and host_vars/ of the fleet sit beside a/.
        for rel in VARS_FILES:
            target = root / "a" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / rel, target)
        return [root / "a" / "base.yml", root / "b" / "gpus.yml"], [
            root / "a" / "base.yml",
            root / "b" / "gpus.yml",
        ]
    raise AssertionError(kind)


def inventory_args(sources: list[Path]) -> list[str]:
    """`-i SOURCE` for each source, in order (the same options for Ansible and deployctl)."""
    return [word for source in sources for word in ("-i", str(source))]


def ansible_inventory(sources: list[Path]) -> dict[str, Any]:
    argv = [str(BIN / "ansible-inventory"), "--list", *inventory_args(sources)]
    done = run_tool(argv, env=ANSIBLE_ENV, check=True)
    return json.loads(done.stdout)


def ansible_debug(sources: list[Path], names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """What `ansible all -m debug` prints for the named variables, per host (rendered on the
    controller; nothing connects)."""
    fields = ", ".join(f"'{n}': ({n} if {n} is defined else '{UNDEFINED}')" for n in names)
    argv = [
        str(BIN / "ansible"),
        "all",
        "-o",
        "-m",
        "debug",
        "-a",
        f"msg={{{{ {{{fields}}} }}}}",
        *inventory_args(sources),
    ]
    done = run_tool(argv, env=ANSIBLE_ENV, check=True)
    rendered = {}
    for line in done.stdout.splitlines():  # `host | SUCCESS => {...}`, one line per host
        host, _, rest = line.partition(" | SUCCESS => ")
        if rest:
            msg = json.loads(rest)["msg"]
            rendered[host] = {k: v for k, v in msg.items() if v != UNDEFINED}
    return rendered


def ansible_hosts(sources: list[Path], pattern: str) -> list[str]:
    """What `ansible PATTERN --list-hosts` lists, in its order."""
    argv = [str(BIN / "ansible"), pattern, "--list-hosts", *inventory_args(sources)]
    listed = run_tool(argv, check=True).stdout
    return [line.strip() for line in listed.splitlines()[1:]]


def ansible_refuses(path: Path) -> str:
    """What ansible-inventory says refusing a source (it must refuse it)."""
    strict = {**ANSIBLE_ENV, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True"}
    theirs = run_tool(
        [str(BIN / "ansible-inventory"), "--list", "-i", str(path)], env=strict, check=False
    )
    assert theirs.returncode != 0, theirs.stdout
    return theirs.stderr


def deployctl_hosts(cli: CLI, sources: list[Path], *extra: str) -> dict[str, Any]:
    result = cli("hosts", "--json", *inventory_args(sources), *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["hosts"]


KINDS = [
    "yaml",
    "ini",
    "ini-no-extension",
    "yaml-as-json",
    "saved-json",
    "script",
    "folder",
    "several",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.heavy
def test_hosts_agree_with_ansible_inventory(tmp_path: Path, cli: CLI, kind: str) -> None:
    ours_sources, their_sources = fleet_sources(tmp_path, kind)
    theirs = ansible_inventory(their_sources)["_meta"]["hostvars"]
    ours = deployctl_hosts(cli, ours_sources)
    assert list(ours) == ansible_hosts(their_sources, "all")
    rendered = ansible_debug(their_sources, TEMPLATED)
    for host, their_vars in theirs.items():
        mine = ours[host]
        assert mine["address"] == their_vars.get("ansible_host", host), host
        assert mine["port"] == their_vars.get("ansible_port", 22), host
        assert mine["user"] == their_vars.get("ansible_user"), host
        expected = {**DEFAULT_VARS, **their_vars, **rendered[host]}
        assert mine["vars"] == expected, host


def test_templated_variables_are_resolved_not_shown_raw(tmp_path: Path, cli: CLI) -> None:
    sources, _ = fleet_sources(tmp_path, "yaml")
    ours = deployctl_hosts(cli, sources)
    a01, rtx = ours["h200-a01"]["vars"], ours["rtx-bc"]["vars"]
    # host_vars/h200-a01.yml's model beats h200's; the chain goes through model_path.
    assert a01["model_path"] == "/models/Qwen3"
    assert a01["served_name"] == "qwen3"
    assert a01["log_dir"] == "/nvme/logs"
    assert a01["gpus_total"] == 4 and rtx["gpus_total"] == 8  # one expression keeps its type
    assert rtx["log_dir"] == "/ssd/logs"


def test_graph_matches_ansible_inventory_graph(tmp_path: Path, cli: CLI) -> None:
    for kind in ("yaml", "ini", "folder"):
        root = tmp_path / kind
        ours_sources, their_sources = fleet_sources(root, kind)
        for group in ("all", "gpu"):
            argv = [
                str(BIN / "ansible-inventory"),
                "--graph",
                group,
                *inventory_args(their_sources),
            ]
            theirs = run_tool(argv, check=True).stdout
            args = ["hosts", "--graph", "-H", group, *inventory_args(ours_sources)]
            ours = cli(*args)
            assert ours.returncode == 0, ours.stderr
            assert ours.stdout == theirs, (kind, group)


PATTERNS = [
    "all",
    "rtx,head",
    "canary:h200",
    "gpu:!canary",
    "gpu:&canary",
    "!rtx-bb",
    "rtx-b*:head",
    "~h200-a0[12]",
    "h200_canary,rtx,h200",
]


def test_patterns_select_what_ansible_lists_in_its_order(tmp_path: Path) -> None:
    sources, _ = fleet_sources(tmp_path, "ini")
    inventory = load_inventory(sources)
    for pattern in PATTERNS:
        theirs = ansible_hosts(sources, pattern)
        assert [h.name for h in inventory.select(pattern)] == theirs, pattern


# ---- malformed input: refused as Ansible refuses it, in one line --------------------------

MALFORMED = [
    ("gpu[01:] x=1\n", "fleet.ini", "has no end"),
    ("gpu[a:5]\n", "fleet.ini", "mixes letters and numbers"),
    ("gpu[1:2:3:4]\n", "fleet.ini", "begin:end or begin:end:step"),
    ("gpu[01:100]\n", "fleet.ini", "same width"),
    ("gpu01:\n", "fleet.ini", "ending in ':' is not allowed"),
    ("[a:children]\nb\n[b:children]\na\n", "fleet.ini", "recursive dependency loop"),
    ("[a:children]\nnosuch\n", "fleet.ini", "includes undefined group 'nosuch'"),
    ("[nosuch:vars]\nx=1\n", "fleet.ini", "not valid for undefined group 'nosuch'"),
    ("[gpu:hosts:x]\nh1\n", "fleet.ini", "invalid section entry"),
    ("[gpu:wat]\nh1\n", "fleet.ini", "unknown type 'wat'"),
    ("[gpu]\nh1 novalue\n", "fleet.ini", "expected key=value"),
    ("all:\n  hosts:\n    gpu[01:]:\n", "fleet.yml", "has no end"),
    (
        "all:\n  children:\n    a:\n      children:\n        b:\n          children:\n            a:\n",
        "fleet.yml",
        "recursive dependency loop",
    ),
]


@pytest.mark.parametrize(("text", "name", "message"), MALFORMED)
def test_malformed_inventory_is_one_line_error_where_ansible_also_refuses(
    tmp_path: Path, cli: CLI, text: str, name: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = cli("hosts", "-i", str(path))
    assert result.returncode != 0
    assert message in result.stderr
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert "gpu[01:]" not in result.stdout  # never a host literally named so
    ansible_refuses(path)


# Where Ansible is silent, deployctl still refuses: a reversed numeric range gives Ansible no
# host at all, and YAML's `gpu01::` a host literally named `gpu01:`.
@pytest.mark.parametrize(
    ("text", "name", "message"),
    [
        ("gpu[05:01]\n", "fleet.ini", "host range 'gpu[05:01]' is reversed"),
        ("all:\n  hosts:\n    gpu01::\n", "fleet.yml", "ending in ':' is not allowed"),
    ],
)
def test_what_ansible_silently_misreads_is_refused(
    tmp_path: Path, cli: CLI, text: str, name: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = cli("hosts", "-i", str(path))
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_ini_values_are_typed_as_ansible_types_them(tmp_path: Path) -> None:
    path = tmp_path / "fleet.ini"
    path.write_text(
        textwrap.dedent(
            """\
            [gpu]
            h1 n=8 f=1.5 b=True t=true s="two words" q='8' l="[1, 'a']" d="{'k': 1}" e=
            [gpu:vars]
            v=23
            w=FALSE
            spaced = a value with spaces
            """
        ),
        encoding="utf-8",
    )
    theirs = ansible_inventory([path])["_meta"]["hostvars"]["h1"]
    ours = load_inventory(path).hosts["h1"].vars
    assert {k: ours[k] for k in theirs} == theirs
    assert theirs["n"] == 8 and theirs["t"] == "true" and theirs["l"] == [1, "a"]


# ---- dynamic sources and vault ------------------------------------------------------------


@pytest.mark.heavy
def test_plugin_config_is_resolved_by_ansible_inventory(tmp_path: Path, cli: CLI) -> None:
    config = tmp_path / "generated.yml"
    config.write_text(
        textwrap.dedent(
            """\
            plugin: ansible.builtin.generator
            hosts:
              name: "{{ role }}-{{ n }}"
              parents:
                - name: "{{ role }}"
            layers:
              role: [h200, rtx]
              n: ["01", "02"]
            """
        ),
        encoding="utf-8",
    )
    ours = deployctl_hosts(cli, [config])
    assert list(ours) == ansible_hosts([config], "all")
    assert sorted(ours) == ["h200-01", "h200-02", "rtx-01", "rtx-02"]
    graph = cli("hosts", "--graph", "-H", "rtx", "-i", str(config))
    assert graph.stdout.splitlines() == ["@rtx:", "  |--rtx-01", "  |--rtx-02"]


def test_dynamic_source_without_ansible_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, {"fleet.py": SCRIPT})
    make_executable(tmp_path / "fleet.py")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-venv" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(Exception) as info:
        load_inventory(tmp_path / "fleet.py")
    assert "pip install 'deployctl[ansible]'" in str(info.value)
    assert "fleet.py" in str(info.value)


def encrypt(value: str, password_file: Path) -> str:
    done = run_tool(
        [str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file",
         str(password_file), value, "--name", "x"],
        check=True,
    )  # fmt: skip
    return done.stdout.split("x: ", 1)[1]


@pytest.mark.heavy
def test_vaulted_values_are_decrypted_with_ansibles_options(tmp_path: Path, cli: CLI) -> None:
    password = tmp_path / "vault-pass"
    password.write_text("correct horse\n", encoding="utf-8")
    encrypted_file = tmp_path / "group_vars" / "rtx.yml"
    write(
        tmp_path,
        {
            "fleet.ini": "[gpu]\nh1\n[rtx]\nr1\n",
            "group_vars/gpu.yml": f"model_revision: {encrypt('rev-42', password)}\nplain: 1\n"
            'extra_args: ["--revision={{ model_revision }}"]\n',
            "group_vars/rtx.yml": "served_name: kimi\n",
        },
    )
    run_tool(
        [str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(password),
         str(encrypted_file)],
        check=True,
    )  # fmt: skip
    assert encrypted_file.read_text().startswith("$ANSIBLE_VAULT")
    inventory = str(tmp_path / "fleet.ini")
    vault = VaultOptions(password_files=(str(password),))
    decrypted = load_inventory(Path(inventory), vault).hosts
    assert decrypted["h1"].vars["model_revision"] == "rev-42"
    assert decrypted["r1"].vars["served_name"] == "kimi"
    # Shown, a vaulted value is masked whatever its name; the rest is not.
    ours = deployctl_hosts(cli, [Path(inventory)], "--vault-password-file", str(password))
    assert ours["h1"]["vars"]["model_revision"] == MASK
    assert ours["r1"]["vars"]["served_name"] == MASK
    assert ours["h1"]["vars"]["plain"] == 1
    assert decrypted["h1"].vars["extra_args"] == ["--revision=rev-42"]  # a template used it
    rendered = cli("render", "-i", inventory, "-H", "h1", "--set", "model_path=/m",
                   "--vault-password-file", str(password))  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    assert f"--revision={MASK}" in rendered.stdout and "rev-42" not in rendered.stdout
    refused = cli("hosts", "-i", inventory)
    assert refused.returncode != 0
    assert "vault" in refused.stderr and "--vault-password-file" in refused.stderr
    wrong = tmp_path / "wrong-pass"
    wrong.write_text("nope\n", encoding="utf-8")
    failed = cli("hosts", "-i", inventory, "--vault-password-file", str(wrong))
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert len(failed.stderr.strip().splitlines()) <= 2, failed.stderr


# ---- templated variables: errors ----------------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"a": "{{ b }}", "b": "{{ a }}"},
            "host h1: variable a has a reference cycle: a -> b -> a",
        ),
        ({"a": "{{ nosuch }}/x"}, "host h1: variable a: 'nosuch' is undefined"),
        ({"a": "{{ b"}, "host h1: variable a:"),
    ],
)
def test_template_cycle_or_undefined_is_an_error_naming_host_and_variable(
    tmp_path: Path, cli: CLI, variables: dict[str, str], message: str
) -> None:
    path = tmp_path / "fleet.yml"
    path.write_text(json.dumps({"all": {"hosts": {"h1": variables, "h2": {}}}}), encoding="utf-8")
    result = cli("hosts", "-i", str(path), "-H", "h1")
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert cli("hosts", "-i", str(path), "-H", "h2").returncode == 0  # only h1 is broken


def test_help_imports_no_ansible_and_no_inventory_reader() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "deployctl", "--help"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()}
    assert "deployctl.cli" in imported
    assert not {m for m in imported if m.split(".")[0] == "ansible"}
    assert "deployctl.inventory_sources" not in imported and "jinja2" not in imported


# ---- corners, each checked against the real Ansible ----------------------------------------


def agree(cli: CLI, root: Path, files: dict[str, str], sources: list[str], names=()) -> None:
    """deployctl's hosts and variables (templated `names` rendered) equal Ansible's."""
    write(root, files)
    for rel in files:
        if rel.endswith(".py"):
            make_executable(root / rel)
    paths = [root / s for s in sources]
    theirs = ansible_inventory(paths)["_meta"]["hostvars"]
    ours = deployctl_hosts(cli, paths)
    assert list(ours) == ansible_hosts(paths, "all")
    rendered = ansible_debug(paths, tuple(names)) if names else {}
    for host in ours:
        expected = {**DEFAULT_VARS, **theirs.get(host, {}), **rendered.get(host, {})}
        assert ours[host]["vars"] == expected, host


CORNERS = {
    "group_vars of several sources, source by source": (
        {
            "a/inv.ini": "[parent:children]\nchild\n[child]\nh1\n",
            "b/inv.ini": "[parent]\nh1\n",
            "a/group_vars/child.yml": "v: a_child\n",
            "b/group_vars/parent.yml": "v: b_parent\n",
        },
        ["a/inv.ini", "b/inv.ini"],
        (),
    ),
    "only the first vars file of a name": (
        {
            "inv.ini": "[web]\nh1\n",
            "group_vars/web/x.yml": "a: folder\n",
            "group_vars/web.yml": "a: yml\n",
            "group_vars/web.json": '{"a": "json", "b": 1}\n',
            "host_vars/h1.yml": "h: yml\n",
            "host_vars/h1.yaml": "h: yaml\n",
        },
        ["inv.ini"],
        (),
    ),
    "a script's group vars keep their precedence": (
        {
            "dyn.py": f"#!{sys.executable}\nimport json\nprint(json.dumps("
            '{"a": {"hosts": ["h1"], "vars": {"v": "a"}}}))\n',
            "st.ini": "[z]\nh1\n[z:vars]\nv=z\n",
        },
        ["dyn.py", "st.ini"],
        (),
    ),
    "a host entry's port yields to its own ansible_port and counts only first": (
        {"inv.ini": "[a]\nh1:2222 ansible_port=22\nh2\n[b]\nh2:3333\n"},
        ["inv.ini"],
        (),
    ),
    "magic variables: inventory_dir, inventory_file, hostvars": (
        {
            "inv.ini": "[g]\nh1 flag=1\nh2 key_file='{{ inventory_dir }}/keys/id' "
            "f='{{ inventory_file | basename }}' other=\"{{ hostvars['h1']['flag'] }}\"\n"
        },
        ["inv.ini"],
        ("key_file", "f", "other"),
    ),
    "inventory variables before Jinja's globals": (
        {
            "inv.yml": "all:\n  hosts:\n    h1:\n      namespace: prod\n      range: 5\n"
            '      ns: "{{ namespace }}-x"\n      r: "{{ range }}"\n'
        },
        ["inv.yml"],
        ("ns", "r"),
    ),
    "constant templates keep their types": (
        {
            "inv.yml": "all:\n  hosts:\n    h1:\n"
            "      i: '{{ 5 }}'\n      t: '{{ true }}'\n      n: \"{{ '5' | int }}\"\n"
            "      l: '{{ [1, 2] }}'\n      d: \"{{ {'a': 1} }}\"\n      z: \"{{ '007' }}\"\n"
            "      b: \"{{ 'off' | bool }}\"\n"
        },
        ["inv.yml"],
        ("i", "t", "n", "l", "d", "z", "b"),
    ),
    "group priority is not a variable": (
        {"inv.ini": "[a]\nh1\n[b]\nh1\n[a:vars]\nv=a\nansible_group_priority=10\n[b:vars]\nv=b\n"},
        ["inv.ini"],
        (),
    ),
}


@pytest.mark.parametrize("case", list(CORNERS))
@pytest.mark.heavy
def test_corner_agrees_with_ansible(tmp_path: Path, cli: CLI, case: str) -> None:
    files, sources, names = CORNERS[case]
    agree(cli, tmp_path, files, sources, names)


def test_comma_host_list_is_an_inventory(cli: CLI) -> None:
    ours = deployctl_hosts(cli, [Path("h1,h2:2222")])
    assert list(ours) == ["h1", "h2"] and ours["h2"]["port"] == 2222


@pytest.mark.parametrize("pattern", ["h200[0]", "h200[-1]", "h200[1:]", "h200[0:1]", "gpu[2:3]"])
def test_pattern_subscripts_select_as_ansible_does(tmp_path: Path, pattern: str) -> None:
    sources, _ = fleet_sources(tmp_path, "ini")
    inventory = load_inventory(sources)
    assert [h.name for h in inventory.select(pattern)] == ansible_hosts(sources, pattern)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"x": "{{ nope }}"}, "variable x: 'nope' is undefined"),
        ({"y": {}, "x": "{{ y.z }}"}, "variable x: 'dict object' has no attribute 'z'"),
        ({"p": "{{ nope }}", "ansible_port": "{{ p }}"}, "'nope' is undefined"),
        ({"x": "{{ 'a' | regex_replace('(') }}"}, "variable x: missing )"),
    ],
)
def test_template_errors_are_one_line_errors(
    tmp_path: Path, cli: CLI, variables: dict[str, Any], message: str
) -> None:
    path = tmp_path / "inv.yml"
    path.write_text(json.dumps({"all": {"hosts": {"h1": variables}}}), encoding="utf-8")
    result = cli("hosts", "-i", str(path))
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and "internal error" not in result.stderr


def test_unhashable_yaml_key_is_a_one_line_error(tmp_path: Path, cli: CLI) -> None:
    path = tmp_path / "inv.yml"
    path.write_text("all:\n  hosts:\n    ? [a, b]\n    : 1\n", encoding="utf-8")
    result = cli("hosts", "-i", str(path))
    assert result.returncode == 1 and "a key must be text, not list" in result.stderr
    assert f"{path}: line 3" in result.stderr


def test_a_secret_inside_a_templated_value_is_masked(tmp_path: Path, cli: CLI) -> None:
    path = tmp_path / "inv.yml"
    path.write_text(
        "all:\n  hosts:\n    h1:\n      db_password: hunter22\n"
        '      url: "https://u:{{ db_password }}@db"\n',
        encoding="utf-8",
    )
    shown = deployctl_hosts(cli, [path])["h1"]["vars"]
    assert shown["url"] == f"https://u:{MASK}@db"
    assert "hunter22" not in json.dumps(shown)


def test_vault_errors_name_the_file(tmp_path: Path, cli: CLI) -> None:
    password = tmp_path / "pass"
    password.write_text("pw\n", encoding="utf-8")
    write(
        tmp_path, {"inv.ini": "[g]\nh1\n", "group_vars/g.yml": f"x: {encrypt('s3cret', password)}"}
    )
    result = cli("hosts", "-i", str(tmp_path / "inv.ini"))
    assert result.returncode == 1 and str(tmp_path / "group_vars" / "g.yml") in result.stderr


def vault_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The ansible-vault command lines deployctl runs from now on (each still runs)."""
    runs: list[list[str]] = []
    real = subprocess.run

    def run(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        if Path(argv[0]).name == "ansible-vault":
            runs.append(argv)
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(inventory_sources.subprocess, "run", run)
    return runs


@pytest.mark.heavy
def test_encrypted_files_and_values_are_decrypted_in_one_ansible_vault_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = tmp_path / "pass"
    password.write_text("pw\n", encoding="utf-8")
    write(
        tmp_path,
        {
            "inv.yml": f"all:\n  hosts:\n    h1:\n      a: {encrypt('from-inline', password)}",
            "group_vars/all.yml": f"b: {encrypt('from-a-file', password)}",
            "host_vars/h1.yml": "c: from-a-vaulted-file\n",
            "host_vars/h2.yml": "d: of-no-host\n",
        },
    )
    for name in ("h1", "h2"):
        run_tool(
            [str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(password),
             str(tmp_path / "host_vars" / f"{name}.yml")],
            check=True,
        )  # fmt: skip
    runs = vault_runs(monkeypatch)
    vault = VaultOptions(password_files=(str(password),))
    found = load_inventory(tmp_path / "inv.yml", vault).hosts["h1"].vars
    assert (found["a"], found["b"], found["c"]) == (
        "from-inline",
        "from-a-file",
        "from-a-vaulted-file",
    )
    assert len(runs) == 1, runs
    assert len(runs[0]) == 2 + len(vault.argv()) + 3  # the two values and h1's file, not h2's


@pytest.mark.heavy
def test_a_value_no_host_ends_with_needs_no_password_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, other = tmp_path / "pass", tmp_path / "other-pass"
    ours.write_text("pw\n", encoding="utf-8")
    other.write_text("another\n", encoding="utf-8")
    write(
        tmp_path,
        {
            # h1's own x wins over its group's, which only the other password decrypts.
            "inv.ini": "[g]\nh1\n",
            "group_vars/g.yml": f"x: {encrypt('unused', other)}",
            "host_vars/h1.yml": "x: used\n",
        },
    )
    run_tool(
        [str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(ours),
         str(tmp_path / "host_vars" / "h1.yml")],
        check=True,
    )  # fmt: skip
    vault = VaultOptions(password_files=(str(ours),))
    assert load_inventory(tmp_path / "inv.ini", vault).hosts["h1"].vars["x"] == "used"


def test_graph_json_is_the_subtree_each_group_once(tmp_path: Path, cli: CLI) -> None:
    sources, _ = fleet_sources(tmp_path, "yaml")
    result = cli("hosts", "--graph", "--json", "-H", "gpu", *inventory_args(sources))
    groups = json.loads(result.stdout)["groups"]
    assert list(groups) == ["gpu", "h200", "h200_canary", "rtx"]
    assert groups["h200"] == {
        "children": ["h200_canary"],
        "hosts": ["h200-a01", "h200-a02", "h200-a03", "h200-b01"],
    }
    unknown = cli("hosts", "--graph", "--json", "-H", "nope", *inventory_args(sources))
    assert unknown.returncode == 1 and "no group named 'nope'" in unknown.stderr


FOREIGN = """\
all:
  vars:
    env: prod
  hosts:
    shared1:
      port: web
      template: nginx.conf.j2
      model_path: /m
    shared2:
      port: web
      model_path: /m
    gpu1:
      model_path: /m
      deployctl_env: {NCCL_DEBUG: INFO}
      deployctl_port: 31000
"""


def test_an_inventory_with_its_own_env_port_and_template_loads_as_ansible_reads_it(
    tmp_path: Path, cli: CLI
) -> None:
    (cli.cwd / "inv.yml").write_text(FOREIGN, encoding="utf-8")
    theirs = ansible_inventory([cli.cwd / "inv.yml"])["_meta"]["hostvars"]
    result = cli("hosts", "--json", "-i", "inv.yml")
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout)["hosts"]
    assert list(ours) == ["shared1", "shared2", "gpu1"]
    for host in ours:
        assert ours[host]["vars"] == {**DEFAULT_VARS, **theirs[host]}, host
    assert theirs["shared1"]["env"] == "prod" and theirs["shared1"]["port"] == "web"
    # One warning per host and variable, naming deployctl's own spelling; gpu1 sets it.
    warned = [line.split(": warning: ")[0:2] for line in result.stderr.splitlines()]
    assert [(h, text.split("'")[1]) for h, text in warned] == [
        ("shared1", "port"), ("shared1", "env"), ("shared2", "port"), ("shared2", "env")
    ]  # fmt: skip
    assert all(f"until deployctl_{text.split(chr(39))[1]} is set" in text for _, text in warned)

    # A template name is a string, so deployctl's: render says it is unknown, and how to
    # keep it for yourself.
    template = cli("render", "-i", "inv.yml", "-H", "shared1")
    assert template.returncode == 1
    assert "shared1: error: unknown template 'nginx.conf.j2'" in template.stderr
    hint = next(line for line in template.stderr.splitlines() if ": hint: " in line)
    assert "set deployctl_template for deployctl's" in hint
    # A port that is no number is the user's: render will not put the default in its place.
    port = cli("render", "-i", "inv.yml", "-H", "shared2")
    assert port.returncode == 1
    assert (
        "shared2: error: host shared2: port 'web' is not a port number (1-65535), so it is "
        "not deployctl's port"
    ) in port.stderr
    assert "set deployctl_port for deployctl's" in port.stderr
    # deployctl's own spelling is what it serves from.
    served = cli("render", "-i", "inv.yml", "-H", "gpu1")
    assert served.returncode == 0, served.stderr
    assert "--port=31000" in served.stdout and "\nNCCL_DEBUG=INFO\n" in served.stdout
