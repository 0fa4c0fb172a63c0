"""A pytest plugin: run as on a freshly booted machine, where `time.monotonic()` is near zero.

Linux's monotonic clock counts from boot, so code that takes a constant start (`last = 0.0`)
for "long ago" works on a machine up for hours and fails on one booted minutes ago, as CI
machines often are. `pytest -p tests.fresh_boot` runs a whole run so (this process, and every
Python it starts with its site, through `fresh_boot_site/sitecustomize.py`: not a host agent's
call, which runs with `-S`); the `fresh_boot_clock` fixture of `tests/conftest.py` does it for
one test.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

SITE = Path(__file__).with_name("fresh_boot_site")
START_S = 0.001


def booted_just_now(start_s: float = START_S) -> Callable[[], float]:
    """A monotonic clock that reads `start_s` now and runs at the real clock's pace."""
    real = time.monotonic
    origin = real() - start_s
    return lambda: real() - origin


def pytest_configure() -> None:
    os.environ["DEPLOYCTL_TEST_MONOTONIC_START"] = str(START_S)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    time.monotonic = booted_just_now()
    # xdist workers are Python processes started after this: the sitecustomize starts them
    # near zero too, and each worker loads this plugin again (a no-op rebase).
