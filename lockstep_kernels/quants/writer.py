"""Quantisers of our own (gguf-py dequantises the K-quants but cannot write them): Q8_0, Q4_0, Q4_K,
Q5_K and Q6_K blocks in ggml's layout, so llama.cpp and gguf-py read what we write.

The rule is simple rather than llama.cpp's searched one: sub-block scales (and minimums) are rounded
*up* to the super-block's 6-bit (Q6_K: 8-bit) grid, so the range of every sub-block is covered and a
value's error stays within half a step of its sub-block (Q4_K/Q5_K: or one minimum step at the top).
"""

from __future__ import annotations

import numpy as np

from lockstep_kernels.quants import BLOCK_TYPES


def _f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x rounded away from zero to f16 (a stored step never shrinks, so the range it must cover is
    covered, subnormal steps included): (f16 bytes [n, 2], the float32 value the decoder reads)."""
    h = x.astype(np.float16)
    short = np.abs(h.astype(np.float32)) < np.abs(x)
    h = np.where(short, np.nextafter(h, np.copysign(np.float16(np.inf), h)), h)
    return h.reshape(-1, 1).view(np.uint8), h.astype(np.float32)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), 0).astype(np.float32)


def _nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo.astype(np.uint8) & 0x0F) | ((hi.astype(np.uint8) & 0x0F) << 4)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 [n, 32] -> blocks [n, 34]."""
    dh, d = _f16(np.abs(x).max(axis=1) / np.float32(127))
    q = np.clip(np.round(_div(x, d[:, None])), -127, 127).astype(np.int8)
    return np.concatenate([dh, q.view(np.uint8)], axis=1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """float32 [n, 32] -> blocks [n, 18]: d = (the value of largest magnitude) / -8."""
    big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    dh, d = _f16(big / np.float32(-8))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d[:, None] != 0, x / np.where(d != 0, d, 1)[:, None], 0)
    q = np.clip(np.round(q) + 8, 0, 15)
    return np.concatenate([dh, _nibbles(q[:, :16], q[:, 16:])], axis=1)


def _scales_up(step: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sub-block steps [n, s] on a super-block grid: (grid f16 bytes, grid value [n], integer scales [n, s])."""
    gh, g = _f16(step.max(axis=1) / np.float32(top))
    sc = np.clip(np.ceil(_div(step, g[:, None])), 0, top)
    return gh, g, sc


def _pack_scale_min_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The inverse of kquants.scale_min_k4: eight 6-bit scales and minimums into 12 bytes."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    lo = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    mid = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    top = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo, mid, top], axis=1)


def _asymmetric_k(x: np.ndarray, levels: int):
    """Q4_K/Q5_K's quantities for super-blocks [n, 256]: header bytes and quants [n, 8, 32]."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    low = np.minimum(sub.min(axis=2), 0)
    dh, d, sc = _scales_up((sub.max(axis=2) - low) / np.float32(levels), 63)
    mh, dmin, mn = _scales_up(-low, 63)
    step = (d[:, None] * sc.astype(np.float32))[..., None]
    shift = (dmin[:, None] * mn.astype(np.float32))[..., None]
    q = np.clip(np.round(_div(sub + shift, np.broadcast_to(step, sub.shape))), 0, levels).astype(np.uint8)
    return np.concatenate([dh, mh, _pack_scale_min_k4(sc, mn)], axis=1), q


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [n, 256] -> blocks [n, 144]."""
    head, q = _asymmetric_k(x, 15)
    qs = _nibbles(q[:, 0::2], q[:, 1::2]).reshape(x.shape[0], 128)  # sub-blocks 2p, 2p + 1 share bytes
    return np.concatenate([head, qs], axis=1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """float32 [n, 256] -> blocks [n, 176]."""
    n = x.shape[0]
    head, q = _asymmetric_k(x, 31)
    qh = np.zeros((n, 32), dtype=np.uint8)
    for b in range(8):  # bit b of byte l: the fifth bit of value l of sub-block b
        qh |= ((q[:, b] >> 4) & 1) << np.uint8(b)
    qs = _nibbles(q[:, 0::2], q[:, 1::2]).reshape(n, 128)
    return np.concatenate([head, qh, qs], axis=1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [n, 256] -> blocks [n, 210]: sixteen int8 scales of 16 values, 6-bit quants."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    dh, d, sc = _scales_up(np.abs(sub).max(axis=2) / np.float32(31), 127)
    step = np.broadcast_to((d[:, None] * sc.astype(np.float32))[..., None], sub.shape)
    u = (np.clip(np.round(_div(sub, step)), -32, 31) + 32).astype(np.uint8).reshape(n, 2, 2, 64)
    ql = _nibbles(u[:, :, 0], u[:, :, 1]).reshape(n, 128)
    high = (u.reshape(n, 2, 4, 32) >> 4)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), dh], axis=1)


QUANTIZERS = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0, "q4_k": quantize_q4_k, "q5_k": quantize_q5_k,
              "q6_k": quantize_q6_k}


def quantize(x: np.ndarray, name: str) -> np.ndarray:
    """float32 [..., K] -> raw blocks uint8 [..., K / block_size * type_size] of type `name`."""
    if name not in QUANTIZERS:
        raise ValueError(f"no quantiser for {name!r} (have: {', '.join(QUANTIZERS)})")
    kind = BLOCK_TYPES[name]
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % kind.block_size:
        raise ValueError(f"{name} needs a row length divisible by {kind.block_size}, got {x.shape[-1]}")
    blocks = QUANTIZERS[name](x.reshape(-1, kind.block_size))
    return blocks.reshape(*x.shape[:-1], x.shape[-1] // kind.block_size * kind.type_size)
