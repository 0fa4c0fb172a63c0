"""One interface to run commands and move files on a host, locally or over SSH.

This is the only module that imports fabric or paramiko, and it imports them lazily so
that commands which never touch a remote host start fast.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import ipaddress
import logging
import os
import random
import select
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from deployctl.errors import (
    AgentError,
    CommandError,
    CommandTimeoutError,
    ConnectError,
    HostKeyError,
)
from deployctl.localfiles import append_file
from deployctl.shell import join, quote

if TYPE_CHECKING:
    import fabric
    import paramiko

    from deployctl.inventory import Host

# paramiko logs a failed handshake with a traceback; with no handler anywhere Python would
# print it on our stderr. The error reaches the user as one ConnectError line instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_CONNECT_TIMEOUT = 10.0
# sshd drops connections that arrive while too many handshakes are pending (MaxStartups), as
# a burst of a few hundred hosts at once can make it; such a drop gets one more try.
HANDSHAKE_RETRY_DELAY = (0.5, 1.0)  # seconds, drawn at random so retries do not bunch up
# How long close() waits for a command holding the connection; a connect under way is not waited for.
CLOSE_WAIT = 1.0
DEFAULT_COMMAND_TIMEOUT = 120.0
# The most one command's output (a reply) may be: a host that sends more without ending is
# stopped there, not held in memory until the timeout (the `max_reply_mib` setting).
DEFAULT_MAX_REPLY_MIB = 64
_STDERR_TAIL = 400
# accept-new appends to one known_hosts file from many threads.
_KNOWN_HOSTS_LOCK = threading.Lock()


@dataclass(frozen=True)
class CommandResult:
    """What a command returned: exit code and its output."""

    command: str
    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    def check(self, host: str) -> CommandResult:
        """Return self, or raise CommandError with the command, exit code and stderr tail."""
        if self.exit_code != 0:
            tail = (self.stderr.strip() or self.stdout.strip())[-_STDERR_TAIL:]
            raise CommandError(
                f"{host}: command exited {self.exit_code}: {_shorten(self.command)}"
                + (f": {tail}" if tail else ""),
                output=tail,
            )
        return self


def _shorten(command: str, limit: int = 120) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


def known_hosts_name(host: str, port: int) -> str:
    """A host's name in known_hosts, as OpenSSH writes it and paramiko looks it up."""
    return host if port == 22 else f"[{host}]:{port}"


@functools.cache
def _fabric_connection_class() -> type[fabric.Connection]:
    import fabric

    class SharedConfigConnection(fabric.Connection):  # type: ignore[misc]
        # fabric sets `inline_ssh_env` per instance without declaring it on the class, so
        # invoke takes it for a change to the Config and re-merges it, emptying it for a
        # moment: with one Config shared by every host's thread, another thread then read
        # no keys at all. Declared here it is a plain attribute and the Config stays as read.
        inline_ssh_env = None

    return SharedConfigConnection


@functools.cache
def _transport_class() -> type[paramiko.Transport]:
    import paramiko

    class QuietTransport(paramiko.Transport):
        # paramiko's transport thread wakes every 0.1 s to see whether it was closed, so
        # kept connections (top, watch, a fleet of hundreds) cost CPU while idle: 2.3 % of
        # a core for 64 hosts. Once a second is enough: close() does not wait for a wake-up.
        _active_check_timeout = 1.0

    return QuietTransport


