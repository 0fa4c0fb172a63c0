"""The one connection interface, exercised the same way locally and over real sshd."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployctl import connection
from deployctl.connection import (
    Connection,
    ConnectOptions,
    LocalConnection,
    SSHConnection,
)
from deployctl.errors import AgentError, CommandError, CommandTimeoutError, ConnectError
from deployctl.inventory import Host
from tests.sshd_hosts import SSHLab, free_port


def ssh_host(lab: SSHLab, name: str, **extra: object) -> Host:
    return Host(
        name,
        {
            **lab.hosts[name].inventory_vars(lab.client_key),
            "known_hosts_file": str(lab.known_hosts),
            **extra,
        },
    )


@pytest.fixture(params=["local", "ssh"])
def conn(request: pytest.FixtureRequest, hosts: SSHLab) -> Iterator[Connection]:
    if request.param == "local":
        connection: Connection = LocalConnection("local", 30)
    else:
        connection = SSHConnection(ssh_host(hosts, "alpha"), ConnectOptions())
    yield connection
    connection.close()


def test_run_returns_exit_code_stdout_and_stderr(conn: Connection) -> None:
    result = conn.run("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    with pytest.raises(CommandError, match=r"exited 3.*err"):
        result.check(conn.name)


def test_argv_is_quoted_so_values_stay_single_arguments(conn: Connection) -> None:
    value = "a b; echo pwned $(id) `id` 'q' \"d\"\nline2"
    result = conn.run(["printf", "%s|", value, "-x"])
    assert result.stdout == value + "|-x|"


def test_stdin_and_large_output_on_both_streams(conn: Connection) -> None:
    big = conn.run(
        "head -c 3000000 /dev/zero | tr '\\0' o; head -c 3000000 /dev/zero | tr '\\0' e >&2"
    )
    assert len(big.stdout) == 3_000_000 and len(big.stderr) == 3_000_000
    assert conn.run("wc -c", stdin=b"x" * 100_000).stdout.strip() == "100000"


def test_a_command_that_ends_before_reading_its_input_reports_its_own_exit(
    conn: Connection,
) -> None:
    """A host-side call that fails at once (a state dir that is a file) closes the channel
    while its input is still being sent: the answer is its output and exit code, not a
    failure of the connection."""
    for _ in range(5):
        result = conn.run("echo cannot start >&2; exit 4", stdin=b"x" * 4_000_000)
        assert (result.exit_code, result.stderr) == (4, "cannot start\n")


def test_write_file_is_atomic_and_read_back(conn: Connection, tmp_path: Path) -> None:
    target = conn.run("mktemp -d").stdout.strip() + "/sub/file.txt"
    conn.write_file(target, b"one\x00two", mode=0o600)
    assert conn.read_file(target) == b"one\x00two"
    assert conn.run(["stat", "-c", "%a", target]).stdout.strip() == "600"
    conn.write_file(target, b"replaced")
    assert conn.read_file(target) == b"replaced"
    leftovers = conn.run(["sh", "-c", 'ls -A "$(dirname "$1")"', "sh", target]).stdout.split()
    assert leftovers == ["file.txt"]


def test_reading_a_missing_file_is_an_error(conn: Connection) -> None:
    with pytest.raises(CommandError, match="No such file"):
        conn.read_file("/nonexistent/deployctl-test")


def test_command_timeout_is_bounded(conn: Connection) -> None:
    start = time.monotonic()
    with pytest.raises(CommandTimeoutError, match="timed out"):
        conn.run("sleep 60", timeout=0.5)
    took = time.monotonic() - start
    # Not the command's 60 s; a loaded machine (load 20) took 3.8 s to connect and time out.
    assert took < 20, f"took {took:.2f}s, bound 20s (timeout 0.5 s)"


def test_round_trips_are_counted(conn: Connection) -> None:
    for _ in range(3):
        conn.run("true")
    conn.read_file("/etc/hostname")
    assert conn.round_trips == 4


def test_ssh_connection_is_opened_once_and_reused(hosts: SSHLab) -> None:
    conn = SSHConnection(ssh_host(hosts, "alpha"), ConnectOptions())
    try:
        first = conn.run("echo $PPID").stdout
        transport = conn._client.get_transport() if conn._client else None
        second = conn.run("echo $PPID").stdout
        assert conn._client is not None and conn._client.get_transport() is transport
        assert first and second
    finally:
        conn.close()


def test_a_dropped_connection_is_opened_again_once_the_host_is_back(hosts: SSHLab) -> None:

    bravo = hosts.hosts["bravo"]
    conn = SSHConnection(ssh_host(hosts, "bravo", connect_timeout=2), ConnectOptions())
    try:
        assert conn.run("echo up").stdout == "up\n"
        bravo.go_away()  # sshd and our session with it are gone
        with pytest.raises(ConnectError):
            conn.run("echo down")
        bravo.start()
        assert conn.run("echo back").stdout == "back\n"  # the same connection object
    finally:
        bravo.ensure_running()
        conn.close()


def pending_handshake(address: str, port: int) -> socket.socket:
    """A connection sshd has taken (it sent its banner) that never authenticates."""
    sock = socket.create_connection((address, port), timeout=5)
    deadline = time.monotonic() + 5
    while True:  # until a banner: sshd may still count its own start-up probe and drop this
        if sock.recv(256).startswith(b"SSH-2.0-"):
            return sock
        assert time.monotonic() < deadline, "sshd sent no banner"
        sock.close()
        time.sleep(0.05)
        sock = socket.create_connection((address, port), timeout=5)


def test_a_connection_dropped_in_the_handshake_gets_one_more_try(
    hosts: SSHLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sshd's MaxStartups drops a connection that arrives while too many handshakes are
    pending, as a burst of hundreds of hosts can make it: a second try, after a pause, gets in."""
    bravo = hosts.hosts["bravo"]
    config = bravo.etc / "sshd_config"
    usual = config.read_text()
    assert "\nMaxStartups 500:30:1000\n" in usual
    # Each try, told by its outcome, with when it began and ended.
    tries: list[tuple[str, float, float]] = []
    pending: list[socket.socket] = []
    held: socket.socket | None = None
    real_connect = SSHConnection._connect

    def counted(self: SSHConnection) -> Any:
        began = time.monotonic()
        try:
            client = real_connect(self)
        except ConnectError as exc:
            tries.append((type(exc).__name__, began, time.monotonic()))
            while pending:  # the pending handshake gives up once it made us drop
                pending.pop().close()
            raise
        tries.append(("in", began, time.monotonic()))
        return client

    monkeypatch.setattr(SSHConnection, "_connect", counted)
    # The pause, long enough for a loaded machine's sshd to see the pending handshake go.
    monkeypatch.setattr(connection, "HANDSHAKE_RETRY_DELAY", (2.0, 2.5))
    bravo.stop()
    # One pending handshake is all it takes: drop every other connection meanwhile.
    config.write_text(usual.replace("\nMaxStartups 500:30:1000\n", "\nMaxStartups 1:100:1\n"))
    bravo.start()
    try:
        pending.append(pending_handshake(bravo.address, bravo.port))
        conn = SSHConnection(ssh_host(hosts, "bravo", connect_timeout=20), ConnectOptions())
        assert conn.run("echo in").stdout == "in\n"
        conn.close()
        assert [outcome for outcome, _, _ in tries] == ["_DroppedError", "in"], tries
        pause = tries[1][1] - tries[0][2]
        assert 2.0 <= pause < 2.5 + 2, f"paused {pause:.2f}s, bounds 2.0s to 4.5s"

        # Still dropped on the second try: one line, that says what happened.
        tries.clear()
        held = pending_handshake(bravo.address, bravo.port)  # held through both tries
        conn = SSHConnection(ssh_host(hosts, "bravo", connect_timeout=20), ConnectOptions())
        with pytest.raises(ConnectError) as caught:
            conn.run("true")
        assert [outcome for outcome, _, _ in tries] == ["_DroppedError", "_DroppedError"], tries
        pause = tries[1][1] - tries[0][2]
        assert pause >= 2.0, f"paused {pause:.2f}s, bound 2.0s"
        assert str(caught.value).startswith("bravo: cannot connect to ")
        assert "Error reading SSH protocol banner" in str(caught.value)
        held.close()

        # A refusal is not a drop: no second try, no pause.
        tries.clear()
        nobody = ssh_host(hosts, "bravo", ansible_port=free_port(bravo.address))
        with pytest.raises(ConnectError, match="Connection refused"):
            SSHConnection(nobody, ConnectOptions()).run("true")
        assert [outcome for outcome, _, _ in tries] == ["ConnectError"], tries
    finally:
        for sock in pending:
            sock.close()
        if held is not None:
            held.close()
        config.write_text(usual)
        bravo.stop()
        bravo.start()


