"""The real browser works: a page from a loopback server renders, runs JavaScript, receives
server-sent events as they are sent, and a screenshot of it is kept."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import tests.browser
from tests.browser import ARTIFACTS, missing_browser, save_screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Page

PAGE = b"""<!doctype html>
<html><head><title>browser check</title></head>
<body style="background:#fff">
<h1>Fleet</h1>
<p id="script">not run</p>
<ul id="events"></ul>
<script>
document.getElementById("script").textContent = "ran";
window.received = [];
function listen() {
  const source = new EventSource("/events");
  source.onmessage = (event) => {
    window.received.push(event.data);
    const item = document.createElement("li");
    item.textContent = event.data;
    document.getElementById("events").append(item);
    if (window.received.length === 2) source.close();  // no reconnect after the stream ends
  };
}
</script>
</body></html>
"""


@dataclass
class EventServer:
    """What the test steers: the server holds the second event back until `release` is set."""

    url: str
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def server() -> Iterator[EventServer]:
    """A tiny http.server on a free loopback port: the page at / and an event stream at /events."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/":
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(PAGE)))
                self.end_headers()
                self.wfile.write(PAGE)
            elif self.path == "/events":
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                self.wfile.write(b"data: first\n\n")
                self.wfile.flush()
                # The second waits for the test: the page must get the first while the stream
                # is still open, not both in one finished body.
                release.wait(timeout=10)
                self.wfile.write(b"data: second\n\n")
                self.wfile.flush()
            else:
                self.send_error(404)

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep pytest's output to the test's own

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    events = EventServer(f"http://127.0.0.1:{httpd.server_address[1]}/", release)
    try:
        yield events
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_page_renders_and_runs_javascript(page: Page, server: EventServer) -> None:
    page.goto(server.url)
    assert page.title() == "browser check"
    assert page.locator("h1").inner_text() == "Fleet"
    assert page.locator("#script").inner_text() == "ran"
    assert page.evaluate("() => [window.innerWidth, window.innerHeight]") == [1440, 900]


def test_event_source_delivers_messages_as_sent(page: Page, server: EventServer) -> None:
    page.goto(server.url)
    page.evaluate("listen()")
    page.wait_for_function("window.received.length === 1", timeout=5000)
    assert page.evaluate("window.received") == ["first"]
    server.release.set()
    page.wait_for_function("window.received.length === 2", timeout=5000)
    assert page.evaluate("window.received") == ["first", "second"]
    assert page.locator("#events li").all_inner_texts() == ["first", "second"]


def test_screenshot_is_kept(page: Page, server: EventServer) -> None:
    page.goto(server.url)
    path = save_screenshot(page, "browser-check")
    assert path == ARTIFACTS / "browser-check.png"
    png = path.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    # IHDR, right after the signature: width and height, 4 bytes each, big-endian.
    assert (int.from_bytes(png[16:20]), int.from_bytes(png[20:24])) == (1440, 900)


def test_a_missing_chromium_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    absent = tmp_path / "chromium"
    monkeypatch.setattr(tests.browser, "CHROMIUM", absent)
    assert missing_browser() == f"chromium is not installed ({absent})"
