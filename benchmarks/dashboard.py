"""What `deployctl dashboard` costs at 1 and 256 hosts, against a fresh `status --metrics`.

Sets up the hosts as fleet.py does (tests.sshd_hosts.start_lab: needs root and openssh-server):
N real sshd hosts on loopback, one login user each with /bin/sh as its shell, fleet.py's cheap
fake nvidia-smi (8 H200 GPUs from pre-rendered output) and deployctl's agent in place; no
SGLang install, so every host's patch audit answers "SGLang is not installed". For N=1 the
host also runs the stand-in server (tests/standin, launched with `deployctl launch`), so its
status carries real Prometheus metrics and a log; on the 256 hosts no server runs (each
answers "no run"; the first keeps the stand-in's stopped run from N=1). deployctl is the
console script of fleet.py's benchmark venv (a plain install of this tree, with the
dashboard extra's dependencies).

For each N, after one untimed warm-up (of both at the first size, of `status` at the others:
a dashboard start costs minutes at 256 hosts here), --rounds rounds of two contenders whose
order rotates every round:

  status     `deployctl status --metrics --json -i INV` as a new process: wall time
  dashboard  `deployctl dashboard -i INV --port P --interval 2` started afresh:
             - page: from the process start until `page.goto` first loads the page (the
               server listens; the page itself waits for no round)
             - first API: from the process start until GET /api/dashboard answers the
               first round's document (polled from a thread while the page loads); also
               that round's own refresh_s (it reads the patch audits and kept records too)
             - first render: from the process start until a headless chromium page
               (tests.browser.running_browser, Playwright) shows N rows (`tr[data-target]`),
               `page.goto` polled until the server answers
             then, with that page open (one viewer on /api/events) and one GET of
             /api/dashboard per round, over the next --refreshes rounds:
             - refresh_s: the collector's own time for a round, as /api/dashboard says
             - round s: wall time between rounds as the page receives them
             - CPU s per round: the dashboard process's utime+stime (/proc/PID/stat) over
               the window divided by its rounds; also the whole machine's (sshd, agents)
             - RSS: VmRSS and VmHWM of the process after the window
             - draw ms, live: `draw(latest)` timed in that page 20 times (median), DOM only,
               and again with a forced layout after each (`document.body.offsetHeight`);
               the collector keeps running meanwhile (at 256 hosts the hosts' commands keep
               both cores busy, and chromium's renderer runs at niceness 0)
             - stop s: from SIGINT (after the page was closed) until the process has exited
             - draw ms, quiet: the same draws of the same document after the dashboard has
               stopped, in a fresh page whose files (index.html, app.js, style.css from the
               package) Playwright serves, the event stream refused
             The collector reads audits and kept records in its first round and then every
             60 s: a window can hold such a round (refresh_s keeps every round's figure).

Medians over rounds (refresh_s over every round of every window). Client, hosts and browser
share this machine. Run: python benchmarks/dashboard.py [--hosts 1,256] [--rounds 3]
Results: a table on stdout and benchmarks/results/dashboard.json. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleet import (  # noqa: E402 - needs the path above
    CLK_TCK,
    DEPLOYCTL_VENV,
    Contender,
    Sample,
    cpu_jiffies,
    deployctl_argv,
    ensure_deployctl_venv,
    host_names,
    log,
    measure,
    process_cpu_s,
    python_env,
    setup_hosts,
)

from deployctl.dashboard.server import PAGE_FILES, STATIC  # noqa: E402
from tests.browser import CHROMIUM, VIEWPORT, missing_browser, running_browser  # noqa: E402
from tests.sshd_hosts import SSHLab, copy_standin, free_port, sh, stop_lab  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
INTERVAL = 2.0
DRAWS = 20
# Generous: at 256 hosts a round (and so the first render) takes seconds on 2 cores.
FIRST_RENDER_TIMEOUT_S = 180.0
DRAW_KEYS = ("draw_live_ms", "draw_layout_live_ms", "draw_quiet_ms", "draw_layout_quiet_ms")

# `draw` and `latest` are app.js's globals; `text` is a document to draw instead of `latest`.
TIME_DRAWS = """([text, n]) => {
  const doc = text === null ? latest : JSON.parse(text);
  const dom = [], layout = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    draw(doc);
    dom.push(performance.now() - t);
  }
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    draw(doc);
    void document.body.offsetHeight;
    layout.push(performance.now() - t);
  }
  return { dom, layout };
}"""


# ---- setup ------------------------------------------------------------------------------------


def install_dashboard_extra() -> None:
    """Put the dashboard extra's dependencies (as pyproject.toml names them) in the bench venv."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["optional-dependencies"]["dashboard"]
    pip = [str(DEPLOYCTL_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *wanted], check=True)


