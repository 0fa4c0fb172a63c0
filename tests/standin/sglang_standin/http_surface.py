"""HTTP: the endpoints deployctl probes, with uvicorn-style access lines."""

from __future__ import annotations

import json
import os
import random
import select
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

from .decoder import prompt_tokens
from .log_lines import SHUTDOWN_HEALTH_LINE, log, uvicorn_log
from .pd_common import PDFailure

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from .launcher import Launcher


def activate(server: ThreadingHTTPServer, sockaddr: Any) -> str | None:
    """Bind and listen; on failure close it and return the error as asyncio's and uvloop's
    create_server word it."""
    try:
        server.server_bind()
        server.server_activate()
    except OSError as exc:
        server.server_close()
        reason = (exc.strerror or str(exc)).lower()
        return (
            f"[Errno {exc.errno}] error while attempting to bind on address {sockaddr!r}: {reason}"
        )
    return None


def make_http_server(family: int, sockaddr: Any, launcher: Launcher) -> ThreadingHTTPServer:
    """Create (unbound) the HTTP server; imported lazily so ranks start fast."""
    from http import HTTPStatus
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import unquote

    # Here, not at the top: pd_prefill imports activate() from this module.
    from .pd_decode import DecodePD
    from .pd_prefill import PrefillPD

    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server: Any  # the _HTTPServer below, which carries .launcher

        def do_GET(self) -> None:
            self._route()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path = self.path.split("?", 1)[0]
            launcher = self.server.launcher
            # A drain (SIGTERM) still takes new requests, as SGLang's does: only /health
            # answers 503 then.
            generates = launcher.ready and launcher.node_rank == 0
            if path == "/v1/completions" and generates:
                with launcher.in_flight():
                    self._stream_completion(json.loads(body or b"{}"))
            elif path == "/generate" and generates:
                with launcher.in_flight():
                    self._generate(json.loads(body or b"{}"))
            elif path == "/flush_cache" and launcher.node_rank == 0:
                self._send(200, b"Cache flushed.\nPlease check backend logs for more details.")
            else:
                self._route()

        def _pd_serve(self, request: dict[str, Any], rid: str) -> PDFailure | None:
            """PD: the prefill computes and hands over the room's KV, the decode gets it."""
            pd = self.server.launcher.pd
            try:
                if isinstance(pd, PrefillPD):
                    pd.serve(request, rid, prompt_tokens(request))
                elif isinstance(pd, DecodePD):
                    pd.receive(request, rid, lambda: client_gone(self.connection))
            except PDFailure as failure:
                return failure
            return None

        def _start_stream(self) -> None:
            # Starlette's StreamingResponse sends its headers before the first chunk.
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def _sse(self, doc: Any) -> None:
            data = b"[DONE]" if doc is None else json.dumps(doc).encode()
            self.wfile.write(b"data: " + data + b"\n\n")
            self.wfile.flush()

        def _send_abort(self, failure: PDFailure) -> None:
            """A non-streamed request's abort: ValueError (400) or HTTPException (5xx)."""
            if failure.status == 400 and self.path.startswith("/generate"):
                self._send_json(400, {"error": {"message": str(failure)}})  # _create_error_response
                return
            kind = "BadRequestError" if failure.status == 400 else str(failure.status)
            error = {"object": "error", "message": str(failure), "type": kind, "param": None,
                     "code": failure.status}  # fmt: skip
            self._send_json(failure.status, error)

        def _generate(self, request: dict[str, Any]) -> None:
            """SGLang's native /generate: cumulative text and meta_info per chunk when
            streaming, else one JSON answer."""
            launcher = self.server.launcher
            params = request.get("sampling_params") or {}
            wanted = int(params.get("max_new_tokens") or 16)
            prompt = prompt_tokens(request)
            prefill = isinstance(launcher.pd, PrefillPD)
            stream = bool(request.get("stream"))
            sent, text = 0, ""

            def answer(done: bool, abort: PDFailure | None = None) -> dict[str, Any]:
                finish: dict[str, Any] | None = None
                if abort is not None:
                    finish = {"type": "abort", "message": str(abort), "status_code": abort.status}
                elif done:  # a prefill finishes with FINISH_LENGTH(length=0)
                    finish = {"type": "length", "length": 0 if prefill else wanted}
                meta = {"id": "standin", "finish_reason": finish, "prompt_tokens": prompt,
                        "completion_tokens": sent, "cached_tokens": 0}  # fmt: skip
                return {"text": text, "meta_info": meta, "index": 0}

            if launcher.pd is not None:
                if stream:
                    self._start_stream()
                failure = self._pd_serve(request, uuid_hex())
                if failure is not None and not stream:
                    self._send_abort(failure)
                    return
                if failure is not None or prefill:
                    if failure is None:  # the prefill's one token; the decode goes on from it
                        sent, text = 1, " tok"
                    if not stream:
                        self._send_json(200, answer(True))
                        return
                    self._sse(answer(True, failure))
                    self._sse(None)
                    return
            tokens = launcher.decoder.submit(wanted, stream, request)
            if not stream:
                while sent < wanted:
                    n = tokens.out.get()
                    sent, text = sent + n, text + " tok" * n
                self._send_json(200, answer(True))
                return
            if launcher.pd is None:
                self._start_stream()
            with launcher.decoder.aborted_when_gone(tokens):
                while sent < wanted:
                    n = tokens.out.get()
                    sent, text = sent + n, text + " tok" * n
                    self._sse(answer(sent >= wanted))
            self._sse(None)

        def _stream_completion(self, request: dict[str, Any]) -> None:
            """OpenAI-style SSE chunks as the decode model produces tokens."""
            launcher = self.server.launcher
            wanted = int(request.get("max_tokens") or 16)
            created = int(time.time())
            stream = bool(request.get("stream", True))
            prefill = isinstance(launcher.pd, PrefillPD)
            sent = 0

            def chunk(text: str, finish: str | None) -> dict[str, Any]:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
                return {"id": "cmpl-standin", "object": "text_completion", "created": created,
                        "model": launcher.served_model_name, "choices": [choice]}  # fmt: skip

            def usage() -> dict[str, int]:
                prompt = len(str(request.get("prompt", "")).split())
                return {"prompt_tokens": prompt, "completion_tokens": sent,
                        "total_tokens": prompt + sent}  # fmt: skip

            if launcher.pd is not None:
                if stream:
                    self._start_stream()
                failure = self._pd_serve(request, uuid_hex())
                if failure is not None:
                    if not stream:
                        self._send_abort(failure)
                        return
                    # serving_completions: an abort with a status code is one error chunk.
                    error = {"object": "error", "message": str(failure),
                             "type": HTTPStatus(failure.status).name, "param": None,
                             "code": failure.status}  # fmt: skip
                    self._sse({"error": error})
                    self._sse(None)
                    return
                if prefill:  # the prefill's reply: its one token, then done
                    sent = 1
                    if not stream:
                        self._send_json(200, {**chunk(" tok", "length"), "usage": usage()})
                        return
                    self._sse(chunk(" tok", "length"))
                    if (request.get("stream_options") or {}).get("include_usage"):
                        self._sse({**chunk("", None), "choices": [], "usage": usage()})
                    self._sse(None)
                    return
            tokens = launcher.decoder.submit(wanted, stream, request)
            if launcher.pd is None:
                self._start_stream()
            with launcher.decoder.aborted_when_gone(tokens):
                while sent < wanted:
                    n = tokens.out.get()
                    sent += n
                    self._sse(chunk(" tok" * n, "length" if sent >= wanted else None))
            if (request.get("stream_options") or {}).get("include_usage"):
                self._sse({**chunk("", None), "choices": [], "usage": usage()})
            self._sse(None)

        def _route(self) -> None:
            launcher = self.server.launcher
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate", "/ready", "/ping"):
                healthy = launcher.healthy()
                if launcher.exiting and path in ("/health", "/health_generate"):
                    log(SHUTDOWN_HEALTH_LINE)
                if path in ("/health", "/health_generate") and healthy:
                    # SGLang runs a 1-token request and sleeps 1 s before it looks.
                    time.sleep(float(launcher.knobs["health_s"]))
                    # /health skips the generation when SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION
                    # is off (environ.py's EnvBool; on by default).
                    generates = path == "/health_generate" or os.environ.get(
                        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true"
                    ).lower() not in ("false", "0", "no", "n")
                    if (
                        generates
                        and isinstance(launcher.pd, DecodePD)
                        and launcher.pd.health_failing()
                    ):
                        healthy = False
                        launcher.log_health_check_failed()
                self._send(200 if healthy else 503)
            elif launcher.node_rank > 0:  # 0.5.23's dummy health server serves nothing else
                self._send_json(404, {"detail": "Not Found"})
            elif path == "/metrics" and launcher.args.enable_metrics:
                self._send(200, launcher.metrics_text().encode(), "text/plain; version=0.0.4")
            elif path in ("/model_info", "/get_model_info"):
                self._send_json(200, launcher.model_info())
            elif path == "/v1/models":
                self._send_json(200, {"object": "list", "data": [launcher.model_card()]})
            elif path.startswith("/v1/models/"):
                name = unquote(path[len("/v1/models/") :])
                if name == launcher.served_model_name:
                    self._send_json(200, launcher.model_card())
                else:
                    error = {
                        "message": f"The model '{name}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                    self._send_json(404, {"error": error})
            elif path in ("/server_info", "/get_server_info"):
                self._send_json(200, launcher.server_info())
            else:
                self._send_json(404, {"detail": "Not Found"})

        def _send(self, code: int, body: bytes = b"", ctype: str | None = None) -> None:
            self.send_response(code)
            if ctype:
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _send_json(self, code: int, obj: Any) -> None:
            self._send(code, json.dumps(obj).encode(), "application/json")

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            if self.server.launcher.node_rank > 0:
                return  # the dummy health server logs at warning level: no access lines
            status = int(code) if str(code).isdigit() else 0
            try:
                phrase = HTTPStatus(status).phrase
            except ValueError:
                phrase = ""
            host, port = self.client_address[:2]
            uvicorn_log(
                "INFO", f'{host}:{port} - "{self.requestline}" {status} {phrase}'.rstrip(), fd=1
            )

        def log_message(self, format: str, *args: Any) -> None:
            pass  # uvicorn prints access lines only; errors stay quiet

    class _HTTPServer(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 2048  # uvicorn's backlog: many streams connect at once

        def __init__(self, family: int, sockaddr: Any, launcher: Launcher) -> None:
            self.address_family = family
            self.launcher = launcher
            super().__init__(sockaddr, _Handler, bind_and_activate=False)

        def handle_error(self, request: Any, client_address: Any) -> None:
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)
            # A client gone mid-answer is no error to uvicorn: nothing is printed.

        def server_bind(self) -> None:
            # Skip HTTPServer's getfqdn(): a DNS lookup here would slow start-up.
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(self.server_address)
            self.server_address = self.socket.getsockname()

    return _HTTPServer(family, sockaddr, launcher)


def client_gone(conn: socket.socket) -> bool:
    """Say whether the HTTP client closed its end (a disconnect aborts the request)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def uuid_hex() -> str:
    return f"{random.getrandbits(128):032x}"  # a request id, as SGLang's uuid4().hex
