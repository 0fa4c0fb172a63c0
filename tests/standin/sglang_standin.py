"""Test double for SGLang 0.5.23's ``python -m sglang.launch_server``.

This file lives in tests/ and is never part of deployctl.  It lets tests run
deployctl against hosts without GPUs: it accepts the launch_server flags that
deployctl renders, writes SGLang 0.5.23's log line forms (wording taken from
the 0.5.23 wheel), serves /health, /health_generate, /model_info and /v1/models,
and starts one ``sglang::scheduler_TP{i}`` process per rank.  Behaviour knobs
come from ``<model_path>/standin.json``; see README.md beside this file.

Stdlib only; torch is imported only by rank processes in GPU mode
(``gpu_mib > 0``).  Rank processes are this same file re-executed with a
hidden first argument.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import ctypes
import errno
import functools
import importlib.util
import json
import math
import os
import random
import re
import select
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Iterator
    from http.server import ThreadingHTTPServer

SGLANG_VERSION = "0.5.23"
CHILD_FLAG = "--standin-child"  # hidden first argv element of rank processes
THRESHOLD_FIELD = "speculative_disable_batch_threshold"

KNOB_DEFAULTS: dict[str, Any] = {
    "startup_s": 0.5,
    # None | "startup" | "after_ready" | "above_threshold" (the first decode step that
    # speculation's threshold turns plain crashes every rank)
    "crash": None,
    "crash_after_s": 0.5,
    "crash_message": (
        "The size of tensor a (160) must match the size of tensor b (2) "
        "at non-singleton dimension 0"
    ),
    "gpu_mib": 0,
    # True: each rank sizes a KV pool on its GPU as 0.5.23 does with --mem-fraction-static F
    # (and holds it): F of the memory free before it loaded (gpu_mib counts as its weights).
    "gpu_fraction": False,
    # Host memory each rank holds, every page touched (as a real rank's pinned buffers): a
    # process holding much takes a while to die even after SIGKILL.
    "host_mib": 0,
    "ignore_sigterm": False,
    # Where 0.5.23 is gentler than the worst case, the default is the worst case:
    "late_bind": False,  # True: listen only once ranks are up, as 0.5.23 does
    "pdeathsig": False,  # True: ranks die with the parent (0.5.23's PR_SET_PDEATHSIG)
    "drain_s": 2.0,  # SIGTERM to a ready server: its drain looks this often (SGLang: 5 s)
    # A ready server's /health and /health_generate answer after this long: real SGLang
    # (0.5.17, tests/data/real-sglang-0.5.17) runs a 1-token request and sleeps 1 s first.
    # 0 keeps the suite fast; the fidelity tests run with the real 1.0.
    "health_s": 0.0,
    # True: crash_after_s after ready, one request fails with a logged traceback (uvicorn's
    # "Exception in ASGI application") and the server goes on serving, healthy.
    "request_error": False,
    # Multi-node (--nnodes > 1): how long rank 0 waits for the other nodes to join, and how
    # long a node lives on after the connection to another one is lost (NCCL's watchdog).
    "dist_timeout_s": 30.0,
    "peer_loss_s": 2.0,
    # Slurm node name -> address: on that node (SLURMD_NODENAME) the HTTP server binds there,
    # not to --host, so two "nodes" on one machine have addresses of their own.
    "bind_by_node": {},
    # With --enable-metrics: gauge values by SGLang name without "sglang:" (others read their
    # live value or 0; spec_accept_length, live as of the last Decode batch line, is exported
    # only with speculation), and observations in seconds
    # for the histograms ("time_to_first_token_seconds", "inter_token_latency_seconds",
    # "e2e_request_latency_seconds"); a histogram not given here is the live one.
    "metrics": {},
    "observations": {},
    # The decode model behind streamed /v1/completions: a step over a batch of b requests
    # takes step_ms + per_req_ms * b and gives each request one token; with speculation
    # (while b <= --speculative-disable-batch-threshold, when given, and, with
    # --speculative-adaptive, while b's slot drafts steps > 0) a step takes
    # spec_step_ms + spec_per_req_ms * b and gives each request its accept length in tokens:
    # accept_len, or that of the first of accept_by_class whose "match" (a regex, searched
    # for) is in its prompt text; a fractional one carries its remainder from step to step.
    "step_ms": 10.0,
    "per_req_ms": 0.5,
    "spec_step_ms": 14.0,
    "spec_per_req_ms": 2.0,
    "accept_len": 3,
    "accept_by_class": [],  # [{"match": REGEX, "accept_len": A >= 1}, ...]
    # Speculative steps take this many times longer when speculation has a threshold (a
    # server tune relaunched with T): a tuned run that falls below its curves up to T.
    "threshold_slowdown": 1.0,
    # Plain steps take this many times longer where --speculative-disable-batch-threshold has
    # switched speculation off (b > T): real 0.5.17 still runs the target through the
    # speculative worker's 1-token verify path there and extends the draft every step (an
    # H200 with EAGLE3 and CUDA graphs: 0.59 of a plain server's throughput at 64, 0.55 at
    # 128). Not a server without speculation, nor stock --speculative-adaptive's 0-step slots.
    "off_state_slowdown": 1.0,
    # A regression to catch (deployctl canary): {"factor": F, "min_batch": B} makes every
    # decode step (plain or speculative) over a batch of at least B take F times longer.
    "slowdown": None,
    # A cold start (JIT kernels compiled, CUDA graphs first replayed): {"factor": F, "steps": N,
    # "persist": P} makes the first N decode steps at each batch size take F times longer;
    # with P, the batch sizes done are kept in <model_path>/standin-jit-cache.json for the
    # next launch (as Triton's cache on disk), else each launch starts cold.
    "cold": None,
    # PD disaggregation (--disaggregation-mode prefill|decode); see README.md.
    # Prefill: "mid_transfer" crashes the schedulers while a room's KV is being handed over.
    "pd_crash": None,
    # Prefill: from the ready line on, nothing answers on the bootstrap port (its server's
    # thread is gone; the ranks registered before that).
    "bootstrap_unreachable": False,
    # Decode: the KV never arrives; the request waits in the transfer queue until it is
    # aborted (the client goes) or SGLANG_DISAGGREGATION_WAITING_TIMEOUT passes.
    "stuck_transfer": False,
    # Decode: tries at the prefill's parallel info, one a second (decode.py's 15).
    "handshake_attempts": 15,
    # Decode: after it loses a prefill, /health and /health_generate fail this long (sglang#12779).
    "pd_health_fail_s": 0.0,
}
# SGLang 0.5.23's buckets (srt/observability/metrics_collector.py, TokenizerMetricsCollector's
# defaults: bucket_time_to_first_token, bucket_inter_token_latency, bucket_e2e_request_latency).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
    0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
CRASH_MODES = (None, "startup", "after_ready", "above_threshold")
PD_CRASH_MODES = (None, "mid_transfer")
# The decode CUDA-graph max bs when --cuda-graph-max-bs-decode is not given (the capture_bs
# the stand-in logs, and what adaptive speculation pads batches to, end there).
DEFAULT_CUDA_GRAPH_MAX_BS = 256

# After a SIGQUIT the parent waits this long at most for the other crashing
# ranks to print their tracebacks before it kills the tree.
CRASH_GATHER_S = 1.0
WATCHDOG_INTERVAL_S = 1.0  # SGLang's SubprocessWatchdog polls every second
# After a drain, how long the main process waits for its schedulers to exit on the
# ShutdownReq before it kills its tree (TokenizerManager.sigterm_watchdog's 15 s).
SCHEDULER_EXIT_S = 15.0
# What rank 0 sends the other nodes once its drain has ended: its ShutdownReq, which SGLang
# broadcasts to every rank.
SHUTDOWN_BYTE = b"S"
GIB = 1024**3


# --------------------------------------------------------------------------
# Output.  SGLang logs through `logging` to stderr and uvicorn's access log
# goes to stdout; each record is one os.write so lines from the parent and the
# ranks (sharing one file description) never tear.
# --------------------------------------------------------------------------


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


def _write(fd: int, text: str) -> None:
    data = text.encode("utf-8", "backslashreplace")
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data) :]


def log(msg: str, prefix: str = "") -> None:
    """Write one SGLang logger record: ``[YYYY-MM-DD HH:MM:SS{ prefix}] msg``."""
    _write(2, f"[{_stamp()}{prefix}] {msg}\n")


def uvicorn_log(level: str, msg: str, fd: int = 2) -> None:
    """Write one uvicorn record in the format SGLang configures for it."""
    _write(fd, f"[{_stamp()}] {(level + ':').ljust(9)} {msg}\n")


# The shutdown lines (TokenizerManager's SignalHandler and sigterm_watchdog, http_server's
# health_generate, SubprocessWatchdog, utils' kill_process_tree; the same in 0.5.17 and
# 0.5.23).  The SIGTERM and SIGQUIT handlers are added through the event loop, which calls
# them without arguments: SGLang prints signum and frame as None.
SIGTERM_LINE = "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
SIGQUIT_LINE = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
SHUTDOWN_HEALTH_LINE = "Health check request received during shutdown. Returning 503."


def drain_line(rids: list[str]) -> str:
    """sigterm_watchdog's look at the requests left."""
    return (
        f"Gracefully exiting... Remaining number of requests {len(rids)}. "
        f"Remaining requests remaining_rids={rids!r}."
    )


def child_crashed_line(name: str, pid: int, code: int) -> str:
    """SubprocessWatchdog's line for a child that exited non-zero."""
    return (
        f"Subprocess {name} (pid={pid}) crashed with exit code {code}. "
        "Triggering SIGQUIT for cleanup..."
    )


def scheduler_exit_line(pid: int, code: int) -> str:
    """A node > 0's block_until_scheduler_exits, for each scheduler that ended."""
    return f"Scheduler or DataParallelController {pid} terminated with {code}"


def reconnect_line(addr: str) -> str:
    """A decode's heartbeat that found its prefill's bootstrap server gone."""
    return f"Attempting to reconnect to {addr}..."


def lost_prefill_line(addr: str, affected: int) -> str:
    """_handle_node_failure: the decode forgets the prefill after the heartbeat's failures."""
    return (
        f"Lost connection with prefill instance (bootstrap_addr: {addr}), "
        f"{affected} requests affected"
    )


def kill_tree_line(pid: int, include_parent: bool) -> str:
    return f"kill_process_tree called: parent_pid={pid}, include_parent={include_parent}, pid={pid}"


# --------------------------------------------------------------------------
# Process titles, the way setproctitle does it: rewrite the argv area that
# /proc/<pid>/cmdline shows, and set comm (15 characters) with prctl.
# --------------------------------------------------------------------------

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1


def _prctl(option: int, arg: int | bytes) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def set_process_title(title: str) -> None:
    """Make ``ps -o args`` show exactly ``title`` and ``ps -o comm`` its first 15 bytes."""
    _prctl(PR_SET_NAME, title.encode()[:15])
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Fields after "(comm)": index 0 is field 3; arg_start/arg_end are 48/49.
        fields = stat[stat.rindex(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])
    except (OSError, ValueError, IndexError):
        return
    size = end - start
    if start == 0 or size <= 1:
        return
    raw = title.encode()[: size - 1]
    ctypes.memmove(start, raw + b"\0" * (size - len(raw)), size)


# --------------------------------------------------------------------------
# The real sglang package, if one is importable (never imported: its
# __init__ needs torch).
# --------------------------------------------------------------------------


def _sglang_dirs() -> list[str]:
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return list(spec.submodule_search_locations)


def threshold_flag_supported() -> bool:
    """Say whether the installed SGLang knows --speculative-disable-batch-threshold.

    The flag exists only once the spec-disable patch added the field; with no
    sglang installed at all the stand-in accepts it.
    """
    dirs = _sglang_dirs()
    if not dirs:
        return True
    # 0.5.23 declares fields in arg_groups/fields/spec.py; older releases
    # kept one dataclass in server_args.py.
    for rel in ("srt/arg_groups/fields/spec.py", "srt/server_args.py"):
        for root in dirs:
            try:
                with open(os.path.join(root, rel), encoding="utf-8") as f:
                    return THRESHOLD_FIELD in f.read()
            except OSError:
                continue
    return False


def sglang_root() -> str:
    """Return the directory traceback frames should name as sglang's."""
    dirs = _sglang_dirs()
    if dirs:
        return dirs[0]
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return os.path.join(sys.prefix, "lib", ver, "site-packages", "sglang")


# --------------------------------------------------------------------------
# Argument parsing: SGLang's flag names and argparse semantics (prog name,
# abbreviations, ambiguity) for the subset deployctl uses.
# --------------------------------------------------------------------------

# (option strings, argparse keyword arguments), in ServerArgs field order.
_FLAGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--model-path", "--model"), {"type": str, "required": True}),
    (("--tokenizer-path",), {"type": str}),
    (("--load-format",), {"type": str, "default": "auto"}),
    (("--trust-remote-code",), {"action": "store_true"}),
    (("--context-length",), {"type": str}),
    (("--dtype",), {"type": str, "default": "auto"}),
    (("--quantization",), {"type": str}),
    (("--kv-cache-dtype",), {"type": str, "default": "auto"}),
    (("--mem-fraction-static",), {"type": float}),
    (("--max-running-requests",), {"type": int}),
    (("--chunked-prefill-size",), {"type": int}),
    (("--page-size",), {"type": int}),
    (("--disable-radix-cache",), {"action": "store_true"}),
    (("--dist-init-addr", "--nccl-init-addr"), {"type": str}),
    (("--nnodes",), {"type": int, "default": 1}),
    (("--node-rank",), {"type": int, "default": 0}),
    (("--tp-size", "--tensor-parallel-size"), {"type": int, "default": 1}),
    (("--pp-size", "--pipeline-parallel-size"), {"type": int, "default": 1}),
    (("--dp-size", "--data-parallel-size"), {"type": int, "default": 1}),
    (("--ep-size", "--expert-parallel-size", "--ep"), {"type": int, "default": 1}),
    (("--base-gpu-id",), {"type": int, "default": 0}),
    (("--random-seed",), {"type": int}),
    (("--watchdog-timeout",), {"type": float, "default": 300}),
    (("--host",), {"type": str, "default": "127.0.0.1"}),
    (("--port",), {"type": int, "default": 30000}),
    (("--skip-server-warmup",), {"action": "store_true"}),
    (("--api-key",), {"type": str}),
    (("--served-model-name",), {"type": str}),
    (("--log-level",), {"type": str, "default": "info"}),
    (("--enable-metrics",), {"action": "store_true"}),
    (("--decode-log-interval",), {"type": int, "default": 40}),
    (("--attention-backend",), {"type": str}),
    # 0.5.23 has only the -decode/-prefill spellings, so a bare
    # --cuda-graph-max-bs is an ambiguous abbreviation there, as here.
    (("--cuda-graph-max-bs-decode",), {"type": int}),
    (("--cuda-graph-max-bs-prefill",), {"type": int}),
    (
        ("--cuda-graph-backend-decode",),
        {"choices": ["full", "breakable", "tc_piecewise", "disabled"]},
    ),
    (
        ("--cuda-graph-backend-prefill",),
        {"choices": ["full", "breakable", "tc_piecewise", "disabled"]},
    ),
    (("--sampling-backend",), {"type": str}),
    (("--speculative-draft-attention-backend",), {"type": str}),
    (("--disable-custom-all-reduce",), {"action": "store_true"}),
    (("--enable-torch-compile",), {"action": "store_true"}),
    (("--speculative-algorithm",), {"type": str}),
    (
        ("--speculative-draft-model-path", "--speculative-draft-model"),
        {"type": str},
    ),
    (("--speculative-num-steps",), {"type": int}),
    (("--speculative-eagle-topk",), {"type": int}),
    (("--speculative-num-draft-tokens",), {"type": int}),
    (("--speculative-adaptive",), {"action": "store_true"}),
    (("--speculative-adaptive-config",), {"type": str}),
    (("--disable-cuda-graph",), {"action": "store_true"}),
    (("--enable-dp-attention",), {"action": "store_true"}),
    (("--enable-flashinfer-allreduce-fusion",), {"action": "store_true"}),
    # PD disaggregation: 0.5.23's arg_groups/fields/disagg.py, every field of its PD section
    # (the parser's abbreviations then resolve as the real one's do).  There is no
    # --disaggregation-decode-tp/-dp in 0.5.23: prefill learns the decode's TP at handshake.
    (("--disaggregation-mode",), {"type": str, "default": "null",
                                  "choices": ["null", "prefill", "decode"]}),
    (("--disaggregation-decode-allocation-policy",),
     {"type": str, "default": "early", "choices": ["early", "prefill_complete"]}),
    # arg_groups/choices.py DISAGG_TRANSFER_BACKEND_CHOICES
    (("--disaggregation-transfer-backend",),
     {"type": str, "default": "mooncake",
      "choices": ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]}),
    (("--disaggregation-enable-kv-checksum",), {"action": "store_true"}),
    (("--disaggregation-bootstrap-port",), {"type": int, "default": 8998}),
    (("--disaggregation-ib-device",), {"type": str}),
    (("--disaggregation-decode-enable-radix-cache",), {"action": "store_true"}),
    (("--disaggregation-decode-enable-offload-kvcache",), {"action": "store_true"}),
    (("--disaggregation-decode-retraction-backup",),
     {"type": str, "choices": ["cpu_tensor", "host_pool", "none"]}),
    (("--num-reserved-decode-tokens",), {"type": int, "default": 512}),
    (("--disaggregation-decode-extra-slots",), {"type": int}),
    (("--disaggregation-decode-polling-interval",), {"type": int, "default": 1}),
    (("--enable-pd-role-switch",), {"action": "store_true"}),
    (("--optimistic-prefill-attempts",), {"type": int, "default": 0}),
    (("--disaggregation-decode-host-receive-threshold",), {"type": float, "default": 1.0}),
]  # fmt: skip