def launch_standin(lab: SSHLab, work: Path, name: str, env: dict[str, str]) -> Path:
    """Give one host the stand-in and launch it; return that host's inventory."""
    host = lab.hosts[name]
    copy_standin(host.home)
    model = host.home / "model"
    model.mkdir(exist_ok=True)
    (model / "standin.json").write_text(json.dumps({"startup_s": 0.3}))
    sh("chown", "-R", f"{host.user}:{host.user}", host.home)
    host_vars = {
        name: {
            "launch_module": "sglang_standin", "template": "baseline", "tp": 1,
            "model_path": str(model), "bind_host": host.address,
            "port": free_port(host.address), "log_dir": "~/logs",
        }
    }  # fmt: skip
    inventory = lab.inventory(work / "inventory.yml", [name], host_vars)
    argv = [*deployctl_argv(), "launch", "--json", "--timeout", "60", "-i", str(inventory)]
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the stand-in did not launch: {done.stdout[-800:]}{done.stderr[-800:]}")
    return inventory


# ---- the status contender -----------------------------------------------------------------------


def check_status(names: list[str], metrics: bool) -> Any:
    def check(done: subprocess.CompletedProcess[str]) -> None:
        assert done.returncode in (0, 1), "deployctl failed"
        hosts = json.loads(done.stdout)["hosts"]
        assert sorted(hosts) == sorted(names), f"hosts {sorted(hosts)[:5]}…"
        for name, entry in hosts.items():
            assert entry["ok"], f"{name}: {entry.get('error')}"
            if metrics:
                assert "gen_throughput" in (entry.get("metrics") or {}), f"{name}: {entry}"

    return check


# ---- the dashboard contender --------------------------------------------------------------------


def process_memory_mib(pid: int) -> dict[str, float]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = round(int(value.split()[0]) / 1024, 1)
    return found


def get_document(base: str) -> tuple[dict[str, Any], int]:
    """GET /api/dashboard: the document and its size in bytes."""
    with urllib.request.urlopen(base + "/api/dashboard", timeout=60) as reply:
        body = reply.read()
    document: dict[str, Any] = json.loads(body)
    return document, len(body)


def first_answer(
    base: str, count: int, began: float, stop: threading.Event, out: dict[str, Any]
) -> None:
    """Poll /api/dashboard until it holds the first round's N rows; keep the time it took."""
    while not stop.is_set():
        try:
            doc, _ = get_document(base)
        except (OSError, ValueError):  # not listening yet
            stop.wait(0.02)
            continue
        if len(doc.get("deployments", ())) == count:
            out["first_api_s"] = time.perf_counter() - began
            out["first_refresh_s"] = doc["refresh_s"]
            return
        stop.wait(0.02)  # "no refresh has finished yet": the 30 s wait ran out