class SSHFiles:
    """What is the same for every host of one invocation, read once and shared by its
    connections: the parsed ssh_config files (in fabric's Config) and each known_hosts
    file. Read per host, a known_hosts that lists the whole fleet made a fleet-wide
    command quadratic in its size."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._config: fabric.Config | None = None
        self._known: dict[Path, paramiko.HostKeys] = {}

    def config(self) -> fabric.Config:
        import fabric

        with self._lock:
            if self._config is None:
                self._config = fabric.Config()
            return self._config

    def host_keys(self, path: Path) -> paramiko.HostKeys:
        """The keys of one known_hosts file (empty if it does not exist)."""
        import paramiko

        with self._lock:
            keys = self._known.get(path)
            if keys is None:
                try:
                    keys = paramiko.HostKeys(str(path)) if path.is_file() else paramiko.HostKeys()
                except OSError as exc:  # a name too long, a file that cannot be read
                    raise HostKeyError(
                        f"cannot read known_hosts file {str(path)[:200]}: {exc.strerror or exc}",
                        hint="set known_hosts_file (or --known-hosts) to a readable file",
                    ) from None
                self._known[path] = keys
            return keys


@dataclass(frozen=True)
class ConnectOptions:
    """How to reach hosts: host-key policy and timeouts (and the SSH files they share)."""

    accept_new_host_keys: bool = False
    known_hosts: Path | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT
    files: SSHFiles = field(default_factory=SSHFiles, compare=False, repr=False)


class Closable(Protocol):
    def close(self) -> None: ...


class Connection(ABC):
    """Run commands and read or write files on one host; counts round trips."""

    def __init__(
        self, name: str, command_timeout: float, max_reply_mib: int = DEFAULT_MAX_REPLY_MIB
    ) -> None:
        self.name = name
        self.command_timeout = command_timeout
        self.max_reply = max_reply_mib << 20  # bytes
        self.round_trips = 0
        # Front ends that poll keep one agent process over the connection (agent.py): they
        # set `keeps_agent`; the agent kept, once started, is closed with the connection.
        # One per python: deployments of one host may run in different ones (a router in
        # its own venv), and a call reads the SGLang of the python it runs in.
        self.keeps_agent = False
        self.kept: dict[str, Closable] = {}
        self.kept_lock = threading.Lock()  # held while the kept agent is started or replaced

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        purpose: str | None = None,
    ) -> CommandResult:
        """Run a shell command (a string, or argv that gets quoted) and return its result.

        `purpose`: what was asked, in words, for a timeout's message (else the command's text,
        which for a generated script means nothing to the user).
        """
        text = command if isinstance(command, str) else join(command)
        self.round_trips += 1
        shown = purpose or _shorten(text)
        code, out, err = self._exec(text, stdin, timeout or self.command_timeout, shown)
        return CommandResult(text, code, out, err)

    def read_file(self, path: str, *, timeout: float | None = None) -> bytes:
        """Return a file's bytes; raise CommandError if it cannot be read."""
        return self.run(f"cat -- {quote(path)}", timeout=timeout).check(self.name).stdout_bytes

    def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write a file atomically: a temporary file in the same folder, then rename."""
        script = (
            f'set -e; target={quote(path)}; dir=$(dirname -- "$target"); mkdir -p -- "$dir"; '
            'tmp=$(mktemp "$dir/.deployctl.XXXXXX"); trap \'rm -f -- "$tmp"\' EXIT; '
            f'cat > "$tmp"; chmod {mode:o} "$tmp"; mv -f -- "$tmp" "$target"; trap - EXIT'
        )
        self.run(script, stdin=data).check(self.name)

    @abstractmethod
    def _exec(
        self, command: str, stdin: bytes | None, timeout: float, shown: str
    ) -> tuple[int, bytes, bytes]:
        """Run `command` through the host's shell; return (exit code, stdout, stderr).
        `shown` names the command in a timeout's message."""

    def start(
        self, command: str, until: bytes, timeout: float | None = None, purpose: str | None = None
    ) -> Held:
        """Start a command that goes on running (a held lock) and return once its output
        has a line containing `until`, or it ended. It runs until `Held.close()` closes
        its stdin, or until this process and its connection go. `purpose`: as for `run`."""
        self.round_trips += 1
        timeout = timeout or self.command_timeout
        late = f"{self.name}: no answer within {timeout:g}s: {purpose or _shorten(command)}"
        return self._start(command, until, timeout, late)

    def _start(self, command: str, until: bytes, timeout: float, late: str) -> Held:
        raise NotImplementedError(f"{type(self).__name__} cannot hold a command open")

    def reply_limit(self) -> Limit:
        """The most one command's output may take on this host."""
        return Limit(self.name, self.max_reply)

    def dial(self) -> None:  # noqa: B027 - optional hook
        """Start connecting now and return at once; the first command finishes the connect."""

    def close(self) -> None:
        """Release the connection, and first what is kept over it (agent.KeptAgent); a
        call still at work then fails, and starts no other kept agent."""
        self.keeps_agent = False
        kept, self.kept = self.kept, {}
        for each in list(kept.values()):
            each.close()
        self._disconnect()

    def _disconnect(self) -> None:  # noqa: B027 - optional hook
        """Release the connection itself."""


