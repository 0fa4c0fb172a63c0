"""The host-agent protocol: a copy kept on the host by content hash, replies checked by type."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from deployctl import agent
from deployctl.connection import ConnectOptions, LocalConnection, open_connection
from deployctl.crash import load_catalog
from deployctl.errors import AgentError, HostError, PatchError
from deployctl.inventory import DEFAULT_VARS, Host
from deployctl.ops import runs as launch_ops
from deployctl.ops.runs import run_status
from deployctl.remote import bootstrap, protocol, wire
from deployctl.remote.protocol import PollReply, PreflightReply, ReleaseReply, StatusArgs
from tests.sshd_hosts import SSHLab

STATUS_ARGS: StatusArgs = {
    "state_dir": "~/.deployctl",
    "deployment": None,
    "run": None,
    "tail_bytes": 0,
}


def local_host(tmp_path: Path) -> Host:
    return Host(
        "here", {**DEFAULT_VARS, "python": sys.executable, "state_dir": str(tmp_path / "state")}
    )


# ---- replies are checked against their declared types --------------------------------------


def reply(host: Host, document: object, reply_type: type) -> object:
    text = "Welcome!\n" + wire.REPLY_MARK + json.dumps(document) + "\n"
    return agent.parse_reply(host, "test", 0, text, "", reply_type)


def test_a_reply_missing_a_key_is_an_error_not_a_default(tmp_path: Path) -> None:
    host = local_host(tmp_path)
    good = {"alive": True, "members": [7], "health": None, "size": 0, "data": "", "placement": None}
    assert reply(host, good, PollReply) == good
    for key in good:
        broken = {k: v for k, v in good.items() if k != key}
        with pytest.raises(AgentError, match=rf"test\.{key} is missing"):
            reply(host, broken, PollReply)


def test_nested_keys_and_kinds_are_checked(tmp_path: Path) -> None:
    host = local_host(tmp_path)
    lock = {"acquired": True, "token": "t", "holder": None}
    base = {
        "sglang": {"error": "not installed"},
        "records": {},
        "files": {},
        "hunks": {},
        "live_runs": [],
        "module_found": True,
        "port_free": True,
        "port_error": "",
        "paths": {},
        "log_dir_writable": True,
        "log_dir_error": "",
        "next_log": "/logs/x_v1.log",
        "next_version": 1,
        "busy_ports": {},
        "argv_check": {
            "method": "declarations",
            "note": "",
            "options": 559,
            "findings": [{"level": "error", "flag": "--x", "message": "m", "candidates": []}],
            "seconds": 0.03,
        },
        "lock": lock,
        "launcher_facts": {"sbatch": None},
        "model_mla": None,
        "machine": "3d1219c7c4c5404aaa1f6d2a48adfda4/6aa92503-74d3-440a-8e33-aa44ec85be1c",
    }
    assert reply(host, base, PreflightReply) == base
    # A patch record written before records said whether the set was adopted still reads.
    record = {
        "set": "s", "version": "1", "hash": "h", "variant": "0.5.23", "sglang_version": "0.5.23",
        "site": "/s", "apply_id": "i", "applied_at": "t", "applied_by": "u", "backup_dir": "/b",
        "files": {"x.py": {"original_sha256": "a", "patched_sha256": "b"}},
    }  # fmt: skip
    assert reply(host, {**base, "records": {"s": record}}, PreflightReply)["records"]["s"] == record
    with pytest.raises(AgentError, match=r"argv_check\.findings\[0\]\.level is missing"):
        finding = {"flag": "--x", "message": "m", "candidates": []}
        check = {**base["argv_check"], "findings": [finding]}  # type: ignore[dict-item]
        reply(host, {**base, "argv_check": check}, PreflightReply)
    # The preflight of a port that is in use, with the key gone: never read as "free".
    with pytest.raises(AgentError, match="port_free is missing"):
        reply(host, {k: v for k, v in base.items() if k != "port_free"}, PreflightReply)
    with pytest.raises(AgentError, match=r"lock\.acquired is missing"):
        reply(host, {**base, "lock": {"token": "t", "holder": None}}, PreflightReply)
    with pytest.raises(AgentError, match="port_free is str, not bool"):
        reply(host, {**base, "port_free": "yes"}, PreflightReply)
    with pytest.raises(AgentError, match=r"records\.spec-disable\.applied_at is missing"):
        reply(host, {**base, "records": {"spec-disable": {"set": "spec-disable"}}}, PreflightReply)


def test_the_agents_own_refusal_and_garbage_are_errors(tmp_path: Path) -> None:
    host = local_host(tmp_path)
    refusal = {"error": "another deployctl patch operation is running", "code": "patch"}
    with pytest.raises(PatchError, match="another deployctl patch operation"):
        reply(host, refusal, ReleaseReply)
    with pytest.raises(HostError, match="Not a directory"):
        reply(
            host,
            {"error": "status failed on the host: Not a directory", "code": "host"},
            ReleaseReply,
        )
    with pytest.raises(AgentError, match="unknown agent call"):
        reply(host, {"error": "unknown agent call 'x'"}, ReleaseReply)
    with pytest.raises(AgentError, match="failed: Traceback"):
        agent.parse_reply(host, "x", 1, "", "Traceback (most recent call last): ...", ReleaseReply)


# ---- the agent lives on the host as one bundle, unpacked once under its hash ---------------


def unpacked_files(folder: Path) -> dict[str, bytes]:
    """The modules an unpacked bundle holds, by name (its bytecode cache left out)."""
    package = folder / bootstrap.PACKAGE
    return {p.name: p.read_bytes() for p in sorted(package.glob("*.py"))}


def shipped_files() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in agent.bundle_files()}


def test_the_bundle_is_the_remote_package_and_the_same_bytes_every_time() -> None:
    with zipfile.ZipFile(io.BytesIO(agent.agent_bundle())) as bundle:
        names = bundle.namelist()
        assert names == sorted(names)
        assert {n.split("/", 1)[1] for n in names} == set(shipped_files())
        assert {i.date_time for i in bundle.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    agent.agent_bundle.cache_clear()
    agent.agent_hash.cache_clear()
    assert hashlib.sha256(agent.agent_bundle()).hexdigest() == agent.agent_hash()


def test_the_agent_is_sent_once_then_run_from_its_unpacked_folder(tmp_path: Path) -> None:
    host, conn = local_host(tmp_path), LocalConnection("here", 30)
    folder = tmp_path / "state" / "agent" / agent.agent_hash()
    command = agent.agent_command(host, "status", STATUS_ARGS)
    # The bundle never rides in the command line (one argument is capped at 128 KiB): only
    # the bootstrap with its check of the folder.
    assert len(command) < 8000 < len(agent.agent_bundle())
    assert bootstrap.PACKAGE + ".dispatch" in command

    assert agent.call(host, conn, agent.STATUS, STATUS_ARGS)["run"] is None
    assert unpacked_files(folder) == shipped_files()
    assert conn.round_trips == 3  # the miss, the bundle, the call
    agent.call(host, conn, agent.STATUS, STATUS_ARGS)
    assert conn.round_trips == 4
    # Private, complete, and imported normally: Python kept the modules' bytecode there.
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    assert (folder / "complete").read_text() == agent.agent_hash()
    # The manifest the host wrote is the one the client computed from its own bundle.
    manifest = (folder / bootstrap.MANIFEST).read_bytes()
    assert hashlib.sha256(manifest).hexdigest() == agent.manifest_digest()
    assert manifest == bootstrap.manifest(
        {f"{bootstrap.PACKAGE}/{name}": text for name, text in shipped_files().items()}
    )
    assert list((folder / bootstrap.PACKAGE / "__pycache__").glob("dispatch.*.pyc"))
    assert sorted(p.name for p in folder.parent.iterdir()) == [agent.agent_hash()]


def imported_by(host: Host, call: str, args: dict[str, Any]) -> set[str]:
    """The modules a one-shot call's Python imported, as `python -v` names them."""
    command = agent.agent_command(host, call, args)
    env = {**os.environ, "PYTHONVERBOSE": "1"}
    ran = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)
    assert ran.returncode == 0 and wire.REPLY_MARK in ran.stdout, ran.stderr[-2000:]
    return set(re.findall(r"^import '([\w.]+)'", ran.stderr, re.MULTILINE))


