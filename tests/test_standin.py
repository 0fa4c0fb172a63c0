"""Tests for the SGLang 0.5.23 stand-in (tests/standin/sglang_standin/).

Each test runs the stand-in as a real process tree in its own session, on an
ephemeral port, and kills the whole process group afterwards.
"""

from __future__ import annotations

import ast
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import zipfile
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from deployctl.ops.tune import speculative_graph_sizes
from deployctl.remote.bench import cmd_bench
from deployctl.remote.measures import BenchLevel
from tests.sglang_wheel import SGLANG_VERSION, sglang_wheel
from tests.sshd_hosts import alive
from tests.standin.sglang_standin.adaptive_spec import (
    adaptive_steps,
    cuda_graph_batch_sizes,
    load_adaptive_config,
)
from tests.standin.sglang_standin.decoder import ColdStart
from tests.standin.sglang_standin.knobs import load_knobs
from tests.standin.sglang_standin.log_lines import (
    SHUTDOWN_HEALTH_LINE,
    SIGTERM_LINE,
    child_crashed_line,
    drain_line,
    kill_tree_line,
)
from tests.streamed import stream_tokens
from tests.test_bench import (  # its decode figures tell spec from plain
    MODEL,
    assert_paced,
    plain_tps,
    spec_tps,
)

STANDIN_DIR = Path(__file__).parent / "standin"
STANDIN = STANDIN_DIR / "sglang_standin"  # run by path: its __main__.py
READY = "The server is fired up and ready to roll!"
LAUNCH_SIGQUIT = "Received sigquit from a child process. It usually means the child failed."
RUNNING_SIGQUIT = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    predicate: Callable[[], object], timeout: float = 8.0, what: str | Callable[[], str] = ""
) -> None:
    """Wait for `predicate`; `what` names it in the failure, or (a callable) says it then,
    so that a log it quotes is the log at the time out."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out waiting for {said or predicate}")
        time.sleep(0.02)


def group_members(pgid: int) -> dict[int, str]:
    """Map pid -> `ps` args for the live processes of one process group."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,pgid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    members = {}
    for line in out.splitlines():
        pid, group, stat, *args = line.split(None, 3)
        if int(group) == pgid and not stat.startswith("Z"):
            members[int(pid)] = args[0] if args else ""
    return members


def http_get(port: int, path: str) -> tuple[int, bytes] | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    except OSError:
        return None
    finally:
        conn.close()


