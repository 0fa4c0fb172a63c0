"""Build, offline, the two tiny random-weight models scripts/gpu-real-sglang-check serves.

The device machine can download nothing, so the models are made there: a byte-level BPE
tokenizer trained on a few hundred synthetic lines, a 4-layer Llama target (hidden 256, bf16)
and a one-layer EAGLE3 draft (`LlamaForCausalLMEagle3`) that reads three of the target's
hidden layers. Random weights make every draft wrong (acceptance length 1.0): these models
exercise the server, not its quality. Needs torch, tokenizers, transformers and safetensors.
Usage: python3 scripts/real_sglang_models.py OUTDIR   (writes OUTDIR/target, OUTDIR/draft)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 1024
HIDDEN, FFN, LAYERS, HEADS = 256, 512, 4, 4
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def tokenizer(dest: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = [
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
    lines = [" ".join(words[(7 * i + 5 * j) % len(words)] for j in range(10)) for i in range(300)]
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
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    # /v1/chat/completions needs a chat template.
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(dest)
    return len(fast)


def target(dest: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )
    config.torch_dtype = "bfloat16"
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(dest, safe_serialization=True)


def draft(dest: Path) -> None:
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    head_dim = HIDDEN // HEADS
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "draft_vocab_size": VOCAB,  # the same vocabulary: no d2t map needed
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [0, 1, 2],
            "use_aux_hidden_state": True,
        },
    }
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    gen = torch.Generator().manual_seed(1)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)  # noqa: E731
    # The EAGLE3 layer attends over [embedding, fused hidden]: its q/k/v take 2 × hidden.
    weights = {
        "fc.weight": rand(HIDDEN, 3 * HIDDEN),
        "midlayer.self_attn.q_proj.weight": rand(HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": rand(HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": rand(HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": rand(HIDDEN, HEADS * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(FFN, HIDDEN),
        "midlayer.mlp.up_proj.weight": rand(FFN, HIDDEN),
        "midlayer.mlp.down_proj.weight": rand(HIDDEN, FFN),
        "midlayer.input_layernorm.weight": ones(HIDDEN),
        "midlayer.hidden_norm.weight": ones(HIDDEN),
        "midlayer.post_attention_layernorm.weight": ones(HIDDEN),
        "norm.weight": ones(HIDDEN),
        "lm_head.weight": rand(VOCAB, HIDDEN),
    }
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    import torch

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sgmodels")
    torch.manual_seed(0)
    size = tokenizer(out / "target")
    assert size <= VOCAB, size
    target(out / "target")
    draft(out / "draft")
    print(f"models in {out}: tokenizer {size} tokens, target and draft written")


if __name__ == "__main__":
    main()
