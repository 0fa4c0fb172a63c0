"""Adaptive speculation (--speculative-adaptive): CUDA-graph batch sizes, the draft steps a
batch runs with, and --speculative-adaptive-config."""

from __future__ import annotations

import json

# The decode CUDA-graph max bs when --cuda-graph-max-bs-decode is not given (the capture_bs
# the stand-in logs, and what adaptive speculation pads batches to, end there).
DEFAULT_CUDA_GRAPH_MAX_BS = 256


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
