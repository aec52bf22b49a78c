"""The llama family (Llama 2/3, Mistral, Qwen2 with qkv bias, Qwen3 with q/k norm, Qwen3-MoE with
mixture-of-experts FFNs in its sparse layers) built from ops.

Tensor names are Hugging Face's; loaders of other formats translate to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.models.moe import MoeBlock, moe_shapes
from lockstep_kernels.base import Ops, PagedRows, RopeTable
from lockstep_kernels.weights import Weight, concat_rows


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden),
        "model.norm.weight": (c.hidden,),
    }
    if not c.tie_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden)
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (c.hidden,),
            p + "self_attn.q_proj.weight": (q, c.hidden),
            p + "self_attn.k_proj.weight": (kv, c.hidden),
            p + "self_attn.v_proj.weight": (kv, c.hidden),
            p + "self_attn.o_proj.weight": (c.hidden, q),
            p + "post_attention_layernorm.weight": (c.hidden,),
        }
        if c.moe is not None and c.moe.is_sparse(i):
            shapes |= moe_shapes(c.moe, c.hidden, p + "mlp.")
        else:
            shapes |= {p + "mlp.gate_proj.weight": (c.ffn, c.hidden), p + "mlp.up_proj.weight": (c.ffn, c.hidden),
                       p + "mlp.down_proj.weight": (c.hidden, c.ffn)}
        if c.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
        if c.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,)}
    return shapes


def check_weights(c: ModelConfig, weights: dict[str, Weight],
                  shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    """Every tensor the config implies is there in its shape (`shapes`: another architecture's list)."""
    if c.tie_embeddings and "lm_head.weight" in weights:
        c.tie_embeddings = False  # a stored output matrix wins over the tie flag
    for name, shape in (shapes or expected_shapes(c)).items():
        w = weights.get(name)
        if w is None:
            raise ModelLoadError(f"missing tensor {name}")
        if tuple(w.shape) != shape:
            raise ModelLoadError(f"tensor {name}: shape {tuple(w.shape)} does not match the config's {shape}")


# Each layer's weights uploaded as one matmul operand (concat_rows), which memory planning counts so.
QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
GATE_UP = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
STACKS = (QKV, GATE_UP)


@dataclass
class _Layer:
    attn_norm: Any
    w_qkv: Any  # Ops.upload_qkv (with q/k norm: q | k | v rows as they are)
    b_qkv: Any
    wo: Any
    q_norm: Any
    k_norm: Any
    ffn_norm: Any
    w_gate_up: Any  # Ops.upload_gate_up: its products are silu(gate) * up
    w_down: Any
    moe: MoeBlock | None = None  # a sparse layer's FFN (w_gate_up and w_down are None then)


def final_logits(ops: Ops, x: Any, logit_rows, norm: Any, eps: float, lm_head: Any) -> Any:
    """The final norm and lm_head over the rows asked for (all rows when `logit_rows` is None)."""
    if logit_rows is not None:
        x = x[logit_rows]
    return ops.norm_matmul(x, norm, eps, lm_head)


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: dict[str, Weight], ops: Ops, max_positions: int):
        check_weights(config, weights)
        self.config, self.ops = config, ops
        ops.plan_weights(weights)
        up = ops.upload

        def opt(name: str):
            return up(weights[name]) if name in weights else None

        def parts(*names: str) -> list[Weight]:
            return [weights[n] for n in names]  # of one type or not (concat_rows)

        self.embed = up(weights["model.embed_tokens.weight"])
        self.norm = up(weights["model.norm.weight"])
        self.lm_head = self.embed if config.tie_embeddings else up(weights["lm_head.weight"])
        self.layers = []
        for i in range(config.n_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            bias = None
            if config.qkv_bias:
                bias = Weight(np.concatenate([weights[a + f"{x}_proj.bias"].to_f32() for x in "qkv"]), "f32")
            qkv = parts(*(p + n for n in QKV))
            if config.qk_norm:  # normalised per head before RoPE: the products in their own order
                w_qkv, b_qkv = up(concat_rows(qkv)), None if bias is None else up(bias)
            else:
                w_qkv, b_qkv = ops.upload_qkv(*qkv, bias, config.head_dim)
            if config.moe is not None and config.moe.is_sparse(i):
                ffn = (None, None, MoeBlock(config.moe, weights, m, ops))
            else:
                ffn = (ops.upload_gate_up(*parts(*(p + n for n in GATE_UP))),
                       up(weights[m + "down_proj.weight"]), None)
            self.layers.append(_Layer(
                up(weights[p + "input_layernorm.weight"]),
                w_qkv, b_qkv,
                up(weights[a + "o_proj.weight"]),
                opt(a + "q_norm.weight"), opt(a + "k_norm.weight"),
                up(weights[p + "post_attention_layernorm.weight"]),
                *ffn,
            ))
        cos, sin = config.rope_tables(max_positions)
        self.rope = RopeTable(ops.tensor(cos), ops.tensor(sin), config.rope_neox)
        self.scale = float(config.head_dim) ** -0.5

    def forward(self, tokens, rows: PagedRows, kv: list, logit_rows) -> Any:
        """One step over a batch of token rows; returns float32 logits for `logit_rows` only (all
        rows where it is None)."""
        c, ops = self.config, self.ops
        x = ops.embedding(self.embed, tokens)
        dense = getattr(ops, "dense_layer", None)  # a backend's whole layer in one call (the CPU's)
        for layer, cache in zip(self.layers, kv, strict=True):
            if dense is not None and layer.q_norm is None and layer.moe is None:
                x = dense(x, layer.attn_norm, c.rms_eps, layer.w_qkv, layer.b_qkv, rows, self.rope, cache, c.n_heads,
                          c.n_kv_heads, self.scale, layer.wo, layer.ffn_norm, layer.w_gate_up, layer.w_down)
                continue
            q = self.attention_q(x, layer, rows, cache)
            x = ops.attention_out(q, cache, rows, self.scale, layer.wo, x)
            if layer.moe is None:
                x = ops.ffn(x, layer.ffn_norm, c.rms_eps, layer.w_gate_up, layer.w_down)
            else:
                x = layer.moe.ffn(x, layer.ffn_norm, c.rms_eps)
        return final_logits(ops, x, logit_rows, self.norm, c.rms_eps, self.lm_head)

    def attention_q(self, x, layer: _Layer, rows: PagedRows, cache) -> Any:
        """The layer's rotated queries [T, heads, head_dim]; its keys and values written to `cache`."""
        c, ops = self.config, self.ops
        if layer.q_norm is None:
            return ops.norm_qkv_rope_write(x, layer.attn_norm, c.rms_eps, layer.w_qkv, layer.b_qkv, rows, self.rope,
                                           cache, c.n_heads, c.n_kv_heads)
        qkv = ops.norm_matmul(x, layer.attn_norm, c.rms_eps, layer.w_qkv, layer.b_qkv)
        return self._qk_norm_rope_write(qkv, layer, rows, cache)

    def _qk_norm_rope_write(self, qkv, layer: _Layer, rows: PagedRows, cache) -> Any:
        """Qwen3: q and k are normalised per head before RoPE, so the fused write does not apply."""
        c = self.config
        return self.ops.qk_norm_rope_write(qkv, layer.q_norm, layer.k_norm, c.rms_eps, rows, self.rope, cache,
                                           c.n_heads, c.n_kv_heads)
