"""Child processes: scheduler ranks and the detokenizer, with their GPU hold and crash
modes.  They are the package re-executed (see Launcher._spawn) with CHILD_FLAG first."""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import time
from typing import Any, NoReturn

from .log_lines import log
from .proctitle import PR_SET_PDEATHSIG, prctl, set_process_title
from .tracebacks import RUNNING_FRAMES, STARTUP_FRAMES, Frame, format_traceback

CHILD_FLAG = "--standin-child"  # hidden first argv element of rank processes
GIB = 1024**3


def sleep_until(deadline: float) -> None:
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
_POOL_FRAMES: list[Frame] = [
    *STARTUP_FRAMES[:3],
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
    cfg: dict[str, Any], frames: list[Frame], crash_at: float, exc_line: str | None = None
) -> NoReturn:
    """Fail like a scheduler: log the traceback, SIGQUIT the parent, wait to be killed."""
    rng = random.Random(cfg["index"] * 7919 + int(crash_at * 1000))
    # Ranks hit the error at slightly different moments, so blocks interleave.
    sleep_until(crash_at + rng.uniform(0.0, 0.05))
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
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
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
        sleep_until(t0 + fraction * span)

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
        _crash(cfg, STARTUP_FRAMES, t0 + 0.5 * span)
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
                _crash(cfg, RUNNING_FRAMES, float(line.split()[1]) + cfg["crash_after_s"])
            if line.startswith(b"crash "):
                _crash(cfg, RUNNING_FRAMES, float(line.split()[1]))
            if line == b"shutdown\n" and not cfg["ignore_sigterm"]:
                os._exit(0)
    while True:
        signal.pause()
