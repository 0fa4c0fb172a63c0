"""How soon `deployctl logs -f` shows a crash written to a log on a real sshd host.

Starts one real sshd test host (tests.sshd_hosts.start_lab, needs root and openssh-server),
runs `deployctl logs -f --path LOG` against it, appends a scheduler crash traceback to the log
at a recorded time, and measures until deployctl's stdout shows the crash mark (`!! ` on the
traceback's first line) and the crash report (`CRASH: …`). 9 trials, at random phases of the
0.25 s poll. Run: python benchmarks/follow_latency.py. Results go to benchmarks/results/.
"""

from __future__ import annotations

import json
import os
import queue
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.sshd_hosts import SSHLab, sh, start_lab  # noqa: E402 - needs the path above

RESULTS = Path(__file__).resolve().parent / "results"
TRIALS = 9
# Its own host name (so its own login user, dct-follow): test sessions use alpha…delta.
HOST = "follow"
REMOTE_LOG = "~/logs/server.log"


def crash(trial: int) -> str:
    """Return a scheduler crash; its frame line differs per trial so each is a new report."""
    stamp = f"2026-11-29 10:13:{trial:02d}"
    return (
        f"[{stamp} TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/env/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", '
        "line 3012, in run_scheduler_process\n"
        "    scheduler.event_loop_overlap()\n"
        '  File "/env/lib/python3.11/site-packages/sglang/srt/layers/logits_processor.py", '
        f"line {400 + trial}, in forward\n"
        "    hidden = hidden_states[pruned] + bias\n"
        "RuntimeError: The size of tensor a (160) must match the size of tensor b (2) at "
        "non-singleton dimension 0\n"
    )


def follow(lab: SSHLab, base: Path) -> tuple[list[float], list[float]]:
    host = lab.hosts[HOST]
    log = host.home / "logs" / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("[2026-11-29 10:12:00] The server is fired up and ready to roll!\n")
    sh("chown", "-R", f"{host.user}:{host.user}", host.home)
    inventory = lab.inventory(base / "inv.yml", [HOST])
    home = base / "client-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPLOYCTL_", "SSH_AUTH"))}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    argv = ["logs", "-f", "-i", str(inventory), "--path", REMOTE_LOG, "-n", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployctl", *argv],
        cwd=base,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout

    def read() -> None:
        for line in stdout:
            lines.put((time.monotonic(), line))

    threading.Thread(target=read, daemon=True).start()

    def wait_for(text: str, timeout: float = 15) -> float:
        deadline = time.monotonic() + timeout
        while True:
            try:
                arrived, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                proc.kill()
                raise SystemExit(
                    f"no {text!r} within {timeout}s: {proc.communicate()[1]}"
                ) from None
            if text in line:
                return arrived

    marks: list[float] = []
    reports: list[float] = []
    try:
        wait_for("ready to roll")
        for trial in range(TRIALS):
            time.sleep(random.uniform(0.3, 0.8))  # a random phase of the 0.25 s poll
            text = crash(trial)
            with log.open("a") as handle:
                start = time.monotonic()
                handle.write(text)
            marks.append(wait_for(f"!! [2026-11-29 10:13:{trial:02d} TP0]") - start)
            reports.append(wait_for("CRASH:") - start)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    if proc.returncode != 0:
        raise SystemExit(f"deployctl logs -f exited {proc.returncode}")
    return marks, reports


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("needs root (it starts sshd and creates the test user dct-follow)")
    base = Path(tempfile.mkdtemp(prefix="deployctl-bench-follow-", dir="/tmp"))
    lab = start_lab(base, [HOST])
    try:
        marks, reports = follow(lab, base)
    finally:
        host = lab.hosts[HOST]
        host.stop()
        host.kill_processes()
        shutil.rmtree(base, ignore_errors=True)
        sh("userdel", host.user, check=False)

    def ms(values: list[float]) -> list[float]:
        return [round(v * 1000, 1) for v in values]

    print(f"deployctl logs -f over real sshd (loopback), {TRIALS} trials, poll every 0.25 s")
    print(f"{'until':28} {'median ms':>10} {'max ms':>8} {'min ms':>8}")
    for name, values in (("crash mark (!! line)", marks), ("crash report (CRASH:)", reports)):
        print(
            f"{name:28} {statistics.median(values) * 1000:10.0f} "
            f"{max(values) * 1000:8.0f} {min(values) * 1000:8.0f}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "follow_latency.json"
    out.write_text(
        json.dumps(
            {
                "trials": TRIALS,
                "poll_interval_s": 0.25,
                "mark_ms": ms(marks),
                "report_ms": ms(reports),
                "mark_median_ms": round(statistics.median(marks) * 1000, 1),
                "mark_max_ms": round(max(marks) * 1000, 1),
                "report_median_ms": round(statistics.median(reports) * 1000, 1),
                "report_max_ms": round(max(reports) * 1000, 1),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