# Deprecated flags 0.5.23 warns about at parse time: flag -> replacement.
_DEPRECATED = {
    "--disable-cuda-graph": "--cuda-graph-backend-{decode,prefill}=disabled",
    "--enable-dp-attention": "--attn-dp-size <dp-size>",
}


def build_parser(with_threshold: bool) -> argparse.ArgumentParser:
    """Build the launch_server parser; the threshold flag only when patched in."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    for flags, kwargs in _FLAGS:
        parser.add_argument(*flags, **kwargs)
    if with_threshold:
        parser.add_argument("--speculative-disable-batch-threshold", type=int)
    return parser


def server_args_dict(args: argparse.Namespace) -> dict[str, Any]:
    """Return the resolved-arguments dict SGLang logs as ``server_args=``."""
    out = dict(vars(args))
    out["tokenizer_path"] = args.tokenizer_path or args.model_path
    out["served_model_name"] = args.served_model_name or args.model_path
    return out


# --------------------------------------------------------------------------
# Scheduler tracebacks, with frames from the 0.5.23 sources.
# --------------------------------------------------------------------------

# (path under the sglang package or "torch:" path, line, function, source, expr)
_Frame = tuple[str, int, str, str, str | None]

_STARTUP_FRAMES: list[_Frame] = [
    (
        "srt/managers/scheduler.py",
        6362,
        "run_scheduler_process",
        "scheduler = Scheduler(server_args, port_args)",
        "Scheduler(server_args, port_args)",
    ),
    ("srt/managers/scheduler.py", 568, "__init__", "self.init_model_worker()", None),
    ("srt/managers/scheduler.py", 1137, "init_model_worker", "self.init_memory_pools()", None),
    (
        "srt/managers/scheduler.py",
        1106,
        "init_memory_pools",
        "self.draft_worker.alloc_memory_pool(",
        None,
    ),
    ("srt/speculative/eagle_worker_v2.py", 258, "alloc_memory_pool", "self.init_lm_head()", None),
    (
        "srt/speculative/eagle_worker_v2.py",
        375,
        "init_lm_head",
        "head.data = head.data[self.hot_token_id]",
        "head.data[self.hot_token_id]",
    ),
]

_RUNNING_FRAMES: list[_Frame] = [
    (
        "srt/managers/scheduler.py",
        6368,
        "run_scheduler_process",
        "scheduler.run_event_loop()",
        None,
    ),
    ("srt/managers/scheduler.py", 2010, "run_event_loop", "dispatch_event_loop(self)", None),
    (
        "srt/managers/scheduler.py",
        6215,
        "dispatch_event_loop",
        "return _dispatch_event_loop_once(scheduler)",
        "_dispatch_event_loop_once(scheduler)",
    ),
    (
        "srt/managers/scheduler.py",
        6231,
        "_dispatch_event_loop_once",
        "scheduler.event_loop_overlap()",
        None,
    ),
    (
        "torch:utils/_contextlib.py",
        120,
        "decorate_context",
        "return func(*args, **kwargs)",
        "func(*args, **kwargs)",
    ),
    (
        "srt/managers/scheduler.py",
        2109,
        "event_loop_overlap",
        "batch_result = self.run_batch(batch)",
        "self.run_batch(batch)",
    ),
    (
        "srt/managers/scheduler.py",
        4870,
        "run_batch",
        "batch_result = self.model_worker.forward_batch_generation(",
        None,
    ),
    (
        "srt/speculative/eagle_worker_v2.py",
        1480,
        "forward_batch_generation",
        "verify_input: EagleVerifyInput = self.draft_worker.draft(batch)",
        "self.draft_worker.draft(batch)",
    ),
    ("srt/speculative/eagle_worker_v2.py", 714, "draft", "self.draft_forward(forward_batch)", None),
    (
        "srt/speculative/eagle_worker_v2.py",
        758,
        "draft_forward",
        "topk_index = self.hot_token_id[topk_index]",
        "self.hot_token_id[topk_index]",
    ),
]


def format_traceback(frames: list[_Frame], root: str, exc_line: str) -> str:
    """Render frames the way Python 3.11's traceback module does."""
    torch_root = os.path.join(os.path.dirname(root), "torch")
    out = ["Traceback (most recent call last):\n"]
    for rel, line, func, src, expr in frames:
        path = (
            os.path.join(torch_root, rel[6:])
            if rel.startswith("torch:")
            else os.path.join(root, rel)
        )
        out.append(f'  File "{path}", line {line}, in {func}\n    {src}\n')
        if expr is not None:
            out.append(" " * (4 + src.index(expr)) + "^" * len(expr) + "\n")
    out.append(exc_line + "\n")
    return "".join(out)


# --------------------------------------------------------------------------
# Child processes: scheduler ranks and the detokenizer.
# --------------------------------------------------------------------------


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.time()
    if delay > 0:
        time.sleep(delay)


_HELD: list[Any] = []  # GPU tensors a rank keeps for its whole life


def _gpu_free_gib(index: int) -> float:
    import torch  # type: ignore[import-not-found]  # GPU mode only: costs seconds

    device = torch.device("cuda", index % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return float(torch.cuda.mem_get_info(device)[0]) / GIB


def _gpu_hold(index: int, mib: int) -> int:
    """Allocate ``mib`` MiB on the rank's GPU, touch it, keep it; return the device index."""
    import torch

    device = torch.device("cuda", index % torch.cuda.device_count())
    tensor = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device=device)
    tensor.fill_(1)
    torch.cuda.synchronize(device)
    _HELD.append(tensor)
    return int(device.index)


# Where 0.5.23 sizes the KV pool (the frames of its "no memory left" failure).
_POOL_FRAMES: list[_Frame] = [
    *_STARTUP_FRAMES[:3],
    ("srt/model_executor/model_runner.py", 982, "alloc_memory_pool",
     "result = self.kv_cache_configurator.configure(", None),
    ("srt/mem_cache/kv_cache_configurator.py", 476, "configure",
     "config = self._resolve_memory_pool_config(pre_model_load_memory)", None),
    ("srt/mem_cache/kv_cache_configurator.py", 3182, "_resolve_memory_pool_config",
     "available_bytes = self._profile_available_bytes(pre_model_load_memory)", None),
    ("srt/mem_cache/kv_cache_configurator.py", 3050, "_profile_available_bytes",
     "raise ValueError(", None),
]  # fmt: skip


def default_mem_fraction(total_gib: float, tp: int) -> float:
    """0.5.23's --mem-fraction-static when none is given (memory_hook.py), roughly: the
    capacity less a reserve for activations, at least 10 GiB on a GPU over 60 GiB."""
    total_mib = total_gib * 1024
    reserved = 512 + 2048 * 1.5 + tp / 8 * 1024
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((total_mib - reserved) / total_mib, 3)


def kv_pool_gib(pre: float, available: float, fraction: float) -> float:
    """The KV pool 0.5.23 sizes, in GiB (kv_cache_configurator._profile_available_bytes).

    pool = free now − pre × (1 − F), where pre is what was free before the weights loaded,
    so a server ends up holding F × pre in all: F of what was *free* at its start, not of
    the GPU.  With nothing left for the pool it raises SGLang's ValueError.
    """
    rest = available - pre * (1 - fraction)
    if rest <= 0:
        minimum = 1 - available / pre
        raise ValueError(
            "Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={fraction}. Raise --mem-fraction-static above "
            f"{math.ceil(minimum * 1000) / 1000:.3f} (minimum viable = 1 - available/pre = "
            f"{minimum:.4f}). If using speculative decoding, draft weights are now counted."
        )
    return rest


def _gpu_pool(cfg: dict[str, Any], pre: float) -> float:
    """Size and hold the rank's KV pool; return the GiB free afterwards.  A pool the GPU
    cannot give (another server took the memory meanwhile) fails with CUDA's OOM error."""
    import torch

    index = cfg["gpu"] % torch.cuda.device_count()
    fraction = cfg["mem_fraction"] or default_mem_fraction(
        torch.cuda.mem_get_info(index)[1] / GIB, cfg["tp"]
    )
    try:
        rest = kv_pool_gib(pre, _gpu_free_gib(cfg["gpu"]), fraction)
        _gpu_hold(cfg["gpu"], int(rest * 1024))
    except ValueError as exc:
        _crash(cfg, _POOL_FRAMES, time.time(), f"ValueError: {exc}")
    except torch.cuda.OutOfMemoryError as exc:
        _crash(cfg, _POOL_FRAMES[:4], time.time(), f"torch.OutOfMemoryError: {exc}")
    log(f"[standin] KV pool of {rest:.2f} GB (--mem-fraction-static {fraction}) on cuda:{index}",
        cfg["prefix"])  # fmt: skip
    return _gpu_free_gib(cfg["gpu"])


def _report(cfg: dict[str, Any], word: str) -> None:
    with contextlib.suppress(OSError):
        os.write(cfg["status_fd"], f"{word} {cfg['index']}\n".encode())


def _released_at(ctl_fd: int) -> float:
    """Block until the parent's "go T" line (read a byte at a time, leaving the rest of the
    control pipe to the serving loop) and return T; exit if the parent is gone."""
    line = b""
    while not (line.startswith(b"go ") and line.endswith(b"\n")):
        if line.endswith(b"\n"):
            line = b""  # nothing else is sent before the release; a stray line is no start
        byte = os.read(ctl_fd, 1)
        if not byte:
            os._exit(0)
        line += byte
    return float(line.split()[1])


def _crash(
    cfg: dict[str, Any], frames: list[_Frame], crash_at: float, exc_line: str | None = None
) -> NoReturn:
    """Fail like a scheduler: log the traceback, SIGQUIT the parent, wait to be killed."""
    rng = random.Random(cfg["index"] * 7919 + int(crash_at * 1000))
    # Ranks hit the error at slightly different moments, so blocks interleave.
    _sleep_until(crash_at + rng.uniform(0.0, 0.05))
    exc_line = exc_line or f"RuntimeError: {cfg['crash_message']}"
    tb = format_traceback(frames, cfg["sglang_root"], exc_line)
    # One logger record: the prefixed first line, then raw traceback lines.
    log(f"Scheduler hit an exception: {tb}", cfg["prefix"])
    # Tell the parent this rank has printed, so it kills the tree only once
    # every crashing rank has (real ranks fail together on the same bug).
    _report(cfg, "crashed")
    if os.getppid() == cfg["parent"]:
        with contextlib.suppress(OSError):
            os.kill(cfg["parent"], signal.SIGQUIT)
    # SGLang's parent answers with kill_process_tree(); linger until then.
    time.sleep(10)
    os._exit(1)


def child_main(cfg: dict[str, Any]) -> NoReturn:
    """Run one child process (a scheduler rank or the detokenizer)."""
    set_process_title(cfg["title"])
    if cfg["pdeathsig"]:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != cfg["parent"]:
            os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if cfg["ignore_sigterm"] else signal.SIG_DFL)
    if cfg["role"] == "rank":
        _rank_main(cfg)
    while True:  # the detokenizer just stays around like the real one
        signal.pause()


