"""PD disaggregation (--disaggregation-mode prefill|decode), what prefill and decode share.

After 0.5.23's srt/disaggregation/: the prefill's bootstrap server (common/conn.py
CommonKVBootstrapServer, the class MooncakeKVBootstrapServer inherits), rank registration
(CommonKVManager.register_to_bootstrap), the decode's handshake (try_ensure_parallel_info,
_get_bootstrap_info_from_server), its timeouts and heartbeat, and the log lines and aborts of
prefill.py and decode.py.  The KV "transfer" is one JSON line over TCP from the prefill's rank
port to the decode (the real one is ZMQ metadata plus RDMA); everything a client, the router or
a supervisor sees is the real shape.  The prefill side is in pd_prefill.py, the decode side in
pd_decode.py.
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING, Any

from .log_lines import log

if TYPE_CHECKING:
    from .launcher import Launcher

# disaggregation/utils.py: /health_generate's request carries this host and never transfers.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
# environ.py defaults; read from the server's environment as SGLang does.
PD_ENV_DEFAULTS = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": 300,
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": 300,
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": 5.0,
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": 2,
}
ENSURE_RETRY_INTERVAL_S = 1.0  # decode.py: _ensure_retry_interval
REGISTER_RETRIES = 5  # common/conn.py _register_topology_row: 5 tries, 1 s backoff doubling
BOOTSTRAP_HTTP_TIMEOUT_S = 5.0  # requests.get(url, timeout=5) on the decode side
HEARTBEAT_HTTP_TIMEOUT_S = 3.0  # the heartbeat's session.get(..., timeout=(2, 3))


def pd_env(name: str) -> float:
    """One of SGLang's PD timeouts from the environment, else its default."""
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else float(PD_ENV_DEFAULTS[name])


def kv_error(room: int, reason: str) -> str:
    """str(KVTransferError(room, reason)) as common/conn.py formats it."""
    return f"KVTransferError(bootstrap_room={room}): {reason}"


def connect_host(host: str) -> str:
    # register_to_bootstrap: a wildcard bind is reached through the same-family loopback.
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_request(
    method: str, addr: str, path: str, doc: Any = None, timeout: float = BOOTSTRAP_HTTP_TIMEOUT_S
) -> tuple[int, bytes]:
    """One request to a bootstrap server (host:port); OSError when it cannot be reached,
    http.client.HTTPException when its reply is cut short (the server died answering)."""
    import http.client

    host, _, port = addr.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        body = None if doc is None else json.dumps(doc)
        conn.request(method, path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def requests_error(exc: OSError, addr: str, path: str) -> str:
    """How `requests` words a failed connection in SGLang's "Error fetching …" lines."""
    host, _, port = addr.rpartition(":")
    if isinstance(exc, TimeoutError):
        return (
            f"HTTPConnectionPool(host='{host}', port={port}): Read timed out. "
            f"(read timeout={BOOTSTRAP_HTTP_TIMEOUT_S:g})"
        )
    return (
        f"HTTPConnectionPool(host='{host}', port={port}): Max retries exceeded with url: {path} "
        f"(Caused by NewConnectionError('<urllib3.connection.HTTPConnection object>: "
        f"Failed to establish a new connection: [Errno {exc.errno}] {exc.strerror}'))"
    )


class PDFailure(Exception):
    """A PD request aborted by the scheduler: prepare_abort(req, message, status_code)."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


def room_of(request: dict[str, Any], rid: str) -> int:
    """The request's bootstrap room; scheduler.py refuses a PD request without one."""
    room = request.get("bootstrap_room")
    if room is None:
        message = (
            "Invalid request: Disaggregated request received without bootstrap room id. "
            f"req.rid={rid!r}"
        )
        log(message)
        raise PDFailure(message, 400)
    return int(room)


class PDState:
    """What prefill and decode share: queues for /metrics, failure counters."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.args = launcher.args
        self.knobs = launcher.knobs
        self.lock = threading.Condition()
        self.queues: dict[str, int] = {}  # SGLang gauge name -> requests in it
        self.counters = {"num_bootstrap_failed_reqs_total": 0, "num_transfer_failed_reqs_total": 0}
        self.warned: set[str] = set()

    def enter(self, queue: str, delta: int) -> None:
        with self.lock:
            self.queues[queue] = self.queues.get(queue, 0) + delta

    def count(self, counter: str) -> None:
        with self.lock:
            self.counters[counter] += 1

    def warning_once(self, message: str) -> None:
        with self.lock:
            if message in self.warned:
                return
            self.warned.add(message)
        log(message)