def run_dashboard(
    browser: Any,
    inventory: Path,
    count: int,
    refreshes: int,
    work: Path,
    env: dict[str, str],
    metrics: bool,
) -> dict[str, Any]:
    """Start the dashboard, time its first answer and render, then its rounds; stop it."""
    from playwright.sync_api import Error as PlaywrightError

    port = free_port("127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    argv = [*deployctl_argv(), "dashboard", "-i", str(inventory), "--port", str(port)]
    argv += ["--interval", f"{INTERVAL:g}"]
    page = browser.new_page(viewport=VIEWPORT)
    answered: dict[str, Any] = {}
    stop_polling = threading.Event()
    with tempfile.TemporaryFile("w+") as err:
        began = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=err)
        poller = threading.Thread(
            target=first_answer, args=(base, count, began, stop_polling, answered), daemon=True
        )
        poller.start()
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError("the dashboard exited")
                try:
                    page.goto(base + "/", timeout=10_000)
                    listening = time.perf_counter() - began
                    break
                except PlaywrightError:  # not listening yet
                    time.sleep(0.02)
            page.wait_for_function(
                f"() => document.querySelectorAll('tr[data-target]').length === {count}",
                timeout=FIRST_RENDER_TIMEOUT_S * 1000,
            )
            first_render = time.perf_counter() - began
            poller.join(timeout=FIRST_RENDER_TIMEOUT_S)
            if "first_api_s" not in answered:
                raise RuntimeError("/api/dashboard never answered the first round")
            result = {**answered, "listening_s": listening, "first_render_s": first_render}
            result.update(watch_rounds(page, proc.pid, base, count, refreshes, metrics))
            result.update(time_draws(page, None, "live"))
            drawn = page.evaluate("() => JSON.stringify(latest)")
        except BaseException:
            err.seek(0)
            log(f"dashboard stderr: {err.read()[-3000:]}")
            raise
        finally:
            stop_polling.set()
            # Closed first: with a page open, Ctrl-C waits until the page goes away.
            page.close()
            stopping, killed = time.perf_counter(), False
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed = True
        result.update(stop_s=time.perf_counter() - stopping, killed_after_60_s=killed)
        err.seek(0)
        stderr = err.read()
    result.update(quiet_draws(browser, base, drawn, count))
    # A product problem to report, not a reason to lose the figures: kept and counted.
    result["traceback"] = stderr[-3000:] if "Traceback" in stderr else None
    if result["traceback"]:
        log(f"the dashboard wrote a traceback when stopped:\n{stderr[-1500:]}")
    return result


def time_draws(page: Any, text: str | None, label: str) -> dict[str, float]:
    """Median ms of DRAWS draws of the document, DOM only and with a forced layout."""
    times = page.evaluate(TIME_DRAWS, [text, DRAWS])
    return {
        f"draw_{label}_ms": statistics.median(times["dom"]),
        f"draw_layout_{label}_ms": statistics.median(times["layout"]),
    }


def quiet_draws(browser: Any, base: str, text: str, count: int) -> dict[str, float]:
    """The same draws once the dashboard has stopped and its hosts are idle: a fresh page
    whose files Playwright serves from the package (the event stream refused)."""
    time.sleep(2)  # the hosts' last commands end
    page = browser.new_page(viewport=VIEWPORT)

    def serve(route: Any) -> None:
        path = route.request.url.removeprefix(base).split("?")[0]
        name = "index.html" if path == "/" else path.removeprefix("/static/")
        if name in PAGE_FILES:
            route.fulfill(path=str(STATIC / name))
        else:
            route.abort()

    try:
        page.route(base + "/**", serve)
        page.goto(base + "/")
        drawn = time_draws(page, text, "quiet")
        assert page.locator("tr[data-target]").count() == count, "the quiet page drew no rows"
        return drawn
    finally:
        page.close()


def watch_rounds(
    page: Any, pid: int, base: str, count: int, refreshes: int, metrics: bool
) -> dict[str, Any]:
    """Over `refreshes` rounds the page receives: refresh_s, wall, CPU per round, memory."""
    seen = page.evaluate("() => latest.updated_at")
    refresh_s, sizes = [], []
    for index in range(refreshes + 1):
        page.wait_for_function(
            f"() => latest.updated_at > {seen}", timeout=FIRST_RENDER_TIMEOUT_S * 1000
        )
        seen = page.evaluate("() => latest.updated_at")
        if index == 0:
            cpu0, (busy0, _), t0 = process_cpu_s(pid), cpu_jiffies(), time.perf_counter()
        if index == refreshes:
            cpu1, (busy1, _), t1 = process_cpu_s(pid), cpu_jiffies(), time.perf_counter()
            break
        doc, size = get_document(base)
        assert len(doc["deployments"]) == count, doc.get("error")
        if metrics:
            assert all("metrics" in h for h in doc["status"]["hosts"].values()), doc["status"]
        refresh_s.append(doc["refresh_s"])
        sizes.append(size)
    return {
        "refresh_s": refresh_s,
        "round_s": (t1 - t0) / refreshes,
        "cpu_s_per_round": (cpu1 - cpu0) / refreshes,
        "machine_cpu_s_per_round": (busy1 - busy0) / CLK_TCK / refreshes,
        "document_kib": statistics.median(sizes) / 1024,
        **process_memory_mib(pid),
    }


