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
