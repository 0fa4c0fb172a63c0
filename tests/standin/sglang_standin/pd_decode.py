"""PD: the decode side (handshake with the room's prefill, KV wait, heartbeat)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from .log_lines import log, lost_prefill_line, reconnect_line
from .pd_common import (
    ENSURE_RETRY_INTERVAL_S,
    FAKE_BOOTSTRAP_HOST,
    HEARTBEAT_HTTP_TIMEOUT_S,
    PDFailure,
    PDState,
    host_port,
    http_request,
    kv_error,
    pd_env,
    requests_error,
    room_of,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from .launcher import Launcher


class DecodePD(PDState):
    """The decode side: per request, reach the room's prefill and wait for its KV."""

    def __init__(self, launcher: Launcher) -> None:
        super().__init__(launcher)
        self.queues = {"num_decode_prealloc_queue_reqs": 0, "num_decode_transfer_queue_reqs": 0}
        self.parallel_info: dict[str, dict[str, Any]] = {}  # bootstrap addr -> prefill info
        self.rooms: dict[str, set[int]] = {}  # bootstrap addr -> rooms in transfer
        self.lost: dict[int, str] = {}  # room -> failure reason (a lost prefill)
        self.unhealthy_until = 0.0  # sglang#12779: health fails for a while after a loss
        threading.Thread(target=self.heartbeat, daemon=True).start()

    def node_local(self, host: str) -> str:
        """Where a bootstrap host leads from this decode's node.

        Lab hosts are loopback addresses (127.0.0.2, 127.0.0.3, …), all on one machine; a
        decode bound to one of them stands for a node of its own, where `localhost` is that
        node itself.  So a prefill on 127.0.0.1 (the router beside it registered it there,
        and sends bootstrap_host=127.0.0.1) is out of its reach, as across real nodes
        (sglang#10001): the decode asks its own address.  (Rank addresses come from
        get_local_ip_auto, never loopback on a real host: they are taken as they are.)
        """
        own = self.launcher.listen_host
        if host in ("127.0.0.1", "localhost") and own.startswith("127.") and own != "127.0.0.1":
            return own
        return host

    def reach(self, addr: str) -> str:
        host, _, port = addr.rpartition(":")
        return host_port(self.node_local(host.strip("[]")), int(port))

    def health_failing(self) -> bool:
        return time.time() < self.unhealthy_until

    def fail(self, where: str, rid: str, room: int, reason: str, counter: str) -> PDFailure:
        """Log and count the abort decode.py gives a failed handshake or transfer."""
        message = (
            f"Decode {where} failed for request rank=0 decode_req.req.rid={rid!r} "
            f"decode_req.req.bootstrap_room={room} with exception {kv_error(room, reason)}"
        )
        log(message)
        self.count(counter)
        return PDFailure(message)

    def receive(self, request: dict[str, Any], rid: str, gone: Callable[[], bool]) -> None:
        """Get the request's KV from its prefill before it may decode; PDFailure if not."""
        room, host = room_of(request, rid), request.get("bootstrap_host")
        if host == FAKE_BOOTSTRAP_HOST:
            return
        addr = host_port(str(host), int(request.get("bootstrap_port") or 8998))
        self.enter("num_decode_prealloc_queue_reqs", 1)
        try:
            rank = self.handshake(addr, rid, room, gone)
        finally:
            self.enter("num_decode_prealloc_queue_reqs", -1)
        self.enter("num_decode_transfer_queue_reqs", 1)
        with self.lock:
            self.rooms.setdefault(addr, set()).add(room)
        try:
            self.transfer(addr, rank, rid, room, gone)
        finally:
            self.enter("num_decode_transfer_queue_reqs", -1)
            with self.lock:
                self.rooms.get(addr, set()).discard(room)
                self.lost.pop(room, None)

    def handshake(self, addr: str, rid: str, room: int, gone: Callable[[], bool]) -> dict[str, Any]:
        """The prefill's parallel info, then its rank's address (CommonKVReceiver init)."""
        attempts = int(self.knobs["handshake_attempts"])
        for attempt in range(1, attempts + 1):
            if addr in self.parallel_info:
                break
            path = (
                "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
            )
            try:
                status, body = http_request("GET", self.reach(addr), path)
                if status == 200:
                    with self.lock:
                        self.parallel_info[addr] = json.loads(body)
                    break
                log(f"Failed to get prefill server info: {status}, {body.decode(errors='replace')}")
            except OSError as exc:
                log(f"Error fetching prefill server info from bootstrap: "
                    f"{requests_error(exc, addr, path)}")  # fmt: skip
            if attempt == attempts:
                log(f"Could not fetch prefill parallel info from {addr} after {attempt} attempts")
                raise self.fail("handshake", rid, room, "Aborted by AbortReq.",
                                "num_bootstrap_failed_reqs_total")  # fmt: skip
            deadline = time.time() + ENSURE_RETRY_INTERVAL_S
            while time.time() < deadline:
                if gone():
                    raise self.fail("handshake", rid, room, "Aborted by AbortReq.",
                                    "num_bootstrap_failed_reqs_total")  # fmt: skip
                time.sleep(0.05)
        path = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
        try:
            status, body = http_request("GET", self.reach(addr), path)
            if status == 200:
                return dict(json.loads(body))
            log(f"Failed to get prefill server info: {status}, {body.decode(errors='replace')}")
        except OSError as exc:
            log(f"Error fetching prefill info from bootstrap: {requests_error(exc, addr, path)}")
        reason = (
            "Could not fetch bootstrap info for: prefill_dp_rank: 0 prefill_cp_rank: 0 "
            "target_tp_rank: 0 and target_pp_rank 0"
        )
        raise self.fail("handshake", rid, room, reason, "num_bootstrap_failed_reqs_total")

    def transfer(
        self, addr: str, rank: dict[str, Any], rid: str, room: int, gone: Callable[[], bool]
    ) -> None:
        """Send the room's metadata to the prefill rank and wait for its KV."""
        start = time.time()
        deadline = start + pd_env("SGLANG_DISAGGREGATION_WAITING_TIMEOUT")
        conn: socket.socket | None = None
        buffer = b""
        try:
            while True:
                with self.lock:
                    lost = self.lost.get(room)
                if lost is not None:
                    raise self.fail("transfer", rid, room, lost, "num_transfer_failed_reqs_total")
                if gone():  # the client (the router) dropped it: AbortReq
                    raise self.fail("transfer", rid, room, "Aborted by AbortReq.",
                                    "num_transfer_failed_reqs_total")  # fmt: skip
                if time.time() >= deadline:
                    self.warning_once(
                        "Some requests fail to receive KV Cache transfer done signal after "
                        "bootstrapping. If a greater mean TTFT is acceptable, you can 'export "
                        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to relax the "
                        "timeout condition. "
                    )
                    reason = (
                        f"Request {room} timed out after {time.time() - start:.1f}s in "
                        "KVPoll.WaitingForInput"
                    )
                    raise self.fail("transfer", rid, room, reason,
                                    "num_transfer_failed_reqs_total")  # fmt: skip
                if conn is None:  # ZMQ connects lazily and retries: no error for a dead peer
                    with contextlib.suppress(OSError):
                        conn = socket.create_connection(
                            (rank["rank_ip"], int(rank["rank_port"])), timeout=1.0
                        )
                        conn.sendall(json.dumps({"room": room}).encode() + b"\n")
                        conn.settimeout(0.05)
                    if conn is None:
                        time.sleep(0.05)
                    continue
                try:
                    chunk = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:  # the prefill is gone; only the heartbeat says so
                    conn.close()
                    conn = None
                    time.sleep(0.05)
                    continue
                buffer += chunk
                if b"\n" in buffer and not self.knobs["stuck_transfer"]:
                    kv = json.loads(buffer.partition(b"\n")[0])
                    log(f"[standin] received KV for bootstrap_room={room} from prefill "
                        f"{addr} (prefill port {kv['from']})")  # fmt: skip
                    return
        finally:
            if conn is not None:
                conn.close()

    def heartbeat(self) -> None:
        """CommonKVManager's heartbeat checker: GET /health of every known prefill.

        Like SGLang's (`except Exception`), a reply cut short by the prefill's death is a
        missed beat too, not the end of the checker."""
        interval = pd_env("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL")
        max_failures = int(pd_env("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"))
        timeout = HEARTBEAT_HTTP_TIMEOUT_S
        failures: dict[str, int] = {}
        while True:
            time.sleep(interval)
            with self.lock:
                addrs = list(self.parallel_info)
            for addr in addrs:
                try:
                    reply = http_request("GET", self.reach(addr), "/health", timeout=timeout)
                    ok = reply[0] == 200
                except Exception:  # any failure is a missed beat, as in SGLang
                    ok = False
                if ok:
                    failures[addr] = 0
                    continue
                log(reconnect_line(addr))
                failures[addr] = failures.get(addr, 0) + 1
                if failures[addr] >= max_failures:
                    failures.pop(addr)
                    self.node_failure(addr)

    def node_failure(self, addr: str) -> None:
        """_handle_node_failure: forget the prefill, fail its rooms in transfer."""
        reason = f"Lost connection with prefill instance (bootstrap_addr: {addr})"
        with self.lock:
            self.parallel_info.pop(addr, None)
            rooms = self.rooms.pop(addr, set())
            for room in rooms:
                self.lost[room] = reason
            self.unhealthy_until = time.time() + float(self.knobs["pd_health_fail_s"])
        log(lost_prefill_line(addr, len(rooms)))
