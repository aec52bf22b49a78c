"""The Gated DeltaNet layer of Qwen3.5's hybrid models (linear attention with a recurrent state).

The step's rows go through one stacked projection (q|k|v, z, b, a), the causal conv with silu, the
gated delta rule, the gated RMS norm and the output projection, each op computing every row by
itself; the state each sequence carries is its conv window and its delta-rule matrices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ModelLoadError
from lockstep_kernels.base import Ops, RecurrentRows
from lockstep_kernels.weights import Weight, concat_rows


@dataclass(frozen=True)
class DeltaNetShape:
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    kernel: int  # the causal conv's width

    @property
    def qkv(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @property
    def value(self) -> int:
        return self.v_heads * self.v_dim

    def state_bytes(self) -> int:
        """float32 bytes of one sequence's state in one layer."""
        return 4 * ((self.kernel - 1) * self.qkv + self.v_heads * self.k_dim * self.v_dim)

    def weight_shapes(self, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
        return {
            prefix + "in_proj_qkv.weight": (self.qkv, hidden), prefix + "in_proj_z.weight": (self.value, hidden),
            prefix + "in_proj_b.weight": (self.v_heads, hidden), prefix + "in_proj_a.weight": (self.v_heads, hidden),
            prefix + "conv1d.weight": (self.qkv, 1, self.kernel), prefix + "A_log": (self.v_heads,),
            prefix + "dt_bias": (self.v_heads,), prefix + "norm.weight": (self.v_dim,),
            prefix + "out_proj.weight": (hidden, self.value),
        }


def shape_from_config(cfg: dict) -> DeltaNetShape:
    try:
        shape = DeltaNetShape(int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"]),
                              int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"]),
                              int(cfg["linear_conv_kernel_dim"]))
    except KeyError as e:
        raise ModelLoadError(f"config.json: missing key {e.args[0]!r} (a Gated DeltaNet setting)") from None
    if shape.v_heads % shape.k_heads:
        raise ModelLoadError(f"{shape.v_heads} DeltaNet value heads are not a multiple of {shape.k_heads} key heads")
    return shape


class DeltaNetLayer:
    """One layer's uploaded weights; `index` is its place among the model's recurrent layers (the
    entry of each sequence's state it advances)."""

    def __init__(self, shape: DeltaNetShape, weights: dict[str, Weight], prefix: str, ops: Ops, index: int):
        self.shape, self.ops, self.index = shape, ops, index
        parts = [weights[prefix + f"in_proj_{x}.weight"] for x in ("qkv", "z", "b", "a")]
        if len({w.dtype for w in parts}) > 1:
            raise ModelLoadError(f"tensors {prefix}in_proj_* have different types")
        self.w_in = ops.upload(concat_rows(parts))
        conv = weights[prefix + "conv1d.weight"].to_f32()
        self.conv = ops.tensor(np.ascontiguousarray(conv.reshape(conv.shape[0], conv.shape[-1]), dtype=np.float32))
        self.a_log = ops.upload(weights[prefix + "A_log"])
        self.dt_bias = ops.upload(weights[prefix + "dt_bias"])
        self.norm = ops.upload(weights[prefix + "norm.weight"])
        self.w_out = ops.upload(weights[prefix + "out_proj.weight"])

    def forward(self, x: Any, norm_weight: Any, eps: float, rows: RecurrentRows) -> Any:
        """x [T, hidden] -> x + the layer's output (its residual added)."""
        s, ops = self.shape, self.ops
        t = x.shape[0]
        y = ops.norm_matmul(x, norm_weight, eps, self.w_in)
        z0 = s.qkv
        b0 = z0 + s.value
        mixed = ops.conv1d_silu(y[:, :z0], self.conv, rows, self.index)
        core = ops.gated_delta(mixed, y[:, b0 + s.v_heads :], y[:, b0 : b0 + s.v_heads], self.a_log, self.dt_bias,
                               rows, self.index, s.k_heads)
        return ops.gated_norm_matmul(core.reshape(t * s.v_heads, s.v_dim), self.norm,
                                     y[:, z0:b0].reshape(t * s.v_heads, s.v_dim), eps, self.w_out, x)
