"""ops/driver.py: the Ctrl-C driver rollout and tune share (no host needed)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

from tests.sshd_hosts import REPO

# A unit that starts for 30 s, driven as rollout and tune drive theirs; the process then ends
# the ordinary way (no os._exit, which main() uses and which hid an executor's join).
STARTING = textwrap.dedent(
    """
    import signal, threading, time
    from deployctl.ops.driver import drive

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background shell ignores it

    def starting() -> None:
        print("starting", flush=True)
        time.sleep(30)

    try:
        drive([starting], 1, threading.Event(), lambda: print("first", flush=True))
    except KeyboardInterrupt:
        print("second", flush=True)
    """
)


def test_a_second_ctrl_c_leaves_at_once_and_nothing_joins_the_unit_that_is_starting() -> None:
    """The first Ctrl-C waits for the unit (it puts back what it changed); the second leaves,
    and the interpreter's exit does not wait for the start either (an executor's workers are
    joined at exit: the wait of about 40 s reported, one start long)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STARTING],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "starting\n"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == "first\n"
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == "second\n"
        proc.wait(timeout=60)
        left = time.monotonic() - began
        assert left < 5, f"the second Ctrl-C took {left:.2f}s to leave, bound 5s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# The first Ctrl-C of a command that drives its units (the CLI's handler installed): the units
# put back what they changed for longer than the CLI's grace, and nothing ends them early.
PUTTING_BACK = textwrap.dedent(
    """
    import threading, time
    from deployctl import interrupts
    from deployctl.ops.driver import drive

    interrupts.install()
    cancel = threading.Event()

    def unit() -> str:
        print("starting", flush=True)
        cancel.wait(30)
        time.sleep(interrupts.GRACE_S + 1)  # putting back
        return "put back"

    driven = drive([unit], 1, cancel)
    print(driven.futures[0].result(), driven.interrupted, flush=True)
    """
)


def test_the_first_ctrl_c_of_driven_units_lets_them_put_back_past_the_grace() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PUTTING_BACK],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "starting\n"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "put back True\n")
