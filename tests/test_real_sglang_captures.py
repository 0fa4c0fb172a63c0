"""What a real SGLang 0.5.17 said on an H200 (tests/data/real-sglang-0.5.17, README there),
read by deployctl's parsers, and the stand-in checked against it.

The captures come from `scripts/gpu-real-sglang-check` runs (benchmarks/h200-real-sglang).
"""

from __future__ import annotations

import ast
import http.client
import json
import os
import re
import shutil
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deployctl.crash import scan_text
from deployctl.metrics import GAUGES, HISTOGRAMS, PREFIX, parse_metrics
from deployctl.ops.logs import LogScan, stop_effect
from deployctl.ops.runs import READY_LINE
from tests.conftest import CLI
from tests.sglang_wheel import sglang_wheel
from tests.standin.sglang_standin.log_lines import (
    SHUTDOWN_HEALTH_LINE,
    SIGQUIT_LINE,
    SIGTERM_LINE,
    child_crashed_line,
    drain_line,
    kill_tree_line,
    lost_prefill_line,
    reconnect_line,
    scheduler_exit_line,
)
from tests.test_standin import Launch, free_port, standin, wait_for  # noqa: F401 (the fixture)

REAL = Path(__file__).parent / "data" / "real-sglang-0.5.17"


def real(name: str) -> str:
    return (REAL / name).read_text(encoding="utf-8")


def first_line(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


# ---- deployctl's parsers on the real outputs ---------------------------------------------------


def test_crash_scanner_explains_the_real_kv_cache_memory_crash() -> None:
    text = real("crash-mem-fraction.log")
    (report,) = scan_text(text)

    assert report.signature == "not-enough-memory"
    assert report.exception == "ValueError"
    assert report.message.startswith("Loaded weights leave no GPU memory for the KV cache")
    assert report.file is not None and report.file.endswith(
        "sglang/srt/mem_cache/kv_cache_configurator.py"
    )
    assert (report.line, report.function) == (1647, "_profile_available_bytes")
    assert report.log_line == first_line(text, "Scheduler hit an exception")
    assert "Raise `--mem-fraction-static`" in report.hint


def test_crash_scanner_explains_stock_adaptive_dying_in_its_graph_capture() -> None:
    """SGLang's own --speculative-adaptive with CUDA graphs (default candidates 1, 3, 7 over
    --speculative-num-steps 3): the states of 0 and 1 steps were built, then the 7-step
    state's draft-extend capture (8 tokens a request) hit an illegal memory access."""
    text = real("adaptive-graphs-crash.log")
    (report,) = scan_text(text)

    assert report.signature == "cuda-error"
    assert report.exception == "torch.AcceleratorError"
    assert "illegal memory access" in report.message
    assert report.log_line > first_line(text, "num_tokens_per_req=8")


def test_a_stop_of_the_real_server_is_not_reported_as_a_crash() -> None:
    # This stop signalled the whole process group (as a stop still does at its timeout): the
    # parent logs its scheduler as crashed -15.
    text = real("baseline.log")
    reports = scan_text(text)
    assert [r.signature for r in reports] == ["subprocess-crashed"]
    assert "crashed with exit code -15" in reports[0].message
    assert reports[0].log_line > first_line(text, "SIGTERM received")

    stopped = LogScan("baseline.log", len(text), len(text), reports, stopped=True)
    assert stopped.crashes == []
    # A run that ended on its own (no stop recorded) still reports it.
    died = LogScan("baseline.log", len(text), len(text), reports, stopped=False)
    assert died.crashes == reports


def logged_messages(text: str) -> set[str]:
    """The messages of a log's logger records, without their `[time]` prefix."""
    return {line.split("] ", 1)[1] for line in text.splitlines() if line.startswith("[")}


def rendered(wheel: zipfile.ZipFile, member: str, needle: str, **names: object) -> list[str]:
    """The log messages of `member` that contain `needle`, each rendered as that source
    would render it with `names` (an f-string is evaluated; a plain string is itself)."""
    tree = ast.parse(wheel.read(f"sglang/{member}").decode())
    fstrings = [n for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)]
    parts = {id(part) for f in fstrings for part in f.values}
    found = [
        eval(compile(ast.Expression(f), member, "eval"), {}, dict(names))
        for f in fstrings
        if needle in ast.unparse(f)
    ]
    found += [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
        and needle in n.value and id(n) not in parts
    ]  # fmt: skip
    return found


