"""Qwen3.5 (text): a hybrid of Gated DeltaNet layers and gated full-attention layers, per `layer_types`.

Full-attention layers have an output gate (q_proj yields each head's query then its gate), q/k RMS
norms and rotary embedding on the first `rope_dim` dims of each head. Every RMS norm of the
decoder but the DeltaNet one scales by (1 + weight). The recurrent layers' per-sequence state comes
with the step's rows (PagedRows.recurrent); the attention layers use the paged KV cache as llama does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.config import ModelConfig
from engine.errors import ModelLoadError, UnsupportedError
from engine.loader.moe import hf_moe_config
from engine.models import llama
from engine.models.deltanet import DeltaNetLayer, DeltaNetShape, shape_from_config
from engine.models.moe import MoeBlock, moe_shapes
from lockstep_kernels.base import Ops, PagedRows, RopeTable
from lockstep_kernels.weights import Weight, concat_rows

FULL, LINEAR = "full_attention", "linear_attention"


@dataclass(frozen=True)
class HybridSpec:
    """What a hybrid config adds to ModelConfig (kept in config.extra["hybrid"])."""

    layer_types: tuple[str, ...]
    deltanet: DeltaNetShape
    rope_dim: int

    @property
    def n_linear(self) -> int:
        return self.layer_types.count(LINEAR)

    @property
    def n_full(self) -> int:
        return self.layer_types.count(FULL)


def hybrid_spec(c: ModelConfig) -> HybridSpec | None:
    return c.extra.get("hybrid")


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    spec = hybrid_spec(c)
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, c.hidden),
                                          "model.norm.weight": (c.hidden,)}
    if not c.tie_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden)
    for i, kind in enumerate(spec.layer_types):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (c.hidden,), p + "post_attention_layernorm.weight": (c.hidden,)}
        if kind == LINEAR:
            shapes |= spec.deltanet.weight_shapes(p + "linear_attn.", c.hidden)
        else:
            a = p + "self_attn."
            shapes |= {a + "q_proj.weight": (2 * q, c.hidden), a + "k_proj.weight": (kv, c.hidden),
                       a + "v_proj.weight": (kv, c.hidden), a + "o_proj.weight": (c.hidden, q),
                       a + "q_norm.weight": (c.head_dim,), a + "k_norm.weight": (c.head_dim,)}
        if c.moe is None or not c.moe.is_sparse(i):
            m = p + "mlp."
            shapes |= {m + "gate_proj.weight": (c.ffn, c.hidden), m + "up_proj.weight": (c.ffn, c.hidden),
                       m + "down_proj.weight": (c.hidden, c.ffn)}
        else:
            shapes |= moe_shapes(c.moe, c.hidden, p + "mlp.")
    return shapes


def _offset_norm(w: Weight) -> Weight:
    """Qwen3.5's RMS norms scale by (1 + weight), computed in float32 as transformers does."""
    return Weight(np.float32(1.0) + w.to_f32().astype(np.float32), "f32")


@dataclass
class _Attention:
    w_qkv: Any  # q | gate (per head, interleaved) | k | v
    wo: Any
    q_norm: Any
    k_norm: Any


@dataclass
class _Layer:
    attn_norm: Any
    mixer: DeltaNetLayer | _Attention
    ffn_norm: Any
    ffn: Any  # (w_gate_up, w_down) or a MoeBlock
    kv_index: int  # full attention: its place among the KV pool's layers