def _rank_main(cfg: dict[str, Any]) -> NoReturn:
    prefix: str = cfg["prefix"]
    span: float = cfg["startup_s"]
    spec: bool = cfg["speculative"]
    # torch.distributed's init is a barrier: no rank loads before every rank of the node
    # has started, so the schedule runs from the moment the parent releases them all.
    _report(cfg, "started")
    t0 = _released_at(cfg["ctl_fd"])

    def at(fraction: float) -> None:
        _sleep_until(t0 + fraction * span)

    gpu = cfg["gpu_mib"] > 0 or cfg["gpu_fraction"]
    at(0.1)
    tic = time.time()
    before = _gpu_free_gib(cfg["gpu"]) if gpu else 139.19
    log(f"Load weight begin. avail mem={before:.2f} GB", prefix)
    if gpu:
        device = _gpu_hold(cfg["gpu"], cfg["gpu_mib"])
        after = _gpu_free_gib(cfg["gpu"])
        log(f"[standin] holding {cfg['gpu_mib']} MiB on cuda:{device}", prefix)
    else:
        after = before - 15.52
    held = bytearray(int(cfg["host_mib"]) << 20)
    held[::4096] = b"\x01" * len(range(0, len(held), 4096))
    at(0.35)
    log(
        f"Load weight end. elapsed={time.time() - tic:.2f} s, type={cfg['arch']}, "
        f"avail mem={after:.2f} GB, mem usage={before - after:.2f} GB.",
        prefix,
    )
    if spec:
        log(f"Load weight begin. avail mem={after:.2f} GB", prefix)
        at(0.45)
        log(
            f"Load weight end. elapsed={0.1 * span:.2f} s, type=LlamaForCausalLMEagle3, "
            f"avail mem={after - 0.85:.2f} GB, mem usage=0.85 GB.",
            prefix,
        )
        after -= 0.85
    if cfg["crash"] == "startup":
        _crash(cfg, _STARTUP_FRAMES, t0 + 0.5 * span)
    at(0.55)
    pool = _gpu_pool(cfg, before) if cfg["gpu_fraction"] else after - 104.3
    log(f"Memory pool end. avail mem={pool:.2f} GB", prefix)
    name, per_req = ("target verify", cfg["draft_tokens"]) if spec else ("target decode", 1)
    log(
        f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={per_req}, "
        f"avail mem={pool:.2f} GB",
        prefix,
    )
    tic = time.time()
    at(0.75)
    log(
        f"Capture {name} CUDA graph end. bs={cfg['capture_bs']}, elapsed={time.time() - tic:.2f} s, "
        f"mem usage=1.21 GB, avail mem={pool - 1.21:.2f} GB.",
        prefix,
    )
    if cfg["first"]:
        log(
            f"max_total_num_tokens=1183744, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            f"max_running_requests=2048, context_len={cfg['context_len']}, "
            f"available_gpu_mem={pool - 1.21:.2f} GB",
            prefix,
        )
    _report(cfg, "ready")
    # The parent writes "serving <time>" once it logged the ready line, "crash <time>" once
    # the decoder steps a batch above the threshold or a prefill is mid-transfer (pd_crash),
    # and "shutdown" at the end of a SIGTERM drain (SGLang's ShutdownReq: the event loop
    # ends and the rank exits 0).  EOF means it is gone; unless pdeathsig is set we stay and
    # keep any GPU memory, the orphaned-rank case that makes deployctl kill the group.
    with os.fdopen(cfg["ctl_fd"], "rb", buffering=0) as ctl:
        for line in iter(ctl.readline, b""):
            if line.startswith(b"serving ") and cfg["crash"] == "after_ready":
                _crash(cfg, _RUNNING_FRAMES, float(line.split()[1]) + cfg["crash_after_s"])
            if line.startswith(b"crash "):
                _crash(cfg, _RUNNING_FRAMES, float(line.split()[1]))
            if line == b"shutdown\n" and not cfg["ignore_sigterm"]:
                os._exit(0)
    while True:
        signal.pause()


# --------------------------------------------------------------------------
# HTTP: the endpoints deployctl probes, with uvicorn-style access lines.
# --------------------------------------------------------------------------


def activate(server: ThreadingHTTPServer, sockaddr: Any) -> str | None:
    """Bind and listen; on failure close it and return the error as asyncio's and uvloop's
    create_server word it."""
    try:
        server.server_bind()
        server.server_activate()
    except OSError as exc:
        server.server_close()
        reason = (exc.strerror or str(exc)).lower()
        return (
            f"[Errno {exc.errno}] error while attempting to bind on address {sockaddr!r}: {reason}"
        )
    return None


def make_http_server(family: int, sockaddr: Any, launcher: Launcher) -> ThreadingHTTPServer:
    """Create (unbound) the HTTP server; imported lazily so ranks start fast."""
    from http import HTTPStatus
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import unquote

    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server: Any  # the _HTTPServer below, which carries .launcher

        def do_GET(self) -> None:
            self._route()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path = self.path.split("?", 1)[0]
            launcher = self.server.launcher
            # A drain (SIGTERM) still takes new requests, as SGLang's does: only /health
            # answers 503 then.
            generates = launcher.ready and launcher.node_rank == 0
            if path == "/v1/completions" and generates:
                with launcher.in_flight():
                    self._stream_completion(json.loads(body or b"{}"))
            elif path == "/generate" and generates:
                with launcher.in_flight():
                    self._generate(json.loads(body or b"{}"))
            elif path == "/flush_cache" and launcher.node_rank == 0:
                self._send(200, b"Cache flushed.\nPlease check backend logs for more details.")
            else:
                self._route()

        def _pd_serve(self, request: dict[str, Any], rid: str) -> PDFailure | None:
            """PD: the prefill computes and hands over the room's KV, the decode gets it."""
            pd = self.server.launcher.pd
            try:
                if isinstance(pd, PrefillPD):
                    pd.serve(request, rid, prompt_tokens(request))
                elif isinstance(pd, DecodePD):
                    pd.receive(request, rid, lambda: client_gone(self.connection))
            except PDFailure as failure:
                return failure
            return None

        def _start_stream(self) -> None:
            # Starlette's StreamingResponse sends its headers before the first chunk.
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def _sse(self, doc: Any) -> None:
            data = b"[DONE]" if doc is None else json.dumps(doc).encode()
            self.wfile.write(b"data: " + data + b"\n\n")
            self.wfile.flush()

        def _send_abort(self, failure: PDFailure) -> None:
            """A non-streamed request's abort: ValueError (400) or HTTPException (5xx)."""
            if failure.status == 400 and self.path.startswith("/generate"):
                self._send_json(400, {"error": {"message": str(failure)}})  # _create_error_response
                return
            kind = "BadRequestError" if failure.status == 400 else str(failure.status)
            error = {"object": "error", "message": str(failure), "type": kind, "param": None,
                     "code": failure.status}  # fmt: skip
            self._send_json(failure.status, error)

        def _generate(self, request: dict[str, Any]) -> None:
            """SGLang's native /generate: cumulative text and meta_info per chunk when
            streaming, else one JSON answer."""
            launcher = self.server.launcher
            params = request.get("sampling_params") or {}
            wanted = int(params.get("max_new_tokens") or 16)
            prompt = prompt_tokens(request)
            prefill = isinstance(launcher.pd, PrefillPD)
            stream = bool(request.get("stream"))
            sent, text = 0, ""

            def answer(done: bool, abort: PDFailure | None = None) -> dict[str, Any]:
                finish: dict[str, Any] | None = None
                if abort is not None:
                    finish = {"type": "abort", "message": str(abort), "status_code": abort.status}
                elif done:  # a prefill finishes with FINISH_LENGTH(length=0)
                    finish = {"type": "length", "length": 0 if prefill else wanted}
                meta = {"id": "standin", "finish_reason": finish, "prompt_tokens": prompt,
                        "completion_tokens": sent, "cached_tokens": 0}  # fmt: skip
                return {"text": text, "meta_info": meta, "index": 0}

            if launcher.pd is not None:
                if stream:
                    self._start_stream()
                failure = self._pd_serve(request, uuid_hex())
                if failure is not None and not stream:
                    self._send_abort(failure)
                    return
                if failure is not None or prefill:
                    if failure is None:  # the prefill's one token; the decode goes on from it
                        sent, text = 1, " tok"
                    if not stream:
                        self._send_json(200, answer(True))
                        return
                    self._sse(answer(True, failure))
                    self._sse(None)
                    return
            tokens = launcher.decoder.submit(wanted, stream, request)
            if not stream:
                while sent < wanted:
                    n = tokens.out.get()
                    sent, text = sent + n, text + " tok" * n
                self._send_json(200, answer(True))
                return
            if launcher.pd is None:
                self._start_stream()
            with launcher.decoder.aborted_when_gone(tokens):
                while sent < wanted:
                    n = tokens.out.get()
                    sent, text = sent + n, text + " tok" * n
                    self._sse(answer(sent >= wanted))
            self._sse(None)

        def _stream_completion(self, request: dict[str, Any]) -> None:
            """OpenAI-style SSE chunks as the decode model produces tokens."""
            launcher = self.server.launcher
            wanted = int(request.get("max_tokens") or 16)
            created = int(time.time())
            stream = bool(request.get("stream", True))
            prefill = isinstance(launcher.pd, PrefillPD)
            sent = 0

            def chunk(text: str, finish: str | None) -> dict[str, Any]:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
                return {"id": "cmpl-standin", "object": "text_completion", "created": created,
                        "model": launcher.served_model_name, "choices": [choice]}  # fmt: skip

            def usage() -> dict[str, int]:
                prompt = len(str(request.get("prompt", "")).split())
                return {"prompt_tokens": prompt, "completion_tokens": sent,
                        "total_tokens": prompt + sent}  # fmt: skip

            if launcher.pd is not None:
                if stream:
                    self._start_stream()
                failure = self._pd_serve(request, uuid_hex())
                if failure is not None:
                    if not stream:
                        self._send_abort(failure)
                        return
                    # serving_completions: an abort with a status code is one error chunk.
                    error = {"object": "error", "message": str(failure),
                             "type": HTTPStatus(failure.status).name, "param": None,
                             "code": failure.status}  # fmt: skip
                    self._sse({"error": error})
                    self._sse(None)
                    return
                if prefill:  # the prefill's reply: its one token, then done
                    sent = 1
                    if not stream:
                        self._send_json(200, {**chunk(" tok", "length"), "usage": usage()})
                        return
                    self._sse(chunk(" tok", "length"))
                    if (request.get("stream_options") or {}).get("include_usage"):
                        self._sse({**chunk("", None), "choices": [], "usage": usage()})
                    self._sse(None)
                    return
            tokens = launcher.decoder.submit(wanted, stream, request)
            if launcher.pd is None:
                self._start_stream()
            with launcher.decoder.aborted_when_gone(tokens):
                while sent < wanted:
                    n = tokens.out.get()
                    sent += n
                    self._sse(chunk(" tok" * n, "length" if sent >= wanted else None))
            if (request.get("stream_options") or {}).get("include_usage"):
                self._sse({**chunk("", None), "choices": [], "usage": usage()})
            self._sse(None)

        def _route(self) -> None:
            launcher = self.server.launcher
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate", "/ready", "/ping"):
                healthy = launcher.healthy()
                if launcher.exiting and path in ("/health", "/health_generate"):
                    log(SHUTDOWN_HEALTH_LINE)
                if path in ("/health", "/health_generate") and healthy:
                    # SGLang runs a 1-token request and sleeps 1 s before it looks.
                    time.sleep(float(launcher.knobs["health_s"]))
                    # /health skips the generation when SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION
                    # is off (environ.py's EnvBool; on by default).
                    generates = path == "/health_generate" or os.environ.get(
                        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true"
                    ).lower() not in ("false", "0", "no", "n")
                    if (
                        generates
                        and isinstance(launcher.pd, DecodePD)
                        and launcher.pd.health_failing()
                    ):
                        healthy = False
                        launcher.log_health_check_failed()
                self._send(200 if healthy else 503)
            elif launcher.node_rank > 0:  # 0.5.23's dummy health server serves nothing else
                self._send_json(404, {"detail": "Not Found"})
            elif path == "/metrics" and launcher.args.enable_metrics:
                self._send(200, launcher.metrics_text().encode(), "text/plain; version=0.0.4")
            elif path in ("/model_info", "/get_model_info"):
                self._send_json(200, launcher.model_info())
            elif path == "/v1/models":
                self._send_json(200, {"object": "list", "data": [launcher.model_card()]})
            elif path.startswith("/v1/models/"):
                name = unquote(path[len("/v1/models/") :])
                if name == launcher.served_model_name:
                    self._send_json(200, launcher.model_card())
                else:
                    error = {
                        "message": f"The model '{name}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                    self._send_json(404, {"error": error})
            elif path in ("/server_info", "/get_server_info"):
                self._send_json(200, launcher.server_info())
            else:
                self._send_json(404, {"detail": "Not Found"})

        def _send(self, code: int, body: bytes = b"", ctype: str | None = None) -> None:
            self.send_response(code)
            if ctype:
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _send_json(self, code: int, obj: Any) -> None:
            self._send(code, json.dumps(obj).encode(), "application/json")

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            if self.server.launcher.node_rank > 0:
                return  # the dummy health server logs at warning level: no access lines
            status = int(code) if str(code).isdigit() else 0
            try:
                phrase = HTTPStatus(status).phrase
            except ValueError:
                phrase = ""
            host, port = self.client_address[:2]
            uvicorn_log(
                "INFO", f'{host}:{port} - "{self.requestline}" {status} {phrase}'.rstrip(), fd=1
            )

        def log_message(self, format: str, *args: Any) -> None:
            pass  # uvicorn prints access lines only; errors stay quiet

    class _HTTPServer(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 2048  # uvicorn's backlog: many streams connect at once

        def __init__(self, family: int, sockaddr: Any, launcher: Launcher) -> None:
            self.address_family = family
            self.launcher = launcher
            super().__init__(sockaddr, _Handler, bind_and_activate=False)

        def handle_error(self, request: Any, client_address: Any) -> None:
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)
            # A client gone mid-answer is no error to uvicorn: nothing is printed.

        def server_bind(self) -> None:
            # Skip HTTPServer's getfqdn(): a DNS lookup here would slow start-up.
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(self.server_address)
            self.server_address = self.socket.getsockname()

    return _HTTPServer(family, sockaddr, launcher)


# --------------------------------------------------------------------------
# PD disaggregation (--disaggregation-mode prefill|decode), after 0.5.23's
# srt/disaggregation/: the prefill's bootstrap server (common/conn.py
# CommonKVBootstrapServer, the class MooncakeKVBootstrapServer inherits), rank
# registration (CommonKVManager.register_to_bootstrap), the decode's handshake
# (try_ensure_parallel_info, _get_bootstrap_info_from_server), its timeouts and
# heartbeat, and the log lines and aborts of prefill.py and decode.py.  The KV
# "transfer" is one JSON line over TCP from the prefill's rank port to the decode
# (the real one is ZMQ metadata plus RDMA); everything a client, the router or a
# supervisor sees is the real shape.
# --------------------------------------------------------------------------

# disaggregation/utils.py: /health_generate's request carries this host and never transfers.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
# environ.py defaults; read from the server's environment as SGLang does.
PD_ENV_DEFAULTS = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": 300,
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": 300,
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": 5.0,
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": 2,
}
ENSURE_RETRY_INTERVAL_S = 1.0  # decode.py: _ensure_retry_interval
REGISTER_RETRIES = 5  # common/conn.py _register_topology_row: 5 tries, 1 s backoff doubling
BOOTSTRAP_HTTP_TIMEOUT_S = 5.0  # requests.get(url, timeout=5) on the decode side


def pd_env(name: str) -> float:
    """One of SGLang's PD timeouts from the environment, else its default."""
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else float(PD_ENV_DEFAULTS[name])


def kv_error(room: int, reason: str) -> str:
    """str(KVTransferError(room, reason)) as common/conn.py formats it."""
    return f"KVTransferError(bootstrap_room={room}): {reason}"


