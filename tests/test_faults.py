"""Faults over real sshd test hosts: hosts down or silent, connections dropped mid-apply,
writes that fail, deployctl killed mid-launch, two launches racing.

Each test says what it injects; after each, the hosts must be in a state deployctl can
explain: all patched or all original (and `patch audit` says which), a run recorded or
not started, no lock left that blocks the next command.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deployctl import agent
from deployctl.connection import ConnectOptions, open_connection
from deployctl.errors import CommandTimeoutError, PatchError
from deployctl.inventory import load_inventory
from deployctl.ops import patch as patch_ops
from deployctl.patchset import PatchSet, load_patch_sets
from deployctl.project import SHIPPED_DATA
from deployctl.remote.bootstrap import BOOTSTRAP, PYTHON_FLAGS
from tests.conftest import CLI
from tests.sglang_wheel import SITE, install_on, site_file
from tests.sshd_hosts import SSHLab, TestHost, sh
from tests.test_lifecycle import prepare
from tests.timing import side_by_side

SET = "spec-disable"


# ---- helpers -------------------------------------------------------------------------------


def wait_until(check: Callable[[], Any], timeout: float, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"not within {timeout}s: {getattr(check, '__name__', check)}")


def user_argvs(host: TestHost) -> dict[int, list[str]]:
    """The argv of every process of the host's user."""
    uid = int(sh("id", "-u", host.user).stdout)
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        found[int(entry)] = raw.decode(errors="replace").split("\0")
    return found


def agents(host: TestHost, command: str | None = None) -> list[int]:
    """PIDs of host agents (`python -S -c BOOTSTRAP STATE/agent/HASH DIGEST CALL ARGS`) on the
    host."""
    start = [*PYTHON_FLAGS, "-c", BOOTSTRAP]
    return [
        pid
        for pid, argv in user_argvs(host).items()
        if argv[1 : 1 + len(start)] == start
        and (command is None or argv[3 + len(start) : 4 + len(start)] == [command])
    ]


def ssh_sessions(host: TestHost) -> list[int]:
    """sshd processes serving the host's user (not the listener)."""
    out = sh("pgrep", "-f", f"sshd: {host.user}", check=False).stdout
    return [int(p) for p in out.split()]


def sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@pytest.fixture
def paused_guard(hosts: SSHLab) -> Iterator[SSHLab]:
    """Resume every host after the test, whatever happened."""
    yield hosts
    for host in hosts.hosts.values():
        host.resume()
        if host.proc is None:
            host.start()


# ---- hosts down or silent ------------------------------------------------------------------


