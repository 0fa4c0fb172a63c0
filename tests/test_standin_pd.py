"""The SGLang stand-in's PD disaggregation, behind the real sglang-router 0.3.2 in PD mode.

Prefill and decode stand-ins run as local processes on loopback addresses (127.0.0.x, each
one a "node"), the router registers them by role through `POST /workers`, and requests go
through the router as a client's would.  What each test checks is what the router's client,
the stand-ins' logs and their /metrics show.
"""

from __future__ import annotations

import ast
import http.client
import json
import math
import re
import socket
import sys
import threading
import time
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.router_venv import router_venv
from tests.sglang_wheel import SGLANG_VERSION, sglang_wheel
from tests.standin.sglang_standin.ranks import default_mem_fraction, kv_pool_gib
from tests.standin.sglang_standin.server_args import build_parser
from tests.test_router_standins import Process, Start, answers, call, registered, start
from tests.test_standin import STANDIN, wait_for

pytestmark = pytest.mark.lab  # services: stand-ins and the real router
__all__ = ["start"]  # the fixture, shared with the router tests

ROUTER_HOST = "127.0.0.1"
FAST_PD_ENV = {
    # SGLang's PD timeouts, shortened so that each failure shows within seconds.
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "3",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "3",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.3",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
}


def free_port_on(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def get(host: str, port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def metric(server: Process, host: str, name: str) -> float:
    status, body = get(host, server.port, "/metrics")
    assert status == 200, body
    found = re.search(rf"^sglang:{name}\{{[^}}]*\}} (\S+)$", body.decode(), re.M)
    assert found, f"{name} not on the page"
    return float(found.group(1))


class Fleet:
    """Start PD stand-ins and the real router in PD mode, all in one test's sessions."""

    def __init__(self, start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.start = start
        self.tmp_path = tmp_path
        for name, value in FAST_PD_ENV.items():
            monkeypatch.setenv(name, value)  # the stand-ins inherit it

    def server(self, name: str, mode: str, host: str, bootstrap_port: int | None = None,
               bind: str | None = None, env: dict[str, str] | None = None,
               argv: tuple[object, ...] = (), **knobs: Any) -> Process:  # fmt: skip
        """A ready stand-in in `mode`, listening on `bind` (default `host`)."""
        model = self.tmp_path / name
        model.mkdir()
        (model / "standin.json").write_text(json.dumps({"startup_s": 0.2, **knobs}))
        port = free_port_on(host)
        command = [sys.executable, STANDIN, "--model-path", model, "--host", bind or host,
                   "--port", port, "--disaggregation-mode", mode, "--enable-metrics", *argv]  # fmt: skip
        if bootstrap_port is not None:
            command += ["--disaggregation-bootstrap-port", bootstrap_port]
        proc = self.start(name, *command, port=port, env=env)
        wait_for(lambda: get_ok(host, port), 10, f"{name} ready")
        return proc

    def router(self) -> Process:
        # --disable-retries: one attempt per request, so each failure is seen once (0.3.2
        # retries 5 times by default, each time on both legs).
        port = free_port_on(ROUTER_HOST)
        python = router_venv() / "bin" / "python"
        router = self.start("router", python, "-m", "sglang_router.launch_router",
                            "--host", ROUTER_HOST, "--port", port, "--pd-disaggregation",
                            "--policy", "round_robin", "--disable-retries",
                            "--prometheus-host", ROUTER_HOST,
                            "--prometheus-port", free_port_on(ROUTER_HOST), port=port)  # fmt: skip
        wait_for(lambda: answers(port), 15, "the router's /health")
        return router

    def register(self, router: Process, url: str, role: str, bootstrap_port: int = 0) -> None:
        worker: dict[str, Any] = {"url": url, "worker_type": role}
        if bootstrap_port:
            worker["bootstrap_port"] = bootstrap_port
        status, body = call(router.port, "POST", "/workers", worker)
        assert status == 202, body
        wait_for(
            lambda: any(w["url"] == url and w["is_healthy"] for w in registered(router)),
            10,
            f"{url} registered",
        )


def get_ok(host: str, port: int) -> bool:
    try:
        return get(host, port, "/health")[0] == 200
    except OSError:
        return False


@pytest.fixture
def fleet(start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    return Fleet(start, tmp_path, monkeypatch)


def stream(
    router: Process, max_tokens: int = 4, times: list[float] | None = None
) -> tuple[int, list[Any]]:
    """Stream a completion through the router: its status and the parsed `data:` lines
    (and in `times`, when each arrived)."""
    conn = http.client.HTTPConnection(ROUTER_HOST, router.port, timeout=30)
    request = {"model": "m", "prompt": "w1 w2 w3", "max_tokens": max_tokens, "stream": True}
    try:
        conn.request("POST", "/v1/completions", json.dumps(request),
                     {"Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        if response.status != 200:
            return response.status, [json.loads(response.read())]
        events: list[Any] = []
        while line := response.readline():
            if line.startswith(b"data: "):
                data = line[len(b"data: ") :].strip()
                events.append(None if data == b"[DONE]" else json.loads(data))
                if times is not None:
                    times.append(time.monotonic())
        return 200, events
    finally:
        conn.close()


def rooms(server: Process, verb: str) -> list[int]:
    return [int(r) for r in re.findall(rf"\[standin\] {verb} KV for bootstrap_room=(\d+)",
                                       server.text())]  # fmt: skip


def test_streamed_requests_through_the_real_router_get_their_rooms_kv_from_the_prefill(
    fleet: Fleet,
) -> None:
    bootstrap = free_port_on("127.0.0.2")
    prefill = fleet.server("prefill", "prefill", "127.0.0.2", bootstrap)
    decodes = [fleet.server(f"decode{i}", "decode", f"127.0.0.{3 + i}") for i in range(2)]
    assert f"CommonKVBootstrapServer started successfully on 127.0.0.2:{bootstrap}" in (
        prefill.text()
    )
    router = fleet.router()
    fleet.register(router, f"http://127.0.0.2:{prefill.port}", "prefill", bootstrap)
    for i, decode in enumerate(decodes):
        fleet.register(router, f"http://127.0.0.{3 + i}:{decode.port}", "decode")
    listed = {w["worker_type"]: w for w in registered(router)}
    assert listed["prefill"]["bootstrap_port"] == bootstrap
    assert listed["prefill"]["metadata"]["disaggregation_mode"] == "prefill"
    assert listed["decode"]["metadata"]["disaggregation_mode"] == "decode"

    for _ in range(4):
        status, events = stream(router, 4)
        assert status == 200, events
        assert events[-1] is None
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == " tok" * 4
    # Native /generate, not streamed: the decode's answer, after its room's KV.
    body = {"text": "w1 w2", "sampling_params": {"max_new_tokens": 3}}
    status, answer = call(router.port, "POST", "/generate", body)
    assert status == 200, answer
    assert json.loads(answer)["text"] == " tok" * 3
    sent = rooms(prefill, "sent")
    got = [rooms(decode, "received") for decode in decodes]
    assert len(sent) == 5 and sorted(sent) == sorted(got[0] + got[1])
    assert got[0] and got[1]  # round robin: both decodes served, each with its rooms' KV
    for i, decode in enumerate(decodes):
        assert metric(decode, f"127.0.0.{3 + i}", "num_transfer_failed_reqs_total") == 0


def test_a_decode_on_another_node_cannot_reach_a_loopback_bound_prefill(fleet: Fleet) -> None:
    """sglang#10001: the router beside the prefill registers it at 127.0.0.1 and sends that
    as the bootstrap host; on the decode's node 127.0.0.1 is the decode itself."""
    bootstrap = free_port_on("127.0.0.1")
    prefill = fleet.server("prefill", "prefill", "127.0.0.1", bootstrap)
    decode = fleet.server("decode", "decode", "127.0.0.3", handshake_attempts=2)
    router = fleet.router()
    fleet.register(router, f"http://127.0.0.1:{prefill.port}", "prefill", bootstrap)
    fleet.register(router, f"http://127.0.0.3:{decode.port}", "decode")

    status, events = stream(router)
    # Both legs answer 200 at once (SGLang streams); the router passes on the decode's
    # stream, whose one event is the abort once its handshake gives up.
    assert status == 200, events
    error = events[0]["error"]
    assert (error["code"], error["type"]) == (500, "INTERNAL_SERVER_ERROR")
    assert error["message"].startswith("Decode handshake failed for request rank=0 ")
    assert events[1:] == [None]
    # The prefill waits out its bootstrap timeout for a decode that never comes.
    wait_for(lambda: "Prefill bootstrap failed for request" in prefill.text(), 5, "the prefill")
    assert re.search(r"KVTransferError\(bootstrap_room=\d+\): Request \d+ timed out after 3\.\ds "
                     r"in KVPoll.Bootstrapping", prefill.text())  # fmt: skip
    log = decode.text()
    assert f"Could not fetch prefill parallel info from 127.0.0.1:{bootstrap} after 2 attempts" in (
        log
    )
    assert (
        "Error fetching prefill server info from bootstrap: HTTPConnectionPool(host='127.0.0.1'"
        in (log)
    )
    assert re.search(r"Decode handshake failed for request rank=0 .* with exception "
                     r"KVTransferError\(bootstrap_room=\d+\): Aborted by AbortReq\.", log)  # fmt: skip
    assert metric(decode, "127.0.0.3", "num_bootstrap_failed_reqs_total") == 1
    assert metric(prefill, "127.0.0.1", "num_bootstrap_failed_reqs_total") == 1
    assert rooms(decode, "received") == []


def test_a_prefill_bound_to_every_address_is_reached_from_another_node(fleet: Fleet) -> None:
    bootstrap = free_port_on("0.0.0.0")
    # Its KV manager names its host by SGLANG_HOST_IP (get_local_ip_auto), else it finds it.
    prefill = fleet.server("prefill", "prefill", "127.0.0.2", bootstrap, bind="0.0.0.0",
                           env={"SGLANG_HOST_IP": "127.0.0.2"})  # fmt: skip
    route = get("127.0.0.2", bootstrap, "/route?prefill_dp_rank=0&prefill_cp_rank=0"
                "&target_tp_rank=0&target_pp_rank=0")  # fmt: skip
    assert route[0] == 200 and json.loads(route[1])["rank_ip"] == "127.0.0.2"
    decode = fleet.server("decode", "decode", "127.0.0.3")
    router = fleet.router()
    fleet.register(router, f"http://127.0.0.2:{prefill.port}", "prefill", bootstrap)
    fleet.register(router, f"http://127.0.0.3:{decode.port}", "decode")
    assert stream(router)[0] == 200
    assert len(rooms(decode, "received")) == 1


def pd_pair(fleet: Fleet, prefill_knobs: dict[str, Any], decode_knobs: dict[str, Any]
            ) -> tuple[Process, int, Process, Process]:  # fmt: skip
    """One prefill (127.0.0.2) and one decode (127.0.0.3) behind the router in PD mode."""
    bootstrap = free_port_on("127.0.0.2")
    prefill = fleet.server("prefill", "prefill", "127.0.0.2", bootstrap, **prefill_knobs)
    decode = fleet.server("decode", "decode", "127.0.0.3", **decode_knobs)
    router = fleet.router()
    fleet.register(router, f"http://127.0.0.2:{prefill.port}", "prefill", bootstrap)
    fleet.register(router, f"http://127.0.0.3:{decode.port}", "decode")
    return prefill, bootstrap, decode, router


def test_a_prefill_dying_mid_transfer_fails_the_request_and_then_the_decodes_health(
    fleet: Fleet,
) -> None:
    # Each decode's room waits for as long as the crash takes to reach it (with a 3 s waiting
    # timeout, a slow moment ended the room first and the loss affected no request), and its
    # health fails for 8 s after the loss: time enough to read it on a busy machine.
    patient = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "60"}
    prefill, bootstrap, decode, router = pd_pair(
        fleet, {"pd_crash": "mid_transfer"}, {"pd_health_fail_s": 8.0, "env": patient}
    )
    # A second decode, whose /health skips the generation, waits in a room of its own.
    quiet_env = {**patient, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}
    quiet = fleet.server("quiet", "decode", "127.0.0.4", pd_health_fail_s=8.0, env=quiet_env)
    room = {"bootstrap_host": "127.0.0.2", "bootstrap_port": bootstrap, "bootstrap_room": 99}
    waiting = open_stream("127.0.0.4", quiet.port, room)
    wait_for(lambda: metric(quiet, "127.0.0.4", "num_decode_transfer_queue_reqs") == 1, 5,
             "the quiet decode in transfer")  # fmt: skip
    status, events = stream(router)
    # The decode's leg is what the client gets: its heartbeat loses the prefill and the
    # room in transfer fails with it.
    assert status == 200, events
    message = events[0]["error"]["message"]
    assert message.startswith("Decode transfer failed for request rank=0 ")
    assert message.endswith(
        f"Lost connection with prefill instance (bootstrap_addr: 127.0.0.2:{bootstrap})"
    )
    assert prefill.proc.wait(timeout=5) == -9  # kill_process_tree(include_parent=True)
    log = prefill.text()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in log
    assert f"kill_process_tree called: parent_pid={prefill.proc.pid}, include_parent=True" in log
    assert "[standin] sent KV" not in log
    assert (
        f"Lost connection with prefill instance (bootstrap_addr: 127.0.0.2:{bootstrap}), "
        "1 requests affected" in decode.text()
    )
    # sglang#12779: the healthy decode fails its health checks for a while after that.
    assert get("127.0.0.3", decode.port, "/health")[0] == 503
    assert get("127.0.0.3", decode.port, "/health_generate")[0] == 503
    assert "Health check failed. Server couldn't get a response from detokenizer" in decode.text()
    wait_for(lambda: "1 requests affected" in quiet.text(), 10,
             lambda: f"the quiet decode's loss; its log ends:\n{quiet.text()[-1500:]}")  # fmt: skip
    assert get("127.0.0.4", quiet.port, "/health")[0] == 200
    assert get("127.0.0.4", quiet.port, "/health_generate")[0] == 503
    waiting.close()
    wait_for(lambda: get_ok("127.0.0.3", decode.port), 15, "the decode's health back")
    assert metric(decode, "127.0.0.3", "num_transfer_failed_reqs_total") == 1


def test_an_unreachable_bootstrap_port_fails_the_decodes_handshake(fleet: Fleet) -> None:
    prefill, bootstrap, decode, router = pd_pair(
        fleet, {"bootstrap_unreachable": True}, {"handshake_attempts": 2}
    )
    started, times, result = time.monotonic(), [], []
    client = threading.Thread(target=lambda: result.append(stream(router, times=times)))
    client.start()
    failed = lambda: metric(decode, "127.0.0.3", "num_bootstrap_failed_reqs_total") == 1  # noqa: E731
    wait_for(failed, 2.5, "the decode's two tries, a second apart")
    took = time.monotonic() - started
    assert took > 1.0, f"took {took:.2f}s, bound 1.0s"
    # The router 0.3.2 holds the decode's stream until the prefill's answer is complete:
    # the client waits out the prefill's bootstrap timeout (3 s here, 300 s by default).
    client.join(timeout=10)
    assert times[0] - started > 2.9
    [(status, events)] = result
    assert status == 200, events
    message = events[0]["error"]["message"]
    assert message.startswith("Decode handshake failed for request rank=0 ")
    assert message.endswith("Aborted by AbortReq.")
    log = decode.text()
    assert (
        log.count(
            "Error fetching prefill server info from bootstrap: HTTPConnectionPool(host='127.0.0.2', "
            f"port={bootstrap}): Max retries exceeded with url: /route?prefill_dp_rank=-1"
        )
        == 2
    )
    assert "[Errno 111] Connection refused" in log
    assert f"Could not fetch prefill parallel info from 127.0.0.2:{bootstrap} after 2 attempts" in (
        log
    )
    assert metric(decode, "127.0.0.3", "num_decode_prealloc_queue_reqs") == 0
    assert "Prefill bootstrap failed" in prefill.text()


def test_a_stuck_transfer_runs_with_no_tokens_until_the_waiting_timeout(fleet: Fleet) -> None:
    prefill, _, decode, router = pd_pair(fleet, {}, {"stuck_transfer": True})
    result: list[Any] = []
    client = threading.Thread(target=lambda: result.append(stream(router)))
    client.start()
    wait_for(lambda: "[standin] sent KV" in prefill.text(), 5, "the prefill's hand-off")
    # Waiting for KV it never gets: in the transfer queue, not running, no tokens.
    assert metric(decode, "127.0.0.3", "num_decode_transfer_queue_reqs") == 1
    assert metric(decode, "127.0.0.3", "num_running_reqs") == 0
    assert metric(decode, "127.0.0.3", "gen_throughput") == 0
    client.join(timeout=10)
    [(status, events)] = result
    assert status == 200
    assert re.search(r"KVTransferError\(bootstrap_room=\d+\): Request \d+ timed out after "
                     r"3\.\ds in KVPoll\.WaitingForInput$", events[0]["error"]["message"])  # fmt: skip
    assert "Some requests fail to receive KV Cache transfer done signal" in decode.text()
    assert metric(decode, "127.0.0.3", "num_decode_transfer_queue_reqs") == 0
    assert metric(decode, "127.0.0.3", "num_transfer_failed_reqs_total") == 1


def open_stream(host: str, port: int, request: dict[str, Any]) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "w1", "max_tokens": 4,
                 "stream": True, **request}), {"Content-Type": "application/json"})  # fmt: skip
    return conn


def test_a_stuck_transfer_ends_when_its_client_goes_but_the_router_keeps_it(
    fleet: Fleet,
) -> None:
    prefill, bootstrap, decode, router = pd_pair(fleet, {}, {"stuck_transfer": True})
    in_transfer = lambda: metric(decode, "127.0.0.3", "num_decode_transfer_queue_reqs")  # noqa: E731
    # A client of the decode itself that goes away aborts the room at once.
    room = {"bootstrap_host": "127.0.0.2", "bootstrap_port": bootstrap, "bootstrap_room": 7}
    conn = open_stream("127.0.0.3", decode.port, room)
    wait_for(lambda: in_transfer() == 1, 5, "the request in transfer")
    conn.close()
    wait_for(lambda: in_transfer() == 0, 1, "the abort")
    assert re.search(r"Decode transfer failed for request .* decode_req.req.bootstrap_room=7 "
                     r"with exception KVTransferError\(bootstrap_room=7\): Aborted by AbortReq\.",
                     decode.text())  # fmt: skip
    # Once the router 0.3.2 has the prefill's answer and streams the decode's, it does not
    # pass its client's going on (before that it does, dropping both legs): the decode leg
    # stays open, and the room in transfer, until the decode's waiting timeout ends it.
    conn = open_stream(ROUTER_HOST, router.port, {"model": "m"})
    wait_for(lambda: in_transfer() == 1, 5, "the request in transfer")
    wait_for(lambda: "[standin] sent KV" in prefill.text(), 5, "the prefill's hand-off")
    time.sleep(0.3)  # the prefill's last event and [DONE] reach the router
    conn.close()
    time.sleep(1.5)
    assert in_transfer() == 1
    wait_for(lambda: in_transfer() == 0, 3, lambda: f"the waiting timeout: {decode.text()[-1500:]}")
    assert metric(decode, "127.0.0.3", "num_transfer_failed_reqs_total") == 2


def test_the_router_drops_the_decode_leg_when_its_client_goes_before_the_prefill_answers(
    fleet: Fleet,
) -> None:
    _, _, decode, router = pd_pair(fleet, {"bootstrap_unreachable": True}, {})
    handshaking = lambda: metric(decode, "127.0.0.3", "num_decode_prealloc_queue_reqs")  # noqa: E731
    conn = open_stream(ROUTER_HOST, router.port, {"model": "m"})
    wait_for(lambda: handshaking() == 1, 5, "the decode's handshake")
    conn.close()
    wait_for(lambda: handshaking() == 0, 1.5, "the decode's abort")  # not 15 tries
    assert re.search(r"Decode handshake failed for request .* Aborted by AbortReq\.", decode.text())


def test_every_rank_of_a_dp_attention_prefill_registers(fleet: Fleet) -> None:
    bootstrap = free_port_on("127.0.0.2")
    argv = ("--tp-size", 4, "--dp-size", 2, "--enable-dp-attention")
    fleet.server("prefill", "prefill", "127.0.0.2", bootstrap, argv=argv)
    route = "/route?prefill_dp_rank={}&prefill_cp_rank=0&target_tp_rank={}&target_pp_rank=0"
    status, body = get("127.0.0.2", bootstrap, route.format(-1, -1).replace("cp_rank=0", "cp_rank=-1")
                       .replace("pp_rank=0", "pp_rank=-1"))  # fmt: skip
    assert status == 200, body
    info = json.loads(body)
    assert (info["dp_size"], info["attn_tp_size"]) == (2, 2)
    for dp_rank in (0, 1):
        for tp_rank in (0, 1):
            assert get("127.0.0.2", bootstrap, route.format(dp_rank, tp_rank))[0] == 200
    assert get("127.0.0.2", bootstrap, route.format(2, 0))[0] == 404


def test_a_taken_bootstrap_port_is_logged_and_the_prefill_starts_anyway(fleet: Fleet) -> None:
    """sglang#5704: two prefills on one host with one bootstrap port."""
    bootstrap = free_port_on("127.0.0.2")
    first = fleet.server("first", "prefill", "127.0.0.2", bootstrap)
    second = fleet.server("second", "prefill", "127.0.0.2", bootstrap)
    log = second.text()
    assert (
        f"Server error: [Errno 98] error while attempting to bind on address "
        f"('127.0.0.2', {bootstrap}): address already in use" in log
    )
    assert "CommonKVBootstrapServer started successfully" not in log
    assert "The server is fired up and ready to roll!" in log
    # Its ranks registered with the first prefill's registry, which now sends decodes there.
    status, body = get("127.0.0.2", bootstrap, "/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
                       "&target_tp_rank=-1&target_pp_rank=-1")  # fmt: skip
    assert status == 200 and json.loads(body)["prefill_http_port"] == first.port
    assert first.proc.poll() is None


def wheel_source(relpath: str) -> str:
    with zipfile.ZipFile(sglang_wheel(SGLANG_VERSION)) as wheel:
        return wheel.read(f"sglang/srt/{relpath}").decode()


def real_pd_options() -> dict[str, dict[str, Any]]:
    """The PD fields of 0.5.23's Disagg config (arg_groups/fields/disagg.py), as its
    add_cli_args_from_dataclass turns them into options: --name, default, choices, flag."""
    source = wheel_source("arg_groups/fields/disagg.py")
    lines = source.splitlines()
    first = next(i for i, line in enumerate(lines) if "# PD disaggregation" in line)
    last = next(i for i, line in enumerate(lines) if "# Encode prefill disaggregation" in line)
    backends = ast.literal_eval(
        re.search(r"DISAGG_TRANSFER_BACKEND_CHOICES = (\[[^\]]*\])",
                  wheel_source("arg_groups/choices.py"), re.S).group(1)  # type: ignore[union-attr]
    )  # fmt: skip
    options: dict[str, dict[str, Any]] = {}
    [disagg] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    for field in disagg.body:
        if not (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)):
            continue
        name = field.target.id
        if not (first < field.lineno < last or name.startswith("disaggregation_")):
            continue
        annotation = ast.unparse(field.annotation)
        literal = re.search(r"Literal\[([^\]]*)\]", annotation)
        choices = re.search(r"choices=\[([^\]]*)\]", annotation)
        options["--" + name.replace("_", "-")] = {
            "default": ast.literal_eval(field.value) if field.value else None,
            "flag": annotation.startswith("A[bool"),
            "choices": (
                backends if "DISAGG_TRANSFER_BACKEND_CHOICES" in annotation
                else list(ast.literal_eval(f"[{literal.group(1)}]")) if literal
                else list(ast.literal_eval(f"[{choices.group(1)}]")) if choices
                else None
            ),
        }  # fmt: skip
    return options


def test_the_pd_options_are_the_wheels_own() -> None:
    real = real_pd_options()
    assert "--disaggregation-bootstrap-port" in real and len(real) >= 10
    # 0.5.23 has no decode TP/DP options on the prefill side.
    assert "--disaggregation-decode-tp" not in real and "--disaggregation-decode-dp" not in real
    parser = build_parser(True)
    ours = {
        action.option_strings[0]: {
            "default": action.default,
            "flag": action.nargs == 0,
            "choices": list(action.choices) if action.choices else None,
        }
        for action in parser._actions
        if action.option_strings
        and (action.option_strings[0] in real or "disaggregation" in action.option_strings[0])
    }
    assert ours == real
    args = parser.parse_args(["--model-path", "m", "--disaggregation-mode", "prefill"])
    assert (args.disaggregation_bootstrap_port, args.disaggregation_transfer_backend) == (
        8998,
        "mooncake",
    )


def real_no_pool_message(fraction: float, available: float, pre: float) -> str:
    """0.5.23's own words when the weights leave no KV pool: the f-string of
    kv_cache_configurator._profile_available_bytes's ValueError, evaluated."""
    tree = ast.parse(wheel_source("mem_cache/kv_cache_configurator.py"))
    [profile] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                 and n.name == "_profile_available_bytes"]  # fmt: skip
    [raised] = [n for n in ast.walk(profile) if isinstance(n, ast.Raise)]
    message = raised.exc.args[0]  # type: ignore[union-attr]
    minimum = 1 - available / pre
    namespace = {
        "get_schedule": lambda: types.SimpleNamespace(mem_fraction_static=fraction),
        "minimum_mem_fraction_static": minimum,
        "suggested_mem_fraction_static": math.ceil(minimum * 1000) / 1000,
    }
    return str(eval(compile(ast.Expression(message), "f", "eval"), namespace))


