"""A router's worker list (SGLang's sglang-router) and the held router locks."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sys
import time
from typing import Any

from .files import fail, state_path
from .routing import HoldArgs, HoldReply, RouterArgs, RouterReply, RouterWorker, WorkersArgs
from .runs import server_address
from .wire import ROUTER_LOCKS, listed_as

ROUTER_TIMEOUT = 5.0


def http_call(
    host: str, port: int, method: str, path: str, body: Any = None
) -> tuple[int | None, bytes]:
    """One HTTP request to a server on this host: its status (None: nothing answers) and body."""
    import http.client

    conn = http.client.HTTPConnection(server_address(host), int(port), timeout=ROUTER_TIMEOUT)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        conn.request(method, path, body=data, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return None, b""
    finally:
        conn.close()


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def router_list(host: str, port: int) -> tuple[str | None, list[RouterWorker], str]:
    """Which registration API the router speaks, its workers, and why none when it fails."""
    status, body = http_call(host, port, "GET", "/workers")
    found = _json_or_none(body) if status == 200 else None
    if isinstance(found, dict) and isinstance(found.get("workers"), list):
        workers: list[RouterWorker] = [
            {
                "id": str(w.get("id")) if w.get("id") is not None else None,
                "url": str(w.get("url")),
                "healthy": w.get("is_healthy") if isinstance(w.get("is_healthy"), bool) else None,
                "load": _whole(w.get("load")),
                "worker_type": str(w["worker_type"]) if w.get("worker_type") else None,
                "bootstrap_port": _whole(w.get("bootstrap_port")),
            }
            for w in found["workers"]
            if isinstance(w, dict) and w.get("url")
        ]
        return "workers", workers, ""
    if status is None:
        return None, [], f"nothing answers on {server_address(host)}:{port}"
    legacy_status, legacy_body = http_call(host, port, "GET", "/list_workers")
    urls = _json_or_none(legacy_body) if legacy_status == 200 else None
    if isinstance(urls, dict) and isinstance(urls.get("urls"), list):
        listed: list[RouterWorker] = [
            {
                "id": None, "url": str(u), "healthy": None, "load": None,
                "worker_type": None, "bootstrap_port": None,
            }
            for u in urls["urls"]
        ]  # fmt: skip
        return "legacy", listed, ""
    return None, [], f"no router API answers on port {port} (GET /workers: {status})"


def _router_change(args: RouterArgs, api: str, workers: list[RouterWorker]) -> str:
    """Ask the router to add or remove the worker; the reason when it refuses. Every entry
    the router has for the URL but ours as asked is removed first, by the router's own id
    (or spelling, on a legacy router): an entry spelled otherwise than ours would stay."""
    from urllib.parse import quote

    host, port, url = args["bind_host"], args["port"], str(args["url"])
    adding = args["action"] == "add"
    if api == "legacy" and args["worker_type"]:
        return f"this router's API (/add_worker) cannot register a {args['worker_type']}"
    entries = listed_as(workers, url)
    kept = [e for e in entries if adding and _as_wanted(args, e)]
    for entry in entries:
        if entry in kept:
            continue
        # Listed in another role, with another bootstrap port, unhealthy or spelled
        # otherwise: an addition adds it anew once it is gone.
        refused = _remove(host, port, api, entry)
        if refused and adding:
            return f"{entry['url']} is listed as {_listed_role(entry)} and was not removed"
        if refused:
            return refused
    if not adding or kept:
        return ""
    if api == "legacy":
        return _refused(*http_call(host, port, "POST", f"/add_worker?url={quote(url, safe='')}"))
    body_args: dict[str, Any] = {"url": url}
    if args["worker_type"]:
        body_args["worker_type"] = args["worker_type"]
    if args["bootstrap_port"] is not None:
        body_args["bootstrap_port"] = args["bootstrap_port"]
    return _refused(*http_call(host, port, "POST", "/workers", body_args))


def _remove(host: str, port: int, api: str, entry: RouterWorker) -> str:
    """Remove one entry of the router's list as the router names it; why not, else ""."""
    from urllib.parse import quote

    if api == "legacy":
        path = f"/remove_worker?url={quote(entry['url'], safe='')}"
        return _refused(*http_call(host, port, "POST", path))
    if not entry["id"]:
        return f"the router lists {entry['url']} with no id to remove it by"
    return _refused(*http_call(host, port, "DELETE", f"/workers/{entry['id']}"))