def _connect_host(host: str) -> str:
    # register_to_bootstrap: a wildcard bind is reached through the same-family loopback.
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _http(method: str, addr: str, path: str, doc: Any = None) -> tuple[int, bytes]:
    """One request to a bootstrap server (host:port); OSError when it cannot be reached."""
    import http.client

    host, _, port = addr.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=BOOTSTRAP_HTTP_TIMEOUT_S)
    try:
        body = None if doc is None else json.dumps(doc)
        conn.request(method, path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _requests_error(exc: OSError, addr: str, path: str) -> str:
    """How `requests` words a failed connection in SGLang's "Error fetching …" lines."""
    host, _, port = addr.rpartition(":")
    if isinstance(exc, TimeoutError):
        return (
            f"HTTPConnectionPool(host='{host}', port={port}): Read timed out. "
            f"(read timeout={BOOTSTRAP_HTTP_TIMEOUT_S:g})"
        )
    return (
        f"HTTPConnectionPool(host='{host}', port={port}): Max retries exceeded with url: {path} "
        f"(Caused by NewConnectionError('<urllib3.connection.HTTPConnection object>: "
        f"Failed to establish a new connection: [Errno {exc.errno}] {exc.strerror}'))"
    )


class PDFailure(Exception):
    """A PD request aborted by the scheduler: prepare_abort(req, message, status_code)."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


def room_of(request: dict[str, Any], rid: str) -> int:
    """The request's bootstrap room; scheduler.py refuses a PD request without one."""
    room = request.get("bootstrap_room")
    if room is None:
        message = (
            "Invalid request: Disaggregated request received without bootstrap room id. "
            f"req.rid={rid!r}"
        )
        log(message)
        raise PDFailure(message, 400)
    return int(room)


class PDState:
    """What prefill and decode share: queues for /metrics, failure counters."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.args = launcher.args
        self.knobs = launcher.knobs
        self.lock = threading.Condition()
        self.queues: dict[str, int] = {}  # SGLang gauge name -> requests in it
        self.counters = {"num_bootstrap_failed_reqs_total": 0, "num_transfer_failed_reqs_total": 0}
        self.warned: set[str] = set()

    def enter(self, queue: str, delta: int) -> None:
        with self.lock:
            self.queues[queue] = self.queues.get(queue, 0) + delta

    def count(self, counter: str) -> None:
        with self.lock:
            self.counters[counter] += 1

    def warning_once(self, message: str) -> None:
        with self.lock:
            if message in self.warned:
                return
            self.warned.add(message)
        log(message)


class PrefillPD(PDState):
    """The prefill side: bootstrap server, rank port, per-room KV hand-off."""

    def __init__(self, launcher: Launcher) -> None:
        super().__init__(launcher)
        self.queues = {"num_prefill_bootstrap_queue_reqs": 0, "num_prefill_inflight_queue_reqs": 0}
        self.host = launcher.listen_host
        self.port = int(self.args.disaggregation_bootstrap_port)
        self.decodes: dict[int, socket.socket] = {}  # room -> the decode's transfer connection
        # get_local_ip_auto: SGLANG_HOST_IP or HOST_IP, else the host's own address (not
        # --host), which here is --host, or 127.0.0.1 for a wildcard: reachable from every
        # lab node, as a real host's address is from the others.
        self.rank_ip = (
            os.environ.get("SGLANG_HOST_IP")
            or os.environ.get("HOST_IP")
            or _connect_host(self.host)
        )
        self.rank_port = 0
        self.bootstrap: ThreadingHTTPServer | None = None

    # -- start-up --------------------------------------------------------------

    def start(self) -> None:
        """Start the bootstrap server (disagg_service.start_disagg_service) and the rank port."""
        self.start_bootstrap_server()
        transfer = socket.socket(socket.AF_INET6 if ":" in self.rank_ip else socket.AF_INET)
        transfer.bind((self.rank_ip, 0))
        transfer.listen(256)
        self.rank_port = transfer.getsockname()[1]
        threading.Thread(target=self.accept_decodes, args=(transfer,), daemon=True).start()

    def start_bootstrap_server(self) -> None:
        server = make_bootstrap_server(self.host, self.port)
        error = activate(server, (self.host, self.port))
        if error is not None:
            # _run_server catches it in its thread: logged, and the server starts anyway,
            # its ranks registering with whatever holds the port (sglang#5704).
            root = sglang_root()
            log(
                f"Server error: {error}\nTraceback (most recent call last):\n"
                f'  File "{root}/srt/disaggregation/common/conn.py", line 3320, in _run_server\n'
                "    self._loop.run_until_complete(site.start())\n"
                f"OSError: {error}"
            )
            return
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.bootstrap = server
        log(f"CommonKVBootstrapServer started successfully on {self.host}:{self.port}")

    def on_ready(self) -> None:
        if self.knobs["bootstrap_unreachable"] and self.bootstrap is not None:
            self.bootstrap.shutdown()
            self.bootstrap.server_close()  # connections to the port are refused from now on

    def register_ranks(self) -> None:
        """Each rank PUTs its row to the bootstrap server (register_to_bootstrap)."""
        addr = _host_port(_connect_host(self.host), self.port)
        tp, dp = max(1, self.args.tp_size), max(1, self.args.dp_size)
        # DP attention splits the TP ranks into attention-DP groups; plain DP has a system
        # DP rank per replica (CommonKVManager's attn_* and system_dp_* fields).
        attention_dp = dp if self.args.enable_dp_attention and tp % dp == 0 else 1
        for dp_rank, tp_rank in self.launcher.rank_layout():
            prefix = self.launcher.rank_prefix(dp_rank, tp_rank)
            width = tp // attention_dp
            row = {
                "attn_tp_size": width, "attn_tp_rank": tp_rank % width,
                "attn_cp_size": 1, "attn_cp_rank": 0,
                "attn_dp_size": attention_dp, "attn_dp_rank": tp_rank // width,
                "pp_size": 1, "pp_rank": 0,
                "system_dp_size": dp // attention_dp,
                "system_dp_rank": 0 if attention_dp > 1 else dp_rank or 0,
                "rank_ip": self.rank_ip, "rank_port": self.rank_port,
                "page_size": self.args.page_size or 1, "kv_cache_dtype": self.args.kv_cache_dtype,
                "prefill_http_port": self.args.port,
                "decode_allocation_policy": self.args.disaggregation_decode_allocation_policy,
            }  # fmt: skip
            for attempt in range(REGISTER_RETRIES):
                try:
                    status, _ = _http("PUT", addr, "/route", row)
                    if status == 200:
                        break
                    cause = f"status {status}"
                except OSError as exc:
                    cause = f"[Errno {exc.errno}] {exc.strerror}" if exc.errno else str(exc)
                log(
                    f"Prefill register attempt {attempt + 1}/{REGISTER_RETRIES} failed: {cause}",
                    prefix,
                )
                if attempt < REGISTER_RETRIES - 1:
                    time.sleep(min(1.0 * 2**attempt, 30.0))
            else:
                log(
                    f"Prefill instance failed to register to bootstrap server after "
                    f"{REGISTER_RETRIES} retries",
                    prefix,
                )

    def accept_decodes(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self.read_decode, args=(conn,), daemon=True).start()

    def read_decode(self, conn: socket.socket) -> None:
        """A decode's metadata: the room it waits in (send_metadata's KV indices)."""
        with contextlib.suppress(OSError, ValueError), conn.makefile("rb") as lines:
            for line in lines:
                room = int(json.loads(line)["room"])
                with self.lock:
                    self.decodes[room] = conn
                    self.lock.notify_all()

    # -- a request ----------------------------------------------------------------

    def serve(self, request: dict[str, Any], rid: str, prompt_tokens: int) -> None:
        """Prefill one request: compute its KV, wait for its decode, hand the KV over.

        Raises PDFailure as prefill.py aborts the request; returns once the KV is sent.
        """
        room, host = room_of(request, rid), request.get("bootstrap_host")
        start = time.time()
        time.sleep(float(self.knobs["step_ms"]) / 1000)  # the forward pass
        if host == FAKE_BOOTSTRAP_HOST:
            return  # a health check's warmup: no decode waits for it
        self.enter("num_prefill_bootstrap_queue_reqs", 1)
        try:
            conn = self.wait_for_decode(room, start + pd_env(
                "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"))  # fmt: skip
        finally:
            self.enter("num_prefill_bootstrap_queue_reqs", -1)
        if conn is None:
            elapsed = time.time() - start
            self.warning_once(
                "Some requests timed out when bootstrapping, which means prefill instances fail "
                "to receive the KV indices from the decode instance of this request. If a greater "
                "mean TTFT is acceptable, you can 'export SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
                "=600' (10 minutes) to relax the timeout condition. "
            )
            reason = f"Request {room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"
            message = (
                f"Prefill bootstrap failed for request rank=0 req.rid={rid!r} "
                f"req.bootstrap_room={room} with exception {kv_error(room, reason)}"
            )
            log(message)
            self.count("num_bootstrap_failed_reqs_total")
            raise PDFailure(message)
        self.enter("num_prefill_inflight_queue_reqs", 1)
        try:
            if self.knobs["pd_crash"] == "mid_transfer":
                # The schedulers die with this room's KV half sent: the tree goes down, the
                # decode is left waiting (its heartbeat notices), the router's request breaks.
                self.launcher.crash_schedulers()
                threading.Event().wait()
            kv = {"room": room, "prompt_tokens": prompt_tokens, "from": self.args.port}
            try:
                conn.sendall(json.dumps(kv).encode() + b"\n")
                log(f"[standin] sent KV for bootstrap_room={room}")
            except OSError as exc:
                reason = "Aborted by AbortReq."  # the decode went away first
                message = (
                    f"Prefill transfer failed for request rank=0 req.rid={rid!r} "
                    f"req.bootstrap_room={room} with exception {kv_error(room, reason)}"
                )
                log(message)
                self.count("num_transfer_failed_reqs_total")
                raise PDFailure(message) from exc
        finally:
            self.enter("num_prefill_inflight_queue_reqs", -1)
            with self.lock:
                self.decodes.pop(room, None)

    def wait_for_decode(self, room: int, deadline: float) -> socket.socket | None:
        with self.lock:
            while room not in self.decodes:
                left = deadline - time.time()
                if left <= 0:
                    return None
                self.lock.wait(min(left, 0.5))
            return self.decodes[room]


def make_bootstrap_server(host: str, port: int) -> ThreadingHTTPServer:
    """The prefill's bootstrap registry (CommonKVBootstrapServer's routes), unbound."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    table: dict[tuple[int, int, int, int], dict[str, Any]] = {}
    info: dict[str, Any] = {}
    lock = threading.Lock()

    class _Bootstrap(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, code: int, body: Any) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            row = json.loads(self.rfile.read(length) or b"{}")
            with lock:
                for key in ("attn_tp_size", "attn_cp_size", "pp_size", "page_size",
                            "kv_cache_dtype", "prefill_http_port"):  # fmt: skip
                    info.setdefault(key, row.get(key))
                info.setdefault(
                    "dp_size",
                    row["attn_dp_size"] if row["system_dp_size"] == 1 else row["system_dp_size"],
                )
                dp = row["attn_dp_rank"] if row["system_dp_size"] == 1 else row["system_dp_rank"]
                key4 = (dp, row["attn_cp_rank"], row["attn_tp_rank"], row["pp_rank"])
                table[key4] = {"rank_ip": row["rank_ip"], "rank_port": int(row["rank_port"])}
                info["registered"] = info.get("registered", 0) + 1
            self.reply(200, "OK")

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/health":
                return self.reply(200, "OK")
            if url.path != "/route":
                return self.reply(404, "Not Found")
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            names = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
            if not all(query.get(n) for n in names):
                return self.reply(400, "Missing inputs for bootstrap server.")
            wanted = tuple(int(query[n]) for n in names)
            with lock:
                expected = 0
                if info:
                    expected = info["dp_size"] * info["attn_cp_size"] * info["attn_tp_size"]
                    expected *= info["pp_size"]
                count = info.get("registered", 0)
                if not info or count < expected:
                    return self.reply(
                        503,
                        f"Prefill server not fully registered yet ({count} workers registered).",
                    )
                if wanted == (-1, -1, -1, -1):
                    server = {k: info[k] for k in ("attn_tp_size", "attn_cp_size", "dp_size",
                                                   "pp_size", "page_size", "kv_cache_dtype",
                                                   "prefill_http_port")}  # fmt: skip
                    server.update(follow_bootstrap_room=True, decode_allocation_policy="early")
                    return self.reply(200, server)
                row = table.get(wanted)  # type: ignore[arg-type]
            if row is None:
                dp, cp, tp, pp = wanted
                return self.reply(
                    404,
                    f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} "
                    f"tp_rank={tp} pp_rank={pp}",
                )
            return self.reply(200, row)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # aiohttp's access log is off unless the logger is at DEBUG

    class _Server(ThreadingHTTPServer):
        daemon_threads = True

        def server_bind(self) -> None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(self.server_address)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    _Server.address_family = family
    return _Server((host or "0.0.0.0", port), _Bootstrap, bind_and_activate=False)