class Held(ABC):
    """A command left running by `Connection.start`: its output so far, and how to end it."""

    def __init__(self, output: bytes, ended: bool, limit: Limit) -> None:
        self.output = output  # stdout up to the awaited line (all of it if it ended)
        self.ended = ended  # it ended before that line: it holds nothing
        self.limit = limit  # for each reply read from it

    @abstractmethod
    def close(self, wait: float = 10) -> None:
        """Close its stdin and let it end (waiting up to `wait` seconds for it)."""

    @abstractmethod
    def send(self, data: bytes) -> None:
        """Write to its stdin (a kept agent's next request)."""

    def read_until(self, until: bytes, timeout: float, late: str) -> bytes:
        """Its output from here up to the end of the next line holding `until` (a kept
        agent's reply); ConnectError if it ended first, CommandTimeoutError (`late`) at
        `timeout`, AgentError past the reply's limit (the caller then closes it)."""
        out, ended = _read_until(
            self._read, self._fileno(), until, time.monotonic() + timeout, late, self.limit
        )
        if ended:
            raise ConnectError("the kept command ended")
        return out

    @abstractmethod
    def exit_code(self, wait: float = 0.5) -> int | None:
        """Its exit status once it has ended (waiting up to `wait` seconds for it to be
        known); None while it runs, or when its SSH connection (not the command itself)
        ended it."""

    @abstractmethod
    def _read(self) -> bytes: ...

    @abstractmethod
    def _fileno(self) -> int: ...


@dataclass(frozen=True)
class Limit:
    """The most bytes one reply may take, and the host's name for the error past it."""

    host: str
    most: int

    def check(self, size: int, what: str) -> None:
        """Refuse a reply that has grown past the limit (`what`: what was asked)."""
        if size > self.most:
            raise AgentError(
                f"{self.host}: more than {self.most >> 20} MiB came without an end ({what}); "
                "the command was ended there",
                hint="no host running deployctl's agent sends that much: look at the host; "
                "the max_reply_mib setting raises the limit",
            )


def _read_until(
    read: Any, fd: int, until: bytes, deadline: float, late: str, limit: Limit
) -> tuple[bytes, bool]:
    """Read `fd` (through `read`) until a line holds `until` or EOF: (output, ended); `late`:
    the timeout's message. Each chunk is searched once (a mark split between two chunks
    too); past `limit` it is an AgentError."""
    out = bytearray()
    mark = -1  # where `until` starts, once seen
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CommandTimeoutError(late)
        if not _wait_for(fd, select.POLLIN, min(remaining, 1.0)):
            continue
        chunk = read()
        if not chunk:
            return bytes(out), True
        seen = len(out)
        out += chunk
        if mark < 0:
            mark = out.find(until, max(0, seen - len(until) + 1))
        if mark >= 0 and out.find(b"\n", max(mark, seen)) >= 0:
            return bytes(out), False
        limit.check(len(out), "a reply")


