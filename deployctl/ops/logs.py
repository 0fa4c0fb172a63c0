"""Server logs on hosts: find a run's log, scan it for crashes, print its tail, follow it."""

from __future__ import annotations

import codecs
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from deployctl import events as ev
from deployctl.connection import Connection
from deployctl.crash import (
    Catalog,
    CatalogError,
    CrashReport,
    CrashScanner,
    load_catalog,
    scan_text,
)
from deployctl.errors import (
    CommandTimeoutError,
    ConnectError,
    DeployctlError,
    HostKeyError,
    MissingLogError,
)
from deployctl.events import EventSink
from deployctl.fanout import RECONNECT_BACKOFF_MAX, Fleet, FleetResult, next_backoff
from deployctl.inventory import Host
from deployctl.masking import mask_text
from deployctl.ops.runs import log_secrets, masked_reports, recorded_run
from deployctl.project import Project
from deployctl.shell import quote

# A crash is written at the end of a log; scanning only the tail keeps a 1 GB log cheap.
SCAN_TAIL_BYTES = 64 << 20
TAIL_WINDOWS = (4 << 20, 16 << 20, SCAN_TAIL_BYTES)
# `--all` moves the log in pieces of this size so memory stays bounded on both ends.
SCAN_CHUNK_BYTES = 64 << 20
# The first window read for `logs -n N`; grown (x4) until it holds N lines.
TAIL_WINDOW_BYTES = 64 << 10
# `logs -n N` never moves more than this to find N lines.
TAIL_WINDOW_MAX = 64 << 20
# The most one follow poll brings back; a host that wrote more is polled again at once.
FOLLOW_LIMIT_BYTES = 1 << 20
FOLLOW_INTERVAL = 0.25

# Starts the window script's answer: whatever the login printed before it is not the log.
WINDOW_MARK = b"@@deployctl-window@@"
# Exit codes of the window script (see _window_command).
_NO_FILE, _IS_DIR, _NOT_REGULAR, _UNREADABLE = 65, 66, 67, 68


def load_user_catalog(project: Project) -> Catalog:
    """Load the shipped crash catalog plus the project's own signatures.yml."""
    try:
        return load_catalog(project.user_signatures())
    except CatalogError as exc:
        raise DeployctlError(
            " ".join(str(exc).split()), hint="fix or remove the project's signatures.yml"
        ) from None


def log_path(host: Host, conn: Connection, run: str | None, path: str | None) -> str:
    """Return `path`, else the log of the named (or current) run recorded on the host."""
    return _log_of(host, conn, run, path)[0]


def _log_of(
    host: Host, conn: Connection, run: str | None, path: str | None
) -> tuple[str, bool, bool]:
    """The log to read, whether the run writing it is alive and answers /health (then a
    trace in it is a failed request, as `status` says, not a crash), and whether deployctl
    stopped it. A --path is no run's."""
    if path is not None:
        return path, False, False
    status = recorded_run(host, conn, run)
    record = status["run"]
    if record is None:
        if run is not None:
            raise DeployctlError(
                f"no run {run} recorded on {host.name}",
                hint="check the run id (`deployctl status`), or give --path",
            )
        raise DeployctlError(f"no run recorded on {host.label}", hint="launch one, or give --path")
    healthy = status["alive"] and status["health"] == 200
    return str(record["log"]), healthy, "stop_requested_at" in record


# `stop` signals the server's whole process group, so real SGLang's parent logs its scheduler
# as "crashed with exit code -15" (SIGTERM; -9 after the SIGKILL timeout): the stop, not a crash.
_STOP_EXIT = re.compile(r"crashed with exit code -(?:15|9)\b")


def stop_effect(report: CrashReport) -> bool:
    """A subprocess ended by the signal a stop sends."""
    return report.signature == "subprocess-crashed" and bool(_STOP_EXIT.search(report.message))


