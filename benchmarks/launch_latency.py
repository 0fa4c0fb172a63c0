"""How soon `deployctl launch` returns after SGLang's ready line, or reports a crash line.

Starts one real sshd test host (tests.sshd_hosts.start_lab; needs root and openssh-server;
the host python is Debian's /usr/bin/python3) and launches, as `launch_module`, a tiny server
of this benchmark's own (written into the host user's home). That server prints a few
SGLang-style start-up lines, waits for a trigger file `<model>/go`, then writes in one write
either the ready line or a scheduler crash traceback (RuntimeError: The size of tensor a (160)
must match …), stores the time.time() of that write in `<model>/written`, and then sleeps
(ready) or exits 1 (crash). It serves no /health, so readiness comes from the ready line.

  (a) ready: deployctl exit time - ready line written    (exit 0, state "ready")
  (b) crash: deployctl exit time - crash line written    (exit 1, state "crashed", the crash in --json)

`deployctl launch -i INV --template baseline --timeout 60 --json` runs as a subprocess
(HOME = a temporary folder, PYTHONPATH = the repo). The trigger is created at a random
moment (0.3-0.9 s after the run's log appears), so the write lands at a random phase of
launch's poll loop. `deployctl stop` ends the server between trials; log versions increment.

Passes (ready and crash trials interleaved in each):
  plain    the figures above, `python -m deployctl` exactly as a user runs it
  traced   the same through a wrapper that timestamps each agent round trip in wait_ready,
           wait_ready's return and atexit, to split the latency into its parts
  standin  tests/standin/sglang_standin (knobs: startup_s random 0.8-1.4, crash=startup,
           drain_s=0); the write time is taken by a 2 ms watcher on the log file
plus a breakdown of one poll round trip (ssh exec, python start-up, the agent's own work)
measured over the same sshd with a ready server running.

Run: python benchmarks/launch_latency.py [--trials 9]. JSON goes to
benchmarks/results/launch_latency.json (git-ignored). Both ends share this machine's CPUs:
the load (uptime) is printed and stored.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.sshd_hosts import HOST_PYTHON, SSHLab, TestHost, copy_standin, free_port, sh, start_lab  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# Its own host name (so its own login user, dct-launchlat): test sessions use alpha…delta.
HOST = "launchlat"
SERVER_MODULE = "latency_server"
READY_LINE = "The server is fired up and ready to roll!"
CRASH_TEXT = (
    "The size of tensor a (160) must match the size of tensor b (2) at non-singleton dimension 0"
)
CRASH_MARK = "RuntimeError: " + CRASH_TEXT
SIGNATURE = "tensor-shape-mismatch"
TRACE_ENV = "LAUNCH_LATENCY_TRACE"
FREEZE_ENV = "LAUNCH_LATENCY_GC_FREEZE"
TRACED = ("traced", "gcfreeze")

# ---------------------------------------------------------------------------------------------
# The tiny controllable server (runs on the host with /usr/bin/python3, stdlib only).
# ---------------------------------------------------------------------------------------------

SERVER_SOURCE = r'''"""launch_latency's controllable stand-in for `python -m sglang.launch_server`.