def test_down_and_silent_hosts_are_reported_in_bounded_time(
    paused_guard: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    lab = paused_guard
    names = ["alpha", "bravo", "charlie", "delta"]
    inv = lab.inventory(tmp_path / "inv.yml", names, connect_timeout=2, command_timeout=3)
    healthy = lab.inventory(tmp_path / "healthy.yml", ["charlie", "delta"])
    lab.hosts["alpha"].stop()  # down: nothing listens
    lab.hosts["bravo"].pause()  # silent: connects, then never answers
    # Beside the same command over the healthy hosts alone, under the same load: a loaded
    # machine stretches both, and only the difference is the down and silent hosts' cost.
    (result, elapsed), (reference, usual) = side_by_side(
        lambda: cli("status", "-i", str(inv), "--json", timeout=60),
        lambda: cli("status", "-i", str(healthy), "--json", timeout=60),
    )
    assert reference.returncode == 0, reference.stderr
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    doc = json.loads(result.stdout)["hosts"]
    assert "cannot connect" in doc["alpha"]["error"] and "refused" in doc["alpha"]["error"]
    assert "cannot connect" in doc["bravo"]["error"]
    assert doc["charlie"]["ok"] and doc["delta"]["ok"]
    # connect_timeout 2 s, not forever (nor paramiko's own 15 s banner wait).
    extra = elapsed - usual
    assert extra < 10, (
        f"took {elapsed:.2f}s, {extra:.2f}s more than the healthy hosts' {usual:.2f}s, bound 10s"
    )


def test_host_that_goes_silent_mid_launch_is_reported_and_others_finish(
    paused_guard: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    lab = paused_guard
    bravo, charlie = lab.hosts["bravo"], lab.hosts["charlie"]
    host_vars = {"bravo": prepare(bravo, startup_s=8), "charlie": prepare(charlie, startup_s=1.5)}
    inv = lab.inventory(
        tmp_path / "inv.yml", ["bravo", "charlie"], host_vars, connect_timeout=2, command_timeout=3
    )
    proc = cli.popen("launch", "-i", str(inv), "--json", "--timeout", "60")
    try:
        # bravo's server is starting (a loaded machine, load 32, took more than 30 s to it).
        log = bravo.home / "logs" / "eagle3_v1.log"
        wait_until(lambda: log.exists() or proc.poll() is not None, 90)
        if not log.exists():  # the launch ended first: say what it said (preflight under load?)
            out, err = proc.communicate(timeout=10)
            raise AssertionError(f"launch ended before bravo's server started: {err}{out}")
        bravo.pause()  # bravo's server runs on; its sshd answers nothing more
        paused_at = time.monotonic()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - paused_at
    assert took < 15, f"ended {took:.2f}s after the pause, bound 15s (command_timeout 3 s)"
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    doc = json.loads(out)["hosts"]
    assert doc["charlie"]["ok"] and doc["charlie"]["state"] == "ready"
    assert doc["bravo"]["ok"] is False
    assert any(word in doc["bravo"]["error"] for word in ("timed out", "no answer", "Timeout"))


@pytest.mark.parametrize("held", [False, True], ids=["run", "held"])
def test_host_silent_right_after_the_channel_opens_times_out(
    paused_guard: SSHLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: bool
) -> None:
    """The narrowest window: the channel is open, the command request gets no reply. Both
    for a command run to its end and one held open (a kept agent's start, a router lock)."""
    import paramiko

    lab = paused_guard
    bravo = lab.hosts["bravo"]
    inv = lab.inventory(tmp_path / "inv.yml", ["bravo"], connect_timeout=2, command_timeout=2)
    conn = open_connection(load_inventory(inv).select("bravo")[0], ConnectOptions())
    assert conn.run("echo ready").stdout == "ready\n"
    real_open = paramiko.Transport.open_session

    def open_then_fall_silent(self: paramiko.Transport, *args: Any, **kwargs: Any) -> Any:
        channel = real_open(self, *args, **kwargs)
        bravo.pause()
        return channel

    monkeypatch.setattr(paramiko.Transport, "open_session", open_then_fall_silent)
    outcome: list[BaseException | str] = []

    def attempt() -> None:
        try:
            if held:
                conn.start("echo never; cat", b"never").close()
            else:
                conn.run("echo never")
            outcome.append("answered")
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(15)
    bravo.resume()  # unblocks a hung worker, so a failure here does not hang the suite
    worker.join(15)
    conn.close()
    took = time.monotonic() - start
    assert took < 12, f"a silent host held the command {took:.2f}s, bound 12s (timeout 2 s)"
    assert len(outcome) == 1 and isinstance(outcome[0], CommandTimeoutError), outcome


# ---- patch apply: dropped connection, truncated upload, failing writes ---------------------


@pytest.fixture
def patch_host(hosts: SSHLab, sglang_template: Path, tmp_path: Path) -> dict[str, Any]:
    """alpha with the real SGLang wheel; the shipped set's files and their two states."""
    alpha = hosts.hosts["alpha"]
    python = install_on(alpha, sglang_template)
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": {"python": python}})
    patch_set = load_patch_sets([SHIPPED_DATA / "patches"])[SET]
    variant = patch_set.variants["0.5.23"]
    files = list(variant.files)
    originals = {
        f: site_file(sglang_template, f).read_bytes() if site_file(sglang_template, f).exists()
        else None
        for f in files
    }  # fmt: skip
    patched = patch_ops.patched_copies(variant, originals, files)
    return {
        "host": alpha,
        "inv": inv,
        "set": patch_set,
        "site": alpha.home / "venv" / SITE,
        "original": {f: hashlib.sha256(d).hexdigest() if d else None for f, d in originals.items()},
        "patched": {f: hashlib.sha256(d).hexdigest() if d else None for f, d in patched.items()},
    }


def files_state(ctx: dict[str, Any]) -> str:
    """'original' or 'patched'; anything else is a half-patched host."""
    now = {f: sha(ctx["site"] / f) for f in ctx["original"]}
    if now == ctx["original"]:
        return "original"
    if now == ctx["patched"]:
        return "patched"
    return f"HALF: {now}"


def audit_state(cli: CLI, ctx: dict[str, Any]) -> str:
    result = cli("patch", "audit", "--expect", SET, "-i", str(ctx["inv"]), "--json")
    assert "Traceback" not in result.stderr, result.stderr
    return str(json.loads(result.stdout)["hosts"]["alpha"]["patches"][SET]["state"])


# (when to strike, seconds after that, what dies)
DROPS = [
    ("session", 0.0, "client"),  # before the apply round trip: must stay original
    ("apply", 0.0, "client"),  # the upload is under way
    ("apply", 0.03, "sshd"),
    ("apply", 0.2, "client"),
    ("apply", 0.6, "sshd"),  # verify scripts are running
    ("apply", 2.0, "client"),
]


def test_dropped_connection_during_apply_leaves_all_or_nothing(
    patch_host: dict[str, Any], cli: CLI
) -> None:
    ctx, alpha = patch_host, patch_host["host"]
    outcomes = []
    for trigger, delay, victim in DROPS:
        proc = cli.popen("patch", "apply", SET, "-i", str(ctx["inv"]))
        try:
            if trigger == "session":
                wait_until(lambda: ssh_sessions(alpha), 30, 0.002)
            else:
                wait_until(lambda: agents(alpha, "apply"), 30, 0.002)
            time.sleep(delay)
            if victim == "client":
                proc.kill()
            else:
                for pid in ssh_sessions(alpha):
                    os.kill(pid, signal.SIGKILL)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        # The agent finishes (or gives up) on its own; then the host must be whole.
        wait_until(lambda: not agents(alpha), 60, 0.05)
        state = files_state(ctx)
        assert state in ("original", "patched"), (trigger, delay, victim, state)
        assert audit_state(cli, ctx) == {"original": "missing", "patched": "applied"}[state]
        outcomes.append(state)
        if state == "patched":
            reverted = cli("patch", "revert", SET, "-i", str(ctx["inv"]))
            assert reverted.returncode == 0, reverted.stderr
            assert files_state(ctx) == "original"
    assert outcomes[0] == "original" and outcomes[-1] == "patched", outcomes
    print(f"dropped connections: {len(DROPS)}, outcomes {outcomes}, never half")


def tar_offsets(payload: bytes) -> dict[str, int]:
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        return {member.name: member.offset for member in tar.getmembers()}


def test_upload_cut_at_a_tar_block_boundary_changes_nothing(
    patch_host: dict[str, Any], hosts: SSHLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drop that cuts the upload between two tar members reads as a shorter, valid tar."""
    ctx = patch_host
    host = load_inventory(ctx["inv"]).select("alpha")[0]
    patch_set: PatchSet = ctx["set"]
    cuts: dict[str, Callable[[list[str]], str]] = {
        "after the first patched file": lambda names: [n for n in names if "patched/" in n][1],
        "before the verify scripts": lambda names: next(n for n in names if "verify/" in n),
    }
    real_call = agent.call
    for why, member in cuts.items():

        def cut_upload(
            host: Any, conn: Any, command: agent.Call[Any, Any], args: Any, stdin: Any = None
        ) -> Any:
            if command is agent.APPLY:
                offsets = tar_offsets(stdin)
                stdin = stdin[: offsets[member(list(offsets))]]  # noqa: B023
            return real_call(host, conn, command, args, stdin)

        monkeypatch.setattr(agent, "call", cut_upload)
        conn = open_connection(host, ConnectOptions())
        try:
            with pytest.raises(PatchError, match="upload is incomplete"):
                patch_ops.apply_patches(host, conn, [patch_set])
        finally:
            conn.close()
        assert files_state(ctx) == "original", why
        assert not list((ctx["host"].home / ".deployctl" / "patches").rglob(f"{SET}.json"))


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path], None]]:
    """Mount a full tmpfs over a folder (keeping its files); unmount afterwards."""
    mounted: list[Path] = []

    def fill(folder: Path) -> None:
        keep = Path(tempfile.mkdtemp())
        shutil.copytree(folder, keep / "copy", symlinks=True)
        stat = folder.stat()
        probe = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True
        )
        if probe.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.decode().strip()}")
        mounted.append(folder)
        shutil.copytree(keep / "copy", folder, symlinks=True, dirs_exist_ok=True)
        os.chown(folder, stat.st_uid, stat.st_gid)
        shutil.rmtree(keep)
        try:
            with open(folder / "filler", "wb") as handle:  # every free block taken
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
        except OSError:
            pass  # full (the copy may have filled it already)

    yield fill
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("fault", ["site-read-only", "site-disk-full", "record-unwritable"])
def test_failing_write_during_apply_is_rolled_back(
    patch_host: dict[str, Any], cli: CLI, tmpfs: Callable[[Path], None], fault: str
) -> None:
    ctx, alpha = patch_host, patch_host["host"]
    speculative = ctx["site"] / "sglang" / "srt" / "speculative"
    patches = alpha.home / ".deployctl" / "patches"
    if fault == "site-read-only":
        speculative.chmod(0o555)  # eagle_worker_v2.py cannot be replaced there
    elif fault == "site-disk-full":
        tmpfs(speculative)
    else:  # everything works until the record that makes the apply auditable
        (patches / "backups").mkdir(parents=True)
        (patches / ".lock").touch()
        sh("chown", "-R", f"{alpha.user}:{alpha.user}", alpha.home / ".deployctl")
        patches.chmod(0o555)
    try:
        result = cli("patch", "apply", SET, "-i", str(ctx["inv"]))
    finally:
        speculative.chmod(0o755)
        patches.chmod(0o755) if patches.exists() else None
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("alpha: error: rolled back (all files restored)"), result.stderr
    reason = {"site-disk-full": "No space left", "record-unwritable": "Permission denied"}
    assert reason.get(fault, "Permission denied") in result.stderr
    assert files_state(ctx) == "original"
    assert not (patches / f"{SET}.json").exists()
    assert audit_state(cli, ctx) == "missing"


# ---- launch: deployctl killed, two at once -------------------------------------------------


def test_deployctl_killed_mid_launch_leaves_a_consistent_state(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": prepare(alpha, startup_s=3)})
    state = alpha.home / ".deployctl"

    def status() -> dict[str, Any]:
        result = cli("status", "-i", str(inv), "--json")
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout)["hosts"]["alpha"])

    # 1. Killed while it waits for ready: the run goes on, recorded; no lock is left.
    proc = cli.popen("launch", "-i", str(inv), "--timeout", "60")
    wait_until(lambda: (state / "runs" / "current").exists(), 30)
    proc.kill()
    proc.communicate()
    now = status()
    assert now["run"] == "eagle3_v1" and now["alive"] and now["status"] == "running"
    # The lock is held until the wait ends, so it is left behind, naming the dead launcher.
    assert json.loads((state / "lock").read_text())["pid"] == proc.pid
    again = cli("launch", "-i", str(inv), "--timeout", "60")
    assert again.returncode == 1
    # Refused for the running server's port, not for the dead launcher's lock.
    assert "is in use" in again.stderr and "in progress" not in again.stderr
    assert not (state / "lock").exists()  # the stale lock was cleared and ours released
    assert cli("stop", "-i", str(inv)).returncode == 0

    # 2. Killed while it holds the host lock (between preflight and start).
    proc = cli.popen("launch", "-i", str(inv), "--timeout", "60")
    wait_until(lambda: (state / "lock").exists(), 30, 0.0005)
    proc.send_signal(signal.SIGSTOP)
    time.sleep(0.5)  # a start already sent would show by now
    started = (state / "runs" / "current").read_text().strip() != "eagle3_v1"
    proc.kill()
    proc.communicate()
    wait_until(lambda: not agents(alpha), 30, 0.02)
    if started:  # the start went through; the dead launcher still holds the lock
        assert json.loads((state / "lock").read_text())["pid"] == proc.pid
        assert cli("stop", "-i", str(inv)).returncode == 0
    else:
        holder = json.loads((state / "lock").read_text())
        assert holder["pid"] == proc.pid and holder["op"] == "launch"
        assert status()["run"] == "eagle3_v1"  # the old, stopped run: nothing half-started
    after = cli("launch", "-i", str(inv), "--json", "--timeout", "60")
    assert after.returncode == 0, after.stderr  # a dead owner's lock does not block
    assert not (state / "lock").exists()
    assert cli("stop", "-i", str(inv)).returncode == 0
    logs = sorted(p.name for p in (alpha.home / "logs").iterdir())
    assert logs == [f"eagle3_v{n}.log" for n in range(1, len(logs) + 1)]


def test_two_launches_at_once_one_wins_one_is_refused(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    alpha = hosts.hosts["alpha"]
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": prepare(alpha, startup_s=1)})
    procs = [cli.popen("launch", "-i", str(inv), "--json", "--timeout", "60") for _ in "ab"]
    results = [(p.wait(120), *p.communicate()) for p in procs]
    assert sorted(code for code, _, _ in results) == [0, 1], results
    _, out, _ = next(r for r in results if r[0] == 1)
    problems = json.loads(out)["hosts"]["alpha"]["preflight"]["problems"]
    assert any("another deployctl launch is in progress" in p or "is in use" in p for p in problems)
    assert [p.name for p in (alpha.home / "logs").iterdir()] == ["eagle3_v1.log"]
    assert len((alpha.home / "model" / "standin-argv.jsonl").read_text().splitlines()) == 1
    assert not (alpha.home / ".deployctl" / "lock").exists()
    assert cli("stop", "-i", str(inv)).returncode == 0


def test_revert_on_a_full_disk_still_restores_the_originals(
    patch_host: dict[str, Any], cli: CLI, tmpfs: Callable[[Path], None]
) -> None:
    ctx = patch_host
    applied = cli("patch", "apply", SET, "-i", str(ctx["inv"]))
    assert applied.returncode == 0, applied.stderr
    assert files_state(ctx) == "patched"
    # No room for a second copy beside the patched file: the original must replace it in place.
    tmpfs(ctx["site"] / "sglang" / "srt" / "speculative")
    result = cli("patch", "revert", SET, "-i", str(ctx["inv"]))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert files_state(ctx) == "original"
    assert audit_state(cli, ctx) == "missing"
