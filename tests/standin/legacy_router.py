"""A stand-in for sglang-router up to 0.2.1: its legacy worker API and a streaming proxy.

Installed as `sglang_router/launch_router.py` (tests/router_venv.py::legacy_router_python),
it runs as `python -m sglang_router.launch_router --host H --port P [--policy X]
[--worker-urls URL ...]`. Those routers had `POST /add_worker?url=` (after a /health check
of the worker), `POST /remove_worker?url=` and `GET /list_workers`, and no `/workers`.
Requests go round-robin whatever the policy. Stdlib only; one log line per request.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PROXIED = ("/generate", "/v1/completions", "/v1/chat/completions")


class Workers:
    """The registered worker URLs and the round-robin turn, shared by request threads."""

    def __init__(self, urls: list[str]) -> None:
        self.lock = threading.Lock()
        self.urls = list(urls)
        self.turn = 0

    def add(self, url: str) -> bool:
        with self.lock:
            if url in self.urls:
                return False
            self.urls.append(url)
            return True

    def remove(self, url: str) -> None:
        with self.lock:
            if url in self.urls:
                self.urls.remove(url)

    def listed(self) -> list[str]:
        with self.lock:
            return list(self.urls)

    def pick(self) -> str | None:
        with self.lock:
            if not self.urls:
                return None
            self.turn += 1
            return self.urls[(self.turn - 1) % len(self.urls)]


def connect(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=timeout)


def health_error(url: str) -> str | None:
    """Say why the worker's /health does not answer 200, or None when it does."""
    conn = connect(url, timeout=5)
    try:
        conn.request("GET", "/health")
        status = conn.getresponse().status
    except OSError as exc:
        return f"Failed to add worker {url}: /health unreachable ({exc})"
    finally:
        conn.close()
    return None if status == 200 else f"Failed to add worker {url}: /health returned {status}"


class Handler(BaseHTTPRequestHandler):
    server: Any  # the ThreadingHTTPServer below, which carries .workers

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/health":
            self.reply(200, "OK")
        elif path == "/list_workers":
            self.reply(200, json.dumps({"urls": self.server.workers.listed()}), "application/json")
        else:
            self.reply(404, "Not Found")

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        url = parse_qs(parts.query).get("url", [""])[0]
        workers: Workers = self.server.workers
        if parts.path in PROXIED:
            self.proxy(parts.path)
        elif parts.path in ("/add_worker", "/remove_worker") and not url:
            self.reply(400, "Worker URL required. Provide 'url' query parameter")
        elif parts.path == "/add_worker":
            error = health_error(url)
            if error is None and not workers.add(url):
                error = f"Worker {url} already exists"
            if error:
                self.reply(400, error)
            else:
                self.reply(200, f"Successfully added worker: {url}")
        elif parts.path == "/remove_worker":
            workers.remove(url)
            self.reply(200, f"Successfully removed worker: {url}")
        else:
            self.reply(404, "Not Found")

    def do_DELETE(self) -> None:
        self.reply(404, "Not Found")  # the 0.3 API's DELETE /workers/{id} did not exist yet

    def proxy(self, path: str) -> None:
        """Forward the request to the next worker and pass its body on as it arrives."""
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        url = self.server.workers.pick()
        if url is None:
            self.reply(503, "No available workers")
            return
        conn = connect(url, timeout=600)
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            upstream = conn.getresponse()
        except OSError as exc:
            conn.close()
            self.reply(502, f"Failed to reach worker {url}: {exc}")
            return
        # Close-delimited, so each chunk goes out as soon as the worker sends it.
        self.send_response(upstream.status)
        self.send_header("Content-Type", upstream.getheader("Content-Type", "application/json"))
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            while chunk := upstream.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()
        finally:
            conn.close()

    def reply(self, code: int, text: str, ctype: str = "text/plain; charset=utf-8") -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        print(f"{self.address_string()} {format % args}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Serve the legacy router API on --host:--port until SIGTERM."""
    parser = argparse.ArgumentParser(prog="sglang_router.launch_router")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--policy", default="cache_aware")
    parser.add_argument("--worker-urls", nargs="*", default=[])
    # Accepted for the real router's command lines; the stand-in serves no metrics.
    parser.add_argument("--prometheus-host")
    parser.add_argument("--prometheus-port", type=int)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.workers = Workers(args.worker_urls)  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"legacy router listening on {args.host}:{args.port} policy={args.policy}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