def test_gpu_fraction_sizes_the_pool_from_the_memory_free_at_start_as_0_5_23_does() -> None:
    # A 1P1D pair on one H200 (about 139.5 GiB free): each holds F of what was free when
    # it started, so 0.4 + 0.4 holds 0.4 + 0.24 of the GPU ...
    first = kv_pool_gib(139.5, 139.5, 0.4)
    assert first == pytest.approx(55.8)
    assert kv_pool_gib(139.5 - first, 139.5 - first, 0.4) == pytest.approx(33.48)
    # ... and 0.6 + 0.6, one after the other, is no failure in 0.5.23: the second holds
    # 0.6 of the 40 % left.  (Started together, both see the GPU free and the second's
    # pool allocation fails with CUDA's out-of-memory error.)
    second = kv_pool_gib(139.5 * 0.4, 139.5 * 0.4, 0.6)
    assert second == pytest.approx(33.48)
    # Weights over F of what was free: SGLang's own ValueError.
    with pytest.raises(ValueError) as raised:
        kv_pool_gib(55.8, 55.8 - 40.0, 0.3)
    assert str(raised.value) == real_no_pool_message(0.3, 55.8 - 40.0, 55.8)
    assert "Raise --mem-fraction-static above 0.717 " in str(raised.value)
    # Without --mem-fraction-static: the capacity less a 10 GiB reserve on a large GPU.
    assert default_mem_fraction(140.4, 1) == pytest.approx(0.929, abs=0.001)
