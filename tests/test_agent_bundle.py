"""The agent's bundle on a real host is run only when every part of it is the login user's own
and whole; otherwise it is unpacked afresh (said once), and where even that cannot be run,
that host fails with one error naming the folder while the others go on.

Real sshd hosts on loopback (tests/sshd_hosts.py): each host's login user is another user of
this machine, so one host's user plays the other login user of another's host.
"""

from __future__ import annotations

import json
import shlex
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from deployctl import agent
from deployctl.connection import ConnectOptions
from deployctl.crash.catalog import default_catalog
from deployctl.fanout import Fleet
from deployctl.inventory import load_inventory
from deployctl.ops.rounds import metrics_round
from deployctl.remote import bootstrap, wire
from tests.conftest import CLI
from tests.sshd_hosts import HOST_PYTHON, SSHLab, TestHost, sh

pytestmark = pytest.mark.lab


def bundle_folder(host: TestHost) -> Path:
    return host.home / ".deployctl" / "agent" / agent.agent_hash()


# The folder as messages name it: as state_dir spells it (the default's).
SHOWN = f"~/.deployctl/agent/{agent.agent_hash()}"


def status(cli: CLI, inv: Path) -> tuple[dict[str, dict[str, object]], str]:
    """`status --json`: each host's entry, and what it said on stderr."""
    result = cli("status", "-i", str(inv), "--json")
    return json.loads(result.stdout)["hosts"], result.stderr


def assert_fresh(host: TestHost) -> None:
    """The host's bundle folder holds the shipped modules, each part its user's alone."""
    folder = bundle_folder(host)
    package = folder / bootstrap.PACKAGE
    assert {p.name: p.read_bytes() for p in package.glob("*.py")} == {
        p.name: p.read_bytes() for p in agent.bundle_files()
    }
    for part in [folder, *folder.rglob("*")]:
        info = part.lstat()
        assert not stat.S_ISLNK(info.st_mode), part
        assert (info.st_uid, stat.S_IMODE(info.st_mode) & 0o077) == (folder.stat().st_uid, 0)