@pytest.mark.heavy
def test_the_stand_ins_shutdown_lines_are_the_real_ones() -> None:
    """Each line the stand-in writes when it is stopped: the real 0.5.17's as captured (the
    baseline's stop, which signalled the whole group: tests/data/real-sglang-0.5.17/README.md)
    and, for the lines of a drain no capture has yet, as the 0.5.17 wheel's source logs them
    (the f-string itself, evaluated)."""
    messages = logged_messages(real("baseline.log"))
    assert SIGTERM_LINE in messages  # line 517
    assert child_crashed_line("scheduler_0", 820, -15) in messages  # line 518
    assert SIGQUIT_LINE in messages  # line 519
    assert kill_tree_line(721, True) in messages  # line 522
    with zipfile.ZipFile(sglang_wheel("0.5.17")) as wheel:
        rids = ["3f2a", "9c1d"]
        tokenizer = "srt/managers/tokenizer_manager.py"
        assert rendered(wheel, tokenizer, "Draining requests", signum=None, frame=None) == [
            SIGTERM_LINE
        ]
        assert rendered(
            wheel, tokenizer, "Gracefully exiting", remain_num_req=2, remaining_rids=rids
        ) == [drain_line(rids)]
        assert drain_line([]).endswith("requests 0. Remaining requests remaining_rids=[].")
        health = rendered(wheel, "srt/entrypoints/http_server.py", "during shutdown")
        assert health == [SHUTDOWN_HEALTH_LINE]
        proc = types.SimpleNamespace(pid=4242, exitcode=-15)
        watchdog = rendered(
            wheel, "srt/utils/watchdog.py", "crashed ", name="detokenizer", proc=proc
        )
        assert "".join(watchdog) == child_crashed_line("detokenizer", 4242, -15)
        tree = rendered(
            wheel,
            "srt/utils/common.py",
            "kill_process_tree called",
            parent_pid=7,
            include_parent=False,
            os=types.SimpleNamespace(getpid=lambda: 7),
        )
        assert "".join(tree) == kill_tree_line(7, False)
        proc = types.SimpleNamespace(pid=820, exitcode=0)
        ended = rendered(wheel, "srt/entrypoints/engine.py", "terminated with", proc=proc)
        assert ended == [scheduler_exit_line(820, 0)]


def test_a_drains_lines_are_no_crash() -> None:
    """What a drained server logs, rank 0 and a node > 0, in the real lines' forms: nothing
    of it is a crash, stopped or not."""
    stamp = "[2026-12-02 04:34:19] "
    drained = [
        SIGTERM_LINE,
        SHUTDOWN_HEALTH_LINE,
        drain_line(["3f2a", "9c1d"]),
        drain_line([]),
        kill_tree_line(721, True),
        scheduler_exit_line(820, 0),
        kill_tree_line(722, False),
    ]
    text = "".join(stamp + line + "\n" for line in drained)
    assert scan_text(text) == []


def test_a_real_drain_under_streams_is_no_crash_and_logs_the_stand_ins_lines() -> None:
    """`deployctl stop` of the real EAGLE3 server with 16 streams in flight
    (drain-eagle3.log, the log's last 30 lines): SGLang drained them (all 16 ended whole)
    and logged the lines the stand-in writes for a drain; nothing in it is a crash."""
    text = real("drain-eagle3.log")
    messages = logged_messages(text)
    assert SIGTERM_LINE in messages
    assert drain_line([]) in messages  # every request had finished
    assert kill_tree_line(2863, True) in messages
    assert first_line(text, "Draining") < first_line(text, "Gracefully exiting")
    assert scan_text(text) == []