@dataclass
class LogScan:
    """What a crash scan of one log found, and how much of the log it read."""

    path: str
    size: int
    scanned_bytes: int
    reports: list[CrashReport]  # every trace found, oldest first
    healthy: bool = False  # the run writing the log is alive and answers /health
    stopped: bool = False  # deployctl stopped the run writing the log

    @property
    def crashes(self) -> list[CrashReport]:
        """The traces that are crashes: none while the server is healthy, and not the
        signals of a stop."""
        if self.healthy:
            return []
        return [r for r in self.reports if not (self.stopped and stop_effect(r))]

    @property
    def warnings(self) -> list[CrashReport]:
        """Traces in the log of a healthy server: failed requests, not a failed server."""
        return self.reports if self.healthy else []


@dataclass
class CrashSearch:
    """`deployctl crash` over the fleet: good when every log was read and none has a crash."""

    scans: FleetResult[LogScan]

    @property
    def ok(self) -> bool:
        return not self.scans.failed and not any(s.crashes for s in self.scans.succeeded.values())


# ---- reading a remote log by byte ranges ---------------------------------------------------


@dataclass(frozen=True)
class _Window:
    """Bytes [start, start + len(data)) of a remote log whose size was `size` when read."""

    size: int
    inode: int
    start: int
    data: bytes


def _window_command(
    path: str, *, back: int | None = None, start: int = 0, limit: int = 0, inode: int = 0
) -> str:
    """Return one shell command printing "size inode start" and then a byte range of `path`.

    With `back`, the range is the last `back` bytes up to the size just measured (so the end
    offset is exact even while the log grows). Otherwise it is `limit` bytes from `start`,
    or from 0 when the file shrank below `start` or is another file than `inode` (rotated;
    0: not known yet).
    """
    f = quote(path)
    if back is not None:
        pick = f"if [ $s -gt {back} ]; then o=$((s-{back})); else o=0; fi; n=$((s-o))"
    else:
        pick = f"o={int(start)}; n={int(limit)}; if [ $s -lt $o ]; then o=0; fi"
        if inode:
            pick += f"; if [ $i -ne {int(inode)} ]; then o=0; fi"
    # stat then tail|head: GNU tail seeks to the offset, so a huge log is never read whole.
    return (
        f"if [ -d {f} ]; then exit {_IS_DIR}; fi; "
        f"if [ ! -e {f} ]; then exit {_NO_FILE}; fi; "
        f"if [ ! -f {f} ]; then exit {_NOT_REGULAR}; fi; "
        f"if [ ! -r {f} ]; then exit {_UNREADABLE}; fi; "
        f"x=$(stat -L -c '%s %i' -- {f}) || exit {_NO_FILE}; set -- $x; s=$1; i=$2; {pick}; "
        f'echo "{WINDOW_MARK.decode()} $s $i $o"; tail -c +$((o+1)) -- {f} | head -c $n'
    )


def _read_window(
    host: Host,
    conn: Connection,
    path: str,
    *,
    back: int | None = None,
    start: int = 0,
    limit: int = 0,
    inode: int = 0,
) -> _Window:
    """Run the window command once and parse its answer."""
    result = conn.run(_window_command(path, back=back, start=start, limit=limit, inode=inode))
    if result.exit_code == _NO_FILE:
        raise MissingLogError(f"log {path} does not exist on {host.name}")
    if result.exit_code == _IS_DIR:
        raise DeployctlError(f"log {path} on {host.name} is a directory, not a file")
    if result.exit_code == _NOT_REGULAR:
        raise DeployctlError(f"log {path} on {host.name} is not a regular file")
    if result.exit_code == _UNREADABLE:
        raise DeployctlError(f"log {path} on {host.name} is not readable by {host.user or 'us'}")
    result.check(host.name)
    _, _, answer = result.stdout_bytes.partition(WINDOW_MARK + b" ")
    header, _, data = answer.partition(b"\n")
    try:
        size, inode_now, offset = header.decode().split()
        return _Window(int(size), int(inode_now), int(offset), data)
    except ValueError:
        raise DeployctlError(
            f"{host.name}: unexpected answer while reading {path}: {header[:80]!r}"
        ) from None


def _drop_partial_first_line(data: bytes, start: int) -> tuple[bytes, int]:
    """Cut the line a mid-file window starts inside; return the rest and its offset."""
    if start == 0:
        return data, 0
    cut = data.find(b"\n") + 1
    return (data[cut:], start + cut) if cut else (b"", start + len(data))