class _LocalHeld(Held):
    def __init__(
        self, proc: subprocess.Popen[bytes], output: bytes, ended: bool, limit: Limit
    ) -> None:
        super().__init__(output, ended, limit)
        self.proc = proc

    def close(self, wait: float = 10) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc.stdout.close()

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError as exc:
            raise ConnectError(f"the kept command ended: {exc}") from None

    def exit_code(self, wait: float = 0.5) -> int | None:
        try:
            return self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            return None

    def _read(self) -> bytes:
        assert self.proc.stdout is not None
        return os.read(self.proc.stdout.fileno(), 1 << 16)

    def _fileno(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()


class _SSHHeld(Held):
    def __init__(self, channel: paramiko.Channel, output: bytes, ended: bool, limit: Limit) -> None:
        super().__init__(output, ended, limit)
        self.channel = channel

    def close(self, wait: float = 10) -> None:
        with contextlib.suppress(OSError, EOFError):
            self.channel.shutdown_write()
            if wait > 0:
                self.channel.status_event.wait(wait)
        self.channel.close()

    def send(self, data: bytes) -> None:
        try:
            self.channel.sendall(data)
        except (OSError, EOFError) as exc:
            raise ConnectError(f"the kept command ended: {exc or type(exc).__name__}") from None

    def exit_code(self, wait: float = 0.5) -> int | None:
        if not self.channel.status_event.wait(wait):
            return None
        code = self.channel.recv_exit_status()
        return None if code == -1 else code

    def _read(self) -> bytes:
        return bytes(self.channel.recv(1 << 16))

    def _fileno(self) -> int:
        return int(self.channel.fileno())


class LocalConnection(Connection):
    """This machine, through /bin/sh."""

    @staticmethod
    def _shell(command: str, stderr: int) -> subprocess.Popen[bytes]:
        # A session of its own lets a timeout end everything the command started in the
        # foreground, and keeps the user's Ctrl-C to deployctl from ending what it holds.
        return subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )

    def _exec(
        self, command: str, stdin: bytes | None, timeout: float, shown: str
    ) -> tuple[int, bytes, bytes]:
        proc = self._shell(command, subprocess.PIPE)
        try:
            out, err = proc.communicate(stdin or b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise CommandTimeoutError(
                f"{self.name}: command timed out after {timeout:g}s: {shown}"
            ) from None
        return proc.returncode, out, err

    def _start(self, command: str, until: bytes, timeout: float, late: str) -> Held:
        proc = self._shell(command, subprocess.DEVNULL)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        limit = self.reply_limit()
        try:
            out, ended = _read_until(
                lambda: os.read(fd, 1 << 16), fd, until, time.monotonic() + timeout, late, limit
            )
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return _LocalHeld(proc, out, ended, limit)


class SSHConnection(Connection):
    """A host over SSH (fabric/paramiko) with verified host keys; connects on first use."""

    def __init__(self, host: Host, options: ConnectOptions) -> None:
        own = host.settings
        super().__init__(
            host.name, _either(own.command_timeout, options.command_timeout), own.max_reply_mib
        )
        self.host = host
        self.options = options
        self.connect_timeout = _either(own.connect_timeout, options.connect_timeout)
        self._client: paramiko.SSHClient | None = None
        # From dial(): the fabric connection, its socket still connecting, and its deadline.
        self._dialed: tuple[fabric.Connection, socket.socket, float] | None = None
        self._lock = threading.Lock()
        # Counts close() calls: a connect under way when one comes closes what it opened.
        self._closes = 0

    def _known_hosts_path(self, ssh_config: dict[str, Any]) -> Path:
        configured = self.host.settings.known_hosts_file or self.options.known_hosts
        if configured:
            return Path(os.path.expanduser(str(configured)))
        from_config = ssh_config.get("userknownhostsfile")
        if from_config:
            return Path(os.path.expanduser(str(from_config).split()[0]))
        return Path.home() / ".ssh" / "known_hosts"

    def _fabric_connection(self) -> fabric.Connection:
        """The host as ssh_config resolves it (address, port, user, proxy); not yet open."""
        host = self.host
        connect_kwargs: dict[str, Any] = {
            "banner_timeout": self.connect_timeout,
            "auth_timeout": self.connect_timeout,
            "transport_factory": _transport_class(),
        }
        if host.key_file:
            connect_kwargs["key_filename"] = [host.key_file]
        return _fabric_connection_class()(
            host.address,
            user=host.user,
            port=host.port,
            config=self.options.files.config(),
            connect_timeout=self.connect_timeout,
            connect_kwargs=connect_kwargs,
        )

    def dial(self) -> None:
        """Start the TCP connect without waiting for it. A fleet command dials its first
        batch of hosts at once, so every sshd is starting up while this process's threads
        still take turns with the handshakes. Only a direct connect to an address (no proxy,
        no name to look up here) is dialed; anything else, failures included, is left to the
        connect proper, which reports it in the host's own thread."""
        with self._lock:
            if self._client is not None or self._dialed is not None:
                return
            sock = None
            try:
                conn = self._fabric_connection()
                if conn.gateway:
                    return
                address = ipaddress.ip_address(conn.host)
                family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.setblocking(False)
                if sock.connect_ex((str(address), conn.port)) in (0, errno.EINPROGRESS):
                    self._dialed = (conn, sock, time.monotonic() + self.connect_timeout)
                    return
            except Exception:  # the connect proper reports it, in the host's thread
                pass
            if sock is not None:
                sock.close()

    def _finish_dial(self, sock: socket.socket, deadline: float) -> socket.socket:
        """Wait for a dialed socket to connect. Fails as socket.create_connection does, so a
        dialed host and any other read the same to the user."""
        try:
            if not _wait_for(sock.fileno(), select.POLLOUT, max(0.0, deadline - time.monotonic())):
                raise TimeoutError("timed out")
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, os.strerror(error))
        except BaseException:
            sock.close()
            raise
        sock.settimeout(self.connect_timeout)
        return sock

    def _connect(self) -> paramiko.SSHClient:
        import paramiko

        dialed, self._dialed = self._dialed, None
        conn = dialed[0] if dialed is not None else self._fabric_connection()
        client: paramiko.SSHClient = conn.client
        known_hosts = self._known_hosts_path(dict(conn.ssh_config))
        shared = self.options.files.host_keys(known_hosts)
        name = known_hosts_name(conn.host, conn.port)
        for key_type, key in (shared.lookup(name) or {}).items():  # this host's keys only
            client.get_host_keys().add(name, key_type, key)
        # Fabric's default policy accepts any key; ours refuses or records like `accept-new`.
        policy = (
            _AcceptNewPolicy(known_hosts, shared)
            if self.options.accept_new_host_keys
            else _RejectPolicy()
        )
        client.set_missing_host_key_policy(cast("paramiko.MissingHostKeyPolicy", policy))
        where = f"{conn.user}@{conn.host}:{conn.port}"
        sock: socket.socket | None = None
        try:
            try:
                if dialed is not None:
                    sock = self._finish_dial(dialed[1], dialed[2])
                elif not conn.gateway:
                    sock = socket.create_connection(
                        (conn.host, conn.port), timeout=self.connect_timeout
                    )
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conn.connect_kwargs["sock"] = sock
                conn.open()
            except BaseException:
                # paramiko leaves a failed handshake's transport thread and socket behind.
                client.close()
                if sock is not None:
                    sock.close()
                raise
        except _UnknownHostKey as exc:
            raise HostKeyError(
                f"{self.name}: host key of {exc.hostname} is not known ({exc.key_type}) in {known_hosts}",
                hint="check the key, then connect once with --accept-new-host-keys to record it",
            ) from None
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"{self.name}: host key of {exc.hostname} has CHANGED (got {exc.key.get_name()}); "
                "refusing to connect",
                hint=f"if the host was really reinstalled, remove the old key: ssh-keygen -R {exc.hostname!r} "
                f"-f {known_hosts}",
            ) from None
        except paramiko.AuthenticationException as exc:
            raise ConnectError(
                f"{self.name}: authentication failed for {where}: {exc}",
                hint="check ansible_user and ansible_ssh_private_key_file, or your ssh-agent",
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            reason = str(exc) or type(exc).__name__
            error = _DroppedError if _dropped_in_handshake(exc) else ConnectError
            raise error(f"{self.name}: cannot connect to {where}: {reason}") from None
        return client

    def _connect_or_retry(self) -> paramiko.SSHClient:
        try:
            return self._connect()
        except _DroppedError:
            time.sleep(random.uniform(*HANDSHAKE_RETRY_DELAY))
        return self._connect()

    def _client_or_connect(self) -> paramiko.SSHClient:
        with self._lock:
            transport = self._client.get_transport() if self._client is not None else None
            if self._client is not None and (transport is None or not transport.is_active()):
                # The host dropped us (sshd restarted, a network blip): connect afresh, its
                # key verified again, so a long-lived fleet (top, watch) outlives the outage.
                self._client.close()
                self._client = None
            if self._client is None:
                closes = self._closes
                client = self._connect_or_retry()
                if self._closes != closes:  # closed while connecting: its caller has gone
                    client.close()
                    raise ConnectError(f"{self.name}: the connection was closed")
                self._client = client
            return self._client

    def _exec(
        self, command: str, stdin: bytes | None, timeout: float, shown: str
    ) -> tuple[int, bytes, bytes]:
        import paramiko

        client = self._client_or_connect()
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self.name}: the SSH connection was lost")
        deadline = time.monotonic() + timeout
        out: list[bytes] = []
        err: list[bytes] = []
        expired = threading.Event()
        watchdog: threading.Timer | None = None
        timed_out = f"{self.name}: command timed out after {timeout:g}s: {shown}"
        try:
            # Every blocking step has a timeout, so a host that goes silent cannot hang us.
            channel = transport.open_session(timeout=min(timeout, self.connect_timeout))
            channel.settimeout(timeout)
            watchdog = _close_at(channel, deadline, expired)
            channel.exec_command(command)
            if stdin:
                try:
                    channel.sendall(stdin)
                except OSError:
                    # A command that ends without reading its input (one that fails at once)
                    # closes the channel under us; its output and exit code are the answer.
                    if not channel.closed:
                        raise
            channel.shutdown_write()
            # Read until EOF, not until the exit status: sshd may send the status first.
            limit, size = self.reply_limit(), 0
            while True:
                size += _drain(channel, out, err, limit.most - size)
                if size > limit.most:
                    channel.close()
                    limit.check(size, shown)
                if (channel.eof_received or channel.closed) and not (
                    channel.recv_ready() or channel.recv_stderr_ready()
                ):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    channel.close()
                    raise CommandTimeoutError(timed_out)
                # The channel's pipe wakes us on stdout or stderr data and on EOF.
                _wait_for(channel.fileno(), select.POLLIN, min(remaining, 1.0))
            if expired.is_set():
                raise CommandTimeoutError(timed_out)
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                channel.close()
                raise CommandTimeoutError(
                    f"{self.name}: no exit status within {timeout:g}s: {shown}"
                )
            code = channel.recv_exit_status()
            if expired.is_set():
                raise CommandTimeoutError(timed_out)
            if code == -1:  # no exit status: a signal ended the command, or the connection
                transport.join(0.5)  # a dropped one closes its channels just before it ends
                if not transport.is_active():
                    raise ConnectError(f"{self.name}: the SSH connection was lost")
            channel.close()
        except TimeoutError:
            raise CommandTimeoutError(
                f"{self.name}: no answer within {timeout:g}s: {shown}"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if expired.is_set():
                raise CommandTimeoutError(timed_out) from None
            if "Timeout opening channel" in str(exc):  # the host went silent: a timeout too
                raise CommandTimeoutError(
                    f"{self.name}: no answer within {timeout:g}s: {shown}"
                ) from None
            raise ConnectError(f"{self.name}: SSH failure: {exc or type(exc).__name__}") from None
        finally:
            if watchdog is not None:
                watchdog.cancel()
        return code, b"".join(out), b"".join(err)

    def _start(self, command: str, until: bytes, timeout: float, late: str) -> Held:
        import paramiko

        transport = self._client_or_connect().get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self.name}: the SSH connection was lost")
        deadline = time.monotonic() + timeout
        try:
            channel = transport.open_session(timeout=min(timeout, self.connect_timeout))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(f"{self.name}: SSH failure: {exc or type(exc).__name__}") from None
        limit = self.reply_limit()
        expired = threading.Event()
        watchdog: threading.Timer | None = None
        try:
            watchdog = _close_at(channel, deadline, expired)
            channel.exec_command(command)
            watchdog.cancel()
            if expired.is_set():  # it answered just as the deadline closed the channel
                raise CommandTimeoutError(late)
            out, ended = _read_until(
                lambda: channel.recv(1 << 16), channel.fileno(), until, deadline, late, limit
            )
        except (paramiko.SSHException, OSError, EOFError) as exc:
            channel.close()
            if expired.is_set():
                raise CommandTimeoutError(late) from None
            raise ConnectError(f"{self.name}: SSH failure: {exc or type(exc).__name__}") from None
        except BaseException:
            channel.close()
            raise
        finally:
            if watchdog is not None:
                watchdog.cancel()
        return _SSHHeld(channel, out, ended, limit)

    def _disconnect(self) -> None:
        self._closes += 1
        # A connect holds the lock for its whole handshake (TCP, banner, auth, one retry: up
        # to ~4 connect timeouts); a command leaving on Ctrl-C must not wait for it, and that
        # connect closes its own client when it ends. Other holders keep it for microseconds.
        if not self._lock.acquire(timeout=CLOSE_WAIT):
            return
        try:
            if self._dialed is not None:  # dialed, never used
                self._dialed[1].close()
                self._dialed = None
            if self._client is not None:
                self._client.close()
                self._client = None
        finally:
            self._lock.release()


