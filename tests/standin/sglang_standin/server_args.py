"""Argument parsing: SGLang's flag names and argparse semantics (prog name,
abbreviations, ambiguity) for the subset deployctl uses."""

from __future__ import annotations

import argparse
from typing import Any

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
DEPRECATED = {
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