def test_a_one_shot_call_imports_its_own_handler_and_not_the_others(tmp_path: Path) -> None:
    # Every import is paid for by each call's Python on every host (benchmarks/agent_call.py):
    # a lock release or a status read never loads the kept agent's threads, a patch apply's
    # tar reader, a bench, a router client or a survey; nor the type declarations, nor the
    # standard modules that bring `enum`, `re` or OpenSSL (remote/lean.py: a status call
    # takes ~20 ms of CPU without them, ~55 with them).
    host, conn = local_host(tmp_path), LocalConnection("here", 30)
    state = str(tmp_path / "state")
    release = {"state_dir": state, "deployment": None, "token": "t"}
    assert agent.call(host, conn, agent.RELEASE, release) == {"released": False}
    others = {f"{bootstrap.PACKAGE}.{name}" for name in ("bench", "kept_agent", "router", "survey")}
    declarations = {
        f"{bootstrap.PACKAGE}.{name}" for name in ("protocol", "measures", "patch_types", "routing")
    }
    heavy = {"py_compile", "shutil", "socket", "tarfile", "tempfile", "subprocess", "typing"}
    heavy |= {"json", "re", "enum", "hashlib", "signal", "base64", "contextlib", "collections"}
    imported = imported_by(host, agent.RELEASE.name, release)
    assert f"{bootstrap.PACKAGE}.locks" in imported
    assert not imported & (others | declarations | heavy | {f"{bootstrap.PACKAGE}.runs"})
    status = {**STATUS_ARGS, "state_dir": state, "metrics_bytes": 0}
    imported = imported_by(host, agent.STATUS.name, status)
    assert f"{bootstrap.PACKAGE}.runs" in imported
    assert not imported & (others | declarations | heavy | {f"{bootstrap.PACKAGE}.records"})


