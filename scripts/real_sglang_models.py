"""Build, offline, a Llama target and an EAGLE3 draft whose acceptance is known by
construction, and check a server that serves them.

The device machine can download nothing, so the models are made there: a byte-level BPE
tokenizer trained on a few hundred synthetic lines, a Llama target and a one-layer EAGLE3
draft (`LlamaForCausalLMEagle3`). Their weights are random except for one channel, the
residual stream's dimension 0, which carries what decides every token:

- The target's embedding puts +1 in dimension 0 for every token but K (-1), or +1 for every
  token (`constant`). No layer writes into dimension 0 (row 0 of every `o_proj` and
  `down_proj` is zero), the final norm keeps only dimension 0, and `lm_head` reads only it
  (row K +1, row J -1). Greedy output: K J K J ... (`alternate`) or K K K ... (`constant`).
- The draft's `fc` copies the target's dimension 0 (of its first captured layer), its own
  layer writes nothing into dimension 0 either, and its read-out uses only it. EAGLE3's first
  draft step sees the target's hidden state of the token *before* the one just sampled: it
  predicts x(t+2) from hidden(t). Later steps feed the draft's own hidden state back, which
  still holds x(t)'s sign: the draft repeats its first guess.

So the accept length (`sglang:spec_accept_length`, accepted draft tokens + 1 per verify) is:
- `--accept 1`: constant target, the draft always says J: every draft is wrong: 1.0.
- `--accept 2`: alternating target; in K J K J x(t+2) = x(t), so the draft names x(t)'s own
  token (the opposite sign of the target's read-out): right at step 1, wrong at step 2: 2.0.
- `--accept all`: constant target, the draft always says K: every draft right: steps + 1.

`--size` sets the cost of a target step against a draft step, which is what moves the
crossover (tiny: 4 layers of 256; medium: 16 of 2048; large: 32 of 4096, ~13.5 GB in bf16,
built on the GPU when there is one).

Usage:
  python3 scripts/real_sglang_models.py build OUTDIR [--accept 1|2|all] [--size S] [--steps N]
      writes OUTDIR/target, OUTDIR/draft and OUTDIR/construction.json
  python3 scripts/real_sglang_models.py check CONSTRUCTION_JSON --port P [--host H]
      one greedy request, its tokens against the pattern, and /metrics' accept length against
      the construction's (stdlib only); prints a JSON verdict, exits 1 when it differs
Building needs torch, tokenizers, transformers and safetensors.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

VOCAB = 1024
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
# (layers, hidden, ffn, heads) of the target; the draft has one layer of the same width.
SIZES = {
    "tiny": (4, 256, 512, 4),
    "medium": (16, 2048, 5632, 16),
    "large": (32, 4096, 11008, 32),
}
# The two tokens the target emits: words of the tokenizer's corpus, so both stream as text.
K_WORD, J_WORD = " server", " model"
WORDS = [
    "the",
    "a",
    "of",
    "to",
    "in",
    "is",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "this",
    "that",
    "be",
    "deploy",
    "server",
    "model",
    "token",
    "cache",
    "gpu",
    "batch",
    "request",
    "latency",
    "throughput",
    "speculative",
    "draft",
    "verify",
    "accept",
]


def tokenizer(dest: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    lines = [" ".join(WORDS[(7 * i + 5 * j) % len(WORDS)] for j in range(10)) for i in range(300)]
    lines += ["Hello there! A quick brown fox jumps over the lazy dog, 0123456789."] * 10
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=VOCAB - 24,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>",
    )  # fmt: skip
    # /v1/chat/completions needs a chat template.
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(dest)
    assert len(fast) <= VOCAB, len(fast)
    return fast


def word_token(fast: Any, word: str) -> int:
    ids = fast.encode(word, add_special_tokens=False)
    assert len(ids) == 1, f"{word!r} is {len(ids)} tokens"
    return int(ids[0])


def target(dest: Path, size: str, pattern: str, k: int, j: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden, ffn, heads = SIZES[size]
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=ffn,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=3,
        tie_word_embeddings=False, rms_norm_eps=1e-6,
    )  # fmt: skip
    config.torch_dtype = "bfloat16"
    # save_pretrained writes none, and SGLang cannot pick a model class without it.
    config.architectures = ["LlamaForCausalLM"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device), torch.no_grad():
        model = LlamaForCausalLM(config)
        embed = model.model.embed_tokens.weight
        embed[:, 0] = 1.0
        if pattern == "alternate":
            embed[k, 0] = -1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[k, 0] = 1.0
        model.lm_head.weight[j, 0] = -1.0
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(dest, safe_serialization=True)


def draft(dest: Path, size: str, says: dict[str, int], first_layers: int) -> None:
    """`says`: the token the read-out names when dimension 0 is +1 ("plus") and -1 ("minus")."""
    import torch
    from safetensors.torch import save_file

    _, hidden, ffn, heads = SIZES[size]
    head_dim = hidden // heads
    aux_layers = [1, first_layers // 2, first_layers - 3] if first_layers > 4 else [0, 1, 2]
    dest.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "draft_vocab_size": VOCAB,  # the same vocabulary: no d2t map needed
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layers, "use_aux_hidden_state": True},
    }  # fmt: skip
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    gen = torch.Generator().manual_seed(1)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    fc = rand(hidden, 3 * hidden)
    fc[0, :] = 0.0
    fc[0, 0] = 1.0  # dimension 0 of the first captured layer, which no target layer writes
    o_proj, down_proj = rand(hidden, heads * head_dim), rand(hidden, ffn)
    o_proj[0, :] = 0.0
    down_proj[0, :] = 0.0
    norm = torch.zeros(hidden, dtype=torch.bfloat16)
    norm[0] = 1.0
    lm_head = torch.zeros(VOCAB, hidden, dtype=torch.bfloat16)
    lm_head[says["plus"], 0] = 1.0
    if says["minus"] != says["plus"]:  # a constant target never makes dimension 0 negative
        lm_head[says["minus"], 0] = -1.0
    # The EAGLE3 layer attends over [embedding, fused hidden]: its q/k/v take 2 × hidden.
    weights = {
        "fc.weight": fc,
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": o_proj,
        "midlayer.mlp.gate_proj.weight": rand(ffn, hidden),
        "midlayer.mlp.up_proj.weight": rand(ffn, hidden),
        "midlayer.mlp.down_proj.weight": down_proj,
        "midlayer.input_layernorm.weight": ones(hidden),
        "midlayer.hidden_norm.weight": ones(hidden),
        "midlayer.post_attention_layernorm.weight": ones(hidden),
        "norm.weight": norm,
        "lm_head.weight": lm_head,
    }
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})


def expected_accept_length(accept: str, steps: int) -> float:
    return {"1": 1.0, "2": 2.0, "all": float(steps + 1)}[accept]


def build(out: Path, accept: str, size: str, steps: int) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    fast = tokenizer(out / "target")
    k, j = word_token(fast, K_WORD), word_token(fast, J_WORD)
    pattern = "alternate" if accept == "2" else "constant"
    target(out / "target", size, pattern, k, j)
    # alternate: the target names K on +1 and J on -1; the draft, predicting x(t+2) = x(t)
    # from x(t)'s sign, names J on +1 and K on -1. constant: dimension 0 is always +1.
    says = {
        "1": {"plus": j, "minus": j},
        "2": {"plus": j, "minus": k},
        "all": {"plus": k, "minus": k},
    }[accept]
    draft(out / "draft", size, says, SIZES[size][0])
    construction = {
        "accept": accept,
        "size": size,
        "steps": steps,
        "pattern": pattern,
        "k": k,
        "j": j,
        "k_text": fast.decode([k]),
        "j_text": fast.decode([j]),
        "expected_accept_length": expected_accept_length(accept, steps),
    }
    (out / "construction.json").write_text(json.dumps(construction, indent=1) + "\n")
    return construction


def follows(pattern: str, k: int, j: int, ids: list[int]) -> bool:
    """Whether greedy output `ids` is K K K … (constant) or K and J alternating (alternate)."""
    if not ids:
        return False
    if pattern == "constant":
        return all(t == k for t in ids)
    return set(ids) <= {k, j} and all(a != b for a, b in itertools.pairwise(ids))


def accept_length(metrics: str) -> float | None:
    m = re.search(r"^sglang:spec_accept_length(?:\{[^}]*\})? (\S+)$", metrics, re.M)
    return float(m.group(1)) if m else None


def check(construction: dict[str, Any], base: str) -> dict[str, Any]:
    body = json.dumps(
        {
            "text": "the server model",
            "sampling_params": {"temperature": 0, "max_new_tokens": 256, "ignore_eos": True},
        }
    ).encode()
    request = urllib.request.Request(f"{base}/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        answer = json.load(reply)
    ids = answer.get("output_ids") or answer.get("meta_info", {}).get("output_ids") or []
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as reply:
        measured = accept_length(reply.read().decode())
    expected = construction["expected_accept_length"]
    pattern_ok = follows(construction["pattern"], construction["k"], construction["j"], ids)
    accept_ok = measured is not None and abs(measured - expected) <= 0.05 * expected
    return {
        "construction": construction,
        "text": answer.get("text", "")[:120],
        "output_ids": ids[:16],
        "follows_pattern": pattern_ok,
        "spec_accept_length": measured,
        "accept_length_as_built": accept_ok,
        "ok": pattern_ok and accept_ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("outdir", type=Path)
    b.add_argument("--accept", choices=["1", "2", "all"], default="2")
    b.add_argument("--size", choices=sorted(SIZES), default="tiny")
    b.add_argument("--steps", type=int, default=3, help="the server's draft steps")
    c = sub.add_parser("check")
    c.add_argument("construction", type=Path)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    if args.command == "build":
        built = build(args.outdir, args.accept, args.size, args.steps)
        print(json.dumps(built))
        return
    verdict = check(json.loads(args.construction.read_text()), f"http://{args.host}:{args.port}")
    print(json.dumps(verdict))
    sys.exit(0 if verdict["ok"] else 1)


if __name__ == "__main__":
    main()