def _close_at(
    channel: paramiko.Channel, deadline: float, expired: threading.Event
) -> threading.Timer:
    """A started timer that closes `channel` at `deadline` and sets `expired`. exec_command
    waits for the server's reply without any timeout: closing the channel is what ends that
    wait (and any other) on a host silent since the channel opened."""
    import paramiko

    def expire() -> None:
        expired.set()
        # A connection lost meanwhile has closed the channel already: nothing to end.
        with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
            channel.close()

    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
    watchdog.daemon = True
    watchdog.start()
    return watchdog


def _wait_for(fd: int, event: int, timeout: float) -> bool:
    """Wait until `fd` is ready for `event` (POLLIN, POLLOUT); False when `timeout` passed.
    poll, not select: a fleet of a thousand hosts holds more than select's 1,024 descriptors."""
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(timeout * 1000))


def _drain(channel: paramiko.Channel, out: list[bytes], err: list[bytes], room: int) -> int:
    """Read what has come on stdout and stderr, stopping once past `room` bytes (a host that
    sends faster than we read never keeps us here); how many bytes were read."""
    size = 0
    while size <= room and channel.recv_ready():
        out.append(channel.recv(1 << 16))
        size += len(out[-1])
    while size <= room and channel.recv_stderr_ready():
        err.append(channel.recv_stderr(1 << 16))
        size += len(err[-1])
    return size