Prints SGLang-style start-up lines, waits for <model-path>/go, then writes the ready line or a
scheduler crash traceback in one write, records time.time() of it in <model-path>/written,
then sleeps (ready) or exits 1 (crash). Knobs: <model-path>/latency_server.json. No HTTP.
"""
import argparse
import json
import os
import sys
import time

CRASH_TEXT = "The size of tensor a (160) must match the size of tensor b (2) at non-singleton dimension 0"


def stamp(rank=""):
    return "[" + time.strftime("%Y-%m-%d %H:%M:%S") + rank + "] "


def write_all(text):
    data = text.encode()
    while data:
        data = data[os.write(1, data):]


def main():
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--port", type=int, default=30000)
    args, _ignored = parser.parse_known_args()  # every other SGLang flag is accepted and ignored
    model = args.model_path
    with open(os.path.join(model, "latency_server.json")) as handle:
        knobs = json.load(handle)
    write_all(
        stamp() + "server_args=ServerArgs(model_path=%r, tp_size=1, port=%d, log_level='info')\n"
        % (model, args.port)
        + stamp() + "Load weight begin. avail mem=139.19 GB\n"
        + stamp() + "Load weight end. elapsed=0.01 s, type=LlamaForCausalLM, avail mem=123.67 GB, "
        "mem usage=15.52 GB.\n"
    )
    trigger = os.path.join(model, "go")
    poll = float(knobs.get("trigger_poll_s", 0.005))
    while not os.path.exists(trigger):
        time.sleep(poll)
    if knobs["mode"] == "ready":
        text = stamp() + "The server is fired up and ready to roll!\n"
    else:
        line = 400 + int(knobs.get("trial", 0))
        text = (
            stamp(" TP0") + "Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/env/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", '
            "line 3012, in run_scheduler_process\n"
            "    scheduler.event_loop_overlap()\n"
            '  File "/env/lib/python3.11/site-packages/sglang/srt/layers/logits_processor.py", '
            "line %d, in forward\n"
            "    hidden = hidden_states[pruned] + bias\n"
            "RuntimeError: %s\n" % (line, CRASH_TEXT)
        )
    write_all(text)  # stdout is the log file (O_APPEND): visible to readers once this returns
    written = time.time()
    tmp = os.path.join(model, "written.tmp")
    with open(tmp, "w") as handle:
        handle.write(repr(written))
    os.replace(tmp, os.path.join(model, "written"))
    if knobs["mode"] != "ready":
        sys.exit(1)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
'''

# ---------------------------------------------------------------------------------------------
# The tracing wrapper: `python trace_deployctl.py launch …` = `python -m deployctl launch …`
# plus timestamps of every agent round trip, wait_ready's return and atexit.
# ---------------------------------------------------------------------------------------------

TRACE_SOURCE = r"""import atexit, base64, json, os, runpy, sys, time

import deployctl.agent as agent
import deployctl.ops.runs as launch

events = [{"what": "main", "t": time.time()}]
_call, _wait_ready = agent.call, launch.wait_ready


def call(host, conn, spec, args, stdin=None):
    t0 = time.time()
    doc = _call(host, conn, spec, args, stdin)
    t1 = time.time()
    size = len(base64.b64decode(doc.get("data", ""))) if spec is agent.POLL else None
    events.append({"what": spec.name, "t0": t0, "t1": t1, "bytes": size})
    return doc


def wait_ready(*args, **kwargs):
    outcome = _wait_ready(*args, **kwargs)
    events.append({"what": "wait_ready_return", "t": time.time(), "state": outcome.state.value})
    return outcome


def dump():
    events.append({"what": "atexit", "t": time.time()})
    with open(os.environ["LAUNCH_LATENCY_TRACE"], "w") as handle:
        json.dump(events, handle)
    if os.environ.get("LAUNCH_LATENCY_GC_FREEZE"):
        import gc

        gc.freeze()  # the experiment: interpreter exit without the final full collections


