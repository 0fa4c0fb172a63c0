"""A real browser for the tests: Debian's headless chromium driven by Playwright's sync API."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tests.sshd_hosts import REPO

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

# Playwright cannot download its own browsers here; it drives the Debian package's binary.
CHROMIUM = Path("/usr/bin/chromium")
# Screenshots a test keeps (git-ignored).
ARTIFACTS = REPO / "tests" / "artifacts"
VIEWPORT = {"width": 1440, "height": 900}


def missing_browser() -> str | None:
    """Say what the browser tests lack, or None when chromium and Playwright are both here."""
    if not CHROMIUM.exists():
        return f"chromium is not installed ({CHROMIUM})"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed in this Python"
    return None


@contextmanager
def running_browser() -> Iterator[Browser]:
    """Start Playwright and a headless chromium; close both afterwards."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Root in a container has no user namespaces for chromium's sandbox.
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            yield browser
        finally:
            browser.close()


def save_screenshot(page: Page, name: str) -> Path:
    """Keep a PNG of the page's viewport as tests/artifacts/NAME.png and return its path."""
    if not name or Path(name).name != name:
        raise ValueError(f"a screenshot name is a plain file name, not {name!r}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name.removesuffix('.png')}.png"
    page.screenshot(path=path)
    return path