def scan_log(
    host: Host,
    conn: Connection,
    catalog: Catalog,
    run: str | None,
    path: str | None,
    scan_all: bool,
) -> LogScan:
    """Scan a host's log for crashes: its last 64 MiB in one round trip, or all of it."""
    log, healthy, stopped = _log_of(host, conn, run, path)
    if not scan_all:
        sizes: list[int] = []

        def read_back(back: int) -> tuple[bytes, int]:
            window = _read_window(host, conn, log, back=back)
            sizes.append(window.size)
            return window.data, window.start

        crashes, scanned = _scan_from_end(read_back, catalog)
        return LogScan(log, sizes[-1], scanned, masked_reports(crashes, host), healthy, stopped)
    scanner = CrashScanner(catalog)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offset, inode, size = 0, 0, 0
    while True:
        window = _read_window(host, conn, log, start=offset, limit=SCAN_CHUNK_BYTES, inode=inode)
        if window.start != offset:
            raise DeployctlError(
                f"log {log} on {host.name} was truncated or replaced while being scanned",
                hint="run the scan again",
            )
        inode, size = window.inode, max(window.size, offset + len(window.data))
        scanner.feed(decoder.decode(window.data))
        offset += len(window.data)
        if not window.data or offset >= window.size:
            break
    scanner.feed(decoder.decode(b"", final=True))
    scanner.finish()
    return LogScan(log, size, offset, masked_reports(scanner.reports, host), healthy, stopped)


@dataclass
class LocalCrashes:
    """The crashes found in a log on this machine: good when there are none."""

    crashes: list[CrashReport]

    @property
    def ok(self) -> bool:
        return not self.crashes


def scan_local_file(path: Path, catalog: Catalog, scan_all: bool = False) -> list[CrashReport]:
    """Scan a log on this machine for crashes: its last 64 MiB, or all of it."""
    try:
        if not stat.S_ISREG(path.stat().st_mode) and not path.is_dir():
            raise DeployctlError(f"{path} is not a regular file", hint="give a log file")
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if scan_all:
                return masked_reports(_scan_stream(handle, catalog))

            def read_back(back: int) -> tuple[bytes, int]:
                start = max(0, size - back)
                handle.seek(start)
                return handle.read(back), start

            return masked_reports(_scan_from_end(read_back, catalog)[0])
    except FileNotFoundError:
        raise DeployctlError(f"log file {path} does not exist") from None
    except IsADirectoryError:
        raise DeployctlError(f"{path} is a directory, not a log file") from None
    except OSError as exc:
        raise DeployctlError(f"cannot read {path}: {exc.strerror or exc}") from None


def _scan_from_end(
    read_back: Callable[[int], tuple[bytes, int]], catalog: Catalog
) -> tuple[list[CrashReport], int]:
    """Scan ever larger windows at the log's end until a crash shows; return it and bytes scanned.

    A dead server's crash is at the end of its log, so the first small window usually
    answers; a healthy log costs at most the last SCAN_TAIL_BYTES.
    """
    crashes: list[CrashReport] = []
    data = b""
    for back in TAIL_WINDOWS:
        data, start = read_back(back)
        lines, _ = _drop_partial_first_line(data, start)
        crashes = scan_text(lines.decode("utf-8", errors="replace"), catalog)
        if crashes or start == 0:
            break
    return crashes, len(data)


def _scan_stream(handle: IO[bytes], catalog: Catalog) -> list[CrashReport]:
    """Scan a whole binary stream in 16 MiB chunks through one CrashScanner."""
    scanner = CrashScanner(catalog)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := handle.read(16 << 20):
        scanner.feed(decoder.decode(chunk))
    scanner.feed(decoder.decode(b"", final=True))
    scanner.finish()
    return scanner.reports


# ---- logs: tail and follow -----------------------------------------------------------------


@dataclass
class _Tail:
    """A host's log, its last lines, and where following it continues."""

    path: str
    lines: list[str]
    offset: int
    inode: int