# ---- one N --------------------------------------------------------------------------------------


def bench_size(
    lab: SSHLab,
    base: Path,
    browser: Any,
    count: int,
    rounds: int,
    refreshes: int,
    warm_dashboard: bool,
) -> dict[str, Any]:
    names = host_names(count)
    work = base / f"n{count}"
    (work / "client-home").mkdir(parents=True)
    env = python_env()
    env.update(HOME=str(work / "client-home"), LC_ALL="C.UTF-8")
    metrics = count == 1
    if metrics:
        inventory = launch_standin(lab, work, names[0], env)
    else:
        inventory = lab.inventory(work / "inventory.yml", names)
    status_argv = [*deployctl_argv(), "status", "--metrics", "--json", "-i", str(inventory)]
    status = Contender("status", status_argv, check_status(names, metrics), work, env)
    statuses: list[Sample] = []
    starts: list[dict[str, Any]] = []

    def run_status() -> None:
        statuses.append(measure(status))

    def run_dash() -> None:
        starts.append(run_dashboard(browser, inventory, count, refreshes, work, env, metrics))

    contenders = [("status", run_status), ("dashboard", run_dash)]
    # Every size warms its status; the dashboard (a start costs minutes at 256 hosts here)
    # only at the first size, which warms the page cache, the venv's imports and chromium.
    log(f"N={count}: warm-up")
    for name, run in contenders:
        if name == "status" or warm_dashboard:
            run()
    statuses.clear()
    starts.clear()
    loads = []
    for round_no in range(rounds):
        loads.append(round(os.getloadavg()[0], 2))
        shift = round_no % len(contenders)
        for _, run in contenders[shift:] + contenders[:shift]:
            run()
        last = starts[-1]
        log(
            f"N={count} round {round_no + 1}/{rounds} (load {loads[-1]}): status "
            f"{statuses[-1].wall_s:.2f} s; dashboard first API {last['first_api_s']:.2f} s, "
            f"render {last['first_render_s']:.2f} s, refresh {statistics.median(last['refresh_s']):.3f}"
            f" s, {last['cpu_s_per_round']:.3f} CPU s/round, draw {last['draw_live_ms']:.1f}"
            f" / {last['draw_quiet_ms']:.1f} ms (live / quiet)"
        )
    if metrics:
        stop = [*deployctl_argv(), "stop", "-i", str(inventory)]
        subprocess.run(stop, cwd=work, env=env, capture_output=True, check=True)
    return summarize(count, rounds, refreshes, statuses, starts, loads)


def summarize(
    count: int,
    rounds: int,
    refreshes: int,
    statuses: list[Sample],
    starts: list[dict[str, Any]],
    loads: list[float],
) -> dict[str, Any]:
    def median(key: str, digits: int = 3) -> float:
        return round(statistics.median(s[key] for s in starts), digits)

    every_refresh = [r for s in starts for r in s["refresh_s"]]
    return {
        "hosts": count,
        "rounds": rounds,
        "refreshes_per_round": refreshes,
        "status": {
            "wall_s": round(statistics.median(s.wall_s for s in statuses), 3),
            "client_cpu_s": round(statistics.median(s.client_cpu_s for s in statuses), 3),
            "machine_cpu_s": round(statistics.median(s.machine_cpu_s for s in statuses), 3),
            "peak_rss_mib": round(max(s.peak_rss_mib for s in statuses), 1),
            "walls_s": [round(s.wall_s, 3) for s in statuses],
        },
        "dashboard": {
            "listening_s": median("listening_s"),
            "first_refresh_s": median("first_refresh_s"),
            "first_api_s": median("first_api_s"),
            "first_render_s": median("first_render_s"),
            "refresh_s": round(statistics.median(every_refresh), 3),
            "refresh_s_max": max(every_refresh),
            "round_s": median("round_s"),
            "cpu_s_per_round": median("cpu_s_per_round"),
            "machine_cpu_s_per_round": median("machine_cpu_s_per_round"),
            "rss_mib": median("VmRSS", 1),
            "peak_rss_mib": max(s["VmHWM"] for s in starts),
            "document_kib": median("document_kib", 1),
            "stop_s": median("stop_s"),
            **{key: median(key, 2) for key in DRAW_KEYS},
            "stops_with_traceback": sum(1 for s in starts if s["traceback"]),
            "starts": starts,
        },
        "loadavg_1m_per_round": loads,
    }


