"""Q4_K, Q5_K and Q6_K blocks repacked for the matmul kernels (matmul.cu's WT_Q4K / WT_Q6K, kquant_mm.cu):
planes in the order one warp reads them, so every load is whole and coalesced, and the values are the
blocks' own integers and scales (nothing is rounded here; the kernels scale as gguf does). Q5_K is
Q4_K's planes with Q6_K's top-bit plane (its fifth bit; the sixth is zero), for the integer kernels.

A weight of N rows (padded with zero rows to whole 16-row tiles, T of them) and K values (whole
256-value super-blocks: C = K / 32 chunks, SB = K / 256) becomes:
  * `nib`, uint8 [T * C * 256]: per (tile, chunk), lane l = 4g + t of the warp holds two uint32,
    the low 4 bits of rows g and g + 8 at k = 8t .. 8t + 7 of the chunk; in each word the pair
    (8t + 2j, 8t + 2j + 1) sits at bits 4j and 16 + 4j (one mask gives an f16 pair);
  * `aux`, uint8: for Q6_K (Q5_K) first the top 2 bits, per (tile, chunk) one uint32 a lane (row g's
    pair j at bits 2j and 16 + 2j, row g + 8's at 8 + 2j and 24 + 2j); then per (tile, chunk) 8 uint32
    of sub-block scales (Q4_K, Q5_K: scale and min of rows g and g + 8; Q6_K: the two 16-value scales
    of row g, then of row g + 8); then per (tile, super-block) the f16 block scales of rows g and
    g + 8 (Q4_K, Q5_K: d, dmin of row g, then of row g + 8; Q6_K: d of row g, d of row g + 8).
"""

from __future__ import annotations

import numpy as np

from lockstep_kernels.cuda.plan import KQUANT_TYPES
from lockstep_kernels.quants import BLOCK_TYPES

__all__ = ["KQUANT_TYPES", "pack", "packed_bytes"]
_NIB_SHIFT = np.array([0, 16, 4, 20, 8, 24, 12, 28], dtype=np.uint32)  # value i of a lane's 8 -> bit
_TOP_SHIFT = np.array([[0, 16, 2, 18, 4, 20, 6, 22], [8, 24, 10, 26, 12, 28, 14, 30]], dtype=np.uint32)  # [half, i]


def has_top(dtype: str) -> bool:
    """Whether the planes carry the top-bit plane (values past 4 bits)."""
    return dtype in ("q5_k", "q6_k")


def _fields(raw, dtype: str, xp):
    """Raw blocks uint8 [N, bytes] -> integer values [N, K] (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), sub-block
    scales uint8 [N, C, 2] and f16 super-block scales uint16 [N, SB, 1 or 2] (ggml-common.h's
    layouts, as lockstep_kernels/quants/kquants.py reads them). `xp`: NumPy or CuPy, whichever holds raw."""
    n = raw.shape[0]
    b = raw.reshape(-1, BLOCK_TYPES[dtype].type_size)
    nb = b.shape[0] // n
    if dtype in ("q4_k", "q5_k"):
        qs = b[:, 16 if dtype == "q4_k" else 48:].reshape(-1, 4, 1, 32)
        q = xp.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 256)
        if dtype == "q5_k":  # bit b of qh byte l: value 32 b + l's fifth bit
            qh = b[:, 16:48].reshape(-1, 1, 32)
            q = q | (((qh >> xp.arange(8, dtype=xp.uint8).reshape(1, 8, 1)) & 1) << 4).reshape(-1, 256)
        q = q.reshape(n, nb * 256)
        p = b[:, 4:16].reshape(-1, 3, 4)
        lo, mid, top = p[:, 0], p[:, 1], p[:, 2]  # get_scale_min_k4
        sc = xp.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
        mn = xp.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=-1)
        scales = xp.stack([sc, mn], axis=-1).reshape(n, nb * 8, 2)
        d = xp.ascontiguousarray(b[:, :4]).view(xp.uint16).reshape(n, nb, 2)
    else:
        ql = b[:, :128].reshape(-1, 2, 1, 64)
        low = xp.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(-1, 256)
        qh = b[:, 128:192].reshape(-1, 2, 1, 32)
        high = xp.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2).reshape(-1, 256)
        q = (low | (high << 4)).reshape(n, nb * 256)
        scales = b[:, 192:208].reshape(n, nb * 8, 2)
        d = xp.ascontiguousarray(b[:, 208:210]).view(xp.uint16).reshape(n, nb, 1)
    return q, scales, d


def pack(raw, dtype: str, xp=np):
    """(nib, aux), uint8, of rows of raw blocks (see the module docstring); on the GPU with xp=cupy
    (an 8B model's planes: seconds there, many minutes in NumPy)."""
    q, scales, d = _fields(xp.ascontiguousarray(raw, dtype=xp.uint8), dtype, xp)
    n, k = q.shape
    t_ = -(-n // 16)
    c = k // 32
    if t_ * 16 != n:  # zero rows: zero values, scales and block scales
        q, scales, d = (xp.concatenate([a, xp.zeros((t_ * 16 - n, *a.shape[1:]), a.dtype)]) for a in (q, scales, d))
    lanes = q.reshape(t_, 2, 8, c, 4, 8).astype(xp.uint32)  # [tile, half, g, chunk, t, i]
    words = ((lanes & 0xF) << xp.asarray(_NIB_SHIFT)).sum(axis=-1, dtype=xp.uint32)
    parts = [words.transpose(0, 3, 2, 4, 1)]  # nib: [tile, chunk, g, t, half]
    if has_top(dtype):
        top = ((lanes >> 4) << xp.asarray(_TOP_SHIFT).reshape(1, 2, 1, 1, 1, 8)).sum(axis=(1, -1), dtype=xp.uint32)
        parts.append(top.transpose(0, 2, 1, 3))  # [tile, chunk, g, t]
    parts.append(scales.reshape(t_, 2, 8, c, 2).transpose(0, 3, 2, 1, 4))  # [tile, chunk, g, half, 2]
    parts.append(d.reshape(t_, 2, 8, d.shape[1], d.shape[2]).transpose(0, 3, 2, 1, 4))  # [tile, sb, g, half, .]
    flat = [xp.ascontiguousarray(a).view(xp.uint8).reshape(-1) for a in parts]
    return flat[0], xp.concatenate(flat[1:])


def packed_bytes(n: int, k: int, dtype: str) -> int:
    """Bytes of pack's two planes for an [n, k] weight."""
    tiles, c = -(-n // 16), k // 32
    per_chunk = 256 + 32 + (128 if has_top(dtype) else 0)
    return tiles * (c * per_chunk + (c // 8) * (32 if dtype == "q6_k" else 64))