def test_a_real_decode_losing_its_prefill_is_no_crash_and_logs_the_stand_ins_lines() -> None:
    """A real PD pair over mooncake_tcp (pd-decode-lost-prefill.log): the prefill's main
    process killed under load; the decode's heartbeat failed twice, 5 s apart, and it forgot
    the prefill, in the lines the stand-in writes. Nothing in it is the decode's crash."""
    text = real("pd-decode-lost-prefill.log")
    messages = logged_messages(text)
    assert reconnect_line("localhost:31011") in messages
    assert text.count(reconnect_line("localhost:31011")) == 2
    assert lost_prefill_line("localhost:31011", 0) in messages
    assert first_line(text, "Attempting to reconnect") < first_line(text, "Lost connection")
    assert scan_text(text) == []


def test_metrics_parser_reads_the_real_page_under_load() -> None:
    found = parse_metrics(real("metrics-under-load.txt"))

    assert found["num_running_reqs"] == 32  # the poller kept the busiest page
    assert found["num_queue_reqs"] == 0
    assert found["gen_throughput"] > 0
    assert 0 <= found["token_usage"] < 1
    assert found["spec_accept_length"] is None  # not speculating
    for name in HISTOGRAMS:
        assert found[name]["count"] > 0 and found[name]["p50"] is not None


def test_metrics_parser_reads_the_real_speculative_page() -> None:
    found = parse_metrics(real("metrics-under-load-eagle3.txt"))

    assert found["spec_accept_length"] == 1.0  # random weights: every draft is rejected
    assert found["num_running_reqs"] == 32


def test_every_metric_deployctl_reads_is_on_the_real_page() -> None:
    names = {f.name for f in text_string_to_metric_families(real("metrics-under-load-eagle3.txt"))}
    wanted = {PREFIX + n for n in (*GAUGES, *HISTOGRAMS)}
    assert wanted <= names, wanted - names


def test_readiness_fires_on_the_real_log_after_health_answered_503() -> None:
    text = real("baseline.log")
    ready = first_line(text, READY_LINE)
    uvicorn = first_line(text, "Uvicorn running on http://127.0.0.1:30000")
    assert re.search(r"^\[[\d\- :]+\] " + re.escape(READY_LINE) + "$", text, re.M)
    # /health says 503 between the Uvicorn line and the ready line (the warm-up request).
    lines = text.splitlines()
    between = lines[uvicorn : ready - 1]
    assert any('"GET /health HTTP/1.0" 503' in line for line in between)
    assert not any('"GET /health HTTP/1.0" 200' in line for line in between)
    # Nothing before the ready line is a crash.
    assert scan_text("\n".join(lines[:ready]) + "\n") == []


def test_the_threshold_switches_both_ways_in_the_real_speculative_log() -> None:
    text = real("spec-threshold-switches.log")
    switches = re.findall(
        r"Switch adaptive runtime state: steps (\d) -> (\d), draft_tokens \d -> \d"
        r"(?: \((\d+) more since the last line\))?$",
        text,
        re.M,
    )
    assert [(a, b) for a, b, _ in switches] == [("3", "0"), ("0", "3")]
    assert sum(1 + int(more or 0) for _, _, more in switches) == 24
    assert "runs no draft steps while the decode batch is larger than 4" in text
    # No crash across 24 switches with CUDA graphs; only the stop's signal at the end.
    assert [stop_effect(r) for r in scan_text(text)] == [True]


def test_server_info_and_its_deprecated_alias() -> None:
    info = json.loads(real("server_info.json"))
    assert info["version"] == "0.5.17"
    assert info["speculative_algorithm"] is None


# ---- the stand-in against the captures ------------------------------------------------------------