def test_a_call_runs_without_the_hosts_site_packages_and_finds_sglang_in_them(
    tmp_path: Path,
) -> None:
    # A host python's `.pth` files run code at every start of it (any package may add one):
    # the agent's calls skip them, and only the lookup of SGLang reads its site-packages.
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True
    )
    site = next((tmp_path / "env" / "lib").glob("python3*/site-packages"))
    ran = tmp_path / "pth-ran"
    (site / "hook.pth").write_text(f"import pathlib; pathlib.Path({str(ran)!r}).touch()\n")
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text("raise ImportError('needs torch')\n")
    (site / "sglang-0.5.23.dist-info").mkdir()
    (site / "sglang-0.5.23.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.5.23\n")
    host = Host("here", {**local_host(tmp_path).vars, "python": str(tmp_path / "env/bin/python")})
    conn = LocalConnection("here", 30)
    state = str(tmp_path / "state")
    status = {**STATUS_ARGS, "state_dir": state, "metrics_bytes": 0}
    assert agent.call(host, conn, agent.STATUS, status)["run"] is None
    assert not ran.exists(), "a status call ran the host's .pth files"
    probe = agent.call(host, conn, agent.PROBE, {"state_dir": state, "paths": [], "hunks": {}})
    assert set(probe["sglang"]) == {"version", "site", "python"}
    assert probe["sglang"]["version"] == "0.5.23"
    assert os.path.realpath(probe["sglang"]["site"]) == os.path.realpath(site)  # lib64 → lib
    assert probe["sglang"]["python"] == str(tmp_path / "env/bin/python")
    # A launch's preflight finds the server's module there too, in a call's fresh Python.
    found = (
        f"import sys; sys.path.insert(0, {agent.agent_folder(host)!r}); "
        f"from {bootstrap.PACKAGE}.runs import module_found; "
        "print(module_found('sglang.launch_server'), module_found('no_such_module'))"
    )
    python = [str(tmp_path / "env/bin/python"), *bootstrap.PYTHON_FLAGS]
    ran_found = subprocess.run([*python, "-c", found], capture_output=True, text=True, timeout=60)
    assert ran_found.stdout.split() == ["True", "False"], ran_found.stderr


def _replace_dispatch(folder: Path) -> None:
    """What would run in deployctl's place if the folder were run: a call that fails."""
    (folder / bootstrap.PACKAGE / "dispatch.py").write_text("raise SystemExit(3)\n")


def _symlink_runs(folder: Path) -> None:
    module = folder / bootstrap.PACKAGE / "runs.py"
    copy = folder.parent.parent / "elsewhere-runs.py"
    copy.write_bytes(module.read_bytes())
    module.unlink()
    module.symlink_to(copy)


def _foreign_owner(folder: Path) -> None:
    os.chown(folder / bootstrap.PACKAGE / "dispatch.py", 65534, 65534)  # nobody's


