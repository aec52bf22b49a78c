"""The llama family (Llama 2/3, Mistral, Qwen2 with qkv bias, Qwen3 with q/k norm) built from ops.

Tensor names are Hugging Face's; loaders of other formats translate to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from kernels.base import Ops, PagedRows, RopeTable
from kernels.weights import Weight


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
            p + "mlp.gate_proj.weight": (c.ffn, c.hidden),
            p + "mlp.up_proj.weight": (c.ffn, c.hidden),
            p + "mlp.down_proj.weight": (c.hidden, c.ffn),
        }
        if c.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
        if c.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,)}
    return shapes


def check_weights(c: ModelConfig, weights: dict[str, Weight]) -> None:
    if c.tie_embeddings and "lm_head.weight" in weights:
        c.tie_embeddings = False  # a stored output matrix wins over the tie flag
    for name, shape in expected_shapes(c).items():
        w = weights.get(name)
        if w is None:
            raise ModelLoadError(f"missing tensor {name}")
        if tuple(w.shape) != shape:
            raise ModelLoadError(f"tensor {name}: shape {tuple(w.shape)} does not match the config's {shape}")


@dataclass
class _Layer:
    attn_norm: Any
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    bq: Any
    bk: Any
    bv: Any
    q_norm: Any
    k_norm: Any
    ffn_norm: Any
    w_gate: Any
    w_up: Any
    w_down: Any


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: dict[str, Weight], ops: Ops, max_positions: int):
        check_weights(config, weights)
        self.config, self.ops = config, ops
        up = ops.upload

        def opt(name: str):
            return up(weights[name]) if name in weights else None

        self.embed = up(weights["model.embed_tokens.weight"])
        self.norm = up(weights["model.norm.weight"])
        self.lm_head = self.embed if config.tie_embeddings else up(weights["lm_head.weight"])
        self.layers = []
        for i in range(config.n_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            self.layers.append(_Layer(
                up(weights[p + "input_layernorm.weight"]),
                up(weights[a + "q_proj.weight"]), up(weights[a + "k_proj.weight"]),
                up(weights[a + "v_proj.weight"]), up(weights[a + "o_proj.weight"]),
                opt(a + "q_proj.bias"), opt(a + "k_proj.bias"), opt(a + "v_proj.bias"),
                opt(a + "q_norm.weight"), opt(a + "k_norm.weight"),
                up(weights[p + "post_attention_layernorm.weight"]),
                up(weights[m + "gate_proj.weight"]), up(weights[m + "up_proj.weight"]),
                up(weights[m + "down_proj.weight"]),
            ))
        cos, sin = config.rope_tables(max_positions)
        self.rope = RopeTable(ops.tensor(cos), ops.tensor(sin), config.rope_neox)
        self.scale = float(config.head_dim) ** -0.5

    def forward(self, tokens, rows: PagedRows, kv: list, logit_rows) -> Any:
        """One step over a batch of token rows; returns float32 logits for `logit_rows` only."""
        c, ops = self.config, self.ops
        t = len(tokens)
        x = ops.embedding(self.embed, tokens)
        for layer, cache in zip(self.layers, kv, strict=True):
            h = ops.rms_norm(x, layer.attn_norm, c.rms_eps)
            q = ops.matmul(h, layer.wq, layer.bq).reshape(t, c.n_heads, c.head_dim)
            k = ops.matmul(h, layer.wk, layer.bk).reshape(t, c.n_kv_heads, c.head_dim)
            v = ops.matmul(h, layer.wv, layer.bv).reshape(t, c.n_kv_heads, c.head_dim)
            if layer.q_norm is not None:
                q = ops.rms_norm(q.reshape(-1, c.head_dim), layer.q_norm, c.rms_eps).reshape(q.shape)
                k = ops.rms_norm(k.reshape(-1, c.head_dim), layer.k_norm, c.rms_eps).reshape(k.shape)
            q = ops.rope(q, rows.positions, self.rope)
            k = ops.rope(k, rows.positions, self.rope)
            ops.kv_write(cache, k, v, rows.slots)
            attn = ops.attention(q, cache, rows, self.scale)
            x = ops.add(x, ops.matmul(attn, layer.wo))
            h = ops.rms_norm(x, layer.ffn_norm, c.rms_eps)
            g = ops.silu_mul(ops.matmul(h, layer.w_gate), ops.matmul(h, layer.w_up))
            x = ops.add(x, ops.matmul(g, layer.w_down))
        x = x[logit_rows]
        return ops.matmul(ops.rms_norm(x, self.norm, c.rms_eps), self.lm_head)

