"""What the agent reads on its host cheaply: a server's answer over HTTP/1.0, a port's freedom
and the next log version without `socket`'s or `re`'s import (remote/runs.py); a run's members
during a wait without reading all of /proc each time (remote/processes.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deployctl.remote import processes, runs
from deployctl.remote.protocol import RunRecord


def serve_once(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A server on a free loopback port that hands each connection to `answer`."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)  # the request
                answer(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


@pytest.fixture
def metrics_server() -> Iterator[int]:
    body = b"x" * 100_000

    def answer(conn: socket.socket) -> None:
        head = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nX-A: b\r\n\r\n"
        conn.sendall(head + body)

    yield from serve_once(answer)


def test_the_status_code_alone_needs_only_the_status_line(metrics_server: int) -> None:
    assert runs.http_get("127.0.0.1", metrics_server, "/health") == (200, b"")


def test_the_body_is_read_up_to_its_limit_after_the_headers(metrics_server: int) -> None:
    assert runs.http_get("127.0.0.1", metrics_server, "/metrics", limit=10) == (200, b"x" * 10)
    code, body = runs.http_get("127.0.0.1", metrics_server, "/metrics", limit=1_000_000)
    assert (code, len(body)) == (200, 100_000)  # all there was: the server closed


def test_a_short_answer_is_read_to_its_end() -> None:
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy")

    for port in serve_once(answer):
        assert runs.http_get("127.0.0.1", port, "/metrics", limit=4096) == (503, b"busy")


def test_nothing_listening_or_no_answer_in_time_is_no_status() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    assert runs.http_get("127.0.0.1", free, "/health") == (None, b"")

    def silent(conn: socket.socket) -> None:
        threading.Event().wait(1.0)

    for port in serve_once(silent):
        assert runs.http_get("127.0.0.1", port, "/health", timeout=0.2) == (None, b"")


def test_garbage_is_no_status_code() -> None:
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    for port in serve_once(answer):
        assert runs.http_get("127.0.0.1", port, "/health") == (None, b"")


def test_a_bound_port_is_busy_and_a_released_one_free() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        free, why = runs.port_free("127.0.0.1", port)
        assert not free and "in use" in why
    assert runs.port_free("127.0.0.1", port) == (True, "")


def test_the_next_log_version_counts_logs_and_records_of_its_stem_only(tmp_path: Path) -> None:
    logs, records = tmp_path / "logs", tmp_path / "runs"
    logs.mkdir()
    records.mkdir()
    for name in ["a_v1.log", "a_v3.log", "a_v1_v7.log", "ab_v9.log", "a_v².log", "a_v.log"]:
        (logs / name).touch()
    (records / "a_v4.json").touch()  # its log deleted: the version stays taken
    (records / "a_v8.cmd").touch()
    assert runs.next_log_version(str(logs), "a", str(records)) == 5
    assert runs.next_log_version(str(logs), "a_v1", str(records)) == 8
    assert runs.next_log_version(str(tmp_path / "none"), "a", str(tmp_path / "none")) == 1


@pytest.fixture
def group() -> Iterator[tuple[subprocess.Popen[bytes], RunRecord]]:
    """A real process group of three (a shell and its two sleeps), in a session of its own,
    and the run record that names it; killed when the test ends."""
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    run: RunRecord = {"pgid": leader.pid, "sid": leader.pid}  # type: ignore[typeddict-item]
    try:
        deadline = time.monotonic() + 10
        while len(processes.run_members(run)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        yield leader, run
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_a_wait_reads_the_members_it_knows_and_all_of_proc_once_they_are_gone(
    group: tuple[subprocess.Popen[bytes], RunRecord],
) -> None:
    leader, run = group
    everyone = processes.run_members(run)
    assert len(everyone) == 3
    # While one it knows is left, the wait reads only those it knows.
    assert processes.members_left(run, [leader.pid]) == [leader.pid]
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait()
    # None left: all of /proc is read, and the group's other processes found.
    left = processes.members_left(run, [leader.pid])
    assert left == sorted(set(everyone) - {leader.pid})
    os.killpg(leader.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        left = processes.members_left(run, left)  # killed: gone, or zombies, which count gone
    assert left == []


def test_a_full_look_reads_the_stat_of_the_groups_processes_only(
    group: tuple[subprocess.Popen[bytes], RunRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, run = group
    read: list[str] = []
    stat_fields = processes.stat_fields

    def counted(pid: int | str) -> list[bytes] | None:
        read.append(str(pid))
        return stat_fields(pid)

    monkeypatch.setattr(processes, "stat_fields", counted)
    others = sum(entry.isdigit() for entry in os.listdir("/proc")) - 3
    members = processes.run_members(run)
    assert len(members) == 3 and leader.pid in members
    assert others > 10 and sorted(map(int, read)) == members, (others, read)