def test_host_that_goes_silent_mid_session_times_out(hosts: SSHLab) -> None:
    silent = hosts.hosts["bravo"]
    conn = SSHConnection(ssh_host(hosts, "bravo", connect_timeout=2), ConnectOptions())
    try:
        assert conn.run("echo up").stdout == "up\n"
        silent.pause()
        start = time.monotonic()
        with pytest.raises(
            CommandTimeoutError, match=r"bravo: no answer within 2s: echo still-there"
        ):
            conn.run("echo still-there", timeout=2)
        took = time.monotonic() - start
        assert took < 6, f"took {took:.2f}s, bound 6s (timeout 2 s)"
    finally:
        silent.resume()
        conn.close()


def test_agent_call_to_a_silent_host_says_what_was_asked_in_words(hosts: SSHLab) -> None:
    """A timeout names the request, not the generated shell script that carries it."""
    from deployctl import agent

    silent = hosts.hosts["bravo"]
    host = ssh_host(hosts, "bravo", connect_timeout=2, command_timeout=2)
    conn = SSHConnection(host, ConnectOptions())
    try:
        assert conn.run("echo up").stdout == "up\n"
        silent.pause()
        args = agent.proto.StatusArgs(
            state_dir=host.settings.state_dir, deployment=None, run=None, tail_bytes=0,
            metrics_bytes=0,
        )  # fmt: skip
        with pytest.raises(CommandTimeoutError) as caught:
            agent.call(host, conn, agent.STATUS, args)
        message = str(caught.value)
        assert message.startswith("bravo: no answer within 2s: ")
        assert "asked to read the deployments' status" in message
        assert "mktemp" not in message and "python" not in message
    finally:
        silent.resume()
        conn.close()