agent.call, launch.wait_ready = call, wait_ready
atexit.register(dump)
sys.argv = ["deployctl", *sys.argv[1:]]
runpy.run_module("deployctl", run_name="__main__", alter_sys=True)
"""

# ---------------------------------------------------------------------------------------------
# The agent's poll, piece by piece, run locally with the host python (same machine, same files).
# ---------------------------------------------------------------------------------------------

AGENT_PIECES = r"""import json, sys, time
t1 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
from deployctl_remote import dispatch, runs  # the agent's modules and their imports
t2 = time.perf_counter()
args = json.loads(sys.argv[2])
members = runs.process_group(args["pgid"], args["sid"])
t3 = time.perf_counter()
runs.read_from(args["log"], args["offset"], 1 << 20)
t4 = time.perf_counter()
runs.health(args["bind_host"], args["port"])
t5 = time.perf_counter()
runs.health(args["bind_host"], args["port"])
t6 = time.perf_counter()
print(json.dumps({
    "module_imports_ms": (t2 - t1) * 1e3,
    "process_group_ms": (t3 - t2) * 1e3, "read_log_ms": (t4 - t3) * 1e3,
    "health_first_ms": (t5 - t4) * 1e3, "health_again_ms": (t6 - t5) * 1e3,
    "alive": bool(members),
}))
"""


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEPLOYCTL_", "SSH_AUTH"))}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), COLUMNS="200")
    return env


@dataclass
class Bench:
    lab: SSHLab
    base: Path
    host: TestHost
    inv_server: Path
    inv_standin: Path
    model: Path
    standin_model: Path
    env: dict[str, str]
    work: Path
    trace_script: Path
    rng: random.Random
    pgids: set[int] = field(default_factory=set)

    @property
    def logs(self) -> Path:
        return self.host.home / "logs"

    def deployctl(self, *args: str, trace: Path | None = None) -> list[str]:
        if trace is None:
            return [sys.executable, "-m", "deployctl", *args]
        return [sys.executable, str(self.trace_script), *args]

    def stop(self, inventory: Path) -> None:
        done = subprocess.run(
            self.deployctl("stop", "-i", str(inventory), "--json", "--timeout", "5"),
            cwd=self.work, env=self.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"deployctl stop exited {done.returncode}: {done.stderr[-2000:]}")


def chown_home(host: TestHost) -> None:
    sh("chown", "-R", f"{host.user}:{host.user}", host.home)


def setup(lab: SSHLab, base: Path, seed: int) -> Bench:
    host = lab.hosts[HOST]
    (host.home / f"{SERVER_MODULE}.py").write_text(SERVER_SOURCE)
    copy_standin(host.home)
    model = host.home / "model"
    standin_model = host.home / "standin-model"
    model.mkdir()
    standin_model.mkdir()
    (standin_model / "standin.json").write_text(json.dumps({"startup_s": 1.0, "drain_s": 0.0}))
    chown_home(host)
    host.set_gpus("clean", 1)
    common = {
        "tp": 1,
        "bind_host": host.address,
        "port": free_port(host.address),
        "log_dir": "~/logs",
    }
    inv_server = lab.inventory(
        base / "inv-server.yml",
        [HOST],
        {HOST: {**common, "launch_module": SERVER_MODULE, "model_path": str(model)}},
    )
    inv_standin = lab.inventory(
        base / "inv-standin.yml",
        [HOST],
        {HOST: {**common, "launch_module": "sglang_standin", "model_path": str(standin_model)}},
    )
    home = base / "client-home"
    home.mkdir()
    work = base / "work"
    work.mkdir()
    trace_script = base / "trace_deployctl.py"
    trace_script.write_text(TRACE_SOURCE)
    return Bench(
        lab, base, host, inv_server, inv_standin, model, standin_model, cli_env(home), work,
        trace_script, random.Random(seed),
    )  # fmt: skip


class Watcher(threading.Thread):
    """Read a growing log every `every` seconds; note when a marker first shows up."""

    def __init__(self, path_of: Callable[[], Path | None], marker: str, every: float = 0.002):
        super().__init__(daemon=True)
        self.path_of, self.marker, self.every = path_of, marker.encode(), every
        self.found: float | None = None
        self.previous_read: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        buffer, handle = b"", None
        try:
            while not self.done.is_set():
                if handle is None:
                    path = self.path_of()
                    if path is not None:
                        handle = path.open("rb")
                if handle is not None:
                    buffer += handle.read()
                    now = time.time()
                    if self.marker in buffer:
                        self.found = now
                        return
                    self.previous_read = now
                    buffer = buffer[-len(self.marker) :]
                time.sleep(self.every)
        finally:
            if handle is not None:
                handle.close()


def new_log(logs: Path, before: set[str]) -> Path | None:
    try:
        names = set(os.listdir(logs))
    except FileNotFoundError:
        return None
    fresh = sorted(names - before)
    return logs / fresh[0] if fresh else None


def trial(bench: Bench, mode: str, kind: str, index: int) -> dict[str, Any]:
    """One launch; return the latency and what deployctl reported."""
    standin = kind == "standin"
    inventory = bench.inv_standin if standin else bench.inv_server
    model = bench.standin_model if standin else bench.model
    for name in ("go", "written", "written.tmp"):
        (model / name).unlink(missing_ok=True)
    knobs: dict[str, Any]
    if standin:
        knobs = {"startup_s": round(bench.rng.uniform(0.8, 1.4), 3), "drain_s": 0.0}
        if mode == "crash":
            knobs["crash"] = "startup"
        (model / "standin.json").write_text(json.dumps(knobs))
    else:
        knobs = {"mode": mode, "trigger_poll_s": 0.005, "trial": index}
        (model / "latency_server.json").write_text(json.dumps(knobs))
    chown_home(bench.host)
    before = set(os.listdir(bench.logs)) if bench.logs.exists() else set()
    trace = bench.base / f"trace-{kind}-{mode}-{index}.json" if kind in TRACED else None
    env = dict(bench.env, **({TRACE_ENV: str(trace)} if trace else {}))
    if kind == "gcfreeze":
        env[FREEZE_ENV] = "1"
    out_path = bench.base / "launch.out"
    err_path = bench.base / "launch.err"
    load = loadavg()
    watcher: Watcher | None = None
    if standin:
        watcher = Watcher(
            lambda: new_log(bench.logs, before), CRASH_MARK if mode == "crash" else READY_LINE
        )
        watcher.start()
    argv = bench.deployctl(
        "launch", "-i", str(inventory), "--template", "baseline", "--timeout", "60", "--json",
        trace=trace,
    )  # fmt: skip
    with out_path.open("w") as out, err_path.open("w") as err:
        started = time.time()
        proc = subprocess.Popen(argv, cwd=bench.work, env=env, stdout=out, stderr=err)
        exited: list[float] = []
        exit_event = threading.Event()

        def wait() -> None:
            proc.wait()
            exited.append(time.time())
            exit_event.set()

        threading.Thread(target=wait, daemon=True).start()
        log: Path | None = None
        while log is None and not exit_event.is_set():
            log = new_log(bench.logs, before)
            if log is None:
                time.sleep(0.005)
        log_seen = time.time()
        delay = None
        if not standin and log is not None:
            delay = bench.rng.uniform(0.3, 0.9)
            exit_event.wait(delay)
            (model / "go").touch()
        if not exit_event.wait(120):
            proc.kill()
            raise SystemExit(f"{kind} {mode} trial {index}: deployctl launch did not return")
    if watcher is not None:
        watcher.done.set()
        watcher.join(5)
    exit_time = exited[0]
    stdout, stderr = out_path.read_text(), err_path.read_text()
    try:
        doc = json.loads(stdout)
        entry = doc["hosts"][HOST]
    except (ValueError, KeyError):
        raise SystemExit(
            f"{kind} {mode} trial {index}: exit {proc.returncode}, no JSON: {stdout[-1500:]} {stderr[-1500:]}"
        ) from None
    if entry.get("pid"):
        bench.pgids.add(int(entry["pid"]))
    want = (0, "ready") if mode == "ready" else (1, "crashed")
    if (proc.returncode, entry.get("state")) != want:
        raise SystemExit(
            f"{kind} {mode} trial {index}: exit {proc.returncode}, state {entry.get('state')!r}, "
            f"want {want}: {json.dumps(entry)[:2000]} {stderr[-1500:]}"
        )
    if mode == "crash":
        crashes = entry.get("crashes") or []
        if (
            not crashes
            or crashes[0]["signature"] != SIGNATURE
            or CRASH_TEXT not in crashes[0]["message"]
        ):
            raise SystemExit(f"{kind} {mode} trial {index}: crash not in the output: {entry}")
    if standin:
        assert watcher is not None
        if watcher.found is None:
            raise SystemExit(f"standin {mode} trial {index}: the watcher never saw the line")
        written = watcher.found
    else:
        deadline = time.time() + 5
        while not (model / "written").exists() and time.time() < deadline:
            time.sleep(0.005)
        written = float((model / "written").read_text())
    record: dict[str, Any] = {
        "kind": kind,
        "mode": mode,
        "trial": index,
        "latency_ms": (exit_time - written) * 1e3,
        "launch_total_s": exit_time - started,
        "log_seen_after_s": log_seen - started,
        "trigger_delay_s": delay,
        "run": entry.get("run"),
        "elapsed_s_reported": entry.get("elapsed_s"),
        "loadavg": load,
        "knobs": knobs,
    }
    if standin and watcher is not None and watcher.previous_read is not None:
        record["watcher_window_ms"] = (written - watcher.previous_read) * 1e3
    if trace is not None:
        record["trace"] = split_trace(json.loads(trace.read_text()), written, exit_time)
    bench.stop(inventory)
    return record


def split_trace(events: list[dict[str, Any]], written: float, exit_time: float) -> dict[str, Any]:
    """Where the time between the write and the exit went, from the wrapper's timestamps."""
    polls = [e for e in events if e["what"] == "poll"]
    ret = next(e["t"] for e in events if e["what"] == "wait_ready_return")
    at_exit = next(e["t"] for e in events if e["what"] == "atexit")
    detect = polls[-1]
    previous = polls[-2] if len(polls) > 1 else None
    rtts = [(p["t1"] - p["t0"]) * 1e3 for p in polls]
    gaps = [(b["t0"] - a["t1"]) * 1e3 for a, b in itertools.pairwise(polls)]
    return {
        "polls": len(polls),
        "poll_rtt_ms": rtts,
        "poll_gap_ms": gaps,  # time between polls: the loop's own work (the agent long-polls up to POLL_WAIT)
        # < 0: the write landed while the detecting poll was already under way (before its read)
        "write_to_detecting_poll_start_ms": (detect["t0"] - written) * 1e3,
        "detecting_poll_rtt_ms": (detect["t1"] - detect["t0"]) * 1e3,
        # the write landed during the previous poll but after that poll had read the log
        "missed_by_previous_poll": previous is not None and previous["t1"] > written,
        "scan_and_return_ms": (ret - detect["t1"]) * 1e3,
        "report_and_close_ms": (at_exit - ret) * 1e3,  # JSON, Fleet.close, atexit
        "interpreter_exit_ms": (exit_time - at_exit) * 1e3,
        "after_detecting_poll_ms": (exit_time - detect["t1"]) * 1e3,
    }