class _DroppedError(ConnectError):
    """The host closed the connection during the handshake: worth one more try."""


def _dropped_in_handshake(exc: BaseException) -> bool:
    """Did the host accept the connection, then close it before we were in (sshd's
    MaxStartups)? Not a timeout, a refusal or an error that another try would repeat."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(chain) < 8:  # paramiko wraps the socket's error
        chain.append(link)
        link = link.__cause__ or link.__context__
    closed = (EOFError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
    return any(isinstance(e, closed) for e in chain)


class _UnknownHostKey(Exception):
    def __init__(self, hostname: str, key_type: str) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key_type = key_type


class _RejectPolicy:
    """Refuse a host whose key is not in known_hosts."""

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        raise _UnknownHostKey(hostname, key.get_name())


class _AcceptNewPolicy:
    """Record an unknown key in known_hosts, like OpenSSH's StrictHostKeyChecking=accept-new."""

    def __init__(self, path: Path, shared: paramiko.HostKeys) -> None:
        self.path = path
        self.shared = shared

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        from paramiko.hostkeys import HostKeyEntry

        client.get_host_keys().add(hostname, key.get_name(), key)
        line = HostKeyEntry([hostname], key).to_line() or ""
        with _KNOWN_HOSTS_LOCK:
            # A full disk must not leave half a line behind: all of it or nothing.
            append_file(self.path, line.encode())
            self.shared.add(hostname, key.get_name(), key)


def open_connection(host: Host, options: ConnectOptions) -> Connection:
    """Return the connection for a host: local or SSH, by its ansible_connection."""
    if host.is_local:
        return LocalConnection(
            host.name,
            _either(host.settings.command_timeout, options.command_timeout),
            host.settings.max_reply_mib,
        )
    return SSHConnection(host, options)


def _either(configured: float | None, default: float) -> float:
    """The host's own timeout, else the connect options' (0 is a value, not 'unset')."""
    return default if configured is None else configured