class Server:
    """One stand-in launch: its process, port and log."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path, model: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log
        self.model = model

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, needle: str, timeout: float = 8.0) -> None:
        wait_for(lambda: needle in self.text(), timeout, repr(needle))

    def status(self, path: str = "/health") -> int | None:
        result = http_get(self.port, path)
        return None if result is None else result[0]

    def schedulers(self) -> dict[int, str]:
        return {
            pid: args
            for pid, args in group_members(self.pid).items()
            if args.startswith("sglang::scheduler")
        }


Launch = Callable[..., Server]


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Launch]:
    """Start stand-ins like deployctl does (own session, log file); kill their groups after."""
    started: list[subprocess.Popen[bytes]] = []

    def _launch(
        model: Path | None = None,
        *extra: str,
        tp: int = 2,
        knobs: dict[str, object] | None = None,
        env: dict[str, str] | None = None,
        as_module: bool = False,
        port: int | None = None,
    ) -> Server:
        if model is None:
            model = tmp_path / "model"
        model.mkdir(parents=True, exist_ok=True)
        # A short start-up keeps the file fast; tests that time phases say so.
        (model / "standin.json").write_text(json.dumps(knobs or {"startup_s": 0.3}))
        port = port or free_port()
        entry = ["-m", "sglang_standin"] if as_module else [str(STANDIN)]
        argv = [str(x) for x in ("--model-path", model, "--tp", tp, "--port", port, *extra)]
        log = tmp_path / f"server-{len(started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, *entry, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        started.append(proc)
        return Server(proc, port, log, model)

    yield _launch
    for proc in started:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        pgid = proc.pid
        wait_for(lambda: not group_members(pgid), 5, "the group to die")  # noqa: B023


def test_health_is_503_while_starting_then_200_with_the_ready_line(standin: Launch) -> None:
    server = standin(knobs={"startup_s": 0.8})
    wait_for(lambda: server.status() is not None, 3, "the HTTP port")
    assert server.status() == 503
    assert READY not in server.text()
    wait_for(lambda: server.status() == 200, 5, "/health 200")
    assert server.status("/health_generate") == 200
    log = server.text()
    assert re.search(STAMP + r"\] " + re.escape(READY) + "$", log, re.M)
    # SGLang's order: args, per-rank load and capture, uvicorn, ready.
    order = [
        f"] server_args=ServerArgs(model_path='{server.model}'",
        " TP0] Load weight begin. avail mem=",
        " TP1] Load weight end. elapsed=",
        " TP1] Capture target decode CUDA graph end. bs=",
        f"] INFO:     Uvicorn running on http://127.0.0.1:{server.port} (Press CTRL+C to quit)",
        READY,
    ]
    positions = [log.index(needle) for needle in order]
    assert positions == sorted(positions)
    info = http_get(server.port, "/model_info")
    assert info is not None
    assert json.loads(info[1])["model_path"] == str(server.model)
    assert json.loads(info[1])["is_generation"] is True
    models = http_get(server.port, "/v1/models")
    assert models is not None
    assert json.loads(models[1])["data"][0]["id"] == str(server.model)


def test_one_scheduler_per_rank_in_the_launch_process_group(standin: Launch) -> None:
    server = standin(tp=4)
    server.wait_log(READY)
    titles = sorted(server.schedulers().values())
    assert titles == [f"sglang::scheduler_TP{i}" for i in range(4)]
    comm = subprocess.run(
        ["ps", "-o", "comm=", "-p", ",".join(map(str, server.schedulers()))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert comm == ["sglang::schedul"] * 4  # prctl's 15-byte name, as setproctitle sets it
    for pid in server.schedulers():
        assert os.getpgid(pid) == server.pid
        assert os.getsid(pid) == server.pid


def test_killing_only_the_parent_leaves_the_ranks_and_the_group_kill_ends_them(
    standin: Launch,
) -> None:
    server = standin()
    server.wait_log(READY)
    ranks = list(server.schedulers())
    assert len(ranks) == 2
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(timeout=5)
    time.sleep(0.3)
    assert all(alive(pid) for pid in ranks)
    assert set(ranks) <= set(group_members(server.pid))
    os.killpg(server.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(pid) for pid in ranks), 5, "the ranks to die")


def test_sigterm_to_the_group_ends_everything_like_sglang(standin: Launch) -> None:
    server = standin()
    server.wait_log(READY)
    os.killpg(server.pid, signal.SIGTERM)
    server.proc.wait(timeout=5)
    wait_for(lambda: not group_members(server.pid), 5, "the group to end")
    log = server.text()
    assert "SIGTERM received. signum=None frame=None. Draining requests" in log
    # The ranks die of SIGTERM first; SGLang's subprocess watchdog sees that.
    assert re.search(r"Subprocess scheduler_\d \(pid=\d+\) crashed with exit code -15", log)


def test_a_wedged_server_ignores_sigterm_and_only_sigkill_ends_it(standin: Launch) -> None:
    server = standin(knobs={"startup_s": 0.3, "ignore_sigterm": True, "drain_s": 0.2})
    server.wait_log(READY)
    members = list(group_members(server.pid))
    os.killpg(server.pid, signal.SIGTERM)
    time.sleep(1.5)  # past the drain's first look and the watchdog's
    assert all(alive(pid) for pid in members)
    assert "Gracefully exiting" not in server.text()
    os.killpg(server.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(pid) for pid in members), 5, "the group to die")


def in_flight(server: Server, count: int, tokens: int) -> tuple[list[threading.Thread], list]:
    """`count` streamed requests of `tokens` tokens, each answering once this returns."""
    answers: list[tuple[int, bool]] = []
    before = server.text().count("POST /v1/completions")
    threads = [
        threading.Thread(target=stream_tokens, args=("127.0.0.1", server.port, tokens, answers))
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    wait_for(
        lambda: server.text().count("POST /v1/completions") >= before + count, 10, "the requests"
    )
    return threads, answers


def test_sigterm_to_the_main_process_drains_like_sglang(standin: Launch) -> None:
    knobs = {"startup_s": 0.3, "drain_s": 0.4, "step_ms": 20.0}
    server = standin(knobs=knobs)
    server.wait_log(READY)
    ranks = list(server.schedulers())
    threads, answers = in_flight(server, 3, 100)  # about 2 s each
    os.kill(server.pid, signal.SIGTERM)
    server.wait_log("SIGTERM received")
    # Draining: /health says 503, and a new request is still taken and answered in full.
    assert server.status() == 503
    late, late_answers = in_flight(server, 1, 20)
    for thread in threads + late:
        thread.join(timeout=30)
    assert answers == [(100, True)] * 3 and late_answers == [(20, True)]
    assert server.proc.wait(timeout=10) == -signal.SIGKILL  # kill_process_tree, itself too
    wait_for(lambda: not group_members(server.pid), 5, "the group to end")
    log = server.text()
    lines = [line.split("] ", 1)[1] for line in log.splitlines() if line.startswith("[")]
    assert lines.count(SIGTERM_LINE) == 1 and SHUTDOWN_HEALTH_LINE in lines
    looks = [line for line in lines if line.startswith("Gracefully exiting")]
    first = re.fullmatch(
        r"Gracefully exiting\.\.\. Remaining number of requests (\d)\. .*", looks[0]
    )
    assert first is not None and int(first.group(1)) >= 3, looks
    assert looks[-1] == drain_line([]) and lines[-1] == kill_tree_line(server.pid, True)
    assert "crashed with exit code" not in log
    # The ranks exited on the ShutdownReq (0) before the tree was killed: nothing left.
    assert not any(alive(pid) for pid in ranks)


@pytest.mark.parametrize("child", ["scheduler_1", "detokenizer"])
def test_sigterm_to_one_child_alone_is_a_crash_the_server_ends_on(
    standin: Launch, child: str
) -> None:
    server = standin(knobs={"startup_s": 0.3})
    server.wait_log(READY)
    title = "sglang::detokenizer" if child == "detokenizer" else "sglang::scheduler_TP1"
    (pid,) = [p for p, args in group_members(server.pid).items() if args.startswith(title)]
    os.kill(pid, signal.SIGTERM)
    assert server.proc.wait(timeout=10) != 0
    wait_for(lambda: not group_members(server.pid), 5, "the group to end")
    log = server.text()
    crashed = child_crashed_line(child, pid, -signal.SIGTERM)
    assert crashed in log and log.index(RUNNING_SIGQUIT) > log.index(crashed)
    assert "Gracefully exiting" not in log


def test_startup_crash_prints_one_traceback_per_rank_then_sigquit(standin: Launch) -> None:
    message = "The size of tensor a (160) must match the size of tensor b (2)"
    server = standin(tp=4, knobs={"startup_s": 0.4, "crash": "startup", "crash_message": message})
    assert server.proc.wait(timeout=8) != 0
    wait_for(lambda: not group_members(server.pid), 5, "the group to end")
    log = server.text()
    heads = re.findall(
        STAMP + r" TP(\d)\] Scheduler hit an exception: Traceback \(most recent call last\):$",
        log,
        re.M,
    )
    assert sorted(heads) == ["0", "1", "2", "3"]
    assert log.count(f"\nRuntimeError: {message}\n") == 4
    assert '/sglang/srt/managers/scheduler.py", line 6362, in run_scheduler_process' in log
    assert log.count("sglang/srt/speculative/eagle_worker_v2.py") == 8
    assert log.index(LAUNCH_SIGQUIT) > log.rindex("RuntimeError:")
    assert READY not in log


def test_generate_and_completions_stream_the_decode_models_tokens(standin: Launch) -> None:
    import http.client

    knobs = {"startup_s": 0.2, "accept_len": 3}
    server = standin(None, "--speculative-algorithm", "EAGLE3", tp=1, knobs=knobs)
    server.wait_log(READY)
    answers = {}
    for path, body in (
        ("/generate", {"text": "a b", "sampling_params": {"max_new_tokens": 10}, "stream": True}),
        ("/v1/completions", {"prompt": "a b", "max_tokens": 10, "stream": True,
                             "stream_options": {"include_usage": True}}),
    ):  # fmt: skip
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200
        chunks = [
            json.loads(line[6:])
            for line in reply.read().split(b"\n")
            if line.startswith(b"data: {")
        ]
        answers[path] = chunks
    generated = answers["/generate"]
    # Speculation: 3 tokens a step, so 3 + 3 + 3 + 1; the text is cumulative.
    assert [c["meta_info"]["completion_tokens"] for c in generated] == [3, 6, 9, 10]
    assert generated[-1]["text"] == " tok" * 10 and generated[-1]["meta_info"]["finish_reason"]
    completions = answers["/v1/completions"]
    assert "".join(c["choices"][0]["text"] for c in completions if c["choices"]) == " tok" * 10
    assert completions[-1]["usage"]["completion_tokens"] == 10


def test_ranks_beyond_the_visible_gpus_fail_like_cuda(standin: Launch) -> None:
    server = standin(tp=2, env={"CUDA_VISIBLE_DEVICES": "3"})
    assert server.proc.wait(timeout=8) != 0
    log = server.text()
    assert "[standin] CUDA_VISIBLE_DEVICES=3: 1 visible GPUs" in log
    assert log.count("\nRuntimeError: CUDA error: invalid device ordinal\n") == 1  # rank 1 only
    assert " TP1] Scheduler hit an exception" in log and " TP0] Scheduler hit" not in log
    assert READY not in log


def test_crash_after_ready_uses_the_running_phase_sigquit_line(standin: Launch) -> None:
    knobs = {"startup_s": 0.3, "crash": "after_ready", "crash_after_s": 0.2}
    server = standin(knobs=knobs)
    assert server.proc.wait(timeout=8) != 0
    log = server.text()
    assert log.index(READY) < log.index("Scheduler hit an exception") < log.index(RUNNING_SIGQUIT)
    assert log.count("in event_loop_overlap") == 2


def test_port_in_use_logs_uvicorns_bind_error_and_exits_1(standin: Launch) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = standin(port=port)
        assert server.proc.wait(timeout=5) == 1
    expected = (
        f"] ERROR:    [Errno 98] error while attempting to bind on address "
        f"('127.0.0.1', {port}): address already in use\n"
    )
    assert expected in server.text()


def answers_on(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def test_bind_by_node_binds_a_slurm_node_to_its_own_address(standin: Launch) -> None:
    knobs = {"startup_s": 0.3, "bind_by_node": {"n2": "127.0.3.2"}}
    on_n2 = standin(knobs=knobs, env={"SLURMD_NODENAME": "n2"})
    on_n1 = standin(knobs=knobs, env={"SLURMD_NODENAME": "n1"})  # not in the mapping: --host
    on_n2.wait_log(READY)
    on_n1.wait_log(READY)
    assert answers_on("127.0.3.2", on_n2.port) and not answers_on("127.0.0.1", on_n2.port)
    assert f"Uvicorn running on http://127.0.3.2:{on_n2.port} " in on_n2.text()
    assert answers_on("127.0.0.1", on_n1.port) and not answers_on("127.0.3.2", on_n1.port)


def test_argv_is_recorded_exactly_for_a_hostile_model_dir(standin: Launch, tmp_path: Path) -> None:
    hostile = tmp_path / "m o'd\"el;$(touch pwned)`id`\nnext line"
    extra = ["--trust-remote-code", "--mem-fraction-static", "0.85"]
    server = standin(
        hostile,
        *extra,
        as_module=True,  # the way deployctl runs it: python -m <launch_module>
        env={"PYTHONPATH": str(STANDIN_DIR)},
        knobs={"startup_s": 0.2},
    )
    server.wait_log(READY)
    lines = (hostile / "standin-argv.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 1
    argv = ["--model-path", str(hostile), "--tp", "2", "--port", str(server.port), *extra]
    assert records[0]["argv"] == argv
    assert records[0]["pid"] == records[0]["pgid"] == records[0]["sid"] == server.pid
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("flag", "error"),
    [
        (["--no-such-flag", "1"], "error: unrecognized arguments: --no-such-flag 1"),
        # 0.5.23 has only --cuda-graph-max-bs-{decode,prefill}.
        (["--cuda-graph-max-bs", "8"], "error: ambiguous option: --cuda-graph-max-bs could match"),
    ],
)
def test_unknown_flags_are_argparse_errors(standin: Launch, flag: list[str], error: str) -> None:
    server = standin(None, *flag)
    assert server.proc.wait(timeout=5) == 2
    assert f"sglang serve: {error}" in server.text()


def fake_sglang(root: Path, spec_source: str) -> Path:
    """Write a minimal sglang package tree whose fields/spec.py holds spec_source."""
    fields = root / "sglang" / "srt" / "arg_groups" / "fields"
    fields.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("raise ImportError('needs torch')\n")
    (fields / "spec.py").write_text(spec_source)
    return root


@pytest.mark.parametrize("patched", [False, True])
def test_threshold_flag_follows_the_installed_sglang(
    standin: Launch, tmp_path: Path, patched: bool
) -> None:
    field = "    speculative_disable_batch_threshold: A[Optional[int], 'x'] = None\n"
    source = "class Spec:\n    speculative_algorithm = None\n" + (field if patched else "")
    tree = fake_sglang(tmp_path / "site", source)
    server = standin(
        None, "--speculative-disable-batch-threshold", "5", env={"PYTHONPATH": str(tree)}
    )
    if patched:
        server.wait_log("speculative_disable_batch_threshold=5")
        # Frames name the sglang that is installed.
        assert f"{tree}/sglang/launch_server.py:71: UserWarning" in server.text()
    else:
        assert server.proc.wait(timeout=5) == 2
        assert (
            "error: unrecognized arguments: --speculative-disable-batch-threshold 5"
            in server.text()
        )


def test_threshold_flag_is_accepted_without_any_sglang(standin: Launch) -> None:
    # The stand-in's own contract (deployctl's side is in test_threshold_launch.py): with no
    # sglang installed, the patched flag is accepted, shown in server_args, and served.
    server = standin(None, "--speculative-disable-batch-threshold", "3")
    server.wait_log("speculative_disable_batch_threshold=3")
    server.wait_log("The server is fired up and ready to roll!")
    assert server.status() == 200


def test_a_model_path_that_is_not_a_folder_fails_like_sglang(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    proc = subprocess.run(
        [sys.executable, str(STANDIN), "--model-path", str(missing)],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert proc.returncode == 1
    assert f"OSError: Incorrect path_or_model_id: '{missing}'." in proc.stderr


TENSOR_MISMATCH = (
    "RuntimeError: The size of tensor a (160) must match the size of tensor b (2) "
    "at non-singleton dimension 0"
)


def real_sglang(module: str, stubs: dict[str, object]) -> dict[str, Any]:
    """Run one module of the real 0.5.23 wheel, its imports of other sglang modules (which
    need torch) left out and ``stubs`` given instead; return its namespace."""
    with zipfile.ZipFile(sglang_wheel(SGLANG_VERSION)) as wheel:
        tree = ast.parse(wheel.read(f"sglang/srt/{module}"))
    tree.body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"))
    ]
    namespace: dict[str, Any] = {"__name__": f"real_{Path(module).stem}", **stubs}
    exec(compile(tree, module, "exec"), namespace)
    return namespace


def adaptive_config(path: Path, threshold: int, steps: int = 3) -> Path:
    """Write the config deployctl renders for threshold_mode adaptive (render.py)."""
    config = {"1": {"candidate_steps": [steps]}, str(threshold + 1): {"candidate_steps": [0]}}
    path.write_text(json.dumps(config))
    return path


def bench_level(server: Server, concurrency: int, output_len: int, rounds: int = 1) -> BenchLevel:
    """One level of deployctl's own load generator against the stand-in, `rounds` rounds of
    `concurrency` requests (assert_paced's best round needs more than one to pass over a
    stall: one first token 745 ms late on a loaded machine read a lone round at 0.60)."""
    return cmd_bench(
        {"bind_host": "127.0.0.1", "port": server.port, "concurrency": concurrency,
         "prompts": concurrency * rounds, "input_len": 8, "output_len": output_len, "flush": False,
         "timeout": 10.0, "tool": "builtin", "env": {}, "warmup": False, "client_processes": 0}
    )  # fmt: skip


def test_adaptive_routing_pads_to_cuda_graph_sizes_like_sglang(tmp_path: Path) -> None:
    t6 = load_adaptive_config(str(adaptive_config(tmp_path / "t6.json", 6)))
    graphs = cuda_graph_batch_sizes(256)
    assert [adaptive_steps(b, t6, 3, graphs) for b in range(1, 10)] == [3] * 6 + [0] * 3
    # Above 8 the sizes go in twos: 11 pads to 12, past a threshold of 11; without CUDA
    # graphs nothing pads.
    t11 = load_adaptive_config(str(adaptive_config(tmp_path / "t11.json", 11)))
    assert [adaptive_steps(b, t11, 3, graphs) for b in (10, 11, 12)] == [3, 0, 0]
    assert [adaptive_steps(b, t11, 3, None) for b in (10, 11, 12)] == [3, 3, 0]
    assert graphs[-3:] == [240, 248, 256] and cuda_graph_batch_sizes(300)[-3:] == [272, 288, 300]

    # What 0.5.23 itself routed on the device machine (tests/test_threshold_adaptive.py).
    captured = Path(__file__).parent / "data" / "sglang" / "adaptive-threshold-0.5.23.json"
    for result in json.loads(captured.read_text())["results"]:
        slots = {int(k): v["candidate_steps"] for k, v in result["config"].items()}
        routed = {
            int(b): adaptive_steps(int(b), slots, result["steps"], result["cuda_graph_bs"])
            for b in result["steps_by_batch"]
        }
        assert routed == {int(b): s for b, s in result["steps_by_batch"].items()}, result

    # The same answers as 0.5.23's own code, for every batch size and several configs.
    hook = real_sglang("arg_groups/cuda_graph_hook.py", {"resolving_view": lambda args: args})
    spec_args = types.SimpleNamespace(
        disable_cuda_graph_padding=False, speculative_algorithm="EAGLE3"
    )
    for max_bs in (1, 7, 20, 64, 256, 300, 512):
        real_sizes = hook["generate_decode_cuda_graph_batch_sizes"](spec_args, max_bs)
        assert cuda_graph_batch_sizes(max_bs) == real_sizes, max_bs
        # tune's own list (where a threshold can switch in adaptive mode) is SGLang's too.
        assert speculative_graph_sizes(max_bs) == real_sizes, max_bs
    params = real_sglang(
        "speculative/adaptive_spec_params.py", {"log_info_on_rank0": lambda logger, message: None}
    )
    late_start = tmp_path / "late.json"  # no slot for batch 1, several candidates a slot
    late_start.write_text(
        json.dumps({"4": {"candidate_steps": [1, 3, 5]}, "20": {"candidate_steps": [0, 2]}})
    )
    batches = range(1, 300)
    for config in (tmp_path / "t6.json", tmp_path / "t11.json", late_start, None):
        path = None if config is None else str(config)  # None: SGLang's default config
        slots = load_adaptive_config(path)
        for num_steps in (3, 2, None):
            for graph_bs in (graphs, cuda_graph_batch_sizes(20), None):
                real = params["AdaptiveSpeculativeParams"](num_steps, path)
                real.set_cuda_graph_bs(graph_bs)
                ours = [adaptive_steps(b, slots, num_steps, graph_bs) for b in batches]
                assert ours == [real.get_steps_for_batch(b) for b in batches], (path, num_steps)


def test_adaptive_speculation_drafts_up_to_the_threshold_then_steps_plain(
    standin: Launch, tmp_path: Path
) -> None:
    config = adaptive_config(tmp_path / "adaptive.json", 4)
    server = standin(
        None, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
        "--speculative-adaptive", "--speculative-adaptive-config", config,
        tp=1, knobs={"startup_s": 0.2, **MODEL, "off_state_slowdown": 1.8},
    )  # fmt: skip
    server.wait_log(READY)
    # A 0-step slot is a plain step: off_state_slowdown is the patched server's cost alone.
    level = bench_level(server, 2, 90, rounds=3)
    assert level["failed"] == 0 and level["output_tokens"] == 90 * 2 * 3, level
    assert_paced(level, spec_tps(2))
    level = bench_level(server, 8, 90)
    assert level["failed"] == 0 and level["output_tokens"] == 90 * 8, level
    assert_full_batch_step(level, MODEL["step_ms"] + MODEL["per_req_ms"] * 8)


def test_the_off_state_above_a_patched_threshold_steps_slower_than_plain(
    standin: Launch, tmp_path: Path
) -> None:
    """`off_state_slowdown` F: above --speculative-disable-batch-threshold the patched server's
    plain steps take F times longer (real 0.5.17 still verifies through the speculative worker
    there); up to T it drafts as before, and a server without speculation, or with stock
    adaptive speculation, is untouched (the test above)."""
    slowdown = 1.8
    knobs = {"startup_s": 0.2, **MODEL, "off_state_slowdown": slowdown}
    patched = standin(
        None, "--speculative-algorithm", "EAGLE3", "--speculative-disable-batch-threshold", "4",
        tp=1, knobs=knobs,
    )  # fmt: skip
    plain = standin(tmp_path / "plain", tp=1, knobs=knobs)
    patched.wait_log(READY)
    plain.wait_log(READY)
    levels = {}
    for name, server, concurrency, rounds in (("above", patched, 8, 1), ("below", patched, 2, 3),
                                              ("plain", plain, 8, 1)):  # fmt: skip
        levels[name] = level = bench_level(server, concurrency, 60, rounds)
        assert level["failed"] == 0 and level["output_tokens"] == 60 * concurrency * rounds, level
    plain_step_ms = MODEL["step_ms"] + MODEL["per_req_ms"] * 8
    assert_full_batch_step(levels["above"], plain_step_ms * slowdown)
    assert_paced(levels["below"], spec_tps(2))
    assert_paced(levels["plain"], plain_tps(8))


def assert_full_batch_step(level: BenchLevel, step_ms: float) -> None:
    """A level above a threshold T, on a server that drafts up to T: its throughput is a mix,
    as streams that start or end apart leave T or fewer running, which draft (loaded machines'
    best rounds read 1.06 of the plain pace). Most tokens come from the full batch: its
    step is the median inter-token gap, at most 30 % slow on a loaded machine, and as much
    as 20 % short: the stand-in keeps to its model's clock, so a late step's successor comes
    early (a loaded run read 0.950). A server that drafts at 8 gives 3 tokens a 60 ms step
    (20 ms apart at most, 0.71 of the plain step), one slowed wrongly 1.8 times it: both
    fail."""
    itl = level["itl_ms"]["p50"]
    assert 0.8 * step_ms <= itl <= step_ms / 0.7, (
        f"median inter-token gap {itl:.1f} ms, {itl / step_ms:.3f} of the full batch's step "
        f"({step_ms:.1f} ms), bounds 0.8 to 1.43: {level}"
    )


@pytest.mark.parametrize("factor", [0, -1.5, "2", True, None])
def test_a_bad_off_state_slowdown_is_an_error(tmp_path: Path, factor: object) -> None:
    (tmp_path / "standin.json").write_text(json.dumps({"off_state_slowdown": factor}))
    with pytest.raises(ValueError, match="off_state_slowdown must be a number > 0"):
        load_knobs(str(tmp_path))


def test_a_cold_start_slows_the_first_steps_at_each_batch_size_once(tmp_path: Path) -> None:
    """The `cold` knob: per batch size, its first `steps` steps are `factor` times slower;
    kept in the model folder across launches with `persist`, else each launch is cold."""
    (tmp_path / "standin.json").write_text(json.dumps({"cold": {"factor": 3, "steps": 2}}))
    knob = load_knobs(str(tmp_path))["cold"]
    assert knob == {"factor": 3.0, "steps": 2, "persist": False}
    cache = str(tmp_path / "standin-jit-cache.json")
    first = ColdStart(knob, cache)
    assert [first.factor_for(b) for b in (4, 4, 4, 1, 4)] == [3.0, 3.0, 1.0, 3.0, 1.0]
    assert ColdStart(knob, cache).factor_for(4) == 3.0  # a new launch: cold again
    kept = {**knob, "persist": True}
    server = ColdStart(kept, cache)
    assert [server.factor_for(4) for _ in range(3)] == [3.0, 3.0, 1.0]
    assert json.loads(Path(cache).read_text()) == [4]
    relaunched = ColdStart(kept, cache)
    assert relaunched.factor_for(4) == 1.0 and relaunched.factor_for(5) == 3.0


@pytest.mark.parametrize(
    "cold",
    [{"factor": 2}, {"steps": 3}, {"factor": 0, "steps": 3}, {"factor": 2, "steps": 0},
     {"factor": 2, "steps": 3, "persist": "yes"}, {"factor": 2, "steps": 3, "per": 1}, [2, 3]],
)  # fmt: skip
def test_a_bad_cold_knob_is_an_error(tmp_path: Path, cold: object) -> None:
    (tmp_path / "standin.json").write_text(json.dumps({"cold": cold}))
    with pytest.raises(ValueError, match="cold must be"):
        load_knobs(str(tmp_path))


@pytest.mark.parametrize("mode", ["patch", "adaptive"])
def test_above_threshold_crash_comes_with_the_first_batch_past_it(
    standin: Launch, tmp_path: Path, mode: str
) -> None:
    threshold = (
        ["--speculative-disable-batch-threshold", "4"]
        if mode == "patch"
        else ["--speculative-adaptive", "--speculative-adaptive-config",
              str(adaptive_config(tmp_path / "adaptive.json", 4))]
    )  # fmt: skip
    knobs = {"startup_s": 0.2, "crash": "above_threshold"}
    server = standin(None, "--speculative-algorithm", "EAGLE3", *threshold, knobs=knobs)
    server.wait_log(READY)
    level = bench_level(server, 2, 30)
    assert level["failed"] == 0 and level["output_tokens"] == 60, level
    assert server.status() == 200 and "Scheduler hit" not in server.text()

    level = bench_level(server, 8, 30)
    assert level["output_tokens"] < 8 * 30, level  # the streams in flight are cut off
    assert server.proc.wait(timeout=5) != 0
    wait_for(lambda: not group_members(server.pid), 5, "the group to end")
    log = server.text()
    heads = re.findall(STAMP + r" TP(\d)\] Scheduler hit an exception: Traceback", log)
    assert sorted(heads) == ["0", "1"]
    assert log.count(f"\n{TENSOR_MISMATCH}\n") == 2
    assert log.count("in event_loop_overlap") == 2
    assert log.index(READY) < log.index("Scheduler hit") < log.index(RUNNING_SIGQUIT)


@pytest.mark.parametrize(
    "flags",
    [["--speculative-algorithm", "EAGLE3"], ["--speculative-disable-batch-threshold", "4"]],
    ids=["no-threshold", "no-speculation"],
)
def test_above_threshold_crash_needs_speculation_and_a_threshold(
    standin: Launch, flags: list[str]
) -> None:
    server = standin(None, *flags, knobs={"startup_s": 0.2, "crash": "above_threshold"})
    server.wait_log(READY)
    level = bench_level(server, 8, 30)
    assert level["failed"] == 0 and level["output_tokens"] == 8 * 30, level
    time.sleep(0.3)  # a crash would have come by now
    assert server.status() == 200 and server.proc.poll() is None
    assert "Scheduler hit" not in server.text()


def test_a_decodes_heartbeat_counts_a_reply_cut_short_as_a_missed_beat(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A prefill killed while it answers /health leaves a body cut short (IncompleteRead,
    not an OSError): SGLang's checker counts it as a failure under `except Exception`; a
    checker that died of it would never fail the rooms waiting on that prefill."""
    from tests.standin.sglang_standin.pd_decode import DecodePD

    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "0.1")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "2")
    dying = socket.create_server(("127.0.0.1", 0))
    dying.settimeout(0.1)
    addr = f"127.0.0.1:{dying.getsockname()[1]}"
    stop = threading.Event()

    def answer_short() -> None:
        while not stop.is_set():
            with suppress(TimeoutError):
                conn, _ = dying.accept()
                with conn:
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nOK")

    server = threading.Thread(target=answer_short, daemon=True)
    server.start()
    launcher = types.SimpleNamespace(args=None, knobs={"pd_health_fail_s": 0.0},
                                     listen_host="127.0.0.1")  # fmt: skip
    decode = DecodePD(launcher)  # type: ignore[arg-type]
    with decode.lock:
        decode.parallel_info[addr] = {}
        decode.rooms[addr] = {7}
    try:
        wait_for(lambda: 7 in decode.lost, 5, "the room failed by the heartbeat")
    finally:
        stop.set()
        server.join()
        dying.close()
    assert decode.lost[7] == f"Lost connection with prefill instance (bootstrap_addr: {addr})"
    assert f"{addr}), 1 requests affected" in capfd.readouterr().err