class DecodePD(PDState):
    """The decode side: per request, reach the room's prefill and wait for its KV."""

    def __init__(self, launcher: Launcher) -> None:
        super().__init__(launcher)
        self.queues = {"num_decode_prealloc_queue_reqs": 0, "num_decode_transfer_queue_reqs": 0}
        self.parallel_info: dict[str, dict[str, Any]] = {}  # bootstrap addr -> prefill info
        self.rooms: dict[str, set[int]] = {}  # bootstrap addr -> rooms in transfer
        self.lost: dict[int, str] = {}  # room -> failure reason (a lost prefill)
        self.unhealthy_until = 0.0  # sglang#12779: health fails for a while after a loss
        threading.Thread(target=self.heartbeat, daemon=True).start()

    def node_local(self, host: str) -> str:
        """Where a bootstrap host leads from this decode's node.

        Lab hosts are loopback addresses (127.0.0.2, 127.0.0.3, …), all on one machine; a
        decode bound to one of them stands for a node of its own, where `localhost` is that
        node itself.  So a prefill on 127.0.0.1 (the router beside it registered it there,
        and sends bootstrap_host=127.0.0.1) is out of its reach, as across real nodes
        (sglang#10001): the decode asks its own address.  (Rank addresses come from
        get_local_ip_auto, never loopback on a real host: they are taken as they are.)
        """
        own = self.launcher.listen_host
        if host in ("127.0.0.1", "localhost") and own.startswith("127.") and own != "127.0.0.1":
            return own
        return host

    def reach(self, addr: str) -> str:
        host, _, port = addr.rpartition(":")
        return _host_port(self.node_local(host.strip("[]")), int(port))

    def health_failing(self) -> bool:
        return time.time() < self.unhealthy_until

    def fail(self, where: str, rid: str, room: int, reason: str, counter: str) -> PDFailure:
        """Log and count the abort decode.py gives a failed handshake or transfer."""
        message = (
            f"Decode {where} failed for request rank=0 decode_req.req.rid={rid!r} "
            f"decode_req.req.bootstrap_room={room} with exception {kv_error(room, reason)}"
        )
        log(message)
        self.count(counter)
        return PDFailure(message)

    def receive(self, request: dict[str, Any], rid: str, gone: Callable[[], bool]) -> None:
        """Get the request's KV from its prefill before it may decode; PDFailure if not."""
        room, host = room_of(request, rid), request.get("bootstrap_host")
        if host == FAKE_BOOTSTRAP_HOST:
            return
        addr = _host_port(str(host), int(request.get("bootstrap_port") or 8998))
        self.enter("num_decode_prealloc_queue_reqs", 1)
        try:
            rank = self.handshake(addr, rid, room, gone)
        finally:
            self.enter("num_decode_prealloc_queue_reqs", -1)
        self.enter("num_decode_transfer_queue_reqs", 1)
        with self.lock:
            self.rooms.setdefault(addr, set()).add(room)
        try:
            self.transfer(addr, rank, rid, room, gone)
        finally:
            self.enter("num_decode_transfer_queue_reqs", -1)
            with self.lock:
                self.rooms.get(addr, set()).discard(room)
                self.lost.pop(room, None)

    def handshake(self, addr: str, rid: str, room: int, gone: Callable[[], bool]) -> dict[str, Any]:
        """The prefill's parallel info, then its rank's address (CommonKVReceiver init)."""
        attempts = int(self.knobs["handshake_attempts"])
        for attempt in range(1, attempts + 1):
            if addr in self.parallel_info:
                break
            path = (
                "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
            )
            try:
                status, body = _http("GET", self.reach(addr), path)
                if status == 200:
                    with self.lock:
                        self.parallel_info[addr] = json.loads(body)
                    break
                log(f"Failed to get prefill server info: {status}, {body.decode(errors='replace')}")
            except OSError as exc:
                log(f"Error fetching prefill server info from bootstrap: "
                    f"{_requests_error(exc, addr, path)}")  # fmt: skip
            if attempt == attempts:
                log(f"Could not fetch prefill parallel info from {addr} after {attempt} attempts")
                raise self.fail("handshake", rid, room, "Aborted by AbortReq.",
                                "num_bootstrap_failed_reqs_total")  # fmt: skip
            deadline = time.time() + ENSURE_RETRY_INTERVAL_S
            while time.time() < deadline:
                if gone():
                    raise self.fail("handshake", rid, room, "Aborted by AbortReq.",
                                    "num_bootstrap_failed_reqs_total")  # fmt: skip
                time.sleep(0.05)
        path = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
        try:
            status, body = _http("GET", self.reach(addr), path)
            if status == 200:
                return dict(json.loads(body))
            log(f"Failed to get prefill server info: {status}, {body.decode(errors='replace')}")
        except OSError as exc:
            log(f"Error fetching prefill info from bootstrap: {_requests_error(exc, addr, path)}")
        reason = (
            "Could not fetch bootstrap info for: prefill_dp_rank: 0 prefill_cp_rank: 0 "
            "target_tp_rank: 0 and target_pp_rank 0"
        )
        raise self.fail("handshake", rid, room, reason, "num_bootstrap_failed_reqs_total")

    def transfer(
        self, addr: str, rank: dict[str, Any], rid: str, room: int, gone: Callable[[], bool]
    ) -> None:
        """Send the room's metadata to the prefill rank and wait for its KV."""
        start = time.time()
        deadline = start + pd_env("SGLANG_DISAGGREGATION_WAITING_TIMEOUT")
        conn: socket.socket | None = None
        buffer = b""
        try:
            while True:
                with self.lock:
                    lost = self.lost.get(room)
                if lost is not None:
                    raise self.fail("transfer", rid, room, lost, "num_transfer_failed_reqs_total")
                if gone():  # the client (the router) dropped it: AbortReq
                    raise self.fail("transfer", rid, room, "Aborted by AbortReq.",
                                    "num_transfer_failed_reqs_total")  # fmt: skip
                if time.time() >= deadline:
                    self.warning_once(
                        "Some requests fail to receive KV Cache transfer done signal after "
                        "bootstrapping. If a greater mean TTFT is acceptable, you can 'export "
                        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to relax the "
                        "timeout condition. "
                    )
                    reason = (
                        f"Request {room} timed out after {time.time() - start:.1f}s in "
                        "KVPoll.WaitingForInput"
                    )
                    raise self.fail("transfer", rid, room, reason,
                                    "num_transfer_failed_reqs_total")  # fmt: skip
                if conn is None:  # ZMQ connects lazily and retries: no error for a dead peer
                    with contextlib.suppress(OSError):
                        conn = socket.create_connection(
                            (rank["rank_ip"], int(rank["rank_port"])), timeout=1.0
                        )
                        conn.sendall(json.dumps({"room": room}).encode() + b"\n")
                        conn.settimeout(0.05)
                    if conn is None:
                        time.sleep(0.05)
                    continue
                try:
                    chunk = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:  # the prefill is gone; only the heartbeat says so
                    conn.close()
                    conn = None
                    time.sleep(0.05)
                    continue
                buffer += chunk
                if b"\n" in buffer and not self.knobs["stuck_transfer"]:
                    kv = json.loads(buffer.partition(b"\n")[0])
                    log(f"[standin] received KV for bootstrap_room={room} from prefill "
                        f"{addr} (prefill port {kv['from']})")  # fmt: skip
                    return
        finally:
            if conn is not None:
                conn.close()

    def heartbeat(self) -> None:
        """CommonKVManager's heartbeat checker: GET /health of every known prefill."""
        interval = pd_env("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL")
        max_failures = int(pd_env("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"))
        failures: dict[str, int] = {}
        while True:
            time.sleep(interval)
            with self.lock:
                addrs = list(self.parallel_info)
            for addr in addrs:
                try:
                    ok = _http("GET", self.reach(addr), "/health")[0] == 200
                except OSError:
                    ok = False
                if ok:
                    failures[addr] = 0
                    continue
                log(reconnect_line(addr))
                failures[addr] = failures.get(addr, 0) + 1
                if failures[addr] >= max_failures:
                    failures.pop(addr)
                    self.node_failure(addr)

    def node_failure(self, addr: str) -> None:
        """_handle_node_failure: forget the prefill, fail its rooms in transfer."""
        reason = f"Lost connection with prefill instance (bootstrap_addr: {addr})"
        with self.lock:
            self.parallel_info.pop(addr, None)
            rooms = self.rooms.pop(addr, set())
            for room in rooms:
                self.lost[room] = reason
            self.unhealthy_until = time.time() + float(self.knobs["pd_health_fail_s"])
        log(lost_prefill_line(addr, len(rooms)))


def client_gone(conn: socket.socket) -> bool:
    """Say whether the HTTP client closed its end (a disconnect aborts the request)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def prompt_tokens(request: dict[str, Any]) -> int:
    """A request's prompt length: its input_ids, else its words."""
    ids = request.get("input_ids")
    text = request.get("text", request.get("prompt", ""))
    return len(ids) if isinstance(ids, list) else len(str(text).split())


def prompt_text(request: dict[str, Any] | None) -> str:
    """A request's prompt as text: /generate's "text", /v1/completions' "prompt" (a list of
    them joined), a chat request's messages' contents; "" for token ids alone."""
    if not request:
        return ""
    found = request.get("text", request.get("prompt"))
    if found is None and isinstance(request.get("messages"), list):
        contents = [m.get("content") for m in request["messages"] if isinstance(m, dict)]
        # A message's content is its text, or a list of parts, the text ones {"text": …}.
        found = [p for c in contents for p in (c if isinstance(c, list) else [c])]
    if isinstance(found, list):
        parts = [p.get("text") if isinstance(p, dict) else p for p in found]
        return "\n".join(p for p in parts if isinstance(p, str))
    return found if isinstance(found, str) else ""


def uuid_hex() -> str:
    return f"{random.getrandbits(128):032x}"  # a request id, as SGLang's uuid4().hex


# --------------------------------------------------------------------------
# The main process.
# --------------------------------------------------------------------------


def cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """Return 0.5.23's decode CUDA-graph batch sizes with speculation, up to ``max_bs``.

    As cuda_graph_hook.generate_decode_cuda_graph_batch_sizes: finer steps for small batches,
    and ``max_bs`` itself always last.
    """
    steps = (range(1, 9), range(10, 33, 2), range(40, 65, 4), range(72, 257, 8))
    sizes = [b for part in steps for b in part if b <= max_bs]
    sizes += range(272, max_bs + 1, 16)
    return sizes if max_bs in sizes else [*sizes, max_bs]


def initial_slot_steps(candidates: list[int], num_steps: int | None) -> int:
    """Return the steps an adaptive slot starts with, as AdaptiveStepSlot picks them:
    --speculative-num-steps when it is a candidate, else the middle candidate."""
    ordered = sorted(set(candidates))
    return num_steps if num_steps in ordered else ordered[len(ordered) // 2]


def adaptive_steps(
    batch: int, slots: dict[int, list[int]], num_steps: int | None, graph_bs: list[int] | None
) -> int:
    """Return the draft steps 0.5.23's adaptive speculation runs a batch of ``batch`` with.

    AdaptiveSpeculativeParams._route: pad the batch up to the next CUDA-graph batch size
    (none with CUDA graphs off, nor beyond the largest), then take the slot with the largest
    key at most that (the smallest slot when none is).  Each slot keeps its initial steps:
    SGLang's EMA moves a slot only between its candidates, and deployctl's configs give each
    slot one, so the stand-in has no acceptance feedback to model.
    """
    padded = next((b for b in graph_bs or () if b >= batch), batch)
    key = max((k for k in slots if k <= padded), default=min(slots))
    return initial_slot_steps(slots[key], num_steps)


# TokenizerMetricsCollector's per-request metrics (0.5.23, srt/observability/metrics_collector.py):
# name without "sglang:", its documentation, its buckets (None: a counter), and whether it is
# labelled is_streaming (beside model_name and engine_type, which every one carries).
REQUEST_METRICS: tuple[tuple[str, str, tuple[float, ...] | None, bool], ...] = (
    ("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     TTFT_BUCKETS, True),
    ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     ITL_BUCKETS, False),
    ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
     E2E_BUCKETS, True),
    ("generation_tokens_total", "Number of generation tokens processed.", None, True),
    ("num_requests_total", "Number of requests processed.", None, True),
    ("num_aborted_requests_total", "Number of requests aborted.", None, False),
)  # fmt: skip
_BOUNDS = {name: bounds for name, _, bounds, _ in REQUEST_METRICS if bounds is not None}


class RequestMetrics:
    """The tokenizer manager's request metrics, kept live as 0.5.23 keeps them.

    Series are keyed (name, is_streaming value, "" where the metric has no such label). As
    prometheus_client shows a labelled child only once it is used, the non-streamed series and
    num_aborted_requests_total appear with their first observation; the streamed ones (and
    the ITL histogram) are there from the start, at 0. Callers hold the decoder's lock.
    """

    def __init__(self) -> None:
        self.histograms: dict[tuple[str, str], list[float]] = {}  # bucket counts, then sum
        self.counters: dict[tuple[str, str], float] = {}
        for name, _, _, by_stream in REQUEST_METRICS:
            if name != "num_aborted_requests_total":
                self._row(name, "true" if by_stream else "")

    def _row(self, name: str, streaming: str) -> list[float]:
        if name not in _BOUNDS:
            self.counters.setdefault((name, streaming), 0.0)
            return []
        row = self.histograms.get((name, streaming))
        if row is None:
            row = self.histograms[(name, streaming)] = [0.0] * (len(_BOUNDS[name]) + 2)
        return row

    def observe(self, name: str, streaming: str, value: float, n: int = 1) -> None:
        """``n`` observations of ``value / n`` adding ``value`` to the sum, as 0.5.23's
        observe_inter_token_latency counts a gap that brought n tokens."""
        row = self._row(name, streaming)
        row[bisect.bisect_left(_BOUNDS[name], value / n)] += n  # le: the first bound >= it
        row[-1] += value

    def count(self, name: str, streaming: str, n: float = 1.0) -> None:
        self._row(name, streaming)
        self.counters[(name, streaming)] += n


class DecodeRequest:
    """One request in the decode loop, with the times its metrics need."""

    __slots__ = (
        "aborted", "accept", "arrived", "carry", "last", "left", "out", "prompt_len", "sent",
        "streaming",
    )  # fmt: skip

    def __init__(
        self, tokens: int, out: Any, streaming: bool, accept: float = 1.0, prompt_len: int = 0
    ) -> None:
        self.left = max(1, tokens)
        self.accept = accept  # its tokens per speculative step, on average
        self.carry = 0.0  # the fraction of a token its speculative steps owe it
        self.prompt_len = prompt_len
        self.out = out  # a queue of the tokens each step gives it
        self.streaming = streaming
        self.arrived = time.time()
        self.last: float | None = None  # when its last tokens came out
        self.sent = 0
        self.aborted = False

    def drafted(self) -> int:
        """The tokens a speculative step gives it: its accept length, the fraction carried
        to its next step, so that over its steps it averages exactly that."""
        owed = self.accept + self.carry
        tokens = math.floor(owed + 1e-9)
        self.carry = owed - tokens
        return tokens


class ColdStart:
    """The `cold` knob: the first `steps` decode steps at each batch size are `factor` times
    slower; with `persist`, the batch sizes that got past them are kept in `path`."""

    def __init__(self, knob: dict[str, Any], path: str | None) -> None:
        self.factor, self.steps = float(knob["factor"]), int(knob["steps"])
        self.path = path if knob["persist"] else None
        self.taken: dict[int, int] = {}  # batch size -> cold steps taken by this server
        self.warm: set[int] = set()
        if self.path is not None:
            with contextlib.suppress(OSError, ValueError), open(self.path, encoding="utf-8") as f:
                self.warm = {int(b) for b in json.load(f)}

    def factor_for(self, batch: int) -> float:
        """How much slower this step over `batch` requests is (counted as taken)."""
        if batch in self.warm:
            return 1.0
        self.taken[batch] = self.taken.get(batch, 0) + 1
        if self.taken[batch] >= self.steps:
            self.warm.add(batch)
            if self.path is not None:  # once a batch size: written whole, then renamed
                part = f"{self.path}.{os.getpid()}"
                with open(part, "w", encoding="utf-8") as f:
                    json.dump(sorted(self.warm), f)
                os.replace(part, self.path)
        return self.factor


class DecodeStats:
    """0.5.23's decode statistics (MetricsReporter.report_decode_stats): every `interval`
    decode steps the scheduler logs a `Decode batch` line and sets its gauges from the steps
    since the last one. With speculation the accept length is their tokens over their
    request-steps (update_spec_metrics adds each step's batch size and the tokens it gave: a
    plain step of a speculative server, past its threshold, counts 1 a request), and the
    accept rate the drafts accepted over those proposed. Callers hold the decoder's lock."""

    def __init__(
        self,
        interval: int = 0,
        speculative: bool = False,
        draft_per_round: int = 0,
        graph_max_bs: int | None = None,
        prefix: str = "",
        extra: Callable[[], str] | None = None,
    ) -> None:
        self.interval = interval  # 0: no lines (the decoder alone, in unit tests)
        self.speculative = speculative
        self.draft_per_round = draft_per_round
        self.graph_max_bs = graph_max_bs  # None: CUDA graphs off
        self.prefix = prefix
        self.extra = extra  # PD decode's queue figures
        self.steps = 0
        self.tokens = 0  # since the last line
        self.spec_tokens = 0
        self.spec_forwards = 0
        self.since = time.perf_counter()
        self.accept_length = 0.0  # the gauges, as of the last line
        self.accept_rate = 0.0

    def step(self, batch: int, served: int, forwards: int, kv_tokens: int) -> None:
        """One decode step over ``batch`` requests: ``served`` tokens to ``forwards`` of them
        (an aborted one's last step gives it none), ``kv_tokens`` held by those running."""
        self.steps += 1
        self.tokens += served
        if self.speculative:
            self.spec_tokens += served
            self.spec_forwards += forwards
        if self.interval <= 0 or self.steps % self.interval:
            return
        now = time.perf_counter()
        throughput = self.tokens / max(now - self.since, 1e-9)
        self.since, self.tokens = now, 0
        msg = f"Decode batch, #running-req: {batch}, #token: {kv_tokens}, token usage: 0.00, "
        if self.speculative:
            forwards_seen = max(self.spec_forwards, 1)
            self.accept_length = self.spec_tokens / forwards_seen
            proposed = forwards_seen * self.draft_per_round
            correct = self.spec_tokens - self.spec_forwards
            self.accept_rate = correct / proposed if proposed > 0 else 0.0
            self.spec_tokens = self.spec_forwards = 0
            msg += f"accept len: {self.accept_length:.2f}, accept rate: {self.accept_rate:.2f}, "
        if self.extra is not None:
            msg += self.extra()
        graph = self.graph_max_bs is not None and batch <= self.graph_max_bs
        log(
            f"{msg}cuda graph: {graph}, gen throughput (token/s): {throughput:.2f}, #queue-req: 0",
            self.prefix,
        )


