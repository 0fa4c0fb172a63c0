"""Shell completion, driven as each shell drives it: `_DEPLOYCTL_COMPLETE` and the words typed
so far in the environment of `python -m deployctl` (or of the console script's `main`).
Values come from files only: the inventory the line selects, the project's templates and
patch sets; nothing is run, and a completer that fails answers nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLI

REPO = Path(__file__).resolve().parent.parent
SHIPPED_TEMPLATES = ["baseline", "eagle3", "router"]
SHIPPED_SETS = ["sm120-support", "spec-disable"]

FLEET = """\
all:
  children:
    gpus:
      hosts:
        gpu01:
          deployments: {qwen: {gpus: [0]}, llama: {gpus: [1]}}
        gpu02:
    routers:
      hosts:
        r1:
      vars:
        deployctl_deployments: {edge: {}}
"""


def bash_env(line: str) -> dict[str, str]:
    """What the script of `--show-completion bash` sets: the words, and which is the cursor's
    (the last; an empty one when the line ends in a blank)."""
    words = line.split()
    cword = len(words) if line.endswith(" ") else len(words) - 1
    return {"_DEPLOYCTL_COMPLETE": "complete_bash", "COMP_WORDS": line, "COMP_CWORD": str(cword)}


def complete(cli: CLI, line: str, **env: str) -> list[str]:
    """The candidates bash is given for `line` (as typed, `deployctl` first)."""
    result = cli(env={**bash_env(line), **env})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no traceback, no warning in the user's shell
    return result.stdout.splitlines() if result.stdout.strip() else []


@pytest.fixture
def fleet(cli: CLI) -> Path:
    path = cli.cwd / "fleet.yml"
    path.write_text(FLEET)
    return path


def test_commands_and_option_names_complete(cli: CLI) -> None:
    commands = complete(cli, "deployctl ")
    assert {"hosts", "launch", "status", "patch", "router", "tune"} <= set(commands)
    assert complete(cli, "deployctl pat") == ["patch"]
    assert set(complete(cli, "deployctl patch ")) >= {"list", "apply", "revert", "port", "audit"}
    assert complete(cli, "deployctl launch --dep") == ["--deployment"]
    assert {"--install-completion", "--show-completion"} <= set(complete(cli, "deployctl --"))


def test_hosts_and_groups_come_from_the_yaml_inventory_given_with_i(cli: CLI, fleet: Path) -> None:
    found = complete(cli, f"deployctl launch -i {fleet} -H ")
    assert sorted(found) == ["all", "gpu01", "gpu02", "gpus", "r1", "routers", "ungrouped"]
    assert sorted(complete(cli, f"deployctl status -i {fleet} --hosts gp")) == [
        "gpu01", "gpu02", "gpus",
    ]  # fmt: skip


def test_hosts_and_groups_come_from_an_ini_inventory(cli: CLI) -> None:
    path = cli.cwd / "fleet.ini"
    path.write_text("[gpus]\ngpu[01:03] ansible_user=me\n\n[edge:children]\ngpus\n\n[solo]\nbox\n")
    found = complete(cli, f"deployctl hosts -i {path} -H ")
    assert sorted(found) == ["all", "box", "edge", "gpu01", "gpu02", "gpu03", "gpus", "solo", "ungrouped"]  # fmt: skip


def test_a_comma_list_completes_its_last_term_and_keeps_the_rest(cli: CLI, fleet: Path) -> None:
    assert sorted(complete(cli, f"deployctl hosts -i {fleet} -H gpu01,g")) == [
        "gpu01,gpu02", "gpu01,gpus",
    ]  # fmt: skip
    # An exclusion keeps its `!`; a term given already is not offered again.
    assert sorted(complete(cli, f"deployctl hosts -i {fleet} -H r1,all,!r")) == ["r1,all,!routers"]


def test_deployments_come_from_every_level_of_the_inventory(cli: CLI, fleet: Path) -> None:
    (cli.cwd / "group_vars").mkdir()
    (cli.cwd / "group_vars" / "gpus.yml").write_text("deployments: {big: {}}\n")
    (cli.cwd / "host_vars").mkdir()
    (cli.cwd / "host_vars" / "gpu02.yml").write_text("deployments: {small: {}}\n")
    # Encrypted as a whole: never decrypted, so it adds nothing (and fails nothing).
    (cli.cwd / "host_vars" / "r1.yml").write_text("$ANSIBLE_VAULT;1.1;AES256\n6162\n")
    found = complete(cli, f"deployctl status -i {fleet} -d ")
    assert sorted(found) == ["big", "edge", "llama", "qwen", "small"]
    assert complete(cli, f"deployctl stop -i {fleet} --deployment q") == ["qwen"]


def test_the_inventory_is_the_one_the_line_selects(cli: CLI, fleet: Path) -> None:
    other = cli.cwd / "other.yml"
    other.write_text("all:\n  hosts:\n    lonely:\n")
    env = {"DEPLOYCTL_INVENTORY": str(other)}
    assert complete(cli, "deployctl hosts -H lo", **env) == ["lonely"]
    assert complete(cli, f"deployctl hosts -i {fleet} -H r", **env) == ["r1", "routers"]
    assert complete(cli, "deployctl hosts -H ") == ["localhost", "all", "ungrouped"]  # built-in
    (cli.cwd / "inventories").mkdir()  # a project folder with a default inventory
    (cli.cwd / "inventories" / "default.yml").write_text("all:\n  hosts:\n    mine:\n")
    assert complete(cli, "deployctl hosts -H m") == ["mine"]


def test_templates_are_the_projects_then_the_shipped_ones(cli: CLI, tmp_path: Path) -> None:
    assert complete(cli, "deployctl launch --template ") == SHIPPED_TEMPLATES
    project = tmp_path / "project"
    (project / "templates").mkdir(parents=True)
    (project / "templates" / "mine.j2").write_text("python -m sglang.launch_server\n")
    line = f"deployctl render --project {project} -t "
    assert complete(cli, line) == ["mine", *SHIPPED_TEMPLATES]
    assert complete(cli, f"deployctl tune --project {project} --baseline-template m") == ["mine"]


def test_patch_sets_complete_where_a_command_takes_one(cli: CLI) -> None:
    (cli.cwd / "patches" / "mine").mkdir(parents=True)
    (cli.cwd / "patches" / "mine" / "patch.yml").write_text("name: mine\n")
    (cli.cwd / "patches" / "notes").mkdir()  # no patch.yml: no set
    assert complete(cli, "deployctl patch apply ") == ["mine", *SHIPPED_SETS]
    assert complete(cli, "deployctl patch revert mine s") == SHIPPED_SETS
    assert complete(cli, "deployctl patch port sp") == ["spec-disable"]
    assert complete(cli, "deployctl patch audit --expect m") == ["mine"]


@pytest.mark.parametrize("content", ["all: [\n", "all:\n  hosts: [1, 2\n", "\x00\xff"])
def test_a_broken_or_missing_inventory_gives_no_names_and_no_error(cli: CLI, content: str) -> None:
    path = cli.cwd / "broken.yml"
    path.write_bytes(content.encode("latin-1"))
    assert complete(cli, f"deployctl hosts -i {path} -H ") == []
    assert complete(cli, f"deployctl status -i {path} -d ") == []
    assert complete(cli, f"deployctl hosts -i {cli.cwd / 'missing.yml'} -H ") == []


def test_a_dynamic_inventory_is_never_run(cli: CLI, fleet: Path) -> None:
    marker = cli.cwd / "ran"
    script = cli.cwd / "dynamic.py"
    script.write_text(
        f"#!{sys.executable}\nimport json, pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        'print(json.dumps({"web": {"hosts": ["w1"]}, "_meta": {"hostvars": {}}}))\n'
    )
    script.chmod(0o755)
    assert complete(cli, f"deployctl hosts -i {script} -H ") == []
    assert complete(cli, f"deployctl status -i {script} -d ") == []
    # In a folder with static files, those still answer; the script still does not run.
    folder = cli.cwd / "mixed"
    folder.mkdir()
    (folder / "static.yml").write_text(FLEET)
    (folder / "zz.py").write_text(script.read_text())
    (folder / "zz.py").chmod(0o755)
    assert complete(cli, f"deployctl hosts -i {folder} -H gpu0") == ["gpu01", "gpu02"]
    assert not marker.exists()


def test_a_plugin_config_is_never_handed_to_ansible(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer._completion_classes import BashComplete
    from typer.main import get_command

    from deployctl import inventory_sources
    from deployctl.cli import app

    called: list[list[str]] = []
    monkeypatch.setattr(
        inventory_sources, "_run_ansible", lambda argv, *a, **k: called.append(argv)
    )
    plugin = tmp_path / "aws_ec2.yml"
    plugin.write_text("plugin: amazon.aws.aws_ec2\nregions: [us-east-1]\n")
    completer = BashComplete(get_command(app), {}, "deployctl", "_DEPLOYCTL_COMPLETE")
    items = completer.get_completions(["hosts", "-i", str(plugin), "-H"], "")
    assert items == [] and called == []


def test_a_completer_that_fails_answers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer._completion_classes import BashComplete
    from typer.main import get_command

    from deployctl import project
    from deployctl.cli import app

    def broken(*args: object) -> list[str]:
        raise RuntimeError("a bug")

    completer = BashComplete(get_command(app), {}, "deployctl", "_DEPLOYCTL_COMPLETE")
    assert [i.value for i in completer.get_completions(["launch", "-t"], "e")] == ["eagle3"]
    monkeypatch.setattr(project, "template_names", broken)
    assert completer.get_completions(["launch", "-t"], "e") == []


def test_zsh_and_fish_get_names_with_what_they_are(cli: CLI, fleet: Path) -> None:
    line = f"deployctl hosts -i {fleet} -H gp"
    zsh = cli(env={"_DEPLOYCTL_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": line})
    assert zsh.returncode == 0 and zsh.stderr == ""
    assert '"gpu01":"host"' in zsh.stdout and '"gpus":"group"' in zsh.stdout
    fish = cli(
        env={
            "_DEPLOYCTL_COMPLETE": "complete_fish",
            "_TYPER_COMPLETE_FISH_ACTION": "get-args",
            "_TYPER_COMPLETE_ARGS": line,
        }
    )
    assert fish.returncode == 0 and fish.stderr == ""
    assert sorted(fish.stdout.splitlines()) == ["gpu01\thost", "gpu02\thost", "gpus\tgroup"]


# typer's own switch: the shell is named, not found from this process's parents.
NAMED_SHELL = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_show_completion_prints_the_script_for_deployctl(cli: CLI, shell: str) -> None:
    result = cli("--show-completion", shell, env=NAMED_SHELL)
    assert result.returncode == 0, result.stderr
    assert "_DEPLOYCTL_COMPLETE=complete_" + shell in result.stdout
    assert "python" not in result.stdout  # named `deployctl`, even run as python -m deployctl


def test_the_console_scripts_entry_point_completes_too(fleet: Path) -> None:
    """`deployctl` runs `deployctl.cli:main`, which ends by os._exit: the answer still comes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPLOYCTL_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(bash_env(f"deployctl hosts -i {fleet} -H r"))
    done = subprocess.run(
        [sys.executable, "-c", "from deployctl.cli import main; main()"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout.split(), done.stderr) == (0, ["r1", "routers"], "")


def test_completing_reads_no_more_than_it_needs(fleet: Path) -> None:
    """Fast: no Ansible, no SSH, no Jinja, not the inventory's variable merging."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPLOYCTL_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(bash_env(f"deployctl status -i {fleet} -d "))
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "deployctl"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert sorted(done.stdout.split()) == ["edge", "llama", "qwen"]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()}
    heavy = {"paramiko", "jinja2", "ansible", "deployctl.inventory", "deployctl.patchset"}
    assert not {m for m in imported if m in heavy or m.split(".")[0] in heavy}


def test_installing_writes_the_shells_own_file(cli: CLI) -> None:
    result = cli("--install-completion", "bash", env=NAMED_SHELL)
    assert result.returncode == 0, result.stderr
    script = cli.home / ".bash_completions" / "deployctl.sh"
    assert "_DEPLOYCTL_COMPLETE=complete_bash" in script.read_text()
    assert f"source '{script}'" in (cli.home / ".bashrc").read_text()


def test_init_completes_the_names_of_the_users_ssh_config(cli: CLI) -> None:
    (cli.home / ".ssh").mkdir()
    config = "Host gpu-a gpu-b\n  User ops\nHost *.lab !bad\n  User x\nhost gpu-c\nMatch all\n"
    (cli.home / ".ssh" / "config").write_text(config)
    assert complete(cli, "deployctl init ") == ["gpu-a", "gpu-b", "gpu-c"]
    assert complete(cli, "deployctl init gpu-a gpu-") == ["gpu-a", "gpu-b", "gpu-c"]
    (cli.home / ".ssh" / "config").write_bytes(b"\xff\xfe")  # unreadable as text: nothing
    assert complete(cli, "deployctl init ") == []
