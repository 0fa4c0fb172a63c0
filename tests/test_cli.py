"""The command line as scripts meet it: with --json, a command that fails as a whole still
prints one JSON document (ok false, error, code, hint), and says why on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import CLI


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yml"
    hosts = {"h1": {"ansible_host": "127.0.0.9", "deployments": {"a": {"gpus": [0]}}}}
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


@pytest.mark.parametrize(
    ("args", "code", "exit_code"),
    [
        (["hosts", "-i", "{missing}"], "inventory", 1),
        (["render", "-i", "{inv}", "-H", "nope"], "inventory", 1),
        (["render", "-i", "{inv}", "-d", "nope"], "usage", 1),
        (["status", "-i", "{inv}", "--forks", "1", "-H", ""], "inventory", 1),
        (["crash", "--run", "r", "--path", "p"], "usage", 2),
    ],
    ids=["missing-inventory", "bad-pattern", "unknown-deployment", "empty-pattern", "usage"],
)
def test_a_command_that_fails_as_a_whole_prints_one_json_document(
    cli: CLI, inventory: Path, tmp_path: Path, args: list[str], code: str, exit_code: int
) -> None:
    filled = [a.format(inv=inventory, missing=tmp_path / "missing.yml") for a in args]
    result = cli(*filled, "--json")
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["code"] == code, document
    assert document["error"] and "hint" in document
    assert result.returncode == exit_code
    assert result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr


def test_command_lines_run_in_turn_in_one_process_build_the_commands_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import typer.main

    from deployctl.cli import run, session

    built: list[object] = []
    real = typer.main.get_command
    monkeypatch.setattr(typer.main, "get_command", lambda app: built.append(app) or real(app))
    session.command_tree.cache_clear()
    try:
        assert run(["--version"]) == 0
        assert run(["hosts", "--no-such-option"]) == 2  # a usage error, from the same commands
        assert "No such option" in capsys.readouterr().err
    finally:
        session.command_tree.cache_clear()
    assert built == [session.app]