def _refused(status: int | None, body: bytes) -> str:
    """Why the router did not take a change ("" when it answered 2xx)."""
    if status is not None and 200 <= status < 300:
        return ""
    reason = body.decode("utf-8", "replace").strip().splitlines()
    return f"the router answered {status or 'nothing'}" + (f": {reason[0][:200]}" if reason else "")


def _listed_role(listed: RouterWorker) -> str:
    port = listed["bootstrap_port"]
    return f"{listed['worker_type'] or 'a worker'}" + (f" (bootstrap port {port})" if port else "")


def _router_done(args: RouterArgs, workers: list[RouterWorker]) -> bool:
    entries = listed_as(workers, str(args["url"]))
    if args["action"] == "remove":
        return not entries
    return len(entries) == 1 and _as_wanted(args, entries[0])


def _as_wanted(args: RouterArgs, listed: RouterWorker) -> bool:
    """Listed as the addition asks: spelled as ours, not unhealthy, in the role asked."""
    return (
        listed["url"] == args["url"] and listed["healthy"] is not False and _as_asked(args, listed)
    )


def _as_asked(args: RouterArgs, listed: RouterWorker) -> bool:
    """Listed in the role asked (a router that does not say is taken at its word)."""
    wanted, port = args["worker_type"], args["bootstrap_port"]
    if listed["worker_type"] is None:
        return True
    return (listed["worker_type"] == (wanted or "regular")) and (
        port is None or listed["bootstrap_port"] == port
    )


def _generates(url: str, path: str = "/health_generate") -> str:
    """Ask the worker, from the router's host, to generate (`/health_generate`): a worker
    is added only when it serves, and where its router reaches it. Why not, else ""."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=30) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        return f"{url} cannot be reached from the router's host: {exc}"
    return "" if status == 200 else f"{url}{path} answered {status}"


def cmd_workers(args: WorkersArgs) -> RouterReply:
    """A router's workers, as its list says now."""
    api, workers, error = router_list(args["bind_host"], args["port"])
    return {"api": api, "problem": error, "workers": workers}


def cmd_router(args: RouterArgs) -> RouterReply:
    """Add or remove a router's worker and wait until its list shows it (healthy, for an
    addition) or `wait` runs out: 0.3's router does both in the background. A worker is
    added only once its /health_generate answers 200 from here. `health`: does the worker
    answer /health from here now."""
    host, port = args["bind_host"], args["port"]
    if args["action"] not in ("add", "remove", "health"):
        fail(f"unknown router action {args['action']!r}", "agent")
    api, workers, error = router_list(host, port)
    if api is None:
        return {"api": api, "problem": error, "workers": workers}
    if args["action"] == "health":  # does the URL answer /health now, seen from the router?
        return {"api": api, "problem": _generates(str(args["url"]), "/health"), "workers": workers}
    deadline = time.monotonic() + args["wait"]
    if args["action"] == "add":
        error = _generates(str(args["url"]))
        while error and time.monotonic() < deadline:  # a server just up may answer 503 a while
            time.sleep(0.5)
            error = _generates(str(args["url"]))
    if not error and not _router_done(args, workers):
        error = _router_change(args, api, workers)
    while not error:
        api, workers, error = router_list(host, port)
        if api is None or _router_done(args, workers):
            break
        if time.monotonic() > deadline:
            seen = "still listed" if args["action"] == "remove" else "not listed healthy"
            error = f"{args['url']} is {seen} after {args['wait']:g}s"
            break
        time.sleep(0.2)
    return {"api": api, "problem": error, "workers": workers}


# The file descriptor of the lock this process holds: open until the process ends.
held: list[int] = []


def cmd_hold(args: HoldArgs) -> HoldReply:
    """Take a lock that lives as long as this process: main() then waits for the client to
    close stdin (or to vanish with its connection), so no lock outlives its holder."""
    folder = state_path(args["state_dir"], ROUTER_LOCKS)
    os.makedirs(folder, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", args["name"]) or "_"
    fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raw = os.read(fd, 1 << 16)
        os.close(fd)
        try:
            holder = json.loads(raw)
        except ValueError:
            holder = None
        return {"acquired": False, "holder": holder if isinstance(holder, dict) else {}}
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(dict(args["holder"], since=time.time())).encode())
    held.append(fd)
    return {"acquired": True, "holder": None}


def hold_until_eof() -> None:
    """Keep the lock until the client closes our stdin, or its connection ends."""
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
