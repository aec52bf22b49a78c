"""RoPE and the KV-cache write of the NumPy backend, compiled (numba): one call per step for a layer's
queries, keys and values instead of a dozen NumPy temporaries.

These kernels are compiled without fastmath, so each element is what NumPy's float32 expressions
give (x1 * cos - x2 * sin rounded product by product, no fused multiply-add) and the values stored
in the cache are NumPy's conversions (float16: round to nearest even; bfloat16: f32_to_bf16).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_FLAGS = {"cache": True, "nogil": True, "error_model": "numpy", "boundscheck": False}
KV_KINDS = {"f32": 0, "f16": 1, "bf16": 2}  # the cache types these kernels store (q8_0 is NumPy's)


@intrinsic
def _to_f16(typingctx, x):
    """float32 -> f16 bits (uint16): LLVM's fptrunc, round to nearest even like NumPy's astype."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@intrinsic
def _bits(typingctx, x):
    """float32 -> its bits as uint32."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@njit(inline="always", **_FLAGS)
def _to_bf16(x):
    """lockstep_kernels.weights.f32_to_bf16 for one value."""
    bits = _bits(x)
    return np.uint16((bits + (((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))) >> np.uint32(16))


@njit(inline="always", **_FLAGS)
def _rotate(src, cos, sin, neox, dst):
    """One head's rotation: src, dst [d]; cos, sin [d // 2] of the row's position."""
    half = src.shape[0] // 2
    if neox:
        for i in range(half):
            x1, x2 = src[i], src[half + i]
            dst[i] = x1 * cos[i] - x2 * sin[i]
            dst[half + i] = x2 * cos[i] + x1 * sin[i]
    else:
        for i in range(half):
            xe, xo = src[2 * i], src[2 * i + 1]
            dst[2 * i] = xe * cos[i] - xo * sin[i]
            dst[2 * i + 1] = xo * cos[i] + xe * sin[i]


@njit(**_FLAGS)
def rope_rows(x, positions, cos, sin, neox, out):
    """x, out [T, heads, d] float32; row r rotated by position positions[r]."""
    for r in range(x.shape[0]):
        p = positions[r]
        for h in range(x.shape[1]):
            _rotate(x[r, h], cos[p], sin[p], neox, out[r, h])


@njit(inline="always", **_FLAGS)
def _store(src, kind, dst):
    """One head's values into a cache cell: float32 as they are, or as f16 / bf16 bits."""
    for i in range(src.shape[0]):
        if kind == 0:
            dst[i] = src[i]
        elif kind == 1:
            dst[i] = _to_f16(src[i])
        else:
            dst[i] = _to_bf16(src[i])


@njit(**_FLAGS)
def qkv_rope_write(qkv, positions, slots, cos, sin, neox, n_heads, n_kv, k_cells, v_cells, kind, q_out):
    """qkv [T, (heads + 2 kv) * d] = q | k | v per row: q rotated into q_out [T, heads, d]; k rotated
    and v stored into cell slots[r] of k_cells, v_cells [cells, kv, d] (float32 for kind 0, else
    uint16 bits: 1 f16, 2 bf16)."""
    d = q_out.shape[2]
    row = np.empty(d, np.float32)
    for r in range(qkv.shape[0]):
        p, cell = positions[r], slots[r]
        x = qkv[r]
        for h in range(n_heads):
            _rotate(x[h * d : (h + 1) * d], cos[p], sin[p], neox, q_out[r, h])
        for h in range(n_kv):
            at = (n_heads + h) * d
            _rotate(x[at : at + d], cos[p], sin[p], neox, row)
            _store(row, kind, k_cells[cell, h])
            at = (n_heads + n_kv + h) * d
            _store(x[at : at + d], kind, v_cells[cell, h])


def warm_up() -> None:
    cos = np.ones((4, 4), np.float32)
    pos = np.zeros(2, np.int64)
    x = np.ones((2, 3, 8), np.float32)
    for neox in (True, False):
        rope_rows(x, pos, cos, cos, neox, np.empty_like(x))
        for cells, kind in ((np.zeros((4, 1, 8), np.float32), 0), (np.zeros((4, 1, 8), np.uint16), 1),
                            (np.zeros((4, 1, 8), np.uint16), 2)):
            qkv_rope_write(np.ones((2, 32), np.float32), pos, pos, cos, cos, neox, 2, 1, cells, cells, kind,
                           np.empty((2, 2, 8), np.float32))
