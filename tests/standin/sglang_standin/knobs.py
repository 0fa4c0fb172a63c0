"""Behaviour knobs: <model_path>/standin.json over KNOB_DEFAULTS, checked."""

from __future__ import annotations

import json
import os
import re
from typing import Any

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
CRASH_MODES = (None, "startup", "after_ready", "above_threshold")
PD_CRASH_MODES = (None, "mid_transfer")


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
