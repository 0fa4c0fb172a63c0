"""A bug in deployctl is one line naming a debug file with the traceback, exit 2.

A bug cannot be had on purpose, so these tests plant one (an exception deployctl does not
expect) in an otherwise real run over the sshd test hosts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import CLI
from tests.sshd_hosts import REPO, SSHLab

# Runs the real CLI after replacing one function with one that raises for one host.
PLANT = """
import sys
import deployctl.ops.gpus as gpus
real, target = gpus.check_gpus, sys.argv[1]
def check_gpus(host, conn, *args):
    if host.name == target:
        raise RuntimeError("planted bug")
    return real(host, conn, *args)
gpus.check_gpus = check_gpus
if sys.argv[2] == "report":
    import deployctl.report as report
    def broken(*args):
        raise KeyError("planted in presentation")
    report.render_result = broken
sys.argv = ["deployctl", *sys.argv[3:]]
from deployctl.cli import main
main()
"""


def run_planted(cli: CLI, on_host: str, where: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "HOME": str(cli.home),
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
        "PATH": "/usr/bin:/bin",
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
    result = run_planted(cli, "bravo", "ops", "gpus", "-i", str(inv))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "clean (" in result.stdout and "alpha" in result.stdout  # alpha was still checked
    assert "error: internal error: RuntimeError: planted bug" in result.stdout  # bravo's row
    assert result.stderr.startswith("error: internal error on bravo\n"), result.stderr
    kept = debug_file(result.stderr).read_text()
    assert "on host bravo" in kept and "Traceback (most recent call last)" in kept
    assert "RuntimeError: planted bug" in kept
    assert debug_file(result.stderr).is_relative_to(cli.home / ".local" / "state" / "deployctl")

    as_json = run_planted(cli, "bravo", "ops", "gpus", "-i", str(inv), "--json")
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
    result = run_planted(cli, "nobody", "report", "gpus", "-i", str(inv))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "error: internal error: KeyError: 'planted in presentation'", lines
    assert lines[1].startswith("hint: a bug in deployctl; the traceback is in "), lines
    assert len(lines) == 2
    assert "KeyError: 'planted in presentation'" in debug_file(result.stderr).read_text()


def test_a_user_mistake_is_not_called_a_bug(cli: CLI, tmp_path: Path) -> None:
    result = cli("gpus", "-i", str(tmp_path / "missing.yml"))
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "bug" not in result.stderr
    assert not (cli.home / ".local" / "state" / "deployctl").exists()