class Qwen35Model:
    def __init__(self, config: ModelConfig, weights: dict[str, Weight], ops: Ops, max_positions: int):
        check_weights(config, weights)
        self.config, self.ops = config, ops
        self.spec = spec = hybrid_spec(config)
        ops.plan_weights(weights)
        up = ops.upload
        self.embed = up(weights["model.embed_tokens.weight"])
        self.norm = up(_offset_norm(weights["model.norm.weight"]))
        self.lm_head = self.embed if config.tie_embeddings else up(weights["lm_head.weight"])
        self.layers: list[_Layer] = []
        n_lin = n_full = 0
        for i, kind in enumerate(spec.layer_types):
            p = f"model.layers.{i}."
            if kind == LINEAR:
                mixer = DeltaNetLayer(spec.deltanet, weights, p + "linear_attn.", ops, n_lin)
                n_lin += 1
            else:
                a = p + "self_attn."
                mixer = _Attention(up(concat_rows([weights[a + f"{x}_proj.weight"] for x in "qkv"])),
                                   up(weights[a + "o_proj.weight"]), up(_offset_norm(weights[a + "q_norm.weight"])),
                                   up(_offset_norm(weights[a + "k_norm.weight"])))
                n_full += 1
            self.layers.append(_Layer(up(_offset_norm(weights[p + "input_layernorm.weight"])), mixer,
                                      up(_offset_norm(weights[p + "post_attention_layernorm.weight"])),
                                      self._ffn(weights, p + "mlp.", i), n_full - 1))
        cos, sin = replace(config, head_dim=spec.rope_dim).rope_tables(max_positions)
        self.rope = RopeTable(ops.tensor(cos), ops.tensor(sin), True)
        self.scale = float(config.head_dim) ** -0.5

    def _ffn(self, weights: dict[str, Weight], m: str, i: int):
        moe = self.config.moe
        if moe is not None and moe.is_sparse(i):
            return MoeBlock(moe, weights, m, self.ops)
        return (self.ops.upload_gate_up(weights[m + "gate_proj.weight"], weights[m + "up_proj.weight"]),
                self.ops.upload(weights[m + "down_proj.weight"]))

    @property
    def n_kv_layers(self) -> int:
        return self.spec.n_full

    def forward(self, tokens, rows: PagedRows, kv: list, logit_rows) -> Any:
        c, ops = self.config, self.ops
        x = ops.embedding(self.embed, tokens)
        for layer in self.layers:
            if isinstance(layer.mixer, DeltaNetLayer):
                x = layer.mixer.forward(x, layer.attn_norm, c.rms_eps, rows.recurrent)
            else:
                x = self._attention(x, layer, rows, kv[layer.kv_index])
            if isinstance(layer.ffn, tuple):
                x = ops.ffn(x, layer.ffn_norm, c.rms_eps, *layer.ffn)
            else:
                x = layer.ffn.ffn(x, layer.ffn_norm, c.rms_eps)
        return llama.final_logits(ops, x, logit_rows, self.norm, c.rms_eps, self.lm_head)

    def _attention(self, x, layer: _Layer, rows: PagedRows, cache) -> Any:
        c, ops, at = self.config, self.ops, layer.mixer
        t, d, rot = x.shape[0], c.head_dim, self.spec.rope_dim
        nq, nkv = c.n_heads * d, c.n_kv_heads * d
        y = ops.norm_matmul(x, layer.attn_norm, c.rms_eps, at.w_qkv)
        v = y[:, 2 * nq + nkv :].reshape(t, c.n_kv_heads, d)
        if hasattr(ops, "gated_qk_norm_rope"):  # CUDA: one launch for the steps below
            q, k, gate = ops.gated_qk_norm_rope(y, c.n_heads, c.n_kv_heads, d, at.q_norm, at.k_norm, c.rms_eps,
                                                rows.positions, self.rope, rot)
        else:
            qg = y[:, : 2 * nq].reshape(t, c.n_heads, 2 * d)
            gate = qg[:, :, d:].reshape(t, nq)
            q = ops.rms_norm(qg[:, :, :d].reshape(-1, d), at.q_norm, c.rms_eps).reshape(t, c.n_heads, d)
            k = ops.rms_norm(y[:, 2 * nq : 2 * nq + nkv].reshape(-1, d), at.k_norm,
                             c.rms_eps).reshape(t, c.n_kv_heads, d)
            q[..., :rot] = ops.rope(q[..., :rot], rows.positions, self.rope)
            k[..., :rot] = ops.rope(k[..., :rot], rows.positions, self.rope)
        ops.kv_write(cache, k, v, rows.slots)
        out = ops.sigmoid_mul(ops.attention(q, cache, rows, self.scale), gate)
        return ops.matmul(out, at.wo, residual=x)

    def state_shape(self) -> tuple[int, int, int, int, int, int]:
        """Ops.state_alloc's arguments for one sequence."""
        s = self.spec.deltanet
        return self.spec.n_linear, s.qkv, s.kernel, s.v_heads, s.k_dim, s.v_dim


def check_weights(c: ModelConfig, weights: dict[str, Weight]) -> None:
    llama.check_weights(c, weights, expected_shapes(c))


def from_hf_config(cfg: dict) -> ModelConfig:
    """config.json of qwen3_5 / qwen3_5_moe (a text_config beside a vision_config: the text half is
    read, the vision tower is not loaded) or of their text-only models."""
    text = cfg.get("text_config") or cfg
    try:
        n_layers = int(text["num_hidden_layers"])
        types = tuple(text.get("layer_types") or
                      [FULL if (i + 1) % int(text.get("full_attention_interval", 4)) == 0 else LINEAR
                       for i in range(n_layers)])
        if len(types) != n_layers or set(types) - {FULL, LINEAR}:
            raise ModelLoadError(f"config.json: layer_types {list(types)[:8]} do not give {n_layers} layers "
                                 f"of {FULL!r} / {LINEAR!r}")
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        if rope.get("rope_type", "default") != "default":
            raise UnsupportedError(f"qwen3_5: rope type {rope['rope_type']!r} is not supported")
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"]))
        factor = float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
        moe = hf_moe_config(text, always_renormalize=True)
        config = ModelConfig(
            arch="qwen3_5_moe" if moe is not None else "qwen3_5",
            vocab_size=int(text["vocab_size"]), hidden=int(text["hidden_size"]), n_layers=n_layers,
            n_heads=int(text["num_attention_heads"]), n_kv_heads=int(text["num_key_value_heads"]),
            head_dim=head_dim, ffn=int(text.get("intermediate_size") or 0),
            rms_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10000000.0))),
            max_position=int(text.get("max_position_embeddings", 32768)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            qk_norm=True, moe=moe,
            extra={"hybrid": HybridSpec(types, shape_from_config(text), int(head_dim * factor))},
        )
    except KeyError as e:
        raise ModelLoadError(f"config.json: missing key {e.args[0]!r}") from None
    if bool(text.get("attention_bias", False)):
        raise UnsupportedError("qwen3_5: attention bias is not supported")
    return config


def text_weights(weights: dict[str, Weight]) -> tuple[dict[str, Weight], list[str]]:
    """The language model's tensors under the text model's names; returns the names left out
    (the vision tower, multi-token-prediction heads)."""
    out, dropped = {}, []
    for name, w in weights.items():
        if name.startswith("model.language_model."):
            out["model." + name[len("model.language_model."):]] = w
        elif name.startswith(("model.visual.", "mtp.")):
            dropped.append(name)
        else:
            out[name] = w
    return out, dropped
