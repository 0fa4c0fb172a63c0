"""The dashboard's web server: a Starlette app over the collector's documents.

Read-only: GET only. `/` is the page (static files shipped in the package: no CDN), `/api/status`
the `status --metrics --json` document, `/api/dashboard` what the page draws, and
`/api/events` a server-sent event stream of `/api/dashboard`, one event per round (streams
wait on the event loop, not in a thread each). With a token every request must carry it:
`Authorization: Bearer T`, or the cookie the page gets when it is opened once with `?token=T`
(an EventSource cannot send headers). Every request must name the server by a name it
answers to (its `Host`): a web page that rebinds its own name to this address is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from deployctl.dashboard.access import COOKIE, allowed_hosts, host_allowed, token_matches
from deployctl.dashboard.collector import Collector, Snapshot
from deployctl.errors import UsageError

STATIC = Path(__file__).resolve().parent / "static"
# How long the event stream waits for a round before it sends a keep-alive comment.
KEEPALIVE_S = 15.0
# Seconds Ctrl-C waits for open requests to finish before it closes them.
SHUTDOWN_GRACE_S = 5
# Files the page is built from; anything else under /static is not served.
PAGE_FILES = ("index.html", "app.js", "style.css")
# Every answer is of now: no browser or proxy may keep one.
NO_STORE = {"Cache-Control": "no-store"}
# uvicorn's own listen backlog.
BACKLOG = 2048


class _Rounds:
    """Wait for the collector's next round on the event loop: the collector's thread wakes
    the waiters, so an open event stream holds no thread of the pool."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None  # replaced after each wake-up
        collector.add_listener(self._wake_soon)

    def _wake_soon(self) -> None:  # in the collector's thread
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: no one waits
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self.event is not None:
            self.event.set()
            self.event = None

    async def newer(self, seq: int, timeout: float) -> Snapshot | None:
        """The first round after `seq`; None at `timeout`, on a failure or when stopping."""
        self.loop = asyncio.get_running_loop()
        deadline = self.loop.time() + timeout
        while not self.collector.stopping and self.collector.failure is None:
            latest = self.collector.latest()
            if latest is not None and latest.seq > seq:
                return latest
            left = deadline - self.loop.time()
            if left <= 0:
                return None
            if self.event is None:
                self.event = asyncio.Event()
            try:
                await asyncio.wait_for(self.event.wait(), left)
            except TimeoutError:
                return None
        return None


def build_app(
    collector: Collector, token: str | None, bind: str = "127.0.0.1", allow: Iterable[str] = ()
) -> Starlette:
    """The dashboard's routes, each behind the token when there is one, answering only to
    the bound address, `localhost` and the `allow`ed names."""
    rounds = _Rounds(collector)

    async def page(request: Request) -> Response:
        response = FileResponse(STATIC / "index.html", headers=NO_STORE)
        given = request.query_params.get("token")
        if token is not None and given is not None:  # checked by the middleware already
            response.set_cookie(COOKIE, given, httponly=True, samesite="strict")
        return response

    async def status(request: Request) -> Response:
        snapshot = await _first_snapshot(rounds)
        return _json(snapshot.status if snapshot else _not_yet(collector))

    async def dashboard(request: Request) -> Response:
        snapshot = await _first_snapshot(rounds)
        return _json(snapshot.dashboard if snapshot else _not_yet(collector))

    async def events(request: Request) -> Response:
        return StreamingResponse(
            _event_stream(rounds, request),
            media_type="text/event-stream",
            headers={**NO_STORE, "X-Accel-Buffering": "no"},
        )

    routes = [
        Route("/", page),
        Route("/api/status", status),
        Route("/api/dashboard", dashboard),
        Route("/api/events", events),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    names = allowed_hosts(bind, allow)
    middleware = [Middleware(BaseHTTPMiddleware, dispatch=_guard(token, names))]
    return Starlette(routes=routes, middleware=middleware)


def _guard(
    token: str | None, names: frozenset[str]
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """Refuse a `Host` the server does not answer to, what is not a read (GET, HEAD), and
    any request without the token (when there is one)."""

    async def dispatch(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if not host_allowed(request.headers.get("host"), names):
            return JSONResponse(
                {"error": "this dashboard does not answer to that name (Host header)",
                 "hint": "open it by its address or localhost, or serve it with --allow-host NAME"},
                status_code=400,
            )  # fmt: skip
        if request.method not in ("GET", "HEAD"):
            return JSONResponse({"error": "the dashboard is read-only"}, status_code=405)
        if token is not None and not token_matches(_given_token(request), token):
            return JSONResponse(
                {"error": "a token is needed: open the page with ?token=…"}, status_code=401
            )
        if request.url.path.startswith("/static/") and request.url.path[8:] not in PAGE_FILES:
            return JSONResponse({"error": "not found"}, status_code=404)
        return await call_next(request)

    return dispatch


def _given_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.query_params.get("token") or request.cookies.get(COOKIE)


async def _first_snapshot(rounds: _Rounds) -> Snapshot | None:
    """The latest round; before the first one, wait for it (a page opened at start)."""
    snapshot = rounds.collector.latest()
    if snapshot is None:
        snapshot = await rounds.newer(0, 30.0)
    return snapshot


def _not_yet(collector: Collector) -> dict[str, Any]:
    why = f"{type(collector.failure).__name__}: {collector.failure}" if collector.failure else ""
    return {"error": why or "no refresh has finished yet"}


def _json(document: dict[str, Any]) -> Response:
    return Response(json.dumps(document), media_type="application/json", headers=NO_STORE)


async def _event_stream(rounds: _Rounds, request: Request) -> AsyncIterator[str]:
    """One `update` event per round (the first at once), keep-alives in between."""
    collector = rounds.collector
    seq = 0
    snapshot = collector.latest()
    while not collector.stopping:  # the server is shutting down: end the stream
        if snapshot is not None and snapshot.seq > seq:
            seq = snapshot.seq
            yield f"event: update\nid: {seq}\ndata: {json.dumps(snapshot.dashboard)}\n\n"
        elif collector.failure is not None:
            yield f"event: failed\ndata: {json.dumps(_not_yet(collector))}\n\n"
            return
        else:
            yield ": keep-alive\n\n"
        if await request.is_disconnected():
            return
        snapshot = await rounds.newer(seq, KEEPALIVE_S)


def listen(bind: str, port: int) -> socket.socket:
    """The server's listening socket, opened before anything starts: a taken port or an
    address this machine does not have is one error line."""
    where = f"--bind {bind} --port {port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            bind.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"{where}: the address cannot be resolved ({exc})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"{where}: cannot listen there ({exc.strerror or exc})",
            hint="another program has that port: choose another --port"
            if exc.errno == errno.EADDRINUSE
            else "give an address of this machine with --bind",
        ) from None
    return sock


def serve(app: Starlette, sock: socket.socket, collector: Collector) -> None:
    """Serve on `sock` until Ctrl-C or SIGTERM; the collector stops first, so the pages'
    event streams end and the server can close."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            collector.request_stop()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=SHUTDOWN_GRACE_S
    )
    Server(config).run(sockets=[sock])