# What a folder must not be run with, and why the host says it was not: each a part that
# another user can change, or one that is not what the bundle holds.
DAMAGES = {
    "no marker": (lambda f: ((f / "complete").unlink(), _replace_dispatch(f)), "incomplete"),
    "open folder": (lambda f: (f.chmod(0o777), _replace_dispatch(f)), "the folder is writable"),
    "open package": (
        lambda f: (f.chmod(0o711), (f / bootstrap.PACKAGE).chmod(0o777), _replace_dispatch(f)),
        f"{bootstrap.PACKAGE} is writable by others",
    ),
    "open module": (
        lambda f: (f / bootstrap.PACKAGE / "dispatch.py").chmod(0o666),
        "dispatch.py is writable by others",
    ),
    "open bytecode": (
        lambda f: (f / bootstrap.PACKAGE / "__pycache__").chmod(0o777),
        "__pycache__ is writable by others",
    ),
    "foreign module": (_foreign_owner, "dispatch.py belongs to another user"),
    "symlink": (_symlink_runs, "runs.py is a symlink"),
    "deleted module": (
        lambda f: (f / bootstrap.PACKAGE / "runs.py").unlink(),
        "runs.py is missing",
    ),
    "changed module": (_replace_dispatch, "dispatch.py was changed"),
    "shadowing module": (
        lambda f: (f / "json.py").write_text("raise SystemExit(3)\n"),
        "a file the bundle has not: json.py",
    ),
    "no manifest": (lambda f: (f / "manifest").unlink(), "incomplete"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.heavy
def test_a_folder_not_whole_or_open_to_others_is_unpacked_afresh_and_said_once(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    host, conn = local_host(tmp_path), LocalConnection("here", 30)
    assert agent.call(host, conn, agent.STATUS, STATUS_ARGS)["run"] is None  # unpacked, run
    folder = tmp_path / "state" / "agent" / agent.agent_hash()
    damage_folder, why = DAMAGES[damage]
    damage_folder(folder)
    capsys.readouterr()
    before = conn.round_trips
    assert agent.call(host, conn, agent.STATUS, STATUS_ARGS)["run"] is None
    assert conn.round_trips == before + 3  # the miss, the bundle, the call
    assert unpacked_files(folder) == shipped_files()
    for part in [folder, *folder.rglob("*")]:
        assert not part.is_symlink() and part.stat().st_uid == os.getuid(), part
        assert stat.S_IMODE(part.stat().st_mode) in (0o700, 0o600), part
    warned = capsys.readouterr().err
    assert warned.count("warning: ") == 1 and why in warned and str(folder) in warned, warned
    assert "unpacked afresh" in warned
    # Said once: the next call runs the fresh folder, and says nothing.
    agent.call(host, conn, agent.STATUS, STATUS_ARGS)
    assert conn.round_trips == before + 4
    assert capsys.readouterr().err == ""


@pytest.mark.heavy
def test_two_first_calls_at_once_both_unpack_and_both_answer(tmp_path: Path) -> None:
    host = local_host(tmp_path)
    with ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(
                lambda _: agent.call(host, LocalConnection("here", 30), agent.STATUS, STATUS_ARGS)[
                    "run"
                ],
                range(8),
            )
        )
    assert replies == [None] * 8
    folder = tmp_path / "state" / "agent" / agent.agent_hash()
    assert unpacked_files(folder) == shipped_files()
    assert sorted(p.name for p in folder.parent.iterdir()) == [agent.agent_hash()]


def test_a_folder_others_can_write_is_never_run(tmp_path: Path) -> None:
    """Only its owner may change what a call runs: a group-writable folder is sent again."""
    host, conn = local_host(tmp_path), LocalConnection("here", 30)
    folder = tmp_path / "state" / "agent" / agent.agent_hash()
    folder.mkdir(parents=True, mode=0o700)
    (folder / "complete").write_text(agent.agent_hash())
    folder.chmod(0o770)  # group-writable: as good as another's
    result = conn.run(agent.agent_command(host, "status", STATUS_ARGS))
    assert result.exit_code == wire.AGENT_MISSING_EXIT
    assert wire.AGENT_MISSING in result.stdout


def test_status_over_ssh_sends_the_agent_once_per_host(hosts: SSHLab, tmp_path: Path) -> None:
    alpha = hosts.hosts["alpha"]
    host = Host("alpha", {**DEFAULT_VARS, **alpha.inventory_vars(hosts.client_key)})
    conn = open_connection(host, ConnectOptions(known_hosts=hosts.known_hosts))
    catalog = load_catalog()
    try:
        assert run_status(host, conn, catalog).run is None
        assert conn.round_trips == 3
        run_status(host, conn, catalog)
        assert conn.round_trips == 4
    finally:
        conn.close()
    copies = list((alpha.home / ".deployctl" / "agent").iterdir())
    assert [p.name for p in copies] == [agent.agent_hash()]


# ---- the launch poll decodes the log as one stream -----------------------------------------


@pytest.mark.heavy
def test_a_character_split_between_polls_stays_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, conn = local_host(tmp_path), LocalConnection("here", 30)
    log = tmp_path / "server.log"
    line = "é→東京 ok"
    log.write_text(line + "\n", encoding="utf-8")
    server = subprocess.Popen(["sleep", "300"], start_new_session=True)
    run: protocol.RunRecord = {
        "template": "baseline", "threshold": None, "command": "sleep 300", "port": 1,
        "bind_host": "127.0.0.1", "tp": 1, "patches": {}, "deployctl_version": "test",
        "started_by": "test", "restart_of": None, "id": "x_v1", "log": str(log),
        "pid": server.pid, "pgid": server.pid, "sid": server.pid, "started_at": time.time(),
        "status": "running",
    }  # fmt: skip
    # Polls of 3 bytes cut →, 東 and 京 in two.
    monkeypatch.setattr(launch_ops, "POLL_LIMIT_BYTES", 3)
    monkeypatch.setattr(launch_ops, "POLL_WAIT", 0.0)
    # Ready once the whole line is read, not at a deadline: a loaded machine polls slowly.
    monkeypatch.setattr(launch_ops, "READY_LINE", "東京 ok")
    try:
        outcome = launch_ops.wait_ready(host, conn, run, load_catalog(), timeout=60)
    finally:
        os.killpg(server.pid, 9)
        server.wait()
    assert outcome.state == "ready"
    assert outcome.last_line == line


def test_a_host_where_the_agent_cannot_be_kept_changes_no_other_host(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder\n")
    first = Host("first", {**DEFAULT_VARS, "python": sys.executable, "state_dir": str(blocked)})
    second = Host("second", dict(first.vars))  # the same state_dir text, another host
    conn = LocalConnection("first", 30)
    with pytest.raises(HostError, match="Not a directory"):
        agent.call(first, conn, agent.STATUS, {**STATUS_ARGS, "state_dir": str(blocked)})
    # The bundle rode in argv for `first` (imported from memory); `second` still gets the
    # short command.
    carried = base64.b64encode(agent.agent_bundle()).decode()
    assert carried in agent.agent_command(first, "status", STATUS_ARGS)
    assert carried not in agent.agent_command(second, "status", STATUS_ARGS)


def test_an_agent_call_that_breaks_on_the_host_is_one_line_without_a_traceback(
    tmp_path: Path,
) -> None:
    # A run id that is not text breaks a path join on the host: a TypeError, no OSError.
    host, conn = local_host(tmp_path), LocalConnection("here", 30)
    state = str(tmp_path / "state")
    assert agent.call(host, conn, agent.BENCH_RESULTS, {"state_dir": state, "runs": ["r"]})
    with pytest.raises(AgentError) as failed:
        agent.call(host, conn, agent.BENCH_RESULTS, {"state_dir": state, "runs": [7]})  # type: ignore[list-item]
    message = str(failed.value)
    assert message.startswith("bench_results failed on the host: TypeError: "), message
    assert "Traceback" not in message and "\n" not in message


# ---- what a host that does not run deployctl's agent may send back --------------------------

# A host's `python` in deployctl's agent's place (a compromised host): every call, and every
# request of a kept agent (whose ready line it fakes), is answered by ANSWER(), in Python.
FAKE_PYTHON = """#!{python}
import json, os, sys
def answer():
{answer}
if "{session}" in sys.argv:  # ready as a kept agent: the folder's name is the hash it runs
    folder = sys.argv[sys.argv.index("-c") + 2]  # after the python's flags and the script
    ready = {{"session": os.path.basename(folder), "pid": os.getpid()}}
    print("{mark}" + json.dumps(ready), flush=True)
    for line in sys.stdin:
        answer()
else:
    answer()
"""
DEEP = "    print('{mark}' + '[' * 200_000 + ']' * 200_000, flush=True)"
FLOOD = "    while True:\n        sys.stdout.buffer.write(b'x' * 65536)"


def fake_host(tmp_path: Path, answer: str, **settings: object) -> Host:
    script = tmp_path / "fake-python"
    text = FAKE_PYTHON.format(
        python=sys.executable, answer=answer, session=wire.SESSION, mark=wire.REPLY_MARK
    )
    script.write_text(text.replace("{mark}", wire.REPLY_MARK))
    script.chmod(0o755)
    return Host("here", {**DEFAULT_VARS, **settings, "python": str(script),
                         "state_dir": str(tmp_path / "state"), "ansible_connection": "local"})  # fmt: skip


@pytest.mark.parametrize("kept", [False, True], ids=["one-shot", "kept"])
def test_a_reply_nested_deeper_than_python_reads_is_the_hosts_agent_error(
    tmp_path: Path, kept: bool
) -> None:
    host = fake_host(tmp_path, DEEP)
    conn = open_connection(host, ConnectOptions())
    conn.keeps_agent = kept
    try:
        with pytest.raises(AgentError) as failed:
            agent.call(host, conn, agent.STATUS, STATUS_ARGS)
    finally:
        conn.close()
    assert "here" in str(failed.value) and "[[[" not in str(failed.value), failed.value


def test_a_kept_agent_that_floods_without_a_reply_is_ended_at_the_limit(tmp_path: Path) -> None:
    host = fake_host(tmp_path, FLOOD, max_reply_mib=1, command_timeout=20)
    conn = open_connection(host, ConnectOptions())
    conn.keeps_agent = True
    began = time.monotonic()
    try:
        with pytest.raises(
            AgentError, match=r"^here: more than 1 MiB came without an end \(a reply\)"
        ):
            agent.call(host, conn, agent.STATUS, STATUS_ARGS)
        kept = next(iter(conn.kept.values()), None)
        assert isinstance(kept, agent.KeptAgent) and kept.ended  # the next call starts anew
    finally:
        conn.close()
    # Long before the command timeout (20 s): the limit, not the clock, ended it.
    assert time.monotonic() - began < 10, time.monotonic() - began


def test_a_held_command_that_floods_before_its_first_line_is_ended_at_the_limit(
    tmp_path: Path,
) -> None:
    host = fake_host(tmp_path, FLOOD, max_reply_mib=1, command_timeout=20)
    conn = open_connection(host, ConnectOptions())
    try:
        with pytest.raises(AgentError, match=r"more than 1 MiB"):
            conn.start("yes", wire.REPLY_MARK.encode())
    finally:
        conn.close()


class _Vanishing:
    """A directory entry whose file is renamed away between the listing and its stat."""

    def __init__(self, entry: os.DirEntry[str]) -> None:
        self.name, self.path = entry.name, entry.path

    def stat(self, follow_symlinks: bool = True) -> os.stat_result:
        raise FileNotFoundError(2, "No such file or directory", self.path)

    def is_dir(self, follow_symlinks: bool = True) -> bool:
        return False


def _unsound_with_vanishing(folder: Path, where: Path) -> str:
    """The bootstrap's own check of the agent `folder`, with the listing of `where` holding
    one more file that is gone when it is looked at (as another agent call's bytecode
    write, renamed from its temporary name in between)."""
    import types

    gone = where / "dispatch.cpython-311.pyc.140233"
    gone.touch()
    [vanished] = [e for e in os.scandir(where) if e.name == gone.name]
    gone.unlink()

    def scandir(path: str) -> list[Any]:
        listed: list[Any] = list(os.scandir(path))
        return [*listed, _Vanishing(vanished)] if Path(path) == where else listed

    wrapped = types.SimpleNamespace(getuid=os.getuid, lstat=os.lstat, stat=os.stat)
    wrapped.path, wrapped.scandir = os.path, scandir
    namespace: dict[str, Any] = {"os": wrapped, "stat": stat}
    exec(bootstrap._SHA256 + bootstrap._UNSOUND, namespace)
    unsound: Callable[[str, str], str] = namespace["unsound"]
    return unsound(str(folder), agent.manifest_digest())


def test_a_bytecode_file_renamed_away_mid_check_is_no_damage(tmp_path: Path) -> None:
    host, conn = local_host(tmp_path), LocalConnection("here", 30)
    agent.call(host, conn, agent.STATUS, STATUS_ARGS)  # unpacked, run: its bytecode kept
    folder = tmp_path / "state" / "agent" / agent.agent_hash()
    package = folder / bootstrap.PACKAGE
    assert _unsound_with_vanishing(folder, package / "__pycache__") == ""
    # Anywhere else a file that vanishes under the check is still a folder not to run.
    assert _unsound_with_vanishing(folder, package).startswith("it cannot be read: ")
