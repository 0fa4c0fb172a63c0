"""Start `time.monotonic()` near zero in every Python process of a test run under
`-p tests.fresh_boot` (on PYTHONPATH only then), and again in each forked child: the CLI's
processes and the stand-in's see a freshly booted machine too. A Python started without its
site (`-S`: a host agent's call) runs no sitecustomize, so it keeps the machine's clock, also
after it adds its site-packages mid-call (files.find_package): a clock swapped under a deadline
taken before would never reach it."""

import os
import sys
import time

START_S = float(os.environ.get("DEPLOYCTL_TEST_MONOTONIC_START", "0.001"))
_real = time.monotonic
_origin = [0.0]


def _rebase() -> None:
    _origin[0] = _real() - START_S


def _monotonic() -> float:
    return _real() - _origin[0]


if not sys.flags.no_site:
    _rebase()
    time.monotonic = _monotonic
    os.register_at_fork(after_in_child=_rebase)
