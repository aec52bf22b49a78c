"""The mixture-of-experts FFN block (qwen3_moe; qwen3_5_moe adds a shared expert), built from the MoE ops.

Weights go by Hugging Face's per-expert names under the block's prefix (`model.layers.N.mlp.`):
`gate.weight` (the router [E, H]), `experts.E.{gate,up,down}_proj.weight` and, with a shared expert,
`shared_expert.{gate,up,down}_proj.weight` and `shared_expert_gate.weight` [1, H]. Files that stack
the experts into one tensor are split into per-expert views (`expert_views`), never copied.

Use: `block = MoeBlock(config.moe, weights, "model.layers.3.mlp.", ops)`, then per step
`x = block.ffn(x, norm_weight, eps)` (the layer's FFN half with its norm and residual: ops.moe) or
`block(normalised_rows, residual)`; `moe_shapes` lists the tensors it needs for load-time checks.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np

from engine.config import MoeConfig
from lockstep_kernels.base import Ops
from lockstep_kernels.weights import Weight

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
SHARED = ("shared_expert.gate_proj.weight", "shared_expert.up_proj.weight", "shared_expert.down_proj.weight",
          "shared_expert_gate.weight")


def expert_name(prefix: str, e: int, proj: str) -> str:
    return f"{prefix}experts.{e}.{proj}.weight"


def moe_shapes(moe: MoeConfig, hidden: int, prefix: str) -> dict[str, tuple[int, ...]]:
    f = moe.expert_ffn
    shapes = {f"{prefix}gate.weight": (moe.n_experts, hidden)}
    for e in range(moe.n_experts):
        shapes |= {expert_name(prefix, e, "gate_proj"): (f, hidden), expert_name(prefix, e, "up_proj"): (f, hidden),
                   expert_name(prefix, e, "down_proj"): (hidden, f)}
    if moe.shared_ffn:
        s = moe.shared_ffn
        shapes |= {prefix + n: shape for n, shape in zip(SHARED, [(s, hidden), (s, hidden), (hidden, s), (1, hidden)],
                                                          strict=True)}
    return shapes


def expert_slice(w: Weight, index) -> Weight:
    """w's arrays indexed along their first axis (views): expert e of a stacked [E, ...] weight, or a
    slice of rows. Every array a Weight carries (values, scales, blocks) leads with that axis."""
    arrays = {f.name: getattr(w, f.name)[index] for f in fields(w) if isinstance(getattr(w, f.name), np.ndarray)}
    return replace(w, **arrays)


def expert_views(prefix: str, proj: str, stacked: Weight) -> dict[str, Weight]:
    """A stacked [E, N, K] projection as per-expert weights under their HF names."""
    if len(stacked.shape) != 3:
        raise ValueError(f"stacked experts need 3 dimensions, got shape {stacked.shape}")
    return {expert_name(prefix, e, proj): expert_slice(stacked, e) for e in range(stacked.shape[0])}


def fused_gate_up_views(prefix: str, gate_up: Weight) -> dict[str, Weight]:
    """transformers' own layout, `experts.gate_up_proj` [E, 2F, H]: gate rows then up rows per expert."""
    f = gate_up.shape[1] // 2
    out = {}
    for e in range(gate_up.shape[0]):
        one = expert_slice(gate_up, e)
        out[expert_name(prefix, e, "gate_proj")] = expert_slice(one, slice(None, f))
        out[expert_name(prefix, e, "up_proj")] = expert_slice(one, slice(f, None))
    return out


class MoeBlock:
    """One layer's MoE FFN on already normalised rows; `residual` is added last (as Ops.ffn does)."""

    def __init__(self, moe: MoeConfig, weights: dict[str, Weight], prefix: str, ops: Ops):
        self.moe, self.ops = moe, ops
        self.router = ops.upload(weights[f"{prefix}gate.weight"])
        per = [[weights[expert_name(prefix, e, p)] for e in range(moe.n_experts)] for p in PROJECTIONS]
        shared = tuple(weights[prefix + n] for n in SHARED) if moe.shared_ffn else None
        self.experts = ops.upload_experts(*per, shared=shared, active=moe.top_k)

    def ffn(self, x: Any, norm_weight: Any, eps: float) -> Any:
        """x + the block on rms_norm(x, norm_weight, eps): the bits of self(rms_norm(x), residual=x)."""
        return self.ops.moe(x, norm_weight, eps, self.router, self.experts, self.moe.top_k, self.moe.norm_topk, x)

    def __call__(self, x: Any, residual: Any | None = None) -> Any:
        ops = self.ops
        ids, weights = ops.moe_route(ops.matmul(x, self.router), self.moe.top_k, self.moe.norm_topk)
        return ops.moe_ffn(x, self.experts, ids, weights, residual)
