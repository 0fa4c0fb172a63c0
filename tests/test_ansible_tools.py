"""The recorded answers of Ansible's tools (tests/ansible_tools.py): one is given back only for
the same command on the same files, and a live run holds each to Ansible's own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import ansible_tools

TOOL = str(Path(ansible_tools.CHECKOUT) / ".venv" / "bin" / "ansible-inventory")


def a_fleet(folder: Path) -> list[str]:
    folder.mkdir()
    (folder / "fleet.ini").write_text("[gpu]\nh1\n", encoding="utf-8")
    (folder / "group_vars").mkdir()
    (folder / "group_vars" / "gpu.yml").write_text(f"root: {folder}\n", encoding="utf-8")
    return [TOOL, "--list", "-i", str(folder / "fleet.ini")]


def key(argv: list[str], **env: str) -> str:
    found = ansible_tools._recording_key(argv, env)
    assert found is not None, argv
    return found[0]


def test_the_same_command_on_the_same_files_has_one_key_in_any_tests_folder(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Two tests' folders (or one test's in two runs): each names its folder, in an argument
    # and in a file, and the key is the same.
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    first, second = a_fleet(one / "f"), a_fleet(two / "f")
    assert ansible_tools._recording_key(first, {}) == (key(first), str(one))
    assert key(first) == key(second)
    a_fleet(two / "g")  # more files in the folder
    assert key(second) != key(first)


def test_a_changed_byte_mode_file_or_ansible_setting_changes_the_key(tmp_path: Path) -> None:
    argv = a_fleet(tmp_path / "f")
    before = key(argv)
    assert key(argv, HOME="/elsewhere", PATH="/x") == before  # not Ansible's settings
    assert key(argv, ANSIBLE_INVENTORY_UNPARSED_FAILED="True") != before
    assert key([*argv, "--yaml"]) != before
    variables = tmp_path / "f" / "group_vars" / "gpu.yml"
    text = variables.read_text()
    variables.write_text(text.replace("root", "rooT"))
    assert key(argv) != before
    variables.write_text(text)
    assert key(argv) == before
    variables.chmod(0o755)
    assert key(argv) != before
    variables.chmod(0o644)
    (tmp_path / "f" / "host_vars").mkdir()  # an empty folder: Ansible reads its name
    assert key(argv) != before
    (tmp_path / "f" / "host_vars").rmdir()
    assert key(argv) == before


def test_the_venvs_python_in_a_script_is_a_placeholder(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An inventory script's #! line names the python that runs the tests: another checkout's,
    # or the same venv's as `python3`, on another machine.
    keys = []
    for python in ("/work/a/.venv/bin/python", "/srv/b/.venv/bin/python3"):
        folder = tmp_path_factory.mktemp("script")
        (folder / "fleet.py").write_text(f"#!{python}\nprint('{{}}')\n")
        monkeypatch.setitem(ansible_tools.PLACES, "<python>", python)
        keys.append(key([TOOL, "--list", "-i", str(folder / "fleet.py")]))
    assert keys[0] == keys[1]


def test_ansible_vault_and_a_command_naming_no_test_folder_always_run(tmp_path: Path) -> None:
    vault = [TOOL.replace("ansible-inventory", "ansible-vault"), "encrypt", str(tmp_path / "x")]
    assert ansible_tools._recording_key(vault, {}) is None
    assert ansible_tools._recording_key([TOOL, "--list", "-i", "/etc/ansible/hosts"], {}) is None


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[list[str], list[str]]:
    """A command with an answer recorded, and the commands that ran for real (a stand-in for
    Ansible's: what is tested here is what is done with its answers)."""
    argv = a_fleet(tmp_path / "f")
    answer = {"returncode": 0, "stdout": "in <test-folder>/f at <checkout>\n", "stderr": "w\n"}
    monkeypatch.setattr(ansible_tools, "_loaded", {key(argv): answer})
    monkeypatch.setattr(ansible_tools, "MODE", "replay")  # ./scripts/test runs in "live"
    monkeypatch.setattr(ansible_tools, "_answered", {})  # never written by a record run
    ran: list[str] = []

    def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        ran.append(Path(argv[-1]).name)
        stdout = f"in {tmp_path}/f at {ansible_tools.CHECKOUT}\n"
        return subprocess.CompletedProcess(argv, 0, stdout, "w\n")

    monkeypatch.setattr(ansible_tools, "_run", run)
    return argv, ran


def test_a_recorded_answer_is_replayed_with_this_tests_folder(
    recorded: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    argv, ran = recorded
    done = ansible_tools.run_tool(argv)
    assert done.stdout == f"in {tmp_path}/f at {ansible_tools.CHECKOUT}\n" and done.stderr == "w\n"
    assert ran == []
    with pytest.warns(
        UserWarning, match=r"no answer to .* is recorded for ansible-core .*: Ansible runs"
    ):
        ansible_tools.run_tool([*argv, "--yaml"])  # nothing recorded for it: it runs
    assert ran == ["--yaml"]


def test_a_live_run_fails_where_ansible_no_longer_answers_as_recorded(
    recorded: tuple[list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, ran = recorded
    monkeypatch.setattr(ansible_tools, "MODE", "live")
    assert ansible_tools.run_tool(argv).returncode == 0  # the same answer
    with pytest.raises(AssertionError, match=r"no answer to .* is recorded"):
        ansible_tools.run_tool([*argv, "--yaml"])
    (Path(argv[-1]).parent / "fleet.ini").write_text("[gpu]\nh2\n")  # another key
    ansible_tools._recordings()[key(argv)] = {"returncode": 0, "stdout": "old\n", "stderr": "w\n"}
    with pytest.raises(AssertionError, match="not the one recorded"):
        ansible_tools.run_tool(argv)
    assert ran == ["fleet.ini", "fleet.ini"]  # the one not recorded failed before it ran


@pytest.mark.parametrize(
    ("argv", "same"),
    [
        (["all", "--list-hosts"], False),  # the order is Ansible's answer
        (["all", "-o", "-m", "debug"], True),  # hosts answer in parallel
    ],
)
def test_only_an_ad_hoc_modules_lines_may_come_in_another_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], same: bool
) -> None:
    (tmp_path / "fleet.ini").write_text("h1\nh2\n")
    command = [
        TOOL.replace("ansible-inventory", "ansible"),
        *argv,
        "-i",
        str(tmp_path / "fleet.ini"),
    ]
    recorded = {"returncode": 0, "stdout": "h1 | x\nh2 | y\n", "stderr": ""}
    monkeypatch.setattr(ansible_tools, "_loaded", {key(command): recorded})
    monkeypatch.setattr(ansible_tools, "MODE", "live")
    monkeypatch.setattr(ansible_tools, "_answered", {})
    monkeypatch.setattr(
        ansible_tools,
        "_run",
        lambda argv, env: subprocess.CompletedProcess(argv, 0, "h2 | y\nh1 | x\n", ""),
    )
    if same:
        assert ansible_tools.run_tool(command).stdout == "h2 | y\nh1 | x\n"
    else:
        with pytest.raises(AssertionError, match="not the one recorded"):
            ansible_tools.run_tool(command)


def test_a_record_run_adds_its_answers_to_those_recorded(
    recorded: tuple[list[str], list[str]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    argv, ran = recorded
    file = tmp_path_factory.mktemp("recordings") / "runs.json"  # not in the test's folder
    file.write_text('{"of-another-test": {"returncode": 0, "stdout": "", "stderr": ""}}')
    monkeypatch.setattr(ansible_tools, "RECORDINGS", file)
    monkeypatch.setattr(ansible_tools, "MODE", "record")
    ansible_tools.run_tool(argv)  # recorded already: it runs again all the same
    assert ran == ["fleet.ini"]
    ansible_tools._write_recordings()
    written = json.loads(file.read_text())
    assert set(written) == {"of-another-test", key(argv)}
    assert written[key(argv)]["stdout"] == "in <test-folder>/f at <checkout>\n"
