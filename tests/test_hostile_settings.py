"""Every deployctl setting with hostile values, through every command: a user's mistake is
always one error line and exit 1 (or a command that works), never a bug (exit 2, a traceback,
"a bug in deployctl").

The commands run in this process (`deployctl.cli.run`), against real sshd hosts, so the
battery of some two thousand command lines takes minutes, not most of an hour.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployctl.cli import run
from deployctl.settings import SETTINGS
from tests.sshd_hosts import INVENTORY_DUMPER, SSHLab
from tests.test_lifecycle import prepare

# Kind → value, as an inventory would hold it.
VALUES: dict[str, Any] = {
    "non-numeric": "abc",
    "negative": -1,
    "zero": 0,
    "out-of-range": 99999,
    "huge-number": 10**30,
    "float": 2.5,
    "huge-text": "x" * 200_000,
    "empty": "",
    "empty-list": [],
    "empty-map": {},
    "nul": "a\x00b",
    "list": [1, "x"],
    "map": {"a": {"b": 1}},
    "bool": True,
    "null": None,
}
# Commands refused or answered on this machine: every one for every value.
LOCAL = [["hosts"], ["render"], ["metrics-targets"], ["tune", "--dry-run"]]
# Commands that reach the host: the launch preflight (which reads the most settings) for
# every value, and the others in turn, so each meets every setting with several values.
PREFLIGHT = ["launch", "--dry-run"]
REMOTE = [
    ["render", "--check"],
    ["status"],
    ["gpus"],
    ["stop"],
    ["patch", "audit"],
    ["crash"],
    ["logs"],
    ["top", "--once"],
    ["bench", "--compare", "some_run"],
    ["restart", "--crashed", "--no-wait"],
    ["tune", "--report"],
]


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder, an empty HOME and a debug folder for the in-process CLI."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    # As the `cli` fixture's environment: none of deployctl's or ssh-agent's settings.
    for name in [n for n in os.environ if n.startswith(("DEPLOYCTL_", "SSH_AUTH"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DEPLOYCTL_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.chdir(work)
    return work


# The battery in slices of settings, so the test workers share it (whole, it took most of
# a loaded CI run on one worker).
SLICE = 4
SLICES = [list(SETTINGS)[i : i + SLICE] for i in range(0, len(SETTINGS), SLICE)]


@pytest.mark.parametrize("names", SLICES, ids=[f"{names[0]}..{names[-1]}" for names in SLICES])
def test_every_setting_with_hostile_values_is_a_user_error_on_every_command(
    hosts: SSHLab, client: Path, capsys: pytest.CaptureFixture[str], names: list[str]
) -> None:
    alpha = hosts.hosts["alpha"]
    base = prepare(alpha, tp=1)
    inventory = client / "inv.yml"
    problems: list[str] = []
    tried = 0
    for name in names:
        for turn, (kind, value) in enumerate(VALUES.items()):
            hosts.inventory(inventory, ["alpha"], {"alpha": {**base, name: value}})
            for command in [*LOCAL, PREFLIGHT, REMOTE[turn % len(REMOTE)]]:
                tried += 1
                code = run([*command, "-i", str(inventory)])
                out, err = capsys.readouterr()
                where = f"{name}={kind}: deployctl {' '.join(command)}: exit {code}"
                if code == 2 or "a bug in deployctl" in err or "Traceback" in out + err:
                    problems.append(f"{where}: {err.strip()[:300]}")
                elif code == 1 and "error: " not in out + err:  # gpus shows it in its table
                    problems.append(f"{where}, and no error line: {err.strip()[:300]}")
    assert not (alpha.home / "logs").exists() or not list((alpha.home / "logs").iterdir())
    assert problems == [], f"{len(problems)} of {tried} failed:\n" + "\n".join(problems[:80])
    print(f"hostile settings tried: {tried} command lines, all clear")


def test_the_battery_reaches_every_remote_command_with_every_setting() -> None:
    # Each setting meets len(VALUES) turns of REMOTE in a row: every command at least once.
    assert len(VALUES) >= len(REMOTE)
    assert [name for names in SLICES for name in names] == list(SETTINGS)
    assert set(SETTINGS) >= {"port", "dist_port", "tp", "node_rank", "env", "gpus", "python"}
    # An inventory holds the NUL value as it is (YAML escapes it).
    written = yaml.dump({"v": VALUES["nul"]}, Dumper=INVENTORY_DUMPER)
    assert yaml.safe_load(written)["v"] == "a\x00b"
