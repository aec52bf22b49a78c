"""The K-quants: 256-value super-blocks of 16 or 32-value sub-blocks with quantized sub-block scales
(Q2_K, Q3_K, Q4_K, Q5_K, Q6_K). Byte layouts are ggml-common.h's block_q*_K, in field order.
"""

from __future__ import annotations

import numpy as np

from lockstep_kernels.quants._bits import BITS, CRUMBS, NIBBLES, as_f32, f16, low_high_f32

QK_K = 256


def _crumbs(qs: np.ndarray, groups: int) -> np.ndarray:
    """2-bit fields: byte l of group g holds values g*128 + 32*s + l at bits 2s (s = 0..3)."""
    n = qs.shape[0]
    return (qs.reshape(n, groups, 1, 32) >> CRUMBS[:, None]) & np.uint8(3)


def _high_bits(hmask: np.ndarray) -> np.ndarray:
    """32 bytes of one bit per value: bit b of byte l belongs to value 32*b + l."""
    n = hmask.shape[0]
    return (hmask.reshape(n, 1, 1, 32) >> BITS[:, None]) & np.uint8(1)


def _nibble_rows(qs: np.ndarray, width: int) -> np.ndarray:
    """Groups of `width` bytes: their low nibbles, then their high nibbles."""
    n = qs.shape[0]
    return (qs.reshape(n, -1, 1, width) >> NIBBLES[:, None]) & np.uint8(0x0F)


def scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit minimums (get_scale_min_k4)."""
    n = packed.shape[0]
    p = packed.reshape(n, 3, 4)
    lo, mid, top = p[:, 0], p[:, 1], p[:, 2]
    sc = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return sc, mn


def dequantize_q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scales = blocks[:, :16]
    d, dmin = f16(blocks, 80), f16(blocks, 82)
    dl = (d * (scales & 0x0F).astype(np.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).astype(np.float32)).reshape(n, 16, 1)
    q = _crumbs(blocks[:, 16:80], 2).reshape(n, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _q3_scales(packed: np.ndarray) -> np.ndarray:
    """Sixteen 6-bit scales: low nibbles from bytes 0..7, two high bits each from bytes 8..11."""
    n = packed.shape[0]
    low = ((packed[:, :8].reshape(n, 1, 8) >> NIBBLES[:, None]).reshape(n, 16)) & np.uint8(0x0F)
    high = ((packed[:, 8:].reshape(n, 1, 4) >> CRUMBS[:, None]).reshape(n, 16)) & np.uint8(0x03)
    return ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)


def dequantize_q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    dl = (f16(blocks, 108) * _q3_scales(blocks[:, 96:108])).reshape(n, 16, 1)
    low = _crumbs(blocks[:, 32:96], 2).reshape(n, 16, 16)
    high = _high_bits(blocks[:, :32]).reshape(n, 16, 16) ^ np.uint8(1)  # a set bit means no -4 offset
    q = (low.astype(np.int8) - (high << np.uint8(2)).astype(np.int8)).astype(np.float32)
    return (dl * q).reshape(n, QK_K)


def _scaled_min(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = blocks.shape[0]
    sc, mn = scale_min_k4(blocks[:, 4:16])
    d = (f16(blocks, 0) * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (f16(blocks, 2) * mn.astype(np.float32)).reshape(n, 8, 1)
    return d, dm


def _scale_shift(q: np.ndarray, d: np.ndarray, dm: np.ndarray) -> np.ndarray:
    """d * q - dm in place (the products commute bit for bit)."""
    np.multiply(q, d, out=q)
    return np.subtract(q, dm, out=q)


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dm = _scaled_min(blocks)
    q = low_high_f32(blocks[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32)
    return _scale_shift(q, d, dm).reshape(n, QK_K)


def dequantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dm = _scaled_min(blocks)
    low = _nibble_rows(blocks[:, 48:], 32).reshape(n, 8, 32)
    high = _high_bits(blocks[:, 16:48]).reshape(n, 8, 32)
    q = as_f32(low | (high << np.uint8(4)))
    return _scale_shift(q, d, dm).reshape(n, QK_K)


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    d = (f16(blocks, 208) * scales).reshape(n, 16, 1)
    low = _nibble_rows(blocks[:, :128], 64).reshape(n, 8, 32)
    high = _crumbs(blocks[:, 128:192], 2).reshape(n, 8, 32)
    q = as_f32(low | (high << np.uint8(4))).reshape(n, 16, 16)
    np.subtract(q, np.float32(32), out=q)  # small integers: exact, as gguf's int8 subtraction
    return np.multiply(q, d, out=q).reshape(n, QK_K)