def accept_classes(knob: list[dict[str, Any]]) -> list[tuple[re.Pattern[str], float]]:
    """The `accept_by_class` knob (checked by accept_by_class_knob) compiled, in order."""
    return [(re.compile(c["match"]), float(c["accept_len"])) for c in knob]


class Decoder:
    """The decode model: one scheduler loop stepping over the running requests."""

    def __init__(
        self,
        knobs: dict[str, Any],
        speculative: bool,
        threshold: int | None,
        adaptive: Callable[[int], int] | None = None,
        cold_cache: str | None = None,
    ) -> None:
        import queue

        self.queue_type = queue.Queue
        self.knobs = knobs
        self.speculative = speculative
        self.threshold = threshold
        self.adaptive = adaptive  # batch -> draft steps, with --speculative-adaptive
        self.cold = ColdStart(knobs["cold"], cold_cache) if knobs["cold"] else None
        # Called at the first step speculation's threshold makes plain (crash "above_threshold").
        self.on_plain_fallback: Callable[[], None] | None = None
        self.thresholded = False  # speculation turns off above some batch size
        self.running: list[DecodeRequest] = []
        self.cond = threading.Condition()
        self.emitted: list[tuple[float, int]] = []  # (time, tokens) of recent steps
        self.metrics = RequestMetrics()  # kept under self.cond
        # Silent here; the Launcher gives it one that logs its `Decode batch` lines.
        self.stats = DecodeStats(speculative=speculative)
        self.classes = accept_classes(knobs["accept_by_class"])
        threading.Thread(target=self.loop, daemon=True).start()

    def accept_for(self, prompt: str) -> float:
        """The accept length of a request with this prompt: its class's, else accept_len."""
        found = (a for pattern, a in self.classes if pattern.search(prompt))
        return next(found, float(self.knobs["accept_len"]))

    def submit(
        self, tokens: int, streaming: bool = True, body: dict[str, Any] | None = None
    ) -> DecodeRequest:
        """Add a request (its HTTP body gives its prompt) to the running batch."""
        accept = self.accept_for(prompt_text(body))
        length = prompt_tokens(body) if body else 0
        request = DecodeRequest(tokens, self.queue_type(), streaming, accept, length)
        with self.cond:
            self.running.append(request)
            self.cond.notify()
        return request

    def abort(self, request: DecodeRequest) -> None:
        """Its client went away: counted at once (TokenizerManager.abort_request); the
        request leaves the batch after the step under way (the scheduler's to_finish)."""
        with self.cond:
            if request.left > 0 and not request.aborted:
                request.aborted = True
                self.metrics.count("num_aborted_requests_total", "")

    @contextlib.contextmanager
    def aborted_when_gone(self, request: DecodeRequest) -> Iterator[None]:
        """Abort ``request`` when writing to its client fails (the client went away)."""
        try:
            yield
        except ConnectionError:
            self.abort(request)
            raise

    def _tokens_out(self, request: DecodeRequest, n: int, now: float) -> None:
        """TokenizerManager.collect_metrics for one output: a streamed request's first one
        is its TTFT, each later one its gap (n tokens, gap / n each); a request finished
        (aborted too) counts with the tokens it got."""
        metrics = self.metrics
        request.sent += n
        if request.streaming and not request.aborted:
            if request.last is None:
                metrics.observe("time_to_first_token_seconds", "true", now - request.arrived)
            else:
                metrics.observe("inter_token_latency_seconds", "", now - request.last, n)
        request.last = now
        if request.left > 0 and not request.aborted:
            return
        streaming = "true" if request.streaming else "false"
        if not request.streaming and not request.aborted:  # its one output is its first
            metrics.observe("time_to_first_token_seconds", streaming, now - request.arrived)
        metrics.count("generation_tokens_total", streaming, request.sent)
        metrics.count("num_requests_total", streaming)
        metrics.observe("e2e_request_latency_seconds", streaming, now - request.arrived)

    def speculates(self, batch: int) -> bool:
        """Say whether a step over ``batch`` requests drafts (threshold and adaptive slot)."""
        if not self.speculative or self.switched_off(batch):
            return False
        return self.adaptive is None or self.adaptive(batch) > 0

    def switched_off(self, batch: int) -> bool:
        """Say whether --speculative-disable-batch-threshold turns a step over ``batch``
        requests plain (the patched server's off state, not an adaptive 0-step slot)."""
        return self.speculative and self.threshold is not None and batch > self.threshold

    def step(self, batch: int) -> tuple[float, bool]:
        """(seconds, whether it drafts) of one step over `batch` requests."""
        k = self.knobs
        drafts = self.speculates(batch)
        if drafts:
            slow = float(k["threshold_slowdown"]) if self.thresholded else 1.0
            seconds = (k["spec_step_ms"] + k["spec_per_req_ms"] * batch) / 1000 * slow
        else:
            seconds = (k["step_ms"] + k["per_req_ms"] * batch) / 1000
            if self.switched_off(batch):
                seconds *= float(k["off_state_slowdown"])
        slowdown = k["slowdown"]
        if slowdown is not None and batch >= slowdown["min_batch"]:
            seconds *= slowdown["factor"]
        if self.cold is not None:
            seconds *= self.cold.factor_for(batch)
        return seconds, drafts

    def loop(self) -> None:
        # Steps keep to a clock: the time the loop and the streams spend on the CPU between
        # two steps is part of the next step's time, not added to it, so a busy machine
        # moves the curves only when it cannot keep up at all.
        due = time.time()
        while True:
            with self.cond:
                while not self.running:
                    self.cond.wait()
                    due = time.time()  # idle: the next step starts now
                batch = list(self.running)
            if (
                self.on_plain_fallback is not None
                and self.speculative
                and not self.speculates(len(batch))
            ):
                self.on_plain_fallback()
                threading.Event().wait()  # the schedulers are dead: no token comes any more
            seconds, drafts = self.step(len(batch))
            due = max(due, time.time() - seconds) + seconds  # behind by a step at most
            _sleep_until(due)
            total = forwards = 0
            with self.cond:
                now = time.time()
                for entry in batch:
                    # An aborted request runs this last step, its token thrown away.
                    n = 0 if entry.aborted else min(entry.drafted() if drafts else 1, entry.left)
                    entry.left -= n
                    total += n
                    forwards += n > 0
                    self._tokens_out(entry, n, now)
                    if n:
                        entry.out.put(n)
                    if entry.left <= 0 or entry.aborted:
                        self.running.remove(entry)
                self.emitted = [e for e in self.emitted if e[0] > now - 1.0] + [(now, total)]
                kv_tokens = sum(e.prompt_len + e.sent for e in self.running)
                self.stats.step(len(batch), total, forwards, kv_tokens)

    def gen_throughput(self) -> float:
        now = time.time()
        with self.cond:
            return float(sum(n for t, n in self.emitted if t > now - 1.0))