# ---- report -------------------------------------------------------------------------------------

COLUMNS = [
    ("N", lambda r: str(r["hosts"])),
    ("status s", lambda r: f"{r['status']['wall_s']:.2f}"),
    ("page s", lambda r: f"{r['dashboard']['listening_s']:.2f}"),
    ("1st refresh_s", lambda r: f"{r['dashboard']['first_refresh_s']:.2f}"),
    ("1st API s", lambda r: f"{r['dashboard']['first_api_s']:.2f}"),
    ("1st render s", lambda r: f"{r['dashboard']['first_render_s']:.2f}"),
    ("refresh_s", lambda r: f"{r['dashboard']['refresh_s']:.3f}"),
    ("round s", lambda r: f"{r['dashboard']['round_s']:.2f}"),
    ("CPU s/round", lambda r: f"{r['dashboard']['cpu_s_per_round']:.3f}"),
    ("machine CPU s/round", lambda r: f"{r['dashboard']['machine_cpu_s_per_round']:.2f}"),
    ("RSS MiB", lambda r: f"{r['dashboard']['rss_mib']:.0f}"),
    ("doc KiB", lambda r: f"{r['dashboard']['document_kib']:.1f}"),
    ("draw ms live", lambda r: f"{r['dashboard']['draw_live_ms']:.1f}"),
    ("+layout", lambda r: f"{r['dashboard']['draw_layout_live_ms']:.1f}"),
    ("draw ms quiet", lambda r: f"{r['dashboard']['draw_quiet_ms']:.1f}"),
    ("+layout", lambda r: f"{r['dashboard']['draw_layout_quiet_ms']:.1f}"),
    ("stop s", lambda r: f"{r['dashboard']['stop_s']:.1f}"),
]


def table(results: list[dict[str, Any]]) -> str:
    rows = [[name for name, _ in COLUMNS]] + [[cell(r) for _, cell in COLUMNS] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hosts", default="1,256", help="comma list of fleet sizes")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per size (median)")
    parser.add_argument(
        "--refreshes", type=int, default=5, help="dashboard rounds watched per start"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "dashboard.json")
    parser.add_argument(
        "--nice", type=int, default=-10, help="niceness for the benchmark and all it starts"
    )
    args = parser.parse_args()
    sizes = sorted({int(x) for x in args.hosts.split(",")})
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        sys.exit("the sshd test hosts need root and openssh-server")
    if max(sizes) > 500:
        sys.exit("at most 500 hosts (one loopback address each, from 127.0.0.2)")
    if why := missing_browser():
        sys.exit(f"the page needs a browser: {why}")
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    base = Path(tempfile.mkdtemp(prefix="deployctl-dash-", dir="/tmp"))
    base.chmod(0o755)
    lab = None
    results = []
    try:
        ensure_deployctl_venv(base)
        install_dashboard_extra()
        lab, _ = setup_hosts(base, max(sizes), sglang=False)
        with running_browser() as browser:
            for n in sizes:
                first = not results
                results.append(
                    bench_size(lab, base, browser, n, args.rounds, args.refreshes, first)
                )
                partial = args.output.with_suffix(".partial.json")
                partial.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if lab is not None:
            stop_lab(lab)
        shutil.rmtree(base, ignore_errors=True)
    doc = {
        "benchmark": "dashboard",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "chromium": subprocess.run(
                [str(CHROMIUM), "--version"], capture_output=True, text=True
            ).stdout.strip(),
            "loadavg_at_end": os.getloadavg(),
            "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        },
        "deployctl": deployctl_argv(),
        "interval_s": INTERVAL,
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