def _split_lines(data: bytes, secrets: Sequence[str]) -> list[str]:
    """The log's lines, secrets masked."""
    text = mask_text(data.decode("utf-8", errors="replace"), secrets)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _read_tail(
    host: Host, conn: Connection, path: str, lines: int, complete_only: bool = False
) -> _Tail:
    """Return the last `lines` lines of a remote log, usually in one round trip."""
    # With `complete_only` an unterminated last line is left out and the offset points at its
    # start, so a follower prints it once, when it is complete.
    window = _read_window(host, conn, path, back=max(TAIL_WINDOW_BYTES, lines * 256))
    start, data, size = window.start, window.data, window.start + len(window.data)
    # Grow the window backwards until it holds `lines` whole lines (or the file's start).
    while start > 0 and data.count(b"\n") <= lines and size - start < TAIL_WINDOW_MAX:
        back = min(start, max(size - start, TAIL_WINDOW_BYTES) * 3)
        earlier = _read_window(host, conn, path, start=start - back, limit=back, inode=window.inode)
        if earlier.start != start - back:  # rotated meanwhile: what we have is the new file
            break
        start, data = earlier.start, earlier.data + data
    end = size
    if complete_only:
        cut = data.rfind(b"\n") + 1
        if cut or start == 0:
            end = start + cut
            data = data[:cut]
    data, _ = _drop_partial_first_line(data, start)
    picked = _split_lines(data, log_secrets(host))[-lines:] if lines else []
    return _Tail(path, picked, end, window.inode)


@dataclass
class LogsResult:
    """What `logs` did: the hosts that failed (and why), and `--crash` scans without follow."""

    failed: dict[str, BaseException] = field(default_factory=dict)
    scans: FleetResult[LogScan] | None = None

    @property
    def ok(self) -> bool:
        return not self.failed


class _Follower:
    """One host's follow loop: poll new bytes, send whole lines, report crashes."""

    def __init__(
        self,
        host: Host,
        conn: Connection,
        tail: _Tail,
        catalog: Catalog,
        sink: EventSink,
        stop: threading.Event,
        crash_only: bool,
    ) -> None:
        self.host, self.conn, self.tail = host, conn, tail
        self.catalog, self.sink, self.stop = catalog, sink, stop
        self.crash_only = crash_only
        self.secrets = log_secrets(host)
        self.failure: BaseException | None = None
        self.restart()

    def restart(self) -> None:
        """Forget what was read: the log was truncated or replaced by a new one."""
        self.scanner = CrashScanner(self.catalog)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""

    def emit(self, text: str) -> None:
        """Send the whole lines of `text` and the crashes they complete."""
        text = self.pending + text
        cut = text.rfind("\n") + 1
        self.pending = text[cut:]
        if not cut:
            return
        whole = mask_text(text[:cut], self.secrets)
        if not self.crash_only:
            for line in whole[:-1].split("\n"):
                crash = self.scanner.is_crash_line(line)
                self.sink.emit(ev.LogLine(target=self.host.label, line=line, crash=crash))
        for report in self.scanner.feed(whole):
            self.sink.emit(ev.LogCrash(target=self.host.label, report=report))

    def _fail(self, exc: BaseException) -> None:
        if not self.stop.is_set():  # after Ctrl-C, connections close under us
            self.failure = exc
            self.sink.emit(ev.HostFailed(target=self.host.label, exception=exc))

    def stopped(self) -> bool:
        if self.sink.closed:
            self.stop.set()
        return self.stop.is_set()

    def run(self) -> None:
        """Poll until stopped. A lost connection is reported once and opened again with
        backoff; any other failure is reported once and ends only this host."""
        offset, inode = self.tail.offset, self.tail.inode
        backoff, began = 0.0, time.monotonic()
        while not self.stopped():
            try:
                window = _read_window(
                    self.host,
                    self.conn,
                    self.tail.path,
                    start=offset,
                    limit=FOLLOW_LIMIT_BYTES,
                    inode=inode,
                )
            except MissingLogError:  # rotated away, like `tail -F`: wait for the new file
                if inode:
                    offset, inode = 0, 0
                    self.restart()
                self.stop.wait(FOLLOW_INTERVAL)
                continue
            except (ConnectError, CommandTimeoutError) as exc:
                if isinstance(exc, HostKeyError) or self.stop.is_set():
                    self._fail(exc)
                    return
                if not backoff:
                    elapsed = time.monotonic() - began
                    lost = ev.ConnectionLost(
                        target=self.host.label, elapsed=elapsed, error=str(exc)
                    )
                    self.sink.emit(lost)
                backoff = next_backoff(backoff, FOLLOW_INTERVAL, RECONNECT_BACKOFF_MAX)
                self.stop.wait(backoff)
                continue
            except Exception as exc:  # a failing host must not stop the others
                self._fail(exc)
                return
            if backoff:
                elapsed = time.monotonic() - began
                self.sink.emit(ev.Reconnected(target=self.host.label, elapsed=elapsed))
                backoff = 0.0
            if window.start != offset:  # truncated or replaced: the new content starts at 0
                self.restart()
            offset, inode = window.start + len(window.data), window.inode
            self.emit(self.decoder.decode(window.data))
            if len(window.data) < FOLLOW_LIMIT_BYTES:
                self.stop.wait(FOLLOW_INTERVAL)


