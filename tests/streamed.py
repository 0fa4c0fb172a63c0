"""A long-running command (`watch`, `logs -f`) read in threads while a test waits on it; a
streamed completion read to its end (`stream_tokens`).

A wait for a line ends at its deadline even while the command prints nothing (a blocking
`readline` in the test's own thread would wait for ever, and CI would run into its time
limit instead of failing), and stderr is drained as it comes (a full pipe would stop the
command). A JSON line that breaks its schema (checked as it is read) fails the test.
"""

from __future__ import annotations

import http.client
import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI


class Streamed:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.seen: list[str] = []  # stdout lines read so far, without their newline
        self._lines: queue.Queue[str | None] = queue.Queue()  # None: stdout ended
        self._err: list[str] = []
        self._failure: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := self.proc.stdout.readline():
                self._lines.put(line)
        except BaseException as failure:  # a line that broke its schema: the test fails
            self._failure = failure
        finally:
            self._lines.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self._err.extend(iter(self.proc.stderr.readline, ""))

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    def _take(self, line: str) -> None:
        self.seen.append(line.rstrip("\n"))

    def until(self, done: Callable[[str], bool], timeout: float) -> bool:
        """Read lines until `done(line)` holds: False when the deadline passes or the
        command ends first."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self._lines.put(None)  # later waits end at once too
                break
            self._take(line)
            if done(line):
                return True
        if self._failure is not None:
            raise self._failure
        return False

    def expect(self, needle: str, timeout: float = 10) -> None:
        """Read lines until one holds `needle`; fail the test when none does in time."""
        if not self.until(lambda line: needle in line, timeout):
            _, err = self.interrupt()
            pytest.fail(f"no {needle!r} in {self.seen}; stderr: {err}")

    def interrupt(self, timeout: float = 30) -> tuple[int, str]:
        """Ctrl-C it (if it still runs) and wait for its end: (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for thread in self._threads:
            thread.join(timeout=10)  # the lines after the wait are checked, not kept
        if self._failure is not None:
            raise self._failure
        return self.proc.returncode, self.stderr


class WatchJson:
    """`deployctl watch --json` (every 0.5 s unless `extra` says otherwise)."""

    def __init__(self, cli: CLI, inv: Path, *extra: str) -> None:
        interval = () if "--interval" in extra else ("--interval", "0.5")
        self.stream = Streamed(cli.popen("watch", "-i", str(inv), "--json", *interval, *extra))

    @property
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.seen if line.strip()]

    def until(self, done: Callable[[list[dict[str, Any]]], bool], timeout: float) -> bool:
        return self.stream.until(lambda _: done(self.events), timeout)

    def started(self, timeout: float = 60) -> dict[str, Any]:
        """Wait for its first look (the `watching` event): what the test does next, watch
        sees happen."""
        if not self.until(lambda evs: bool(evs), timeout) or self.events[0]["event"] != "watching":
            _, err = self.stream.interrupt()
            pytest.fail(f"watch did not start: {self.events}; stderr: {err}")
        return self.events[0]

    def stop(self) -> list[dict[str, Any]]:
        self.stream.interrupt()
        return self.events


def watch_events(
    cli: CLI, inv: Path, done: Callable[[list[dict[str, Any]]], bool], timeout: float, *extra: str
) -> list[dict[str, Any]]:
    """`watch --json` until `done(events)` holds (or `timeout` passes), then Ctrl-C."""
    watch = WatchJson(cli, inv, *extra)
    try:
        watch.until(done, timeout)
    finally:
        events = watch.stop()
    return events


def kind_in(*kinds: str) -> Callable[[list[dict[str, Any]]], bool]:
    """`done` for `watch_events`: the newest event is of one of `kinds`."""
    return lambda events: bool(events) and events[-1]["event"] in kinds


def stream_tokens(address: str, port: int, tokens: int, out: list[tuple[int, bool]]) -> None:
    """One streamed completion read to its end: (tokens got, ended with [DONE]) into `out`;
    a connection cut before the end counts what came."""
    got, done = 0, False
    conn = http.client.HTTPConnection(address, port, timeout=120)
    try:
        body = {"model": "m", "prompt": "hi", "max_tokens": tokens, "stream": True}
        conn.request("POST", "/v1/completions", json.dumps(body))
        reply = conn.getresponse()
        for line in iter(reply.readline, b""):
            if line.startswith(b"data: {"):
                got += line.count(b" tok")
            done = done or line.strip() == b"data: [DONE]"
    except (OSError, http.client.HTTPException):
        pass
    finally:
        conn.close()
    out.append((got, done))
