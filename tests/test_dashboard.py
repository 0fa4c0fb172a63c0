"""`deployctl dashboard`: who may read it (the token rules), and the real server over the
sshd lab's stand-in deployments: its documents are the CLI's, its event stream, its
refusals. The page itself is driven in a real chromium in tests/test_dashboard_page.py."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from deployctl.connection import ConnectOptions
from deployctl.crash import load_catalog
from deployctl.dashboard.access import check_bind, new_token, read_token, token_matches
from deployctl.dashboard.collector import Collector
from deployctl.errors import UsageError
from deployctl.fanout import Fleet
from deployctl.inventory import load_inventory
from tests.conftest import CLI
from tests.sshd_hosts import SSHLab, free_port, sh
from tests.test_faults import wait_until
from tests.test_lifecycle import inventory, launch_json, prepare
from tests.test_logs import PAIR_LINES, PAIR_PREFIX, pair_leaks

# ---- the token rules ---------------------------------------------------------------------------


def test_a_new_token_is_private_and_never_written_over_a_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    token = new_token(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_token(path) == token and len(token) >= 40
    with pytest.raises(UsageError, match="the file exists"):
        new_token(path)
    assert read_token(path) == token


def test_a_token_file_others_can_read_or_too_short_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("x" * 40)
    path.chmod(0o644)
    with pytest.raises(UsageError, match=r"can be read by others \(mode 644\)") as caught:
        read_token(path)
    assert caught.value.hint == f"chmod 600 {path}"
    path.chmod(0o600)
    path.write_text("short")
    with pytest.raises(UsageError, match="does not hold a token"):
        read_token(path)
    with pytest.raises(UsageError, match="No such file"):
        read_token(tmp_path / "missing")


def test_only_loopback_is_served_without_a_token() -> None:
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", "t" * 40)
    for address in ("0.0.0.0", "10.1.2.3", "::"):
        with pytest.raises(UsageError, match="needs --token-file"):
            check_bind(address, None)
    assert token_matches("a" * 30, "a" * 30)
    assert not token_matches("a" * 29 + "b", "a" * 30) and not token_matches(None, "a" * 30)


def test_a_non_loopback_bind_without_a_token_is_refused_in_one_line(cli: CLI) -> None:
    (cli.cwd / "inv.yml").write_text(
        "all:\n  hosts:\n    h1: {ansible_host: 127.0.0.1, ansible_port: 1}\n"
    )
    result = cli("dashboard", "-i", "inv.yml", "--bind", "0.0.0.0", "--port", "1")
    assert result.returncode == 1
    assert result.stderr.startswith("error: --bind 0.0.0.0 is reachable from other machines")
    assert "Traceback" not in result.stderr


# ---- the server over the lab -------------------------------------------------------------------


class Dashboard:
    """A `deployctl dashboard` process and how to ask it."""

    def __init__(
        self, proc: subprocess.Popen[str], port: int, token: str | None, bind: str = "127.0.0.1"
    ) -> None:
        self.proc = proc
        self.base = f"http://{bind}:{port}"
        self.token = token

    def get(
        self, path: str, token: str | None = None, method: str = "GET", **headers: str
    ) -> tuple[int, bytes]:
        given = token if token is not None else self.token
        if given:
            headers.setdefault("Authorization", f"Bearer {given}")
        request = urllib.request.Request(self.base + path, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def document(self, path: str) -> dict[str, Any]:
        code, body = self.get(path)
        assert code == 200, body[:300]
        found: dict[str, Any] = json.loads(body)
        return found


@contextmanager
def dashboard(
    cli: CLI, inv: Path, *extra: str, token: str | None = None, bind: str = "127.0.0.1"
) -> Iterator[Dashboard]:
    """Serve the inventory's dashboard until the block ends, then Ctrl-C it."""
    port = free_port(bind.strip("[]"))
    proc = cli.popen(
        "dashboard", "-i", str(inv), "--port", str(port), "--interval", "1", "--bind", bind, *extra
    )
    served = Dashboard(proc, port, token, bind)
    try:
        wait_until(lambda: _answers(served) or proc.poll() is not None, 30, 0.1)
        assert proc.poll() is None, proc.communicate()[1]
        yield served
    finally:
        proc.send_signal(2)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        assert "Traceback" not in err, err


def _answers(served: Dashboard) -> bool:
    try:
        return served.get("/api/status")[0] in (200, 401)
    except OSError:
        return False


