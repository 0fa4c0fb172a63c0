"""PD: the prefill side (bootstrap server, rank registration, per-room KV hand-off)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from .http_surface import activate
from .log_lines import log
from .pd_common import (
    FAKE_BOOTSTRAP_HOST,
    REGISTER_RETRIES,
    PDFailure,
    PDState,
    connect_host,
    host_port,
    http_request,
    kv_error,
    pd_env,
    room_of,
)
from .sglang_sources import sglang_root

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from .launcher import Launcher


class PrefillPD(PDState):
    """The prefill side: bootstrap server, rank port, per-room KV hand-off."""

    def __init__(self, launcher: Launcher) -> None:
        super().__init__(launcher)
        self.queues = {"num_prefill_bootstrap_queue_reqs": 0, "num_prefill_inflight_queue_reqs": 0}
        self.host = launcher.listen_host
        self.port = int(self.args.disaggregation_bootstrap_port)
        self.decodes: dict[int, socket.socket] = {}  # room -> the decode's transfer connection
        # get_local_ip_auto: SGLANG_HOST_IP or HOST_IP, else the host's own address (not
        # --host), which here is --host, or 127.0.0.1 for a wildcard: reachable from every
        # lab node, as a real host's address is from the others.
        self.rank_ip = (
            os.environ.get("SGLANG_HOST_IP") or os.environ.get("HOST_IP") or connect_host(self.host)
        )
        self.rank_port = 0
        self.bootstrap: ThreadingHTTPServer | None = None

    # -- start-up --------------------------------------------------------------

    def start(self) -> None:
        """Start the bootstrap server (disagg_service.start_disagg_service) and the rank port."""
        self.start_bootstrap_server()
        transfer = socket.socket(socket.AF_INET6 if ":" in self.rank_ip else socket.AF_INET)
        transfer.bind((self.rank_ip, 0))
        transfer.listen(256)
        self.rank_port = transfer.getsockname()[1]
        threading.Thread(target=self.accept_decodes, args=(transfer,), daemon=True).start()

    def start_bootstrap_server(self) -> None:
        server = make_bootstrap_server(self.host, self.port)
        error = activate(server, (self.host, self.port))
        if error is not None:
            # _run_server catches it in its thread: logged, and the server starts anyway,
            # its ranks registering with whatever holds the port (sglang#5704).
            root = sglang_root()
            log(
                f"Server error: {error}\nTraceback (most recent call last):\n"
                f'  File "{root}/srt/disaggregation/common/conn.py", line 3320, in _run_server\n'
                "    self._loop.run_until_complete(site.start())\n"
                f"OSError: {error}"
            )
            return
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.bootstrap = server
        log(f"CommonKVBootstrapServer started successfully on {self.host}:{self.port}")

    def on_ready(self) -> None:
        if self.knobs["bootstrap_unreachable"] and self.bootstrap is not None:
            self.bootstrap.shutdown()
            self.bootstrap.server_close()  # connections to the port are refused from now on

    def register_ranks(self) -> None:
        """Each rank PUTs its row to the bootstrap server (register_to_bootstrap)."""
        addr = host_port(connect_host(self.host), self.port)
        tp, dp = max(1, self.args.tp_size), max(1, self.args.dp_size)
        # DP attention splits the TP ranks into attention-DP groups; plain DP has a system
        # DP rank per replica (CommonKVManager's attn_* and system_dp_* fields).
        attention_dp = dp if self.args.enable_dp_attention and tp % dp == 0 else 1
        for dp_rank, tp_rank in self.launcher.rank_layout():
            prefix = self.launcher.rank_prefix(dp_rank, tp_rank)
            width = tp // attention_dp
            row = {
                "attn_tp_size": width, "attn_tp_rank": tp_rank % width,
                "attn_cp_size": 1, "attn_cp_rank": 0,
                "attn_dp_size": attention_dp, "attn_dp_rank": tp_rank // width,
                "pp_size": 1, "pp_rank": 0,
                "system_dp_size": dp // attention_dp,
                "system_dp_rank": 0 if attention_dp > 1 else dp_rank or 0,
                "rank_ip": self.rank_ip, "rank_port": self.rank_port,
                "page_size": self.args.page_size or 1, "kv_cache_dtype": self.args.kv_cache_dtype,
                "prefill_http_port": self.args.port,
                "decode_allocation_policy": self.args.disaggregation_decode_allocation_policy,
            }  # fmt: skip
            for attempt in range(REGISTER_RETRIES):
                try:
                    status, _ = http_request("PUT", addr, "/route", row)
                    if status == 200:
                        break
                    cause = f"status {status}"
                except OSError as exc:
                    cause = f"[Errno {exc.errno}] {exc.strerror}" if exc.errno else str(exc)
                log(
                    f"Prefill register attempt {attempt + 1}/{REGISTER_RETRIES} failed: {cause}",
                    prefix,
                )
                if attempt < REGISTER_RETRIES - 1:
                    time.sleep(min(1.0 * 2**attempt, 30.0))
            else:
                log(
                    f"Prefill instance failed to register to bootstrap server after "
                    f"{REGISTER_RETRIES} retries",
                    prefix,
                )

    def accept_decodes(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self.read_decode, args=(conn,), daemon=True).start()

    def read_decode(self, conn: socket.socket) -> None:
        """A decode's metadata: the room it waits in (send_metadata's KV indices)."""
        with contextlib.suppress(OSError, ValueError), conn.makefile("rb") as lines:
            for line in lines:
                room = int(json.loads(line)["room"])
                with self.lock:
                    self.decodes[room] = conn
                    self.lock.notify_all()

    # -- a request ----------------------------------------------------------------

    def serve(self, request: dict[str, Any], rid: str, prompt_tokens: int) -> None:
        """Prefill one request: compute its KV, wait for its decode, hand the KV over.

        Raises PDFailure as prefill.py aborts the request; returns once the KV is sent.
        """
        room, host = room_of(request, rid), request.get("bootstrap_host")
        start = time.time()
        time.sleep(float(self.knobs["step_ms"]) / 1000)  # the forward pass
        if host == FAKE_BOOTSTRAP_HOST:
            return  # a health check's warmup: no decode waits for it
        self.enter("num_prefill_bootstrap_queue_reqs", 1)
        try:
            conn = self.wait_for_decode(room, start + pd_env(
                "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"))  # fmt: skip
        finally:
            self.enter("num_prefill_bootstrap_queue_reqs", -1)
        if conn is None:
            elapsed = time.time() - start
            self.warning_once(
                "Some requests timed out when bootstrapping, which means prefill instances fail "
                "to receive the KV indices from the decode instance of this request. If a greater "
                "mean TTFT is acceptable, you can 'export SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
                "=600' (10 minutes) to relax the timeout condition. "
            )
            reason = f"Request {room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"
            message = (
                f"Prefill bootstrap failed for request rank=0 req.rid={rid!r} "
                f"req.bootstrap_room={room} with exception {kv_error(room, reason)}"
            )
            log(message)
            self.count("num_bootstrap_failed_reqs_total")
            raise PDFailure(message)
        self.enter("num_prefill_inflight_queue_reqs", 1)
        try:
            if self.knobs["pd_crash"] == "mid_transfer":
                # The schedulers die with this room's KV half sent: the tree goes down, the
                # decode is left waiting (its heartbeat notices), the router's request breaks.
                self.launcher.crash_schedulers()
                threading.Event().wait()
            kv = {"room": room, "prompt_tokens": prompt_tokens, "from": self.args.port}
            try:
                conn.sendall(json.dumps(kv).encode() + b"\n")
                log(f"[standin] sent KV for bootstrap_room={room}")
            except OSError as exc:
                reason = "Aborted by AbortReq."  # the decode went away first
                message = (
                    f"Prefill transfer failed for request rank=0 req.rid={rid!r} "
                    f"req.bootstrap_room={room} with exception {kv_error(room, reason)}"
                )
                log(message)
                self.count("num_transfer_failed_reqs_total")
                raise PDFailure(message) from exc
        finally:
            self.enter("num_prefill_inflight_queue_reqs", -1)
            with self.lock:
                self.decodes.pop(room, None)

    def wait_for_decode(self, room: int, deadline: float) -> socket.socket | None:
        with self.lock:
            while room not in self.decodes:
                left = deadline - time.time()
                if left <= 0:
                    return None
                self.lock.wait(min(left, 0.5))
            return self.decodes[room]


def make_bootstrap_server(host: str, port: int) -> ThreadingHTTPServer:
    """The prefill's bootstrap registry (CommonKVBootstrapServer's routes), unbound."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    table: dict[tuple[int, int, int, int], dict[str, Any]] = {}
    info: dict[str, Any] = {}
    lock = threading.Lock()

    class _Bootstrap(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, code: int, body: Any) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            row = json.loads(self.rfile.read(length) or b"{}")
            with lock:
                for key in ("attn_tp_size", "attn_cp_size", "pp_size", "page_size",
                            "kv_cache_dtype", "prefill_http_port"):  # fmt: skip
                    info.setdefault(key, row.get(key))
                info.setdefault(
                    "dp_size",
                    row["attn_dp_size"] if row["system_dp_size"] == 1 else row["system_dp_size"],
                )
                dp = row["attn_dp_rank"] if row["system_dp_size"] == 1 else row["system_dp_rank"]
                key4 = (dp, row["attn_cp_rank"], row["attn_tp_rank"], row["pp_rank"])
                table[key4] = {"rank_ip": row["rank_ip"], "rank_port": int(row["rank_port"])}
                info["registered"] = info.get("registered", 0) + 1
            self.reply(200, "OK")

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/health":
                return self.reply(200, "OK")
            if url.path != "/route":
                return self.reply(404, "Not Found")
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            names = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
            if not all(query.get(n) for n in names):
                return self.reply(400, "Missing inputs for bootstrap server.")
            wanted = tuple(int(query[n]) for n in names)
            with lock:
                expected = 0
                if info:
                    expected = info["dp_size"] * info["attn_cp_size"] * info["attn_tp_size"]
                    expected *= info["pp_size"]
                count = info.get("registered", 0)
                if not info or count < expected:
                    return self.reply(
                        503,
                        f"Prefill server not fully registered yet ({count} workers registered).",
                    )
                if wanted == (-1, -1, -1, -1):
                    server = {k: info[k] for k in ("attn_tp_size", "attn_cp_size", "dp_size",
                                                   "pp_size", "page_size", "kv_cache_dtype",
                                                   "prefill_http_port")}  # fmt: skip
                    server.update(follow_bootstrap_room=True, decode_allocation_policy="early")
                    return self.reply(200, server)
                row = table.get(wanted)  # type: ignore[arg-type]
            if row is None:
                dp, cp, tp, pp = wanted
                return self.reply(
                    404,
                    f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} "
                    f"tp_rank={tp} pp_rank={pp}",
                )
            return self.reply(200, row)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # aiohttp's access log is off unless the logger is at DEBUG

    class _Server(ThreadingHTTPServer):
        daemon_threads = True

        def server_bind(self) -> None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(self.server_address)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    _Server.address_family = family
    return _Server((host or "0.0.0.0", port), _Bootstrap, bind_and_activate=False)
