"""Ctrl-C ends a command within interrupts.GRACE_S whatever its threads are doing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from deployctl import interrupts
from tests.sshd_hosts import REPO

# A command whose clean-up after Ctrl-C waits on a worker that never ends (a host that went
# silent mid-read), or that takes charge of the interrupt and then ends by itself.
PROGRAM = """
import sys, threading, time
from deployctl import interrupts
interrupts.install()
hang = threading.Event()
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    if sys.argv[1] == "charge":
        interrupts.take_charge()
        time.sleep(interrupts.GRACE_S + 1)  # puts back what it changed, then ends
        print("put back", flush=True)
        sys.exit(130)
    hang.wait()  # a clean-up that never ends
"""


def interrupted(mode: str) -> tuple[subprocess.CompletedProcess[str], float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, mode],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # A shell's background job hands its children SIGINT ignored: start with it default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - began
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), took


def test_ctrl_c_ends_a_command_whose_clean_up_hangs_within_the_grace() -> None:
    done, took = interrupted("hang")
    assert done.returncode == 130, done
    assert done.stderr == interrupts.MESSAGE
    # Never before the grace (its clean-up had the time); not much after it on a busy machine.
    grace = interrupts.GRACE_S
    assert grace <= took < grace + 3, (
        f"ended {took:.2f}s after Ctrl-C, bounds {grace}s to {grace + 3}s"
    )


def test_a_command_that_takes_charge_of_ctrl_c_is_not_ended_early() -> None:
    done, took = interrupted("charge")
    assert (done.returncode, done.stdout) == (130, "put back\n"), done
    assert took >= interrupts.GRACE_S + 1, (
        f"ended {took:.2f}s after Ctrl-C, bound {interrupts.GRACE_S + 1}s"
    )