def test_silent_host_before_connecting_is_bounded(hosts: SSHLab) -> None:
    silent = hosts.hosts["charlie"]
    silent.pause()
    conn = SSHConnection(ssh_host(hosts, "charlie", connect_timeout=1), ConnectOptions())
    try:
        start = time.monotonic()
        with pytest.raises(ConnectError, match="cannot connect"):
            conn.run("true")
        took = time.monotonic() - start
        # connect_timeout, not paramiko's own 15 s banner wait; a loaded machine (load 40)
        # measured 5 s more than the timeout.
        assert took < 12, f"took {took:.2f}s, bound 12s (connect_timeout 1 s)"
    finally:
        silent.resume()
        conn.close()


def test_refused_authentication_is_a_clear_error(
    hosts: SSHLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retry would first wait 30 s: a loaded machine's slow handshake is not taken for one.
    monkeypatch.setattr(connection, "HANDSHAKE_RETRY_DELAY", (30.0, 30.0))
    other_key = tmp_path / "other_key"
    import subprocess

    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True
    )
    host = ssh_host(hosts, "alpha", ansible_ssh_private_key_file=str(other_key))
    conn = SSHConnection(host, ConnectOptions())
    before = set(threading.enumerate())
    began = time.monotonic()
    with pytest.raises(ConnectError, match="authentication failed"):
        conn.run("true")
    took = time.monotonic() - began
    assert took < 20, f"took {took:.2f}s, bound 20s: tried again after a 30 s pause"
    # Nothing of the failed handshake is left behind: its transport thread (and socket) end.
    for thread in set(threading.enumerate()) - before:
        thread.join(2)
        assert not thread.is_alive(), thread


