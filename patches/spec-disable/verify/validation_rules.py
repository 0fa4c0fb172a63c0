"""Exercise the server-argument validation of --speculative-disable-batch-threshold without torch.

Run as `<python> validation_rules.py` with DEPLOYCTL_SITE=<site-packages holding sglang/>.
`arg_groups/speculative_hook.py` imports torch-dependent modules, so this script
extracts the real `_validate_speculative_disable_batch_threshold` function from
the patched file's source, checks that `handle_speculative_decoding` calls it,
and runs it against plain namespaces. Its one SGLang dependency,
`adaptive_unsupported_reason` (attention DP, multi-layer EAGLE, two-batch overlap,
PD-multiplexing, out-of-tree workers), and the attention-DP probe are replaced
by stubs, so those helpers' own logic is not tested here.
Exit 0 on success; otherwise one line on stderr and exit 1.
"""

from __future__ import annotations
import __future__

import ast
import logging
import os
import sys
import types

FUNC = "_validate_speculative_disable_batch_threshold"


class CheckError(Exception):
    pass


def _load_validator(site: str):
    path = os.path.join(site, "sglang", "srt", "arg_groups", "speculative_hook.py")
    if not os.path.isfile(path):
        raise CheckError(f"missing {path}")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    funcs = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    if FUNC not in funcs:
        raise CheckError(f"speculative_hook.py defines no {FUNC}")
    handler = funcs.get("handle_speculative_decoding")
    calls = []
    if handler is not None:
        calls = [
            n
            for n in ast.walk(handler)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == FUNC
        ]
    if not calls:
        raise CheckError(f"handle_speculative_decoding does not call {FUNC}")

    module = ast.Module(body=[funcs[FUNC]], type_ignores=[])
    code = compile(
        module, path, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )

    # The function imports adaptive_unsupported_reason lazily; serve a stub.
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative"):
        sys.modules.setdefault(name, types.ModuleType(name))
    stub = types.ModuleType("sglang.srt.speculative.adaptive_spec_params")

    def adaptive_unsupported_reason(cfg):
        if cfg.enable_multi_layer_eagle:
            return "enable_multi_layer_eagle=True is not supported"
        return None

    stub.adaptive_unsupported_reason = adaptive_unsupported_reason
    sys.modules[stub.__name__] = stub

    namespace = {
        "resolving_view": lambda server_args: server_args,
        "resolved_view": lambda server_args: server_args,
        "attn_dp_enabled_of": lambda view: view.attn_dp,
        "logger": logging.getLogger("validation_rules"),
        "ServerArgs": object,
    }
    exec(code, namespace)
    return namespace[FUNC]


def _args(**overrides):
    base = dict(
        speculative_disable_batch_threshold=5,
        speculative_algorithm="EAGLE3",
        speculative_adaptive=False,
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        pp_size=1,
        disaggregation_mode="null",
        enable_hisparse=False,
        enable_lora=None,
        lora_paths=None,
        attn_dp=False,
        enable_multi_layer_eagle=False,
    )
    base.update(overrides)
    return types.SimpleNamespace(**base)


def check(site: str) -> None:
    validate = _load_validator(site)

    for ok in (
        _args(),
        _args(speculative_algorithm="EAGLE"),
        _args(speculative_disable_batch_threshold=None),
        _args(speculative_disable_batch_threshold=None, speculative_algorithm=None),
    ):
        validate(ok)

    bad_cases = {
        "N=0": _args(speculative_disable_batch_threshold=0),
        "N=-3": _args(speculative_disable_batch_threshold=-3),
        "no algorithm": _args(speculative_algorithm=None),
        "with --speculative-adaptive": _args(speculative_adaptive=True),
        "NGRAM": _args(speculative_algorithm="NGRAM"),
        "DFLASH": _args(speculative_algorithm="DFLASH"),
        "topk 4": _args(speculative_eagle_topk=4),
        "attention DP": _args(attn_dp=True),
        "num_steps 0": _args(speculative_num_steps=0),
        "pipeline parallel": _args(pp_size=2),
        "prefill node": _args(disaggregation_mode="prefill"),
        "hisparse": _args(enable_hisparse=True),
        "LoRA": _args(enable_lora=True),
        "LoRA paths": _args(lora_paths=["a=/x"]),
        "multi-layer EAGLE": _args(enable_multi_layer_eagle=True),
        "FROZEN_KV_MTP": _args(speculative_algorithm="FROZEN_KV_MTP"),
    }
    for label, args in bad_cases.items():
        try:
            validate(args)
        except ValueError as exc:
            if "--speculative-disable-batch-threshold" not in str(exc):
                raise CheckError(f"{label}: error does not name the flag: {exc}") from None
        else:
            raise CheckError(f"{label}: accepted, expected a ValueError")


def main() -> int:
    sys.dont_write_bytecode = True  # leave the host's site-packages untouched
    site = os.environ.get("DEPLOYCTL_SITE")
    if not site:
        print("DEPLOYCTL_SITE is not set", file=sys.stderr)
        return 1
    try:
        check(site)
    except CheckError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except Exception as exc:  # an API change is a failure too
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