def show_logs(
    fleet: Fleet,
    catalog: Catalog,
    run: str | None,
    path: str | None,
    lines: int,
    follow: bool,
    crash_only: bool,
    sink: EventSink,
) -> LogsResult:
    """Send each host's log tail (or its crashes) to `sink` as events; with `follow`, until
    Ctrl-C (or until the sink's reader goes)."""
    if crash_only and not follow:
        scans = fleet.run(lambda host, conn: scan_log(host, conn, catalog, run, path, False))
        return LogsResult(scans.failed, scans)
    if not follow:
        tails = fleet.run(
            lambda host, conn: _read_tail(host, conn, log_path(host, conn, run, path), lines)
        )
        for result in tails:
            for line in result.value.lines if result.value is not None else []:
                sink.emit(ev.LogLine(target=result.name, line=line))
        _report_failed(tails, sink)
        return LogsResult(tails.failed)
    stop = threading.Event()
    try:
        return _follow(fleet, catalog, run, path, lines, crash_only, sink, stop)
    except KeyboardInterrupt:  # Ctrl-C before the polling started: still a clean end
        stop.set()
        return LogsResult()


def _report_failed(results: FleetResult[_Tail], sink: EventSink) -> None:
    for name, exc in results.failed.items():
        sink.emit(ev.HostFailed(target=name, exception=exc))


def _follow(
    fleet: Fleet,
    catalog: Catalog,
    run: str | None,
    path: str | None,
    lines: int,
    crash_only: bool,
    sink: EventSink,
    stop: threading.Event,
) -> LogsResult:
    """Send each log's tail, then poll every host in a thread of its own until Ctrl-C."""

    def start(host: Host, conn: Connection) -> _Tail:
        log = log_path(host, conn, run, path)
        if not crash_only:
            return _read_tail(host, conn, log, lines, complete_only=True)
        # Crash-only following starts with the crashes already in the log's tail.
        window = _read_window(host, conn, log, back=SCAN_TAIL_BYTES)
        cut = window.data.rfind(b"\n") + 1
        if not cut and window.start > 0:  # one endless line: skip it
            return _Tail(log, [], window.size, window.inode)
        data, _ = _drop_partial_first_line(window.data[:cut], window.start)
        return _Tail(log, _split_lines(data, log_secrets(host)), window.start + cut, window.inode)

    tails = fleet.run(start)
    _report_failed(tails, sink)
    followers: list[_Follower] = []
    for result in tails:
        if result.value is not None:
            conn = fleet.connection(result.host)
            follower = _Follower(result.host, conn, result.value, catalog, sink, stop, crash_only)
            # The tail goes through the scanner too, so a crash under way is still reported.
            follower.emit("".join(line + "\n" for line in result.value.lines))
            followers.append(follower)
    threads = [
        threading.Thread(target=f.run, name=f"follow-{f.host.label}", daemon=True)
        for f in followers
    ]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            stop.wait(0.2)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a follow ends: not an error
    stop.set()
    deadline = time.monotonic() + 1.0
    for thread in threads:
        # A poll in flight ends quickly; daemon threads never hold the exit longer than this
        # (well within interrupts.GRACE_S, after which Ctrl-C ends the command regardless).
        thread.join(max(0.0, deadline - time.monotonic()))
    stopped = {f.host.label: f.failure for f in followers if f.failure is not None}
    return LogsResult({**tails.failed, **stopped})
