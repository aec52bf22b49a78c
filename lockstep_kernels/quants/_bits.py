"""Byte-field helpers the block dequantisers share."""

from __future__ import annotations

import numpy as np

NIBBLES = np.array([0, 4], dtype=np.uint8)
CRUMBS = np.array([0, 2, 4, 6], dtype=np.uint8)
BITS = np.arange(8, dtype=np.uint8)


def f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The little-endian f16 at byte `at` of each block, as float32 [n, 1]."""
    return np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16).astype(np.float32)


def low_high(b: np.ndarray) -> np.ndarray:
    """Bytes [..., m] -> nibbles [..., 2, m]: all low nibbles, then all high ones."""
    return (b[..., None, :] >> NIBBLES[:, None]) & np.uint8(0x0F)


def low_high_f32(b: np.ndarray) -> np.ndarray:
    """low_high as float32, written straight into one array (decoding runs per matmul tile: one
    fewer temporary per value matters)."""
    out = np.empty((*b.shape[:-1], 2, b.shape[-1]), dtype=np.float32)
    np.bitwise_and(b, np.uint8(0x0F), out=out[..., 0, :], casting="unsafe")
    np.right_shift(b, np.uint8(4), out=out[..., 1, :], casting="unsafe")
    return out


def as_f32(q: np.ndarray) -> np.ndarray:
    out = np.empty(q.shape, dtype=np.float32)
    out[...] = q
    return out