def two_launched(lab: SSHLab, cli: CLI, tmp_path: Path) -> Path:
    """alpha and bravo each serving a stand-in; their inventory."""
    inv = inventory(lab, tmp_path, ["alpha", "bravo"], tp=1)
    code, _, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    return inv


def test_the_api_serves_the_status_document_and_an_event_per_round(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = two_launched(hosts, cli, tmp_path)
    with dashboard(cli, inv) as served:
        status = served.document("/api/status")
        cli_status = json.loads(cli("status", "-i", str(inv), "--metrics", "--json").stdout)
        assert status["schema"] == cli_status["schema"]
        for name in ("alpha", "bravo"):
            ours, theirs = status["hosts"][name], cli_status["hosts"][name]
            assert set(ours) == set(theirs)  # the same document: key for key
            for key in ("run", "pid", "state", "log", "ready", "crashed", "metrics_note"):
                assert ours[key] == theirs[key], key
        # The records (patch audit, tunes, bench) follow the first round's statuses.
        page = wait_until(
            lambda: (d := served.document("/api/dashboard"))["audit"] is not None and d, 30, 0.2
        )
        assert [r["target"] for r in page["deployments"]] == ["alpha", "bravo"]
        assert page["status"]["hosts"].keys() == status["hosts"].keys()
        assert page["audit"] is not None and page["interval_s"] == 1
        # The event stream: the latest round at once, then one per round.
        request = urllib.request.Request(served.base + "/api/events")
        with urllib.request.urlopen(request, timeout=30) as stream:
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            seen = []
            for line in stream:
                if line.startswith(b"id: "):
                    seen.append(int(line[4:]))
                if len(seen) == 2:
                    break
        assert seen[1] == seen[0] + 1
        assert served.get("/static/../access.py")[0] == 404  # only the page's own files
        html = served.get("/")[1].decode()
        assert "/static/app.js" in html and "cdn" not in html.lower()


def test_with_a_token_every_request_needs_it_and_writes_are_refused(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = inventory(hosts, tmp_path, ["alpha"], tp=1)
    token_file = tmp_path / "token"
    made = cli("dashboard", "--new-token", str(token_file))
    assert made.returncode == 0, made.stderr
    token = token_file.read_text().strip()
    with dashboard(cli, inv, "--token-file", str(token_file), token=token) as served:
        for path in ("/", "/api/status", "/api/dashboard", "/api/events", "/static/app.js"):
            assert served.get(path, token="wrong-" + "x" * 30)[0] == 401, path
            assert served.get(path, token="")[0] == 401, path
        assert served.get("/api/status")[0] == 200
        # The page opened once with ?token= gives a cookie the page's own requests carry.
        request = urllib.request.Request(f"{served.base}/?token={token}")
        with urllib.request.urlopen(request, timeout=30) as reply:
            cookie = reply.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        pair = cookie.split(";")[0]
        assert served.get("/api/dashboard", token="", Cookie=pair)[0] == 200
        post = urllib.request.Request(served.base + "/api/status", data=b"{}", method="POST")
        post.add_header("Authorization", f"Bearer {token}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(post, timeout=30)
        assert refused.value.code == 405


def test_a_host_that_goes_away_shows_its_error_and_never_stalls_the_rest(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    inv = two_launched(hosts, cli, tmp_path)
    with dashboard(cli, inv) as served:
        served.document("/api/dashboard")
        hosts.hosts["bravo"].go_away()
        try:

            def bravo_failed() -> dict[str, Any] | None:
                doc = served.document("/api/dashboard")
                rows = {r["target"]: r for r in doc["deployments"]}
                return doc if not rows["bravo"]["ok"] else None

            doc = wait_until(bravo_failed, 30, 0.5)
            rows = {r["target"]: r for r in doc["deployments"]}
            assert rows["alpha"]["ok"] and rows["bravo"]["error"]
            assert doc["status"]["hosts"]["alpha"]["state"] == "ready"
            # Rounds go on at the interval while bravo is away (its backoff is its own).
            first = doc["updated_at"]
            later = wait_until(
                lambda: (d := served.document("/api/dashboard"))["updated_at"] >= first + 2 and d,
                20,
                0.5,
            )
            assert later["refresh_s"] < 5
        finally:
            hosts.hosts["bravo"].start()
        wait_until(
            lambda: all(r["ok"] for r in served.document("/api/dashboard")["deployments"]), 60, 1
        )


@pytest.mark.heavy
def test_help_works_and_serving_says_what_to_install_without_the_extra(tmp_path: Path) -> None:
    inventory_file = tmp_path / "inv.yml"
    inventory_file.write_text(
        "all:\n  hosts:\n    h1: {ansible_host: 127.0.0.1, ansible_port: 1}\n"
    )
    # The dashboard extra absent: starlette and uvicorn cannot be imported.
    runner = (
        "import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None; "
        "sys.argv = ['deployctl', *sys.argv[1:]]; from deployctl.cli import main; main()"
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", runner, *args], capture_output=True, text=True, check=False,
            cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path), "COLUMNS": "200"},
        )  # fmt: skip

    shown = run("dashboard", "--help")
    assert shown.returncode == 0 and "--token-file" in shown.stdout
    refused = run("dashboard", "-i", str(inventory_file))
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: the dashboard needs its web server (starlette")
    assert "pip install 'deployctl[dashboard]'" in refused.stderr


# ---- who may ask, and how: without the lab (a host that never answers) ------------------------


def unreachable(tmp_path: Path) -> Path:
    """An inventory whose one host never answers: the server runs, its rounds fail fast."""
    path = tmp_path / "inv.yml"
    path.write_text("all:\n  hosts:\n    h1: {ansible_host: 127.0.0.1, ansible_port: 1}\n")
    return path


@pytest.mark.lab  # serves the dashboard: a service
@pytest.mark.parametrize("bind", ["localhost", "127.0.0.2", "[::1]"])
def test_every_loopback_address_serves_without_a_token_and_head_is_a_read(
    cli: CLI, tmp_path: Path, bind: str
) -> None:
    with dashboard(cli, unreachable(tmp_path), bind=bind) as served:
        assert served.proc.poll() is None
        for path in ("/", "/api/status", "/api/dashboard", "/static/app.js"):
            assert served.get(path, method="HEAD")[0] == 200, path
        assert served.get("/api/status")[0] == 200
        assert served.get("/api/status", method="DELETE")[0] == 405


@pytest.mark.lab  # serves the dashboard: a service
def test_a_request_by_a_name_the_server_does_not_answer_to_is_refused(
    cli: CLI, tmp_path: Path
) -> None:
    # DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 sends
    # `Host: evil.example`; the browser lets it read the answer as its own.
    with dashboard(cli, unreachable(tmp_path), "--allow-host", "Dash.Example") as served:
        port = served.base.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", ""):
            for path in ("/", "/api/status", "/api/events"):
                code, body = served.get(path, Host=host)
                assert code == 400, (host, path)
                assert b"--allow-host" in body
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"dash.example:{port}"):
            assert served.get("/api/status", Host=host)[0] == 200, host


@pytest.mark.lab  # serves the dashboard: a service
def test_a_non_ascii_token_is_a_401_not_a_500(cli: CLI, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    assert cli("dashboard", "--new-token", str(token_file)).returncode == 0
    token = token_file.read_text().strip()
    with dashboard(cli, unreachable(tmp_path), "--token-file", str(token_file)) as served:
        wrong = "é" + token[1:]
        assert served.get("/api/status", token=wrong)[0] == 401  # sent as latin-1 bytes
        assert served.get("/api/status?token=%C3%A9%E2%82%AC" + token, token="")[0] == 401
        cookie = f"deployctl_dashboard={wrong}"
        assert served.get("/api/status", token="", Cookie=cookie)[0] == 401
        assert served.get("/api/status", token=token)[0] == 200


def test_a_taken_port_is_one_error_line_before_anything_starts(cli: CLI, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("dashboard", "-i", str(unreachable(tmp_path)), "--port", str(port))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: --bind 127.0.0.1 --port {port}: cannot listen there (Address already in use)",
        "hint: another program has that port: choose another --port",
    ]
    assert result.stdout == ""


def open_stream(base: str) -> socket.socket:
    """An event stream held open (its first bytes read): what a page's EventSource does."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"GET /api/events HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    return sock


@pytest.mark.lab  # serves the dashboard: a service
def test_open_event_streams_hold_no_thread_and_the_page_loads_at_once(
    cli: CLI, tmp_path: Path
) -> None:
    # Starlette's thread pool has 40 threads; a stream that waited in one held it between
    # rounds, so 45 open pages made the next page load wait 17-20 s.
    with dashboard(cli, unreachable(tmp_path), "--interval", "2") as served:
        served.document("/api/dashboard")
        streams = [open_stream(served.base) for _ in range(45)]
        try:
            time.sleep(2.5)  # every stream waits for its next round
            # Counted, not timed: a stream that waited in a thread of the pool (40) held it.
            threads = len(os.listdir(f"/proc/{served.proc.pid}/task"))
            assert threads < 20, f"{threads} threads with 45 streams open, bound 20"
            for path in ("/", "/static/app.js", "/api/dashboard", "/api/status"):
                started = time.monotonic()
                assert served.get(path)[0] == 200
                took = time.monotonic() - started
                # At once: a loaded machine (load 12-18) measured up to 3.3 s.
                assert took < 10, f"{path} took {took:.2f}s, bound 10s, 45 streams open"
        finally:
            for stream in streams:
                stream.close()


# ---- the records: read at the first round, and again after it -----------------------------------


def test_records_are_read_again_after_the_first_round(hosts: SSHLab, tmp_path: Path) -> None:
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"])
    selected = load_inventory(inv).select(None)
    tunes = hosts.hosts["alpha"].home / ".deployctl" / "tunes"
    with Fleet(selected, ConnectOptions(), forks=1) as fleet:
        collector = Collector(fleet, load_catalog(), {}, 1.0, records_every=0.0)
        first = collector.refresh().dashboard
        assert first["tunes"] == {} and first["audit"] is not None
        tunes.mkdir(parents=True)
        # The shape every kept record has (one of another shape is skipped as unreadable).
        record = {
            "host": "alpha", "deployment": None, "tune": 1, "outcome": "tuned",
            "outcome_note": "", "threshold": 4, "threshold_mode": "patch", "phases": {},
            "refined_levels": [], "envelope_ratio": {}, "min_ratio": 0.9, "held": True,
            "serving": None, "launches": 2, "levels_measured": 4,
        }  # fmt: skip
        (tunes / "1.json").write_text(json.dumps(record))
        sh("chown", "-R", f"{hosts.hosts['alpha'].user}:", hosts.hosts["alpha"].home)
        later = collector.refresh().dashboard
    assert later["tunes"]["alpha"]["tune"] == 1


def test_the_log_tail_never_shows_the_servers_api_key(
    hosts: SSHLab, cli: CLI, tmp_path: Path
) -> None:
    key = "sk-live-DASHBOARD-0123456789"
    alpha = {**prepare(hosts.hosts["alpha"], tp=1), "extra_args": ["--api-key", key]}
    inv = hosts.inventory(tmp_path / "inv.yml", ["alpha"], {"alpha": alpha})
    code, _, err = launch_json(cli, inv, "--template", "baseline")
    assert code == 0, err
    log_path = next((hosts.hosts["alpha"].home / "logs").glob("*.log"))
    log = log_path.read_text()
    assert f"api_key='{key}'" in log  # SGLang's server_args= line, as the real 0.5.17 writes it
    # Secrets the inventory does not know, each right after another pair: status reads the
    # log before its own health check's access line, so its last line is the last one here.
    with log_path.open("a") as written:
        written.write("".join(f"{PAIR_PREFIX}{line}\n" for line in PAIR_LINES))
    status = cli("status", "-i", str(inv), "--json")
    last = json.loads(status.stdout)["hosts"]["alpha"]["last_line"]
    assert last == PAIR_PREFIX + "cmd: --admin-api-key ********", status.stdout
    shown = cli("status", "-i", str(inv))
    assert pair_leaks(shown.stdout + status.stdout) == [], shown.stdout + status.stdout
    with dashboard(cli, inv) as served:
        page = wait_until(
            lambda: (d := served.document("/api/dashboard"))["deployments"][0].get("tail") and d,
            30,
            0.2,
        )
        tail = "\n".join(page["deployments"][0]["tail"])
        assert "server_args=ServerArgs(" in tail and "api_key='********'" in tail
        assert f"{PAIR_PREFIX}env: HF_TOKEN=********" in tail
        for path in ("/api/dashboard", "/api/status", "/api/events"):
            if path == "/api/events":
                request = urllib.request.Request(served.base + path)
                with urllib.request.urlopen(request, timeout=30) as stream:
                    body = b"".join(stream.readline() for _ in range(3))
            else:
                body = served.get(path)[1]
            assert key.encode() not in body and pair_leaks(body.decode()) == [], path