def test_a_module_another_login_user_replaced_is_never_run(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha, bravo = hosts.hosts["alpha"], hosts.hosts["bravo"]
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    assert all(entry["ok"] for entry in status(cli, inv)[0].values())  # both unpacked
    folder = bundle_folder(alpha)
    # The bundle folder closed to others (711) but its package open to all (777).
    alpha.as_user(f"chmod 711 ~ {folder.parent} {folder} && chmod 777 {folder}/{bootstrap.PACKAGE}")
    # Another login user of the machine puts a module of theirs in its place.
    pwned = alpha.home / "pwned"
    payload = (
        f"open({str(pwned)!r}, 'w').write('ran as ' + __import__('getpass').getuser())\n"
        "print('@@deployctl-reply@@ {}')\n"
    )
    dispatch = folder / bootstrap.PACKAGE / "dispatch.py"
    bravo.as_user(f"rm -f {dispatch} && printf %s {shlex.quote(payload)} >{dispatch}")
    assert dispatch.stat().st_uid != folder.stat().st_uid  # bravo's file in alpha's folder

    entries, said = status(cli, inv)
    assert not pwned.exists(), pwned.read_text()
    assert entries["alpha"]["ok"] and entries["bravo"]["ok"], entries
    assert said.count("warning: ") == 1, said
    assert f"alpha: deployctl's agent at {SHOWN} was not run" in said
    assert f"{bootstrap.PACKAGE} is writable by others" in said and "unpacked afresh" in said
    assert_fresh(alpha)
    # Said once: the fresh folder is run from now on, with nothing to say.
    entries, said = status(cli, inv)
    assert entries["alpha"]["ok"] and "warning" not in said, said


def _delete_module(folder: Path, host: TestHost) -> None:
    host.as_user(f"rm {folder}/{bootstrap.PACKAGE}/runs.py")


def _change_module(folder: Path, host: TestHost) -> None:
    # Its mode stays 0600: only the content tells.
    host.as_user(f"echo 'raise SystemExit(3)' > {folder}/{bootstrap.PACKAGE}/dispatch.py")


def _symlink_module(folder: Path, host: TestHost) -> None:
    module = f"{folder}/{bootstrap.PACKAGE}/runs.py"
    host.as_user(f"cp {module} ~/runs-copy.py && rm {module} && ln -s ~/runs-copy.py {module}")


def _open_module(folder: Path, host: TestHost) -> None:
    host.as_user(f"chmod o+w {folder}/{bootstrap.PACKAGE}/dispatch.py")


DAMAGES: dict[str, tuple[Callable[[Path, TestHost], None], str]] = {
    "deleted module": (_delete_module, "runs.py is missing"),
    "changed module": (_change_module, "dispatch.py was changed"),
    "symlink": (_symlink_module, "runs.py is a symlink"),
    "module others can write": (_open_module, "dispatch.py is writable by others"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_bundle_is_sent_again_once_and_said_once(
    hosts: SSHLab, cli: CLI, tmp_path: Path, damage: str
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha", "bravo"])
    assert all(entry["ok"] for entry in status(cli, inv)[0].values())
    damage_folder, why = DAMAGES[damage]
    damage_folder(bundle_folder(alpha), alpha)
    entries, said = status(cli, inv)
    assert entries["alpha"]["ok"] and entries["bravo"]["ok"], entries
    assert said.count("warning: ") == 1 and why in said, said
    assert_fresh(alpha)
    assert "warning" not in status(cli, inv)[1]


def breaking_python(host: TestHost) -> str:
    """A `python` on a host where something opens every module of the bundle to all users
    before each start of Python (so sending the bundle again cannot help)."""
    wrapper = host.home / "breaking-python"
    modules = f'"$HOME"/.deployctl/{wire.AGENT_DIR}/*/{bootstrap.PACKAGE}/dispatch.py'
    wrapper.write_text(f'#!/bin/sh\nchmod -f o+w {modules}\nexec {HOST_PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    sh("chown", f"{host.user}:{host.user}", wrapper)
    return str(wrapper)


def test_a_bundle_still_unfit_after_it_was_sent_again_is_one_error_naming_its_folder(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["alpha", "bravo"], {"alpha": {"python": breaking_python(alpha)}}
    )
    # Unpacked, opened by the wrapper, unpacked again, opened again: an error.
    result = cli("status", "-i", str(inv), "--json")
    entries = json.loads(result.stdout)["hosts"]
    assert result.returncode == 1 and entries["bravo"]["ok"], (result.stdout, result.stderr)
    assert (entries["alpha"]["ok"], entries["alpha"]["code"]) == (False, "agent")
    error = str(entries["alpha"]["error"])
    assert error == (
        f"alpha: deployctl's agent at {SHOWN} cannot be run even after it was sent again: "
        f"{bootstrap.PACKAGE}/dispatch.py is writable by others"
    ), error
    assert "ModuleNotFoundError" not in result.stdout + result.stderr
    # As text: one error line for alpha (its hint names the folder too), bravo's status.
    text = cli("status", "-i", str(inv))
    assert text.returncode == 1 and "Traceback" not in text.stdout + text.stderr
    assert text.stderr.count("error: ") == 1 and f"look at {SHOWN}" in text.stderr


def test_a_kept_agent_on_a_host_whose_bundle_stays_unfit_fails_that_host_alone(
    hosts: SSHLab, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["alpha", "bravo"], {"alpha": {"python": breaking_python(alpha)}}
    )
    with Fleet(load_inventory(inv).select(None), ConnectOptions(), forks=4) as fleet:
        fleet.keep_agents()
        for _ in range(2):  # the first round unpacks; each then fails alpha alone
            results = {r.name: r for r in metrics_round(fleet, default_catalog(), within=20)}
            assert results["bravo"].error is None, results["bravo"].error
            assert "cannot be run even after it was sent again" in str(results["alpha"].error)
            assert results["alpha"].code == "agent", results["alpha"].error


# A host's `python` in place of deployctl's agent: ready as a kept agent (its folder's name
# is the hash it runs), then bytes without end for the first request.
FLOODING_PYTHON = f"""#!{HOST_PYTHON}
import json, os, sys
if "{wire.SESSION}" in sys.argv:
    folder = sys.argv[sys.argv.index("-c") + 2]  # after the python's flags and the script
    ready = {{"session": os.path.basename(folder), "pid": os.getpid()}}
    print("{wire.REPLY_MARK}" + json.dumps(ready), flush=True)
    sys.stdin.readline()
    while True:
        sys.stdout.buffer.write(b"x" * 65536)
os.execv("{HOST_PYTHON}", ["{HOST_PYTHON}", *sys.argv[1:]])
"""


def test_a_host_that_floods_a_kept_agents_reply_is_ended_at_the_limit_and_the_others_go_on(
    hosts: SSHLab, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    flooding = alpha.home / "flooding-python"
    flooding.write_text(FLOODING_PYTHON)
    flooding.chmod(0o755)
    sh("chown", f"{alpha.user}:{alpha.user}", flooding)
    inv = hosts.inventory(
        tmp_path / "inv.yml", ["alpha", "bravo"], {"alpha": {"python": str(flooding)}},
        max_reply_mib=2, command_timeout=30,
    )  # fmt: skip
    with Fleet(load_inventory(inv).select(None), ConnectOptions(), forks=4) as fleet:
        fleet.keep_agents()
        began = time.monotonic()
        results = {r.name: r for r in metrics_round(fleet, default_catalog(), within=40)}
        took = time.monotonic() - began
    assert results["bravo"].error is None, results["bravo"].error
    error = str(results["alpha"].error)
    assert results["alpha"].code == "agent", error
    assert error.startswith("alpha: more than 2 MiB came without an end (a reply)"), error
    # The limit ended it, not the command timeout (30 s).
    assert took < 20, f"the round took {took:.1f} s (bound 20 s)"