class Launcher:
    """The launch_server main process: ranks, HTTP, signals, readiness."""

    def __init__(
        self,
        args: argparse.Namespace,
        knobs: dict[str, Any],
        adaptive_slots: dict[int, list[int]] | None = None,
    ) -> None:
        self.args = args
        self.knobs = knobs
        self.listen_host: str = knobs["bind_by_node"].get(
            os.environ.get("SLURMD_NODENAME", ""), args.host
        )
        self.pid = os.getpid()
        self.server_args = server_args_dict(args)
        self.served_model_name: str = self.server_args["served_model_name"]
        self.ranks: list[subprocess.Popen[bytes]] = []
        self.children: list[subprocess.Popen[bytes]] = []
        self.detokenizer: subprocess.Popen[bytes] | None = None
        self.ctl_fds: list[int] = []
        self.status_r: int | None = None  # ranks report "ready N" / "crashed N" here
        self.status_buf = b""
        self.started_ranks: set[int] = set()
        self.ready_ranks: set[int] = set()
        self.crashed_ranks: set[int] = set()
        self.sigquit_pending = False
        self.http: ThreadingHTTPServer | None = None
        self.ready = False
        self.exiting = False
        self.sigterm_at: float | None = None
        self.requests: dict[str, float] = {}  # rid -> arrival, of the requests answering now
        self.requests_lock = threading.Lock()
        self.startup_time = time.time()
        self.node_rank = args.node_rank if args.nnodes > 1 else 0
        threshold = getattr(args, THRESHOLD_FIELD, None)
        adaptive = None
        if adaptive_slots is not None:
            max_bs = args.cuda_graph_max_bs_decode or DEFAULT_CUDA_GRAPH_MAX_BS
            graph_bs = None if args.disable_cuda_graph else cuda_graph_batch_sizes(max_bs)
            adaptive = functools.partial(
                adaptive_steps,
                slots=adaptive_slots,
                num_steps=args.speculative_num_steps,
                graph_bs=graph_bs,
            )
        self.decoder = Decoder(
            knobs, bool(args.speculative_algorithm), threshold, adaptive,
            os.path.join(args.model_path, "standin-jit-cache.json"),
        )  # fmt: skip
        self.decoder.thresholded = threshold is not None or any(
            initial_slot_steps(c, args.speculative_num_steps) == 0
            for c in (adaptive_slots or {}).values()
        )
        if knobs["crash"] == "above_threshold":
            self.decoder.on_plain_fallback = self.crash_schedulers
        self.pd: PrefillPD | DecodePD | None = None
        if args.disaggregation_mode == "prefill":
            self.pd = PrefillPD(self)
        elif args.disaggregation_mode == "decode":
            self.pd = DecodePD(self)
        graphs = not args.disable_cuda_graph and args.cuda_graph_backend_decode != "disabled"
        self.decoder.stats = DecodeStats(
            args.decode_log_interval,
            bool(args.speculative_algorithm),
            (args.speculative_num_draft_tokens or 4) - 1,
            (args.cuda_graph_max_bs_decode or DEFAULT_CUDA_GRAPH_MAX_BS) if graphs else None,
            self.rank_prefix(0 if args.dp_size > 1 else None, 0),
            self.pd_decode_figures if isinstance(self.pd, DecodePD) else None,
        )
        self.peers: list[socket.socket] = []  # rank 0: the other nodes; others: rank 0
        self.shutdown_asked = False  # a node > 0: rank 0's drain has ended
        self.peer_lost_at: float | None = None
        config = self._hf_config()
        archs = config.get("architectures") or ["LlamaForCausalLM"]
        self.arch: str = archs[0]
        self.model_type: str | None = config.get("model_type")
        self.context_len = int(config.get("max_position_embeddings") or 4096)
        if args.context_length and str(args.context_length).isdigit():
            self.context_len = int(args.context_length)

    def _hf_config(self) -> dict[str, Any]:
        try:
            with open(os.path.join(self.args.model_path, "config.json"), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    # -- HTTP-facing state --------------------------------------------------

    def healthy(self) -> bool:
        return self.ready and not self.exiting

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Count a request as the tokenizer manager's rid_to_state does, until its answer
        is written: a drain waits for it."""
        rid = uuid_hex()
        with self.requests_lock:
            self.requests[rid] = time.time()
        try:
            yield
        finally:
            with self.requests_lock:
                del self.requests[rid]

    def log_health_check_failed(self) -> None:
        # http_server.health_generate after HEALTH_CHECK_TIMEOUT (20 s; here health_s).
        tic = time.strftime("%H:%M:%S", time.localtime())
        log(
            "Health check failed. Server couldn't get a response from detokenizer for last "
            f"20 seconds. tic start time: {tic}. last_heartbeat time: {tic}"
        )

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.server_args["tokenizer_path"],
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": self.args.load_format,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": self.args.disaggregation_mode,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.model_type,
            "architectures": [self.arch],
        }

    def metrics_text(self) -> str:
        """SGLang's Prometheus page: the scheduler's gauges and latency histograms."""
        # DisaggregationMode.to_engine_type: "prefill", "decode", else "unified".
        engine = {"prefill": "prefill", "decode": "decode"}.get(
            self.args.disaggregation_mode, "unified"
        )
        labels = (
            f'engine_type="{engine}",model_name="{self.served_model_name}",'
            'moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        )
        with self.decoder.cond:
            accept_length = self.decoder.stats.accept_length
        values = {
            "num_running_reqs": len(self.decoder.running),
            "gen_throughput": self.decoder.gen_throughput(),
            "spec_accept_length": accept_length,
            **self.knobs["metrics"],
        }
        names = ["num_running_reqs", "num_queue_reqs", "gen_throughput", "cache_hit_rate",
                 "token_usage"]  # fmt: skip
        if self.args.speculative_algorithm:
            names.append("spec_accept_length")
        counters: dict[str, int] = {}
        if self.pd is not None:
            # In PD a request waiting for its KV is in a queue of its own, not running.
            with self.pd.lock:
                values.update(self.pd.queues)
                counters = dict(self.pd.counters)
            names += list(self.pd.queues)
        lines = []
        for name in names:
            lines += [f"# HELP sglang:{name} {name}.", f"# TYPE sglang:{name} gauge"]
            lines.append(f"sglang:{name}{{{labels}}} {float(values.get(name, 0))}")
        for name, count in counters.items():
            base = name.removesuffix("_total")  # prometheus_client's counter naming
            lines += [f"# HELP sglang:{base} {base}.", f"# TYPE sglang:{base} counter"]
            lines.append(f"sglang:{name}{{{labels}}} {float(count)}")
        # The tokenizer manager's metrics carry no rank labels (real 0.5.17's page).
        labels = f'engine_type="{engine}",model_name="{self.served_model_name}"'
        observations = self.knobs["observations"]
        with self.decoder.cond:
            histograms = {key: list(row) for key, row in self.decoder.metrics.histograms.items()}
            live = dict(self.decoder.metrics.counters)
        for name, doc, bounds, by_stream in REQUEST_METRICS:
            lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} "
                      + ("counter" if bounds is None else "histogram")]  # fmt: skip
            if bounds is None:
                for (key, streaming), value in sorted(live.items()):
                    if key == name:
                        child = f',is_streaming="{streaming}"' if by_stream else ""
                        lines.append(f"sglang:{name}{{{labels}{child}}} {value}")
                continue
            if name in observations:  # the knob's values stand for the streamed series
                knob, series = RequestMetrics(), (name, "true" if by_stream else "")
                for x in observations[name]:
                    knob.observe(*series, float(x))
                histograms = {k: v for k, v in histograms.items() if k[0] != name}
                histograms[series] = knob.histograms[series]
            for (key, streaming), row in sorted(histograms.items()):
                if key != name:
                    continue
                child = f',is_streaming="{streaming}"' if by_stream else ""
                cumulative = 0.0
                for bound, in_bucket in zip((*bounds, math.inf), row, strict=False):
                    cumulative += in_bucket
                    le = "+Inf" if bound == math.inf else repr(float(bound))
                    lines.append(f'sglang:{name}_bucket{{{labels}{child},le="{le}"}} {cumulative}')
                lines.append(f"sglang:{name}_count{{{labels}{child}}} {cumulative}")
                lines.append(f"sglang:{name}_sum{{{labels}{child}}} {row[-1]}")
        return "\n".join(lines) + "\n"

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.served_model_name,
            "parent": None,
            "max_model_len": self.context_len,
        }

    def server_info(self) -> dict[str, Any]:
        return {
            **self.server_args,
            "startup_time": self.startup_time,
            "internal_states": [{}],
            "version": SGLANG_VERSION,
            "frontend": "python",
        }

    # -- start-up -------------------------------------------------------------

    def bind(self) -> str | None:
        """Bind the HTTP port; return uvicorn's error text when that fails."""
        host, port = self.listen_host, self.args.port
        try:
            infos = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except socket.gaierror as exc:
            return str(exc)
        family, _, _, _, sockaddr = infos[0]
        server = make_http_server(family, sockaddr, self)
        error = activate(server, sockaddr)
        if error is not None:
            return error
        self.http = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return None

    def rank_layout(self) -> list[tuple[int | None, int]]:
        """Return (dp rank or None, tp rank) per scheduler process."""
        tp, dp = max(1, self.args.tp_size), max(1, self.args.dp_size)
        if self.args.nnodes > 1:  # this node's share of the TP ranks
            per_node = tp // self.args.nnodes
            return [
                (None, t) for t in range(self.node_rank * per_node, (self.node_rank + 1) * per_node)
            ]
        if dp == 1:
            return [(None, t) for t in range(tp)]
        if self.args.enable_dp_attention:
            width = tp // dp if tp % dp == 0 else 1
            return [(t // width, t) for t in range(tp)]
        return [(d, t) for d in range(dp) for t in range(tp)]

    def pd_decode_figures(self) -> str:
        """The part of a PD decode's `Decode batch` line about its queues (no pool here)."""
        queues = self.pd.queues if self.pd is not None else {}
        figures = (
            "pre-allocated usage: 0.00, "
            f"#prealloc-req: {queues.get('num_decode_prealloc_queue_reqs', 0)}, "
            f"#transfer-req: {queues.get('num_decode_transfer_queue_reqs', 0)}, "
        )
        if self.args.disaggregation_decode_host_receive_threshold < 1:
            figures += "#host-receive-req: 0, "
        return figures + "#retracted-req: 0, "

    def rank_prefix(self, dp_rank: int | None, tp_rank: int) -> str:
        """The `[time DPd TPt]` part a rank's log lines carry."""
        prefix = "" if dp_rank is None else f" DP{dp_rank}"
        return prefix + (f" TP{tp_rank}" if self.args.tp_size > 1 else "")

    def spawn_children(self, t0: float) -> None:
        """Start the ranks and the detokenizer."""
        self.status_r, status_w = os.pipe()
        spec = bool(self.args.speculative_algorithm)
        draft_tokens = self.args.speculative_num_draft_tokens or 4
        max_bs = self.args.cuda_graph_max_bs_decode or DEFAULT_CUDA_GRAPH_MAX_BS
        capture_bs = [b for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64) if b <= max_bs]
        capture_bs += list(range(80, max_bs + 1, 16))
        common = {
            "parent": self.pid,
            "startup_s": float(self.knobs["startup_s"]),
            "crash": self.knobs["crash"],
            "crash_after_s": float(self.knobs["crash_after_s"]),
            "crash_message": str(self.knobs["crash_message"]),
            "gpu_mib": int(self.knobs["gpu_mib"]),
            "gpu_fraction": bool(self.knobs["gpu_fraction"]),
            "mem_fraction": self.args.mem_fraction_static,
            "tp": max(1, self.args.tp_size),
            "host_mib": int(self.knobs["host_mib"]),
            "pdeathsig": bool(self.knobs["pdeathsig"]),
            "sglang_root": sglang_root(),
            "arch": self.arch,
            "context_len": self.context_len,
            "speculative": spec,
            "draft_tokens": draft_tokens,
            "capture_bs": capture_bs,
            "status_fd": status_w,
        }
        # CUDA numbers only the devices CUDA_VISIBLE_DEVICES names (all when it is unset).
        names = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = None if names is None else [v for v in names.split(",") if v.strip()]
        if visible is not None:
            log(f"[standin] CUDA_VISIBLE_DEVICES={names}: {len(visible)} visible GPUs")
        for index, (dp_rank, tp_rank) in enumerate(self.rank_layout()):
            prefix = self.rank_prefix(dp_rank, tp_rank)
            ctl_r, ctl_w = os.pipe()
            gpu = self.args.base_gpu_id + index
            cfg = {
                **common,
                "role": "rank",
                "index": index,
                "prefix": prefix,
                "title": f"sglang::scheduler{prefix.replace(' ', '_')}",
                "gpu": gpu,
                "first": index == 0,
                "ignore_sigterm": bool(self.knobs["ignore_sigterm"]),
                "ctl_fd": ctl_r,
            }
            if visible is not None and gpu >= len(visible):
                # As torch.cuda.set_device fails for a rank beyond the visible devices.
                cfg.update(crash="startup", crash_message="CUDA error: invalid device ordinal")
            proc = self._spawn(cfg, (status_w, ctl_r))
            os.close(ctl_r)
            self.ranks.append(proc)
            self.ctl_fds.append(ctl_w)
        detok = {**common, "role": "detokenizer", "title": "sglang::detokenizer"}
        ignore = bool(self.knobs["ignore_sigterm"])
        self.detokenizer = self._spawn({**detok, "ignore_sigterm": ignore}, ())
        os.close(status_w)
        self.release_ranks(t0)

    def release_ranks(self, t0: float) -> None:
        """Wait until every rank has started, then start their schedules together: from t0,
        or from now less a little when process creation lagged (eight ranks on a small CPU)."""
        self.wait_for_reports(self.started_ranks)
        span = float(self.knobs["startup_s"])
        self.tell_ranks(f"go {max(t0, time.time() - 0.05 * span)!r}\n".encode())

    def crash_schedulers(self) -> None:
        """Tell every rank to fail now, as the running schedulers do on the threshold bug."""
        line = f"crash {time.time()!r}\n".encode()
        for fd in self.ctl_fds:
            with contextlib.suppress(OSError):
                os.write(fd, line)

    def _spawn(self, cfg: dict[str, Any], fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
        import subprocess  # the main process only; ranks start faster without it

        # -S skips site (tens of ms per rank) unless a rank needs torch from it.
        flags = [] if cfg["gpu_mib"] > 0 or cfg["gpu_fraction"] else ["-S"]
        cmd = [sys.executable, *flags, os.path.abspath(__file__), CHILD_FLAG, json.dumps(cfg)]
        # Same process group and session as the parent, like mp.Process.
        proc = subprocess.Popen(cmd, pass_fds=fds)
        self.children.append(proc)
        return proc

    def read_reports(self, timeout: float) -> None:
        """Collect "started N", "ready N" and "crashed N" lines from the ranks for up to
        ``timeout`` s."""
        if self.status_r is None:
            time.sleep(timeout)
            return
        readable, _, _ = select.select([self.status_r], [], [], timeout)
        if not readable:
            return
        chunk = os.read(self.status_r, 4096)
        if not chunk:  # every rank has closed its end
            os.close(self.status_r)
            self.status_r = None
            return
        *lines, self.status_buf = (self.status_buf + chunk).split(b"\n")
        reports = {b"started": self.started_ranks, b"ready": self.ready_ranks}
        for line in lines:
            word, _, index = line.partition(b" ")
            reports.get(word, self.crashed_ranks).add(int(index))

    def pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for rank reports, then act on a pending SIGQUIT."""
        self.read_reports(timeout)
        if self.sigquit_pending:
            self.handle_sigquit()

    def idle_until(self, deadline: float) -> None:
        while time.time() < deadline:
            self.pump(min(0.05, max(0.0, deadline - time.time())))

    def wait_for_ranks(self) -> None:
        """Block until every rank reports ready, failing like SGLang if one dies."""
        self.wait_for_reports(self.ready_ranks)

    def wait_for_reports(self, reported: set[int]) -> None:
        """Block until every rank is in ``reported``, failing like SGLang if one dies."""
        while len(reported) < len(self.ranks):
            self.pump(0.2)
            for index, proc in enumerate(self.ranks):
                code = proc.poll()
                if code is not None and index not in reported:
                    self.fail_rank_died(index, code)

    def fail_rank_died(self, index: int, code: int) -> NoReturn:
        """Exit like launch_server when a rank dies without a traceback."""
        self.kill_process_tree(include_parent=False)
        message = (
            f"Rank {index} scheduler died during initialization (exit code: {code}). "
            "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
            "Run `dmesg -T | grep -i oom` to check."
        )
        root = sglang_root()
        _write(
            2,
            "Traceback (most recent call last):\n"
            f'  File "{root}/launch_server.py", line 86, in <module>\n'
            "    run_server(server_args)\n"
            f'  File "{root}/srt/entrypoints/engine.py", line 2027, in _wait_for_scheduler_ready\n'
            "    raise _scheduler_died_error(i, scheduler_procs[i])\n"
            f"RuntimeError: {message}\n",
        )
        os._exit(1)

    def kill_process_tree(self, include_parent: bool) -> None:
        log(kill_tree_line(self.pid, include_parent))
        for proc in self.children:
            with contextlib.suppress(OSError):
                proc.kill()
        if include_parent:
            os.kill(self.pid, signal.SIGKILL)

    # -- signals ----------------------------------------------------------------

    def on_sigquit(self, signum: int, frame: Any) -> None:
        self.sigquit_pending = True  # acted on by pump(), outside the handler

    def handle_sigquit(self) -> NoReturn:
        """Log SGLang's SIGQUIT line for the current phase and kill the tree."""
        if self.knobs["crash"] or self.knobs["pd_crash"]:
            # Let the other crashing ranks finish their tracebacks first.
            deadline = time.time() + CRASH_GATHER_S
            while time.time() < deadline and any(
                proc.poll() is None and index not in self.crashed_ranks
                for index, proc in enumerate(self.ranks)
            ):
                self.read_reports(0.05)
        if self.ready:
            # The tokenizer manager's handler, added through the event loop,
            # so SGLang formats signum and frame as None.
            log(SIGQUIT_LINE)
        else:
            log("Received sigquit from a child process. It usually means the child failed.")
        self.kill_process_tree(include_parent=True)
        os._exit(1)  # not reached: kill_process_tree SIGKILLs this process

    def on_sigterm_running(self, signum: int, frame: Any) -> None:
        # TokenizerManager's SignalHandler.sigterm_handler: it only sets gracefully_exit;
        # sigterm_watchdog does the rest (serve() here).
        log(SIGTERM_LINE)
        if not self.exiting:
            self.exiting = True
            self.sigterm_at = time.time()

    # -- phases -------------------------------------------------------------------

    def uvicorn_startup_lines(self) -> None:
        uvicorn_log("INFO", f"Started server process [{self.pid}]")
        uvicorn_log("INFO", "Waiting for application startup.")
        uvicorn_log("INFO", "Application startup complete.")

    def exit_bind_failed(self, error: str) -> NoReturn:
        uvicorn_log("ERROR", error)
        uvicorn_log("INFO", "Waiting for application shutdown.")
        uvicorn_log("INFO", "Application shutdown complete.")
        # launch_server's `finally: kill_process_tree(os.getpid(), include_parent=False)`
        self.kill_process_tree(include_parent=False)
        os._exit(1)

    # -- multi-node: rank 0 hosts the rendezvous at --dist-init-addr, the others join it --

    def dist_address(self) -> tuple[str, int]:
        host, _, port = (self.args.dist_init_addr or "").rpartition(":")
        if not host or not port.isdigit():
            self.fail_dist(
                f"ValueError: --dist-init-addr {self.args.dist_init_addr!r} is not host:port"
            )
        return host.strip("[]"), int(port)

    def fail_dist(self, error: str) -> NoReturn:
        """Fail the way torch.distributed's rendezvous fails in a scheduler, and exit."""
        tb = format_traceback([], sglang_root(), error)
        log(f"Scheduler hit an exception: {tb}", " TP0" if self.args.tp_size > 1 else "")
        log("Received sigquit from a child process. It usually means the child failed.")
        self.kill_process_tree(include_parent=False)
        os._exit(1)

    def open_rendezvous(self) -> socket.socket:
        host, port = self.dist_address()
        server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as c10d's TCPStore does
        try:
            server.bind((host, port))
        except OSError as exc:
            self.fail_dist(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on "
                f"any local network address. port: {port}, useIpv6: false, code: -{exc.errno}, "
                f"name: {errno.errorcode.get(exc.errno or 0, '?')}, message: {exc.strerror}"
            )
        server.listen(16)
        return server

    def gather_nodes(self, server: socket.socket) -> None:
        """Rank 0: wait until every other node has joined and brought its ranks up (NCCL's
        init needs every rank); a node that drops out on the way fails this one too."""
        deadline = time.time() + float(self.knobs["dist_timeout_s"])
        server.settimeout(0.05)
        ready: set[socket.socket] = set()
        while len(ready) < self.args.nnodes - 1:
            self.pump(0)
            if time.time() > deadline:
                self.fail_dist(
                    f"torch.distributed.DistStoreError: Timed out after "
                    f"{self.knobs['dist_timeout_s']:g} seconds waiting for clients. "
                    f"{len(self.peers) + 1}/{self.args.nnodes} clients joined."
                )
            if len(self.peers) < self.args.nnodes - 1:
                with contextlib.suppress(TimeoutError):
                    self.peers.append(server.accept()[0])
            readable, _, _ = select.select([p for p in self.peers if p not in ready], [], [], 0.05)
            for peer in readable:
                if peer.recv(6) != b"ready\n":  # the node's end closed: it failed
                    self.fail_dist(
                        "torch.distributed.DistBackendError: NCCL error in: "
                        "../torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process "
                        "exited or there was a network error, NCCL version 2.27.5"
                    )
                ready.add(peer)
        server.close()

    def join_rank0(self) -> None:
        """A node > 0: connect to rank 0's rendezvous, retrying as torch does."""
        host, port = self.dist_address()
        deadline = time.time() + float(self.knobs["dist_timeout_s"])
        while True:
            try:
                self.peers.append(socket.create_connection((host, port), timeout=1.0))
                return
            except OSError as exc:
                if time.time() > deadline:
                    self.fail_dist(
                        "torch.distributed.DistNetworkError: The client socket has timed out "
                        f"after {self.knobs['dist_timeout_s']:g}s while trying to connect to "
                        f"({host}, {port}). {exc.strerror or exc}"
                    )
                time.sleep(0.1)

    def check_peers(self) -> bool:
        """Another node gone: NCCL's watchdog ends this node a little later.  True once
        rank 0's drain has ended (its ShutdownReq reaches every rank): from then on the
        nodes part without an error."""
        if self.shutdown_asked:
            return False
        if self.peer_lost_at is None:
            readable, _, _ = select.select(self.peers, [], [], 0)
            for peer in readable:
                byte = peer.recv(1)
                if byte == SHUTDOWN_BYTE:
                    self.shutdown_asked = True
                    return True
                if not byte:
                    self.peer_lost_at = time.time()
        elif time.time() >= self.peer_lost_at + float(self.knobs["peer_loss_s"]):
            first = self.rank_layout()[0][1]
            log(
                f"[PG ID 0 PG GUID 0(default_pg) Rank {first}] Process group watchdog thread "
                "terminated with exception: NCCL error: remote process exited or there was a "
                "network error, NCCL version 2.27.5",
                f" TP{first}",
            )
            log("Received sigquit from a child process. It usually means the child failed.")
            self.kill_process_tree(include_parent=False)
            os._exit(1)
        return False

    def run_node(self) -> NoReturn:
        """A node > 0: join rank 0, bring up its ranks, then serve only a dummy /health."""
        # A node > 0 installs no SIGTERM handler: its main process blocks in
        # block_until_scheduler_exits, and SIGTERM ends it at once.
        signal.signal(signal.SIGQUIT, self.on_sigquit)
        if self.knobs["ignore_sigterm"]:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.join_rank0()
        self.spawn_children(time.time())
        self.wait_for_ranks()
        self.peers[0].sendall(b"ready\n")
        error = self.bind()
        if error is not None:
            self.exit_bind_failed(error)
        self.ready = True
        serving = f"serving {time.time()!r}\n".encode()
        for fd in self.ctl_fds:
            with contextlib.suppress(OSError):
                os.write(fd, serving)
        while True:
            self.pump(0.05)
            if self.check_peers():
                self.tell_ranks(b"shutdown\n")  # rank 0's ShutdownReq, broadcast to every rank
            if all(rank.poll() is not None for rank in self.ranks):
                # block_until_scheduler_exits() returned: this node's schedulers are gone.
                for rank in self.ranks:
                    log(scheduler_exit_line(rank.pid, rank.returncode))
                # launch_server's `finally: kill_process_tree(os.getpid(), include_parent=False)`
                self.kill_process_tree(include_parent=False)
                os._exit(0)

    def run(self) -> NoReturn:
        """Start up, report readiness, then serve until signalled."""
        if self.node_rank > 0:
            self.run_node()
        span = float(self.knobs["startup_s"])
        t0 = time.time()
        signal.signal(signal.SIGQUIT, self.on_sigquit)
        rendezvous = self.open_rendezvous() if self.args.nnodes > 1 else None
        if isinstance(self.pd, PrefillPD):
            self.pd.start()
        if not self.knobs["late_bind"]:
            error = self.bind()
            if error is not None:
                self.uvicorn_startup_lines()
                self.exit_bind_failed(error)
        self.spawn_children(t0)
        if rendezvous is not None:
            self.gather_nodes(rendezvous)
        self.wait_for_ranks()
        if isinstance(self.pd, PrefillPD):
            self.pd.register_ranks()  # each KV manager, before its scheduler reports ready
        warm = time.time()
        self.uvicorn_startup_lines()
        if self.knobs["late_bind"]:
            error = self.bind()
            if error is not None:
                self.exit_bind_failed(error)
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        uvicorn_log(
            "INFO", f"Uvicorn running on http://{host}:{self.args.port} (Press CTRL+C to quit)"
        )
        # The warmup request: TP0 runs a prefill, then the server reports ready.
        self.idle_until(max(t0 + 0.9 * span, warm + 0.05 * span))
        client = f"127.0.0.1:{random.randint(40000, 60000)}"
        uvicorn_log("INFO", f'{client} - "GET /model_info HTTP/1.1" 200 OK', fd=1)
        first_prefix = self.rank_prefix(0 if self.args.dp_size > 1 else None, 0)
        log(
            "Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, "
            "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
            "input throughput (token/s): 0.00",
            first_prefix,
        )
        uvicorn_log("INFO", f'{client} - "POST /generate HTTP/1.1" 200 OK', fd=1)
        self.idle_until(max(t0 + span, warm + 0.1 * span))
        # From here on SGLang's tokenizer manager owns SIGTERM and SIGQUIT.
        ignore = self.knobs["ignore_sigterm"]
        signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else self.on_sigterm_running)
        self.ready = True
        if isinstance(self.pd, PrefillPD):
            self.pd.on_ready()
        log("The server is fired up and ready to roll!")
        serving = f"serving {time.time()!r}\n".encode()
        for fd in self.ctl_fds:
            with contextlib.suppress(OSError):
                os.write(fd, serving)
        self.serve()

    def serve(self) -> NoReturn:
        """Watch the children like SubprocessWatchdog; drain after a SIGTERM."""
        drain = float(self.knobs["drain_s"])
        watched = [(f"scheduler_{i}", proc) for i, proc in enumerate(self.ranks)]
        if self.detokenizer is not None:
            watched.append(("detokenizer", self.detokenizer))
        next_check = time.time() + WATCHDOG_INTERVAL_S
        next_drain_check: float | None = None
        request_error_at = (
            time.time() + float(self.knobs["crash_after_s"])
            if self.knobs["request_error"]
            else None
        )
        while True:
            self.pump(0.05)
            if self.peers:
                self.check_peers()
            now = time.time()
            if request_error_at is not None and now >= request_error_at:
                request_error_at = None
                self.log_request_error()
            if self.sigterm_at is not None:
                # sigterm_watchdog: a look every drain_s (5 s in SGLang) until none is left.
                next_drain_check = next_drain_check or self.sigterm_at + drain
                if now >= next_drain_check:
                    if not self.log_remaining():
                        self.shutdown()
                    next_drain_check = now + drain
            if now < next_check:
                continue
            next_check = now + WATCHDOG_INTERVAL_S
            for name, proc in watched:
                code = proc.poll()
                if code is not None and code != 0:
                    log(child_crashed_line(name, proc.pid, code))
                    self.sigquit_pending = True  # SGLang SIGQUITs itself here
                    break

    def log_remaining(self) -> int:
        """Log the drain's look at the requests still answering; how many there are."""
        with self.requests_lock:
            rids = list(self.requests)
        log(drain_line(rids))
        return len(rids)

    def log_request_error(self) -> None:
        """One failed request, as uvicorn logs it; the server keeps serving."""
        site = "/usr/local/lib/python3.11/site-packages"
        lines = [
            "Traceback (most recent call last):",
            f'  File "{site}/uvicorn/protocols/http/httptools_impl.py", line 409, in run_asgi',
            "    result = await app(  # type: ignore[func-returns-value]",
            f'  File "{site}/sglang/srt/entrypoints/http_server.py", line 1089, in openai_v1_chat_completions',
            "    return await raw_request.app.state.openai_serving_chat.handle_request(request, raw_request)",
            f'  File "{site}/sglang/srt/managers/tokenizer_manager.py", line 612, in _tokenize_one_request',
            "    input_ids = self.tokenizer.encode(input_text)",
            "ValueError: The input (40961 tokens) is longer than the model's context length (40960 tokens).",
        ]
        uvicorn_log("ERROR", "Exception in ASGI application\n" + "\n".join(lines))

    def tell_ranks(self, line: bytes) -> None:
        for fd in self.ctl_fds:
            with contextlib.suppress(OSError):
                os.write(fd, line)

    def shutdown(self) -> NoReturn:
        """The end of a drain, as sigterm_watchdog ends it: the watchdog stopped (children
        exiting now are no crash), a ShutdownReq to every scheduler (the other nodes' too),
        up to 15 s for them to exit, then kill_process_tree of everything, this process
        included (SIGKILL: no uvicorn shutdown lines)."""
        self.tell_ranks(b"shutdown\n")
        for peer in self.peers:
            with contextlib.suppress(OSError):
                peer.sendall(SHUTDOWN_BYTE)
        deadline = time.time() + SCHEDULER_EXIT_S
        while time.time() < deadline and any(rank.poll() is None for rank in self.ranks):
            time.sleep(0.05)
        self.kill_process_tree(include_parent=True)
        os._exit(0)  # not reached: kill_process_tree SIGKILLs this process


# --------------------------------------------------------------------------
# Entry point.
# --------------------------------------------------------------------------


def _model_path_from_argv(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg in ("--model-path", "--model") and i + 1 < len(argv):
            return argv[i + 1]
        for flag in ("--model-path=", "--model="):
            if arg.startswith(flag):
                return arg[len(flag) :]
    return None


def record_argv(argv: list[str]) -> None:
    """Append this start's exact argv to <model_path>/standin-argv.jsonl."""
    model_path = _model_path_from_argv(argv)
    if model_path is None or not os.path.isdir(model_path):
        return
    entry = {
        "argv": argv,
        "env": dict(os.environ),
        "pid": os.getpid(),
        "pgid": os.getpgrp(),
        "sid": os.getsid(0),
        "time": time.time(),
    }
    fd = os.open(
        os.path.join(model_path, "standin-argv.jsonl"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def load_knobs(model_path: str) -> dict[str, Any]:
    """Read <model_path>/standin.json over the defaults; reject unknown knobs."""
    knobs = dict(KNOB_DEFAULTS)
    try:
        with open(os.path.join(model_path, "standin.json"), encoding="utf-8") as f:
            given = json.load(f)
    except FileNotFoundError:
        return knobs
    unknown = sorted(set(given) - set(KNOB_DEFAULTS))
    if unknown:
        raise ValueError(f"standin.json: unknown knob(s) {unknown}; known: {sorted(KNOB_DEFAULTS)}")
    knobs.update(given)
    if knobs["crash"] not in CRASH_MODES:
        raise ValueError(f"standin.json: crash must be one of {CRASH_MODES}")
    if knobs["pd_crash"] not in PD_CRASH_MODES:
        raise ValueError(f"standin.json: pd_crash must be one of {PD_CRASH_MODES}")
    if not _positive(knobs["off_state_slowdown"]):
        raise ValueError(
            "standin.json: off_state_slowdown must be a number > 0, "
            f"not {knobs['off_state_slowdown']!r}"
        )
    if not _accept_length(knobs["accept_len"]):
        raise ValueError(
            f"standin.json: accept_len must be a number >= 1, not {knobs['accept_len']!r}"
        )
    knobs["accept_by_class"] = accept_by_class_knob(knobs["accept_by_class"])
    if knobs["slowdown"] is not None:
        knobs["slowdown"] = slowdown_knob(knobs["slowdown"])
    if knobs["cold"] is not None:
        knobs["cold"] = cold_knob(knobs["cold"])
    return knobs


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


def _accept_length(value: Any) -> bool:
    """A number of at least 1: a speculative step gives each request its bonus token."""
    return not isinstance(value, bool) and isinstance(value, int | float) and value >= 1


def accept_by_class_knob(given: Any) -> list[dict[str, Any]]:
    """The `accept_by_class` knob checked: a list of {"match": REGEX, "accept_len": A >= 1}."""
    wanted = 'accept_by_class must be a list of {"match": REGEX, "accept_len": A >= 1}'
    if not isinstance(given, list):
        raise ValueError(f"standin.json: {wanted}, not {given!r}")
    for entry in given:
        if (
            not isinstance(entry, dict)
            or set(entry) != {"match", "accept_len"}
            or not isinstance(entry["match"], str)
            or not _accept_length(entry["accept_len"])
        ):
            raise ValueError(f"standin.json: {wanted}, not {entry!r}")
        try:
            re.compile(entry["match"])
        except re.error as exc:
            raise ValueError(
                f"standin.json: accept_by_class: {entry['match']!r} is not a regex: {exc}"
            ) from None
    return [{"match": e["match"], "accept_len": float(e["accept_len"])} for e in given]


def _count(value: Any) -> bool:
    """An int of at least 1 (a bool is no count)."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def cold_knob(given: Any) -> dict[str, Any]:
    """The `cold` knob checked: {"factor": F > 0, "steps": N >= 1, "persist": bool (false)}."""
    wanted = 'cold must be {"factor": F > 0, "steps": N >= 1, "persist": true|false}'
    if not isinstance(given, dict) or not set(given) <= {"factor", "steps", "persist"}:
        raise ValueError(f"standin.json: {wanted}, not {given!r}")
    factor, steps, persist = given.get("factor"), given.get("steps"), given.get("persist", False)
    if not (_positive(factor) and _count(steps) and isinstance(persist, bool)):
        raise ValueError(f"standin.json: {wanted}, not {given!r}")
    return {"factor": float(factor), "steps": steps, "persist": persist}


def slowdown_knob(given: Any) -> dict[str, Any]:
    """The `slowdown` knob checked: {"factor": F > 0, "min_batch": B >= 1 (default 1)}."""
    wanted = 'slowdown must be {"factor": F > 0, "min_batch": B >= 1}'
    if not isinstance(given, dict) or not set(given) <= {"factor", "min_batch"}:
        raise ValueError(f"standin.json: {wanted}, not {given!r}")
    factor, min_batch = given.get("factor"), given.get("min_batch", 1)
    if not (_positive(factor) and _count(min_batch)):
        raise ValueError(f"standin.json: {wanted}, not {given!r}")
    return {"factor": float(factor), "min_batch": min_batch}


def _launch_warning() -> None:
    # launch_server.py warns at import under `python -m`; the log shows it.
    root = sglang_root()
    _write(
        2,
        f"{root}/launch_server.py:71: UserWarning: 'python -m sglang.launch_server' is still "
        "supported, but 'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]\n"
        "  warnings.warn(\n",
    )


def _exit_bad_model_path(path: str) -> NoReturn:
    # A path that is not a local folder is taken for a Hub repo id, and
    # transformers rejects it; launch_server dies with this traceback.
    root = sglang_root()
    _write(
        2,
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n'
        f'  File "{root}/launch_server.py", line 81, in <module>\n'
        "    server_args = prepare_server_args(sys.argv[1:])\n"
        "                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        f"OSError: Incorrect path_or_model_id: {path!r}. Please provide either the path "
        "to a local folder or the repo_id of a model on the Hub.\n",
    )
    sys.exit(1)


def load_adaptive_config(path: str | None) -> dict[int, list[int]]:
    """0.5.23's check of --speculative-adaptive-config (adaptive_spec_params.py): integer
    batch-size keys, each with a non-empty list of non-negative candidate_steps; a missing
    or bad file ends the server with SGLang's exception."""
    if path is None:
        return {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}  # its default
    with open(path) as handle:
        cfg = json.load(handle)
    slots: dict[int, list[int]] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and s >= 0 for s in steps)
        ):
            raise ValueError(
                f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}"
            )
        slots[int(key)] = steps
    if not slots:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string BS key"
        )
    return slots


def main(argv: list[str] | None = None) -> NoReturn:
    """Run the stand-in with launch_server's command line."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [CHILD_FLAG]:
        child_main(json.loads(argv[1]))
    record_argv(argv)
    _launch_warning()
    args = build_parser(threshold_flag_supported()).parse_args(argv)
    for flag, new_flag in _DEPRECATED.items():
        if getattr(args, flag[2:].replace("-", "_")):
            # Printed before logging is configured, so without a timestamp.
            _write(
                2,
                f"\033[1;33m'{flag}' is deprecated and will be removed in a future release. "
                f"Use '{new_flag}' instead.\033[0m\n",
            )
    if not os.path.isdir(args.model_path):
        _exit_bad_model_path(args.model_path)
    slots = (
        load_adaptive_config(args.speculative_adaptive_config)
        if args.speculative_adaptive
        else None
    )
    knobs = load_knobs(args.model_path)
    launcher = Launcher(args, knobs, slots)
    # SGLang logs the dataclass's repr, secrets and all: ServerArgs(model_path='…', …) (the
    # real 0.5.17 capture; 0.5.23's engine.py logs a dict, which deployctl masks too).
    fields = ", ".join(f"{k}={v!r}" for k, v in launcher.server_args.items())
    log(f"server_args=ServerArgs({fields})")
    if args.enable_flashinfer_allreduce_fusion:
        log(
            "--enable-flashinfer-allreduce-fusion is deprecated. "
            "Please use --flashinfer-allreduce-fusion-backend=auto instead."
        )
    launcher.run()


if __name__ == "__main__":
    main()
