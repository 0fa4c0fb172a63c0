"""A bug in deployctl is one line naming a debug file with the traceback, exit 2.

A bug cannot be had on purpose, so these tests plant one (an exception deployctl does not
expect) in an otherwise real run over the sshd test hosts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import CLI, FullDisk
from tests.sshd_hosts import REPO, SSHLab, sh

# Runs the real CLI after replacing MODULE:FUNCTION with one that raises for one host (its
# first argument's name), or for every call with "*".
PLANT = """
import importlib, sys
target, spec = sys.argv[1], sys.argv[2]
module_name, name = spec.split(":")
module = importlib.import_module(module_name)
real = getattr(module, name)
def planted(*args, **kwargs):
    if target == "*" or getattr(args[0], "name", None) == target:
        raise RuntimeError("planted bug")
    return real(*args, **kwargs)
setattr(module, name, planted)
sys.argv = ["deployctl", *sys.argv[3:]]
from deployctl.cli import main
main()
"""


def run_planted(
    cli: CLI, on_host: str, where: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run deployctl with a bug planted in `where` (MODULE:FUNCTION) for host `on_host`."""
    env = {
        "HOME": str(cli.home),
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
        "PATH": "/usr/bin:/bin",
        "TMPDIR": tempfile.gettempdir(),  # the fallback for tracebacks: the same as the test's
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-c", PLANT, on_host, where, *args],
        cwd=cli.cwd, env=env, text=True, capture_output=True, timeout=120,
    )  # fmt: skip


def debug_file(stderr: str) -> Path:
    match = re.search(r"the traceback is in (\S+);", stderr)
    assert match, stderr
    return Path(match.group(1))


def test_a_bug_on_one_host_keeps_its_traceback_and_the_others_finish(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    result = run_planted(cli, "bravo", "deployctl.ops.gpus:check_gpus", "gpus", "-i", str(inv))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "clean (" in result.stdout and "alpha" in result.stdout  # alpha was still checked
    assert "error: internal error: RuntimeError: planted bug" in result.stdout  # bravo's row
    assert result.stderr.startswith("error: internal error on bravo\n"), result.stderr
    kept = debug_file(result.stderr).read_text()
    assert "on host bravo" in kept and "Traceback (most recent call last)" in kept
    assert "RuntimeError: planted bug" in kept
    assert debug_file(result.stderr).is_relative_to(cli.home / ".local" / "state" / "deployctl")

    as_json = run_planted(
        cli, "bravo", "deployctl.ops.gpus:check_gpus", "gpus", "-i", str(inv), "--json"
    )
    assert as_json.returncode == 2
    doc = json.loads(as_json.stdout)["hosts"]
    assert doc["alpha"]["ok"] and doc["alpha"]["code"] is None
    assert (doc["bravo"]["ok"], doc["bravo"]["code"]) == (False, "internal")
    # Two runs, two files: a debug file is never overwritten.
    assert debug_file(as_json.stderr) != debug_file(result.stderr)


def test_a_bug_in_the_command_itself_is_one_line_and_a_file(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    result = run_planted(cli, "*", "deployctl.present.views:render_result", "gpus", "-i", str(inv))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "error: internal error: RuntimeError: planted bug", lines
    assert lines[1].startswith("hint: a bug in deployctl; the traceback is in "), lines
    assert len(lines) == 2
    assert "in planted" in debug_file(result.stderr).read_text()


def test_a_bug_while_reading_one_hosts_log_exits_2_with_its_traceback(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    for name in ("alpha", "bravo"):
        log = hosts.hosts[name].home / "server.log"
        log.write_text(f"{name} line\n")
        sh("chown", f"{hosts.hosts[name].user}:", str(log))
    where = "deployctl.ops.logs:_read_tail"
    result = run_planted(cli, "bravo", where, "logs", "-i", str(inv), "--path", "~/server.log")
    assert result.returncode == 2, result.stderr
    assert result.stdout == "alpha | alpha line\n"
    assert "bravo: error: internal error: RuntimeError: planted bug" in result.stderr
    assert "RuntimeError: planted bug" in debug_file(result.stderr).read_text()


def test_a_user_mistake_is_not_called_a_bug(cli: CLI, tmp_path: Path) -> None:
    result = cli("gpus", "-i", str(tmp_path / "missing.yml"))
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "bug" not in result.stderr
    assert not (cli.home / ".local" / "state" / "deployctl").exists()


def test_a_bug_on_a_full_disk_keeps_its_traceback_elsewhere_and_no_half_file(
    hosts: SSHLab, cli: CLI, tmp_path: Path, full_disk: FullDisk
) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    full_disk.fill()
    result = run_planted(cli, "*", "deployctl.present.views:render_result", "gpus", "-i", str(inv),
                         env={"DEPLOYCTL_DEBUG_DIR": str(full_disk.path)})  # fmt: skip
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 2, result.stderr
    kept = debug_file(result.stderr)
    assert kept.parent == Path(tempfile.gettempdir()) and "planted bug" in kept.read_text()
    kept.unlink()
    assert full_disk.names() == set()


def test_a_bug_with_nowhere_to_keep_its_traceback_is_still_one_line(
    full_disk: FullDisk, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from deployctl.present.terminal import print_bug

    full_disk.fill()
    monkeypatch.setenv("DEPLOYCTL_DEBUG_DIR", str(full_disk.path))
    monkeypatch.setattr(tempfile, "tempdir", str(full_disk.path))  # the fallback is full too
    print_bug([(None, RuntimeError("planted bug"))], "error: internal error")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    kept = re.fullmatch(r"hint: a bug in deployctl; its traceback could not be kept "
                        r"\(cannot write (\S+): No space left on device\); please report it",
                        lines[1])  # fmt: skip
    assert kept and Path(kept.group(1)).parent == full_disk.path, lines
    assert full_disk.names() == set()