def get(port: int, path: str) -> tuple[int, bytes, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    started = time.monotonic()
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read(), time.monotonic() - started
    finally:
        conn.close()


def label_shapes(text: str) -> dict[str, set[str]]:
    """Each sample name with the label names it carries."""
    shapes: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            shapes.setdefault(sample.name, set()).update(sample.labels)
    return shapes


def test_standin_matches_the_real_server(standin: Launch) -> None:  # noqa: F811 (the fixture)
    server = standin(None, "--enable-metrics", tp=1, knobs={"startup_s": 0.3, "health_s": 1.0})
    wait_for(lambda: server.status() == 200, 8, "/health 200")
    log = server.text()

    # The readiness line, as the real server writes it.
    assert re.search(r"^\[[\d\- :]+\] " + re.escape(READY_LINE) + "$", log, re.M)
    # The server_args= line: the dataclass repr, as the real one.
    real_args = re.search(r"\] server_args=(\w+)\((\w+)=", real("baseline.log"))
    standin_args = re.search(r"\] server_args=(\w+)\((\w+)=", log)
    assert real_args is not None and standin_args is not None
    assert standin_args.groups() == real_args.groups() == ("ServerArgs", "model_path")
    # /health and /health_generate: 200 with an empty body, after the real 1 s check.
    for path in ("/health", "/health_generate"):
        status, body, took = get(server.port, path)
        assert (status, body) == (200, b""), (path, status, body)
        assert took >= 1.0, f"{path} took {took:.2f}s, bound 1.0s"
    # Metric names and label shapes: each series the stand-in exports is on the real page
    # with the same labels (the real page has many more).
    status, page, _ = get(server.port, "/metrics")
    assert status == 200
    real_shapes = label_shapes(real("metrics-under-load.txt"))
    for name, labels in label_shapes(page.decode()).items():
        assert name in real_shapes, f"{name} is not on the real page"
        assert labels == real_shapes[name], (name, labels, real_shapes[name])


# ---- deployctl against a stand-in that answers as the real server does --------------------------

REPO = Path(__file__).resolve().parent.parent
FAKE_SMI = REPO / "tests" / "fakes" / "nvidia-smi"


def local_host(tmp_path: Path, knobs: dict[str, object]) -> tuple[Path, dict[str, str]]:
    """An inventory of the built-in localhost running the stand-in, with a fake nvidia-smi that
    shows the stand-in's ranks as a real one would; and the environment the CLI needs."""
    smi = tmp_path / "smi"
    (smi / "bin").mkdir(parents=True)
    (smi / "etc").mkdir()
    shutil.copy(FAKE_SMI, smi / "bin" / "nvidia-smi")
    (smi / "etc" / "captures").write_text(str(REPO / "tests/data/nvidia-smi/h200-1gpu"))
    (smi / "etc" / "gpu-mode").write_text("live")
    model = tmp_path / "model"
    model.mkdir()
    (model / "standin.json").write_text(json.dumps(knobs))
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n  vars:\n"
        f"    python: {sys.executable}\n    launch_module: tests.standin.sglang_standin\n"
        f"    model_path: {model}\n    tp: 1\n    port: {free_port()}\n"
        f"    log_dir: {tmp_path / 'logs'}\n    state_dir: {tmp_path / 'state'}\n"
    )
    return inv, {"PATH": f"{smi / 'bin'}:{os.environ['PATH']}"}


@pytest.mark.lab  # launches the stand-in server on this machine: a service
def test_a_server_whose_health_takes_a_second_is_ready_in_status(cli: CLI, tmp_path: Path) -> None:
    inv, env = local_host(tmp_path, {"startup_s": 0.3, "health_s": 1.0})
    launched = cli("launch", "-i", str(inv), "--timeout", "60", env=env)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    try:
        status = cli("status", "-i", str(inv), "--json", env=env)
        assert json.loads(status.stdout)["hosts"]["localhost"]["state"] == "ready", status.stdout
    finally:
        cli("stop", "-i", str(inv), env=env)


@pytest.mark.lab  # launches the stand-in server on this machine: a service
def test_crash_after_a_stop_reports_no_crash(cli: CLI, tmp_path: Path) -> None:
    inv, env = local_host(tmp_path, {"startup_s": 0.3})
    assert cli("launch", "-i", str(inv), "--timeout", "60", env=env).returncode == 0
    stopped = cli("stop", "-i", str(inv), env=env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    log = next((tmp_path / "logs").glob("*.log")).read_text()
    # SIGTERM to the main process: it drained and ended its children itself.
    assert SIGTERM_LINE in log and drain_line([]) in log
    assert "crashed with exit code" not in log
    crash = cli("crash", "-i", str(inv), "--json", env=env)
    assert crash.returncode == 0, crash.stdout
    assert json.loads(crash.stdout)["hosts"]["localhost"]["crashes"] == []
