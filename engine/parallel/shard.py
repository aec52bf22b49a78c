"""Rank shards of a loaded model's weights, cut along engine.parallel.plan's boundaries."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from engine.config import ModelConfig
from engine.parallel.plan import PlanError, RankShard, TPPlan
from lockstep_kernels.quants import BLOCK_TYPES
from lockstep_kernels.weights import QK8_0, Weight


def column_unit(w: Weight) -> int:
    """Input columns of `w` can be cut only at multiples of this (its quantization block)."""
    if w.dtype == "q8_0":
        return QK8_0
    return BLOCK_TYPES[w.dtype].block_size if w.blocks else 1


def rows(w: Weight, a: int, b: int) -> Weight:
    return Weight(np.ascontiguousarray(w.data[a:b]), w.dtype,
                  None if w.scales is None else np.ascontiguousarray(w.scales[a:b]))


def cols(w: Weight, a: int, b: int, name: str) -> Weight:
    unit = column_unit(w)
    if a % unit or b % unit:
        raise PlanError(f"{name} ({w.dtype}) cannot be cut at column {a if a % unit else b}: its blocks hold "
                        f"{unit} values (choose another --tensor-split)")
    if w.dtype == "q8_0":
        return Weight(np.ascontiguousarray(w.data[:, a:b]), "q8_0",
                      np.ascontiguousarray(w.scales[:, a // QK8_0 : b // QK8_0]))
    if w.blocks:
        size = BLOCK_TYPES[w.dtype].type_size
        return Weight(np.ascontiguousarray(w.data[:, a // unit * size : b // unit * size]), w.dtype)
    return Weight(np.ascontiguousarray(w.data[:, a:b]), w.dtype)


def rank_config(config: ModelConfig, s: RankShard) -> ModelConfig:
    return replace(config, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads, ffn=s.ffn)


def shard_weights(config: ModelConfig, weights: dict[str, Weight], s: RankShard) -> dict[str, Weight]:
    """Rank `s`'s tensors under the same names: q|k|v and gate|up cut by output rows (heads, FFN
    columns), o and down by input columns; norms, embeddings and lm_head whole."""
    d = config.head_dim
    by_rows = {"self_attn.q_proj": (s.q0 * d, s.q1 * d), "self_attn.k_proj": (s.kv0 * d, s.kv1 * d),
               "self_attn.v_proj": (s.kv0 * d, s.kv1 * d), "mlp.gate_proj": (s.f0, s.f1),
               "mlp.up_proj": (s.f0, s.f1)}
    by_cols = {"self_attn.o_proj": (s.q0 * d, s.q1 * d), "mlp.down_proj": (s.f0, s.f1)}
    out = {}
    for name, w in weights.items():
        base = name.rsplit(".", 1)[0]
        module = base.split(".", 3)[-1] if base.startswith("model.layers.") else ""
        if module in by_rows:
            out[name] = rows(w, *by_rows[module])
        elif module in by_cols:
            out[name] = cols(w, *by_cols[module], name)
        else:
            out[name] = w
    return out


def ffn_unit(weights: dict[str, Weight]) -> int:
    """The FFN cut unit the down projections' storage allows (the largest block among the layers)."""
    return max((column_unit(w) for n, w in weights.items() if n.endswith("mlp.down_proj.weight")), default=1)


def shards(config: ModelConfig, weights: dict[str, Weight], plan: TPPlan) -> list[tuple[ModelConfig, dict]]:
    return [(rank_config(config, s), shard_weights(config, weights, s)) for s in plan.ranks]
