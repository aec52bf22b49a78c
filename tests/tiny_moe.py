"""Tiny random mixture-of-experts models for tests: qwen3_moe as an HF directory and as GGUF."""

from __future__ import annotations

import re
from pathlib import Path

from tests.tiny_models import save_tokenizer, to_gguf_name, train_tokenizer, write_gguf

_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def make_moe_config(vocab: int, *, hidden: int = 64, layers: int = 3, heads: int = 4, kv_heads: int = 2,
                    head_dim: int = 16, experts: int = 8, top_k: int = 2, expert_ffn: int = 32,
                    dense_layers: tuple[int, ...] = (1,), sparse_step: int = 1, norm_topk: bool = True):
    import transformers as tf

    return tf.Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=expert_ffn,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        num_experts=experts, num_experts_per_tok=top_k, decoder_sparse_step=sparse_step,
        mlp_only_layers=list(dense_layers), norm_topk_prob=norm_topk, max_position_embeddings=8192,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, rms_norm_eps=1e-5)


def spread_weights(model, router_std: float = 0.5) -> None:
    """Random weights a bit larger than init so logits spread, and routers wide enough that a token's
    top-k experts are clear winners (near ties would make the parity tests flaky, not wrong)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, router_std)
            elif p.dim() >= 2:
                if p.abs().max() == 0 or not torch.isfinite(p).all():
                    p.normal_(0.0, 0.02)
                p.mul_(2.0)


def make_moe_hf_model(where: Path, *, seed: int = 0, dtype: str = "float32", **shape) -> Path:
    """A random qwen3_moe model and the test tokenizer in where/qwen3_moe-...; returns the directory."""
    import torch
    import transformers as tf

    tok = train_tokenizer()
    cfg = make_moe_config(tok.get_vocab_size(), **shape)
    torch.manual_seed(seed)
    model = tf.Qwen3MoeForCausalLM(cfg).eval()
    spread_weights(model)
    out = Path(where) / f"qwen3_moe-s{seed}-{dtype}-e{cfg.num_experts}k{cfg.num_experts_per_tok}"
    model.to(getattr(torch, dtype)).save_pretrained(str(out))
    save_tokenizer(tok, out)
    return out


def moe_gguf_tensors(hf_tensors: dict) -> list:
    """convert_hf_to_gguf's Qwen3Moe tensors: per-expert projections stacked into ffn_*_exps [E, ...]."""
    import numpy as np

    named, stacks = [], {}
    for hf, data in hf_tensors.items():
        m = _EXPERT.fullmatch(hf)
        if m:
            stacks.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = data
            continue
        named.append((to_gguf_name(hf), data))  # the router's name too (engine.loader.moe.GGUF_BLOCK)
    for (layer, proj), per in sorted(stacks.items()):
        named.append((f"blk.{layer}.ffn_{proj}_exps.weight", np.stack([per[e] for e in sorted(per)])))
    return named


def write_moe_gguf(hf_dir: Path, path: Path, dtype: str = "f32", **kw) -> Path:
    """The qwen3_moe model in `hf_dir` as a qwen3moe GGUF with its expert metadata (any write_gguf dtype)."""
    import json

    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    extra = {"expert_count": cfg.get("num_experts", cfg.get("num_local_experts")),
             "expert_used_count": cfg["num_experts_per_tok"],
             "expert_feed_forward_length": cfg["moe_intermediate_size"],
             "expert_weights_norm": bool(cfg["norm_topk_prob"])}
    return write_gguf(hf_dir, path, dtype, extra_kv=extra, tensor_map=moe_gguf_tensors, **kw)
