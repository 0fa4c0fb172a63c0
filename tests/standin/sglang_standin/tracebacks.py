"""Scheduler tracebacks, with frames from the 0.5.23 sources."""

from __future__ import annotations

import os

# (path under the sglang package or "torch:" path, line, function, source, expr)
Frame = tuple[str, int, str, str, str | None]

STARTUP_FRAMES: list[Frame] = [
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

RUNNING_FRAMES: list[Frame] = [
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


def format_traceback(frames: list[Frame], root: str, exc_line: str) -> str:
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
