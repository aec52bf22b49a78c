"""kquant_mm.cu's arithmetic in NumPy (float32 steps, FMA through a wider float): the bits the integer
Q4_K / Q6_K kernels must give, for tests on the CPU and against the GPU.

Activations per 32-value chunk: xq = rint(v * (16256 / amax)), dx = amax / 16256; a chunk's value of
row n for a token is Q4_K (Q5_K) fma(d*sc, dx*P, -(dmin*m * (dx*S))) with P = sum(q xq), S = sum(xq), Q6_K
fma(d*sc1, dx*P1, d*sc0 * (dx*P0)) with P_h = sum((q - 32) xq) over half h; a K slice adds its chunks
in order from 0, the slices (plan.split_k) are added in order.
"""

from __future__ import annotations

import numpy as np

from lockstep_kernels.cuda.kquant import _fields

XMAX = 16256  # kquant_mm.cu's KQX_MAX
F32 = np.float32


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [M, K] float32 (K a multiple of 32) -> xq int64 [M, C, 32], dx and dx * S float32 [M, C]."""
    v = np.ascontiguousarray(x, dtype=F32).reshape(x.shape[0], -1, 32)
    amax = np.abs(v).max(axis=-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, F32(XMAX) / amax, F32(0)).astype(F32)
    xq = np.clip(np.rint(v * inv[..., None]), -XMAX, XMAX).astype(np.int64)
    dx = (amax / F32(XMAX)).astype(F32)
    return xq, dx, (dx * xq.sum(axis=-1).astype(F32)).astype(F32)


POS = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # byte of k = 8j + i among group j's 8 (a plane word's order)


def records(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """kq_quant_x's output for x [M, K]: uint8 [M, C, 64] (group j = k 8j .. 8j+7: xh at 16j + POS,
    xl at 16j + 8 + POS; xq = 128 xh + xl) and float32 [M, C, 4] (dx, dx * S, then S0, S1 as int32 bits)."""
    xq, dx, dxs = quantize_activations(x)
    hi = (xq + 64) >> 7
    lo = xq - 128 * hi
    rec = np.zeros((*xq.shape[:2], 64), np.uint8)
    k = np.arange(32)
    at = 16 * (k >> 3) + POS[k & 7]
    rec[:, :, at] = (hi & 0xFF).astype(np.uint8)
    rec[:, :, at + 8] = (lo & 0xFF).astype(np.uint8)
    sums = np.stack([xq[..., :16].sum(-1), xq[..., 16:].sum(-1)], axis=-1).astype(np.int32).view(F32)
    return rec, np.concatenate([dx[..., None], dxs[..., None], sums], axis=-1)


# a * b + c of float32s through this type: the product is exact in it; the sum rounds twice (to its
# precision, then to float32), which differs from one rounding only where the first lands on a
# float32 midpoint: about 2^-40 of the sums with x86's 64-bit mantissa, 2^-29 with float64's.
WIDE = np.longdouble if np.finfo(np.longdouble).nmant >= 63 else np.float64


def _fma(a, b, c) -> np.ndarray:
    """a * b + c rounded (as good as) once to float32: __fmaf_rn."""
    return (a.astype(WIDE) * b.astype(WIDE) + c.astype(WIDE)).astype(F32)


def chunk_values(raw: np.ndarray, dtype: str, x: np.ndarray) -> np.ndarray:
    """Each chunk's value, float32 [M, N, C], of x [M, K] against raw blocks [N, bytes]."""
    q, scales, d = _fields(np.ascontiguousarray(raw, dtype=np.uint8), dtype, np)
    n, k = q.shape
    c = k // 32
    xq, dx, dxs = quantize_activations(x)
    qc = q.reshape(n, c, 32).astype(np.int64)
    df = d.view(np.float16).astype(F32)  # [N, SB, 1 or 2]
    sb = np.arange(c) // 8
    dxm = dx[:, None, :]
    if dtype in ("q4_k", "q5_k"):
        p = np.einsum("nci,mci->mnc", qc, xq)
        ds = (df[:, sb, 0] * scales[:, :, 0].astype(F32)).astype(F32)  # [N, C]
        dm = (df[:, sb, 1] * scales[:, :, 1].astype(F32)).astype(F32)
        return _fma(np.broadcast_to(ds, p.shape), (dxm * p.astype(F32)).astype(F32), -(dm * dxs[:, None, :]))
    s = scales.view(np.int8).astype(F32)
    p0 = np.einsum("nci,mci->mnc", qc[..., :16] - 32, xq[..., :16])
    p1 = np.einsum("nci,mci->mnc", qc[..., 16:] - 32, xq[..., 16:])
    ds0 = (df[:, sb, 0] * s[:, :, 0]).astype(F32)
    ds1 = (df[:, sb, 0] * s[:, :, 1]).astype(F32)
    first = (ds0 * (dxm * p0.astype(F32)).astype(F32)).astype(F32)
    return _fma(np.broadcast_to(ds1, p1.shape), (dxm * p1.astype(F32)).astype(F32), first)


def matmul(raw: np.ndarray, dtype: str, x: np.ndarray, split: int) -> np.ndarray:
    """x [M, K] @ the weight's rows^T [M, N], summed as the kernels sum with `split` K slices."""
    v = chunk_values(raw, dtype, x)
    c = v.shape[-1]
    total = None
    for s in range(split):
        part = np.zeros(v.shape[:2], dtype=F32)
        for j in range(s * c // split, (s + 1) * c // split):
            part = (part + v[:, :, j]).astype(F32)
        total = part if total is None else (total + part).astype(F32)
    return total
