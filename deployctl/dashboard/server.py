"""The dashboard's web server: a Starlette app over the collector's documents.

Read-only: GET only. `/` is the page (static files shipped in the package: no CDN), `/api/status`
the `status --metrics --json` document, `/api/dashboard` what the page draws, and
`/api/events` a server-sent event stream of `/api/dashboard`, one event per round. With a
token every request must carry it: `Authorization: Bearer T`, or the cookie the page gets
when it is opened once with `?token=T` (an EventSource cannot send headers).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from deployctl.dashboard.access import COOKIE, token_matches
from deployctl.dashboard.collector import Collector, Snapshot

STATIC = Path(__file__).resolve().parent / "static"
# How long the event stream waits for a round before it sends a keep-alive comment.
KEEPALIVE_S = 15.0
# Seconds Ctrl-C waits for open requests to finish before it closes them.
SHUTDOWN_GRACE_S = 5
# Files the page is built from; anything else under /static is not served.
PAGE_FILES = ("index.html", "app.js", "style.css")
# Every answer is of now: no browser or proxy may keep one.
NO_STORE = {"Cache-Control": "no-store"}


def build_app(collector: Collector, token: str | None) -> Starlette:
    """The dashboard's routes, each behind the token when there is one."""

    async def page(request: Request) -> Response:
        response = FileResponse(STATIC / "index.html", headers=NO_STORE)
        given = request.query_params.get("token")
        if token is not None and given is not None:  # checked by the middleware already
            response.set_cookie(COOKIE, given, httponly=True, samesite="strict")
        return response

    async def status(request: Request) -> Response:
        snapshot = await _first_snapshot(collector)
        return _json(snapshot.status if snapshot else _not_yet(collector))

    async def dashboard(request: Request) -> Response:
        snapshot = await _first_snapshot(collector)
        return _json(snapshot.dashboard if snapshot else _not_yet(collector))

    async def events(request: Request) -> Response:
        return StreamingResponse(
            _event_stream(collector, request),
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
    middleware = [Middleware(BaseHTTPMiddleware, dispatch=_guard(token))]
    return Starlette(routes=routes, middleware=middleware)


def _guard(
    token: str | None,
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """Refuse what is not a GET, and any request without the token (when there is one)."""

    async def dispatch(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
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


async def _first_snapshot(collector: Collector) -> Snapshot | None:
    """The latest round; before the first one, wait for it (a page opened at start)."""
    snapshot = collector.latest()
    if snapshot is None:
        snapshot = await run_in_threadpool(collector.wait_newer, 0, 30.0)
    return snapshot


def _not_yet(collector: Collector) -> dict[str, Any]:
    why = f"{type(collector.failure).__name__}: {collector.failure}" if collector.failure else ""
    return {"error": why or "no refresh has finished yet"}


def _json(document: dict[str, Any]) -> Response:
    return Response(json.dumps(document), media_type="application/json", headers=NO_STORE)


async def _event_stream(collector: Collector, request: Request) -> AsyncIterator[str]:
    """One `update` event per round (the first at once), keep-alives in between."""
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
        snapshot = await run_in_threadpool(collector.wait_newer, seq, KEEPALIVE_S)


def serve(app: Starlette, bind: str, port: int, collector: Collector) -> None:
    """Serve until Ctrl-C or SIGTERM; the collector stops first, so the pages' event
    streams end and the server can close."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            collector.request_stop()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=bind, port=port, log_level="warning", access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )  # fmt: skip
    Server(config).run()
