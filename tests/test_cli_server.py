"""The fast tier forks its CLI runs from a server (tests/cli_server.py): a forked run must be
what a fresh `python -m ...` started by `subprocess.run` is, each run from a clean state."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import cli_server
from tests.sshd_hosts import REPO

PROBE = [sys.executable, "-m", "tests.cli_probe"]


def env_for(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "PROBE_ONLY": "x y"}


def both(argv: list[str], cwd: Path, env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    fresh = subprocess.run(argv, cwd=cwd, env=env, text=True, capture_output=True, timeout=60)
    forked = cli_server.run(argv, cwd=str(cwd), env=env, timeout=60)
    return [fresh, forked]


def probed(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    seen = json.loads(done.stdout.splitlines()[0])
    del seen["pid"]
    return seen


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.heavy
def test_a_forked_run_is_what_a_fresh_run_is(tmp_path: Path) -> None:
    # The server starts here with another environment and umask than the run's.
    assert cli_server.run(PROBE, cwd="/", env={**env_for(tmp_path), "GONE": "1"}, timeout=60)
    env = env_for(tmp_path)
    with umask(0o027):
        fresh, forked = both([*PROBE, "a b", "--x"], tmp_path, env)
    assert fresh.returncode == forked.returncode == 0, (fresh.stderr, forked.stderr)
    assert probed(forked) == probed(fresh)
    seen = probed(fresh)
    assert (
        seen["umask"] == 0o027
        and seen["environ"] == env
        and "GONE" not in env
        and seen["cwd"] == str(tmp_path)
    )
    assert seen["argv"][1:] == ["a b", "--x"] and seen["fds"] == ["0", "1", "2", "3"]


@pytest.mark.heavy
def test_a_run_starts_clean_after_a_command_that_filled_caches(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    inventory = tmp_path / "fleet.yml"
    inventory.write_text("all:\n  vars: {root: /m}\n  hosts:\n    h1: {path: '{{ root }}/k'}\n")
    command = cli_server.run(
        [sys.executable, "-m", "deployctl", "hosts", "--json", "-i", str(inventory)],
        cwd=str(tmp_path),
        env=env,
        timeout=60,
    )
    assert command.returncode == 0 and "/m/k" in command.stdout, command.stderr
    fresh, forked = both(PROBE, tmp_path, env)
    assert probed(forked)["caches"] == probed(fresh)["caches"]


@pytest.mark.parametrize("end", ["exit:3", "exit:a message", "raise", "interrupt"])
@pytest.mark.heavy
def test_a_forked_run_ends_as_a_fresh_one(tmp_path: Path, end: str) -> None:
    fresh, forked = both([*PROBE, end], tmp_path, env_for(tmp_path))
    assert forked.returncode == fresh.returncode != 0
    assert forked.stderr == fresh.stderr


@pytest.mark.heavy
def test_stdin_is_the_callers_a_terminal_or_not(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    main, terminal = pty.openpty()
    saved = os.dup(0)
    try:
        os.dup2(terminal, 0)
        runs = both(PROBE, tmp_path, env)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, main, terminal):
            os.close(fd)
    assert [probed(r)["stdin_tty"] for r in runs] == [True, True]
    assert [probed(r)["stdin_tty"] for r in both(PROBE, tmp_path, env)] == [os.isatty(0)] * 2


def test_a_forked_run_past_its_timeout_is_killed(tmp_path: Path) -> None:
    # The server started first, so that the 2 s are the forked run's alone, not its start-up.
    first = cli_server.run(PROBE, cwd=str(tmp_path), env=env_for(tmp_path), timeout=60)
    assert first.returncode == 0, first.stderr
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        cli_server.run([*PROBE, "sleep"], cwd=str(tmp_path), env=env_for(tmp_path), timeout=2)
    out = timed_out.value.output
    assert isinstance(out, str) and out.strip(), f"no pid printed within the 2 s: {out!r}"
    pid = json.loads(out)["pid"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the timed-out run {pid} is still there")
    # The server, whose answer found no one waiting, still runs the next command.
    after = cli_server.run(PROBE, cwd=str(tmp_path), env=env_for(tmp_path), timeout=60)
    assert after.returncode == 0, after.stderr


@pytest.mark.heavy
def test_the_cpu_a_forked_run_spent_is_counted_here(tmp_path: Path) -> None:
    """A forked run is the server's child, not this process's: its CPU (half a second of
    `spin`) reaches `cli_server.cpu_seconds`, which a per-test CPU profile adds to its own."""
    env = env_for(tmp_path)
    before = cli_server.cpu_seconds
    done = cli_server.run([*PROBE, "spin"], cwd=str(tmp_path), env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 0.5 <= cli_server.cpu_seconds - before < 5
