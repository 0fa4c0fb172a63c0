"""Reading inventory sources: malformed host lines and ranges refused where they are (file and
line), dynamic sources' own errors and time limit, and what a folder inventory skips; the real
`ansible-inventory` is the oracle where it has an answer."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests import cli_server
from tests.conftest import CLI
from tests.test_inventory_ansible import ansible_hosts, ansible_refuses, make_executable

# `[` with no `]` after it: Ansible refuses it (its range split finds no end); it is no host.
UNCLOSED = [
    ("[g\nh1\n", "fleet.ini", 1, "[g"),
    ("weird[x\n", "fleet.ini", 1, "weird[x"),
    ("[g]\nh1\n\nweird[x ansible_port=22\n", "fleet.ini", 4, "weird[x"),
    ("[g]\nh1\nh[1:2\n", "fleet.ini", 3, "h[1:2"),
    ("[g]\na]b[1:2]\n", "fleet.ini", 2, "a]b[1:2]"),
    ("all:\n  hosts:\n    weird[x:\n", "fleet.yml", None, "weird[x"),
]


@pytest.mark.parametrize(("text", "name", "line", "pattern"), UNCLOSED)
def test_a_malformed_host_pattern_is_refused_naming_file_and_line(
    tmp_path: Path, cli: CLI, text: str, name: str, line: int | None, pattern: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = cli("hosts", "--json", "-i", str(path))
    assert result.returncode == 1, result.stdout
    where = f"{path}:{line}:" if line else f"{path}:"
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: {where}") and repr(pattern) in first, first
    assert "Traceback" not in result.stderr
    ansible_refuses(path)


def test_a_bracket_ansible_takes_as_part_of_a_name_is_a_name(tmp_path: Path, cli: CLI) -> None:
    path = tmp_path / "fleet.ini"
    path.write_text("[g]\nh1]\n", encoding="utf-8")  # no `[`: Ansible reads a host `h1]`
    result = cli("hosts", "--json", "-i", str(path))
    assert result.returncode == 0, result.stderr
    assert list(json.loads(result.stdout)["hosts"]) == ["h1]"]


@pytest.mark.parametrize(
    ("text", "name", "where", "pattern"),
    [
        ("[g]\nh[0:99999999]\n", "fleet.ini", ":2:", "h[0:99999999]"),
        (
            "h[0:99999999999999999999999999]\n",
            "fleet.ini",
            ":1:",
            "h[0:99999999999999999999999999]",
        ),
        ("[g]\nr[1:1000]-n[1:1000]\n", "fleet.ini", ":2:", "r[1:1000]-n[1:1000]"),
        ("all:\n  hosts:\n    h[0:99999999]:\n", "fleet.yml", ":", "h[0:99999999]"),
    ],
)
def test_a_huge_host_range_is_refused_before_it_is_expanded(
    tmp_path: Path, cli: CLI, text: str, name: str, where: str, pattern: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    before = cli_server.spent_cpu_seconds()
    # Refusing takes a second of CPU; a loaded machine (load 32) stretched it past 30 s of wall.
    result = cli("hosts", "-i", str(path), timeout=120)
    # CPU time, not wall time: on a loaded machine (xdist workers) the wait is longer, but
    # expanding the range would cost minutes of CPU.
    cpu = cli_server.spent_cpu_seconds() - before
    assert 0 < cpu < 10, f"took {cpu:.2f} CPU-s, bound 10 s"
    assert result.returncode == 1
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: {path}{where}") and repr(pattern) in first, first
    assert "more than 100000" in first, first


def test_a_host_range_under_the_cap_expands(tmp_path: Path, cli: CLI) -> None:
    path = tmp_path / "fleet.ini"
    path.write_text("[g]\nr[1:20]-n[01:50]\n", encoding="utf-8")
    result = cli("hosts", "--json", "-i", str(path))
    assert result.returncode == 0, result.stderr
    hosts = list(json.loads(result.stdout)["hosts"])
    assert len(hosts) == 1000 and hosts[:2] == ["r1-n01", "r1-n02"] and hosts[-1] == "r20-n50"


SCRIPTS = {
    "not JSON": ('echo "this is not json"', "Value could not be parsed as JSON"),
    "a wrong shape": ('echo \'{"g": {"hosts": 5}}\'', "'g.hosts' which is 'int' instead of 'list'"),
    "a failure": ("echo broken >&2; exit 3", "non-zero exit code 3"),
}


@pytest.mark.parametrize("case", list(SCRIPTS))
@pytest.mark.heavy
def test_a_dynamic_script_that_fails_shows_ansibles_message(
    tmp_path: Path, cli: CLI, case: str
) -> None:
    body, message = SCRIPTS[case]
    script = tmp_path / "fleet.sh"
    script.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    make_executable(script)
    assert message in ansible_refuses(script)
    result = cli("hosts", "-i", str(script))
    assert result.returncode == 1, result.stdout
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"error: ansible-inventory -i {script} failed: "), lines
    assert message in lines[0] and "defines no hosts" not in result.stderr, lines
    assert len(lines) <= 2, lines


@pytest.mark.heavy
def test_a_plugin_config_that_fails_shows_ansibles_message(tmp_path: Path, cli: CLI) -> None:
    config = tmp_path / "fleet.yml"
    config.write_text("plugin: nosuch_plugin\n", encoding="utf-8")
    result = cli("hosts", "-i", str(config))
    assert result.returncode == 1
    assert "specifies unknown plugin 'nosuch_plugin'" in result.stderr.splitlines()[0]


@pytest.mark.heavy
def test_a_hanging_script_stops_after_the_timeout_users_set(tmp_path: Path, cli: CLI) -> None:
    script = tmp_path / "fleet.py"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n", encoding="utf-8")
    make_executable(script)
    started = time.monotonic()
    result = cli("hosts", "-i", str(script), env={"DEPLOYCTL_INVENTORY_TIMEOUT": "2"})
    took = time.monotonic() - started
    assert took < 20, f"took {took:.2f}s, bound 20s (timeout 2 s)"
    assert result.returncode == 1
    assert f"ansible-inventory -i {script}: no answer in 2s" in result.stderr, result.stderr
    assert "DEPLOYCTL_INVENTORY_TIMEOUT" in result.stderr  # the hint says how to wait longer


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf", ""])
def test_a_bad_inventory_timeout_is_a_one_line_error(tmp_path: Path, cli: CLI, value: str) -> None:
    script = tmp_path / "fleet.sh"
    script.write_text("#!/bin/sh\necho '{}'\n", encoding="utf-8")
    make_executable(script)
    result = cli("hosts", "-i", str(script), env={"DEPLOYCTL_INVENTORY_TIMEOUT": value})
    assert result.returncode == 1, result.stderr
    assert "DEPLOYCTL_INVENTORY_TIMEOUT" in result.stderr.splitlines()[0]


def test_an_editor_backup_in_a_folder_inventory_is_skipped(tmp_path: Path, cli: CLI) -> None:
    folder = tmp_path / "inventory"
    folder.mkdir()
    (folder / "fleet.ini").write_text("[g]\nh1\n", encoding="utf-8")
    (folder / "fleet.ini~").write_text("[g]\nghost\n", encoding="utf-8")
    (folder / "more.yml~").write_text("all:\n  hosts:\n    ghost2:\n", encoding="utf-8")
    assert ansible_hosts([folder], "all") == ["h1"]
    result = cli("hosts", "--json", "-i", str(folder))
    assert result.returncode == 0, result.stderr
    assert list(json.loads(result.stdout)["hosts"]) == ["h1"]