def breakdown(bench: Bench, samples: int) -> dict[str, Any]:
    """Time one poll's parts over the same sshd while a (ready) server runs."""
    from deployctl.agent import (
        agent_bundle,
        agent_command,
        agent_hash,
        install_agent,
        manifest_digest,
    )
    from deployctl.connection import ConnectOptions, open_connection
    from deployctl.inventory import load_inventory
    from deployctl.ops.runs import POLL_LIMIT_BYTES, POLL_WAIT
    from deployctl.remote.bootstrap import BOOTSTRAP, UNPACK
    from deployctl.remote.wire import poll_args

    model = bench.model
    for name in ("go", "written"):
        (model / name).unlink(missing_ok=True)
    (model / "latency_server.json").write_text(
        json.dumps({"mode": "ready", "trigger_poll_s": 0.005})
    )
    (model / "go").touch()
    chown_home(bench.host)
    done = subprocess.run(
        bench.deployctl("launch", "-i", str(bench.inv_server), "--template", "baseline", "--json"),
        cwd=bench.work, env=bench.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    entry = json.loads(done.stdout)["hosts"][HOST]
    if done.returncode != 0 or entry["state"] != "ready":
        raise SystemExit(f"breakdown launch failed: {done.stdout[-1500:]} {done.stderr[-1500:]}")
    pid = int(entry["pid"])
    bench.pgids.add(pid)
    host = load_inventory(bench.inv_server).select(None)[0]
    run = {
        "pgid": pid,
        "sid": pid,
        "log": entry["log"],
        "port": host.vars["port"],
        "bind_host": host.vars["bind_host"],
    }
    size = Path(entry["log"]).stat().st_size
    args = poll_args(host.settings.state_dir, run, size, POLL_LIMIT_BYTES, 0)  # nothing new
    commands = {
        "ssh exec `true`": "true",
        "ssh + python3 -c pass": f"{HOST_PYTHON} -c pass",
        "ssh + agent poll": agent_command(host, "poll", args),
    }
    conn = open_connection(host, ConnectOptions())
    install_agent(host, conn)  # connect, and put the agent in place, outside the timings
    times: dict[str, list[float]] = {k: [] for k in commands}
    try:
        for _ in range(samples):
            for name, command in commands.items():
                t0 = time.perf_counter()
                result = conn.run(command)
                times[name].append((time.perf_counter() - t0) * 1e3)
                if result.exit_code != 0:
                    raise SystemExit(f"{name} exited {result.exit_code}: {result.stderr[-500:]}")
    finally:
        conn.close()
    local: dict[str, list[float]] = {"python3 -c pass": [], "python3 agent poll": []}
    folder = str(bench.work / "agent" / agent_hash())  # run as on a host: unpacked once
    subprocess.run([HOST_PYTHON, "-c", UNPACK, folder], input=agent_bundle(), check=True)
    poll_argv = [HOST_PYTHON, "-c", BOOTSTRAP, folder, manifest_digest(), "poll", json.dumps(args)]
    for _ in range(samples):
        for name, argv in (
            ("python3 -c pass", [HOST_PYTHON, "-c", "pass"]),
            ("python3 agent poll", poll_argv),
        ):
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            local[name].append((time.perf_counter() - t0) * 1e3)
    pieces = [
        json.loads(
            subprocess.run(
                [HOST_PYTHON, "-c", AGENT_PIECES, folder, json.dumps(args)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        for _ in range(samples)
    ]
    importtime = subprocess.run(
        [HOST_PYTHON, "-X", "importtime", *poll_argv[1:]], capture_output=True, text=True
    ).stderr
    imports = parse_importtime(importtime)
    bench.stop(bench.inv_server)
    return {
        "poll_wait_s": POLL_WAIT,
        "samples": samples,
        "over_ssh_ms": {k: summary(v) for k, v in times.items()},
        "local_ms": {k: summary(v) for k, v in local.items()},
        "agent_pieces_ms": {
            k: summary([p[k] for p in pieces]) for k in pieces[0] if k.endswith("_ms")
        },
        "agent_imports": imports,
    }


def parse_importtime(text: str) -> dict[str, Any]:
    """Total import time of the agent process and its biggest top-level imports."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((int(m[1]), int(m[2]), len(m[3]), m[4]))
    top = [(cum, name) for _self, cum, depth, name in rows if depth == 1]
    top.sort(reverse=True)
    return {
        "total_ms": round(sum(r[0] for r in rows) / 1e3, 1),
        "top_level_ms": {name: round(cum / 1e3, 1) for cum, name in top[:8]},
    }


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def run_pass(bench: Bench, kind: str, trials: int) -> list[dict[str, Any]]:
    records = []
    for index in range(trials):
        for mode in ("ready", "crash") if index % 2 == 0 else ("crash", "ready"):
            record = trial(bench, mode, kind, index)
            records.append(record)
            print(
                f"  {kind:8} {mode:6} #{index}  {record['latency_ms']:7.1f} ms  "
                f"(load {record['loadavg'][0]:.2f}, {record['run']})",
                flush=True,
            )
    return records


def cleanup(lab: SSHLab, bench: Bench | None, base: Path) -> None:
    host = lab.hosts[HOST]
    host.stop()
    for pgid in bench.pgids if bench else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, 9)
    time.sleep(0.2)
    shutil.rmtree(base, ignore_errors=True)
    sh("userdel", host.user, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=9, help="trials per case and pass")
    parser.add_argument("--seed", type=int, default=1, help="seed of the trigger delays")
    parser.add_argument("--no-trace", action="store_true", help="skip the traced pass")
    parser.add_argument("--no-standin", action="store_true", help="skip the stand-in pass")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the poll breakdown")
    parser.add_argument(
        "--gc-freeze-pass",
        action="store_true",
        help="also a traced pass whose deployctl calls gc.freeze() at exit (what-if)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "launch_latency.json")
    opts = parser.parse_args()
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        raise SystemExit("needs root and openssh-server (it starts sshd and creates dct-launchlat)")
    from deployctl.ops.runs import POLL_WAIT

    base = Path(tempfile.mkdtemp(prefix="deployctl-bench-launch-", dir="/tmp"))
    uptime_before = uptime()
    print(f"before: {uptime_before}", flush=True)
    lab = start_lab(base, [HOST])
    bench: Bench | None = None
    passes: dict[str, list[dict[str, Any]]] = {}
    detail: dict[str, Any] = {}
    try:
        bench = setup(lab, base, opts.seed)
        passes["plain"] = run_pass(bench, "plain", opts.trials)
        if not opts.no_trace:
            passes["traced"] = run_pass(bench, "traced", opts.trials)
        if opts.gc_freeze_pass:
            passes["gcfreeze"] = run_pass(bench, "gcfreeze", opts.trials)
        if not opts.no_standin:
            passes["standin"] = run_pass(bench, "standin", opts.trials)
        if not opts.no_breakdown:
            detail = breakdown(bench, 20)
    finally:
        cleanup(lab, bench, base)
    uptime_after = uptime()

    def figures(kind: str, mode: str) -> list[float]:
        return [r["latency_ms"] for r in passes[kind] if r["mode"] == mode]

    names = {
        "ready": "(a) ready line -> launch exits 0",
        "crash": "(b) crash line -> launch exits 1",
    }
    print()
    print(
        f"deployctl launch over one real sshd (loopback), {opts.trials} trials per row, "
        f"POLL_WAIT {POLL_WAIT} s, {os.cpu_count()} CPUs shared by both ends"
    )
    print(f"load before: {uptime_before}")
    print(f"load after:  {uptime_after}")
    print(
        f"{'pass':8} {'figure':34} {'median ms':>10} {'min ms':>8} {'max ms':>8}  load1 (min-max)"
    )
    table: dict[str, Any] = {}
    for kind, records in passes.items():
        for mode in ("ready", "crash"):
            values = figures(kind, mode)
            loads = [r["loadavg"][0] for r in records if r["mode"] == mode]
            s = summary(values)
            table[f"{kind}/{mode}"] = {**s, "ms": [round(v, 1) for v in values]}
            print(
                f"{kind:8} {names[mode]:34} {s['median']:10.0f} {s['min']:8.0f} {s['max']:8.0f}"
                f"  {min(loads):.2f}-{max(loads):.2f}"
            )
    split: dict[str, Any] = {}
    for traced in (k for k in TRACED if k in passes):
        print()
        print(f"{traced}: where the time goes (median / min / max, ms)")
        keys = [
            ("write_to_detecting_poll_start_ms", "write -> start of the poll that sees it"),
            ("detecting_poll_rtt_ms", "that poll's round trip"),
            ("scan_and_return_ms", "scan + wait_ready return"),
            ("report_and_close_ms", "print report, close SSH, atexit"),
            ("interpreter_exit_ms", "interpreter exit until reaped"),
        ]
        for mode in ("ready", "crash"):
            traces = [r["trace"] for r in passes[traced] if r["mode"] == mode]
            rtts = [v for t in traces for v in t["poll_rtt_ms"]]
            gaps = [v for t in traces for v in t["poll_gap_ms"]]
            missed = sum(t["missed_by_previous_poll"] for t in traces)
            part = split.setdefault(traced, {})[mode] = {
                k: summary([t[k] for t in traces]) for k, _ in keys
            }
            part["all_poll_rtt_ms"] = summary(rtts)
            part["all_poll_gap_ms"] = summary(gaps)
            part["missed_by_previous_poll"] = missed
            print(f"  {names[mode]}")
            for key, label in keys:
                s = part[key]
                print(f"    {label:42} {s['median']:7.1f} {s['min']:7.1f} {s['max']:7.1f}")
            for key, label in (
                ("all_poll_rtt_ms", "every poll's round trip"),
                ("all_poll_gap_ms", "gap between polls (sleep + loop)"),
            ):
                s = part[key]
                print(f"    {label:42} {s['median']:7.1f} {s['min']:7.1f} {s['max']:7.1f}")
            print(
                f"    writes that landed inside the previous poll, after its read: {missed}/{len(traces)}"
            )
    if detail:
        print()
        print(f"one poll, piece by piece ({detail['samples']} samples; median / min / max, ms)")
        for group in ("over_ssh_ms", "local_ms", "agent_pieces_ms"):
            for name, s in detail[group].items():
                print(
                    f"  {group[:-3]:12} {name:28} {s['median']:7.1f} {s['min']:7.1f} {s['max']:7.1f}"
                )
        imports = detail["agent_imports"]
        top = ", ".join(f"{k} {v}" for k, v in list(imports["top_level_ms"].items())[:6])
        print(f"  agent imports (-X importtime): {imports['total_ms']} ms in all; biggest: {top}")
    if "standin" in passes:
        windows = [r["watcher_window_ms"] for r in passes["standin"] if "watcher_window_ms" in r]
        if windows:
            print(
                f"standin write times come from a log watcher; its read window: median {statistics.median(windows):.1f} ms, max {max(windows):.1f} ms"
            )
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(
        json.dumps(
            {
                "trials": opts.trials,
                "seed": opts.seed,
                "poll_wait_s": POLL_WAIT,
                "cpu_count": os.cpu_count(),
                "client_python": platform.python_version(),
                "host_python": HOST_PYTHON,
                "uptime_before": uptime_before,
                "uptime_after": uptime_after,
                "summary_ms": table,
                "traced_split_ms": split,
                "poll_breakdown": detail,
                "records": [r for records in passes.values() for r in records],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {opts.output}")


if __name__ == "__main__":
    main()