def test_known_hosts_and_ssh_config_are_read_once_for_all_hosts(
    hosts: SSHLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet command shares what is the same for every host: read per host, a
    known_hosts listing the whole fleet made the command quadratic in its size."""
    import fabric
    import paramiko

    reads: list[str] = []
    configs: list[object] = []
    real_load, real_init = paramiko.HostKeys.load, fabric.Config.__init__

    def counting_load(self: paramiko.HostKeys, filename: str) -> None:
        reads.append(filename)
        real_load(self, filename)

    def counting_init(self: fabric.Config, *args: object, **kwargs: object) -> None:
        configs.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(paramiko.HostKeys, "load", counting_load)
    monkeypatch.setattr(fabric.Config, "__init__", counting_init)
    options = ConnectOptions()
    connections = [SSHConnection(ssh_host(hosts, name), options) for name in hosts.hosts]
    try:
        assert [c.run("echo ok").stdout for c in connections] == ["ok\n"] * len(hosts.hosts)
    finally:
        for connection in connections:
            connection.close()
    assert reads == [str(hosts.known_hosts)] and len(configs) == 1
    # Nobody wrote to the shared config: each write re-merges it, which empties it for a
    # moment under the other hosts' threads (fabric's `inline_ssh_env` did, until declared).
    assert options.files.config()._modifications == {}
    # Each host was still checked against its own key: an unknown one is refused.
    stranger = SSHConnection(
        ssh_host(hosts, "alpha", known_hosts_file=str(hosts.known_hosts) + ".empty"), options
    )
    with pytest.raises(ConnectError, match=r"host key of .* is not known"):
        stranger.run("true")


def test_known_hosts_names_a_host_off_port_22_with_its_port() -> None:
    from deployctl.connection import known_hosts_name

    assert known_hosts_name("gpu-1", 22) == "gpu-1"
    assert known_hosts_name("10.0.0.5", 2222) == "[10.0.0.5]:2222"


def test_accept_new_records_a_key_once_however_many_connections_ask(
    hosts: SSHLab, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    options = ConnectOptions(accept_new_host_keys=True, known_hosts=known)
    host = ssh_host(hosts, "alpha", known_hosts_file="")  # so the option names the file
    first, second = SSHConnection(host, options), SSHConnection(host, options)
    try:
        assert first.run("echo one").stdout == "one\n"
        assert second.run("echo two").stdout == "two\n"  # the key is known by now
    finally:
        first.close()
        second.close()
    [line] = known.read_text().splitlines()
    assert line.startswith(f"[{hosts.hosts['alpha'].address}]:{hosts.hosts['alpha'].port} ")


def test_commands_run_with_more_descriptors_open_than_select_can_watch(hosts: SSHLab) -> None:
    """A fleet of about a thousand hosts holds more than 1,024 descriptors; waiting on a
    channel numbered beyond that must still work (select() raised ValueError there)."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    conn = SSHConnection(ssh_host(hosts, "alpha"), ConnectOptions())
    try:
        assert conn.run("echo ok; echo err >&2").stdout == "ok\n"
        assert conn._client is not None
        assert conn._client.get_transport().sock.fileno() > 1024  # type: ignore[union-attr]
    finally:
        conn.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_dialed_connection_is_the_one_the_session_uses(hosts: SSHLab) -> None:
    conn = SSHConnection(ssh_host(hosts, "alpha"), ConnectOptions())
    try:
        conn.dial()
        assert conn._dialed is not None
        dialed = conn._dialed[1]
        assert conn.run("echo ok").stdout == "ok\n"
        assert conn._client is not None and conn._client.get_transport().sock is dialed  # type: ignore[union-attr]
        conn.dial()  # connected already: nothing more to dial
        assert conn._dialed is None
    finally:
        conn.close()


def test_a_dialed_host_that_refuses_fails_as_one_connected_later_does(hosts: SSHLab) -> None:
    alpha = hosts.hosts["alpha"]
    host = ssh_host(hosts, "alpha", ansible_port=free_port(alpha.address))  # nothing listens
    messages = []
    for dial in (True, False):
        conn = SSHConnection(host, ConnectOptions())
        if dial:
            conn.dial()
            assert conn._dialed is not None
        with pytest.raises(ConnectError) as caught:
            conn.run("true")
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert "Connection refused" in messages[0]


def test_closing_a_dialed_connection_that_was_never_used_closes_its_socket(
    hosts: SSHLab,
) -> None:
    conn = SSHConnection(ssh_host(hosts, "alpha"), ConnectOptions())
    conn.dial()
    assert conn._dialed is not None
    dialed = conn._dialed[1]
    conn.close()
    assert dialed.fileno() == -1 and conn._dialed is None


def test_a_fleet_dials_its_first_batch_of_hosts_before_any_starts_work(hosts: SSHLab) -> None:
    """With --forks 2, the first two hosts' connects are under way before either host's
    operation starts; the third connects when a worker is free, as before."""
    from deployctl.fanout import Fleet

    selected = [ssh_host(hosts, name) for name in ("alpha", "bravo", "charlie")]
    dialed_at_start: dict[str, bool] = {}

    def operation(host: Host, conn: Connection) -> str:
        assert isinstance(conn, SSHConnection)
        dialed_at_start[host.name] = conn._dialed is not None
        return conn.run("echo ok").stdout

    with Fleet(selected, ConnectOptions(), forks=2) as fleet:
        results = fleet.run(operation)
    assert [r.value for r in results] == ["ok\n"] * 3
    assert dialed_at_start == {"alpha": True, "bravo": True, "charlie": False}


def test_an_idle_connection_wakes_its_thread_about_once_a_second(
    hosts: SSHLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept connections (top, watch, hundreds of hosts) must cost next to nothing between
    commands: paramiko's transport thread wakes on each socket timeout to check itself."""
    from paramiko.packet import Packetizer

    wakes: list[float] = []
    real = Packetizer._check_keepalive

    def counting(self: Packetizer) -> None:
        wakes.append(time.monotonic())
        real(self)

    monkeypatch.setattr(Packetizer, "_check_keepalive", counting)
    conn = SSHConnection(ssh_host(hosts, "alpha"), ConnectOptions())
    try:
        assert conn.run("echo ok").stdout == "ok\n"
        wakes.clear()
        time.sleep(3)
        # paramiko's own 0.1 s made it about 30.
        assert 1 <= len(wakes) <= 4, f"{len(wakes)} wakes in 3 s, bounds 1 to 4: {wakes}"
    finally:
        conn.close()


def test_a_host_known_by_name_is_not_dialed_ahead(hosts: SSHLab) -> None:
    """A name would be looked up in the dialing thread, one host after another: only
    addresses are dialed ahead; a name is looked up by its own thread when it connects."""
    conn = SSHConnection(ssh_host(hosts, "alpha", ansible_host="localhost"), ConnectOptions())
    conn.dial()
    assert conn._dialed is None
    conn.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_timeout_whose_channel_is_already_gone_raises_nothing_in_its_thread(
    hosts: SSHLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog that ends a command at its timeout closes the channel; a connection lost
    meanwhile makes that close fail, which must stay in the watchdog (the CLI would print the
    thread's traceback)."""
    from paramiko import Channel

    real_close = Channel.close

    def close(self: Channel) -> None:
        if isinstance(threading.current_thread(), threading.Timer):
            raise EOFError  # what a close over a transport that has gone raises
        real_close(self)

    monkeypatch.setattr(Channel, "close", close)
    conn = SSHConnection(ssh_host(hosts, "alpha"), ConnectOptions())
    try:
        with pytest.raises(CommandTimeoutError, match=r"timed out after 0\.5s"):
            conn.run("sleep 10", timeout=0.5)
    finally:
        conn.close()


def test_closing_does_not_wait_for_a_connect_under_way(tmp_path: Path) -> None:
    """A second Ctrl-C closes the fleet while a worker thread is connecting to a silent host
    (TCP up, no SSH banner): the close must not wait out the handshake's timeouts."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    host = Host(
        "silent",
        {
            "ansible_host": "127.0.0.1",
            "ansible_port": port,
            "ansible_user": "nobody",
            "connect_timeout": 20,
            "known_hosts_file": str(tmp_path / "known_hosts"),
        },
    )
    conn = SSHConnection(host, ConnectOptions())
    failures: list[BaseException] = []

    def connect() -> None:
        try:
            conn.run("true")
        except BaseException as exc:  # kept for the assertion below
            failures.append(exc)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    accepted, _ = listener.accept()  # the worker is now waiting for the banner
    try:
        start = time.monotonic()
        conn.close()
        took = time.monotonic() - start
        assert took < 2, f"close took {took:.2f}s, bound 2s (connect_timeout 20 s)"
    finally:
        accepted.close()  # the handshake fails now, and the worker ends
        listener.close()
    worker.join(10)
    assert not worker.is_alive()
    assert failures and isinstance(failures[0], ConnectError)


# ---- a reply is read once and only so far --------------------------------------------------


class FakeStream:
    """Chunks as a host would send them, through a descriptor that is always ready."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.read_bytes = chunks, 0
        self.ready, writer = os.pipe()
        os.write(writer, b"!")  # never read: poll says "ready" every time
        os.close(writer)

    def read(self) -> bytes:
        chunk = next(self.chunks, b"")
        self.read_bytes += len(chunk)
        return chunk

    def close(self) -> None:
        os.close(self.ready)


def test_a_reply_split_in_small_chunks_is_searched_once_and_a_split_mark_found() -> None:
    mark = b"@@deployctl-reply@@ "
    junk = itertools.repeat(b"x" * 4096, 8192)  # 32 MiB before the reply line
    # The mark and the line's end come split across chunks.
    tail = iter([b"motd\n@@deployctl-re", b"ply@@ {", b'"ok": 1}', b"\nafter"])
    stream = FakeStream(itertools.chain(junk, tail))
    limit = connection.Limit("flood", 64 << 20)
    began = time.process_time()
    try:
        out, ended = connection._read_until(
            stream.read, stream.ready, mark, time.monotonic() + 60, "late", limit
        )
    finally:
        stream.close()
    took = time.process_time() - began
    assert not ended and out.endswith(b'motd\n@@deployctl-reply@@ {"ok": 1}\nafter')
    # Each byte searched once: ~0.1 s here. Searching the whole output again for each of
    # 8,196 chunks (and copying it) is ~275 GB of work: minutes.
    assert took < 5, f"{took:.2f} CPU s to read 32 MiB in 4 KiB chunks (bound 5 s)"


def test_a_reply_past_the_limit_is_the_hosts_agent_error_and_reading_stops_there() -> None:
    stream = FakeStream(itertools.repeat(b"x" * 65536))  # a flood with no reply mark
    limit = connection.Limit("flood", 1 << 20)
    try:
        with pytest.raises(
            AgentError, match=r"^flood: more than 1 MiB came without an end \(a reply\)"
        ) as e:
            connection._read_until(
                stream.read, stream.ready, b"@@mark", time.monotonic() + 60, "late", limit
            )
    finally:
        stream.close()
    assert e.value.hint and "max_reply_mib" in e.value.hint
    assert stream.read_bytes <= (1 << 20) + 65536


def test_a_host_that_floods_one_commands_output_is_stopped_at_the_limit(hosts: SSHLab) -> None:
    conn = SSHConnection(ssh_host(hosts, "alpha", max_reply_mib=1), ConnectOptions())
    try:
        began = time.monotonic()
        with pytest.raises(
            AgentError, match=r"^alpha: more than 1 MiB came without an end \(yes\)"
        ):
            conn.run("yes")
        assert time.monotonic() - began < 20  # the limit, not the 120 s timeout
        assert conn.run("echo still-there").stdout == "still-there\n"  # the connection stays
    finally:
        conn.close()
