"""The kept agent's side of the wire (remote/kept_agent.py), run as a host runs it: the bundle
unpacked into a private folder, `python -S -c BOOTSTRAP FOLDER DIGEST --session`, requests on
stdin."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployctl import agent
from deployctl.remote import bootstrap, wire
from deployctl.remote import protocol as proto

FLAGS = bootstrap.PYTHON_FLAGS  # as deployctl runs the agent


class Session:
    def __init__(self, folder: Path | None) -> None:
        if folder is None:  # where nothing can be kept: the bundle rides in argv
            bundle = base64.b64encode(agent.agent_bundle()).decode()
            argv = [sys.executable, *FLAGS, "-c", bootstrap.IN_MEMORY, bundle, wire.SESSION, "{}"]
        else:
            digest = agent.manifest_digest()
            argv = [
                sys.executable,
                *FLAGS,
                "-c",
                bootstrap.BOOTSTRAP,
                str(folder),
                digest,
                wire.SESSION,
            ]
            argv.append("{}")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.ready = self.read()

    def read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert line.startswith(wire.REPLY_MARK), line
        return json.loads(line[len(wire.REPLY_MARK) :])

    def ask(self, request: dict[str, Any] | str) -> Any:
        assert self.proc.stdin is not None
        text = request if isinstance(request, str) else json.dumps(request)
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()
        return self.read()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    folder = tmp_path / "agent" / agent.agent_hash()
    subprocess.run(
        [sys.executable, "-c", bootstrap.UNPACK, str(folder)],
        input=agent.agent_bundle(),
        check=True,
    )
    started = Session(folder)
    yield started
    started.proc.kill()
    started.proc.wait()


def test_it_says_which_bundle_it_runs_and_answers_echo(session: Session) -> None:
    assert session.ready == {"session": agent.agent_hash(), "pid": session.proc.pid}
    first = session.ask({"call": "echo", "args": {}})["reply"]
    second = session.ask({"call": "echo", "args": {}})["reply"]
    assert first["pid"] == second["pid"] == session.proc.pid
    assert second["answered"] == first["answered"] + 1 and first["rss_kib"] > 0


def test_a_bundle_carried_in_argv_keeps_an_agent_too() -> None:
    session = Session(None)
    try:
        assert session.ready == {"session": "<bundle>", "pid": session.proc.pid}
        assert session.ask({"call": "echo", "args": {}})["reply"]["answered"] == 0
    finally:
        session.proc.kill()
        session.proc.wait()


def test_it_answers_a_status_with_its_probes_and_goes_on_after_bad_requests(
    session: Session, tmp_path: Path
) -> None:
    for bad in ("not json", '{"call": [1], "args": {}}', "[" * 100_000 + "]" * 100_000):
        answer = session.ask(bad)
        assert "malformed" in answer["reply"]["error"], answer
    nan = session.ask({"call": "echo", "args": {}, "probes": {"p": "echo ok"}, "timeout": "nan"})
    assert nan["probes"]["p"] == {"exit_code": 0, "output": "ok\n", "stderr": ""}
    refused = session.ask({"call": "apply", "args": {}})  # it changes things: never kept
    assert refused["reply"] == {
        "error": "'apply' is not answered by a kept agent",
        "code": "agent",
    }
    args = {"state_dir": str(tmp_path / "state"), "deployment": None, "run": None,
            "tail_bytes": 100, "metrics_bytes": 0}  # fmt: skip
    answer = session.ask(
        {"call": "status", "args": args, "probes": {"gpus": "echo out; echo err >&2; exit 3"}}
    )
    assert answer["probes"] == {"gpus": {"exit_code": 3, "output": "out\n", "stderr": "err\n"}}
    assert agent.shape_problems(answer["reply"], proto.StatusReply, "status") == []
    assert answer["reply"]["run"] is None


def test_a_probe_past_its_timeout_is_killed_and_reported(session: Session) -> None:
    began = time.monotonic()
    answer = session.ask(
        {"call": "echo", "args": {}, "probes": {"gpus": "sleep 30"}, "timeout": 0.5}
    )
    took = time.monotonic() - began
    assert took < 5, f"took {took:.2f}s, bound 5s (timeout 0.5 s)"
    assert answer["probes"]["gpus"]["exit_code"] == 124
    assert "killed after 0.5s" in answer["probes"]["gpus"]["stderr"]


def test_it_ends_when_its_stdin_ends_even_while_a_call_hangs(
    session: Session, tmp_path: Path
) -> None:
    runs = tmp_path / "state" / "runs"
    runs.mkdir(parents=True)
    os.mkfifo(runs / "current")  # a read that never returns, as on a hung file system
    args = {"state_dir": str(tmp_path / "state"), "deployment": None, "run": None,
            "tail_bytes": 100, "metrics_bytes": 0}  # fmt: skip
    assert session.proc.stdin is not None
    session.proc.stdin.write(json.dumps({"call": "status", "args": args}).encode() + b"\n")
    session.proc.stdin.flush()
    time.sleep(0.3)
    assert session.proc.poll() is None  # stuck in the call
    session.close_stdin()
    assert session.proc.wait(timeout=5) == 0
