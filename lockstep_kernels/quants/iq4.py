"""The non-linear 4-bit types: IQ4_NL (32-value blocks, one f16 scale) and IQ4_XS (256-value
super-blocks, 6-bit sub-block scales); a nibble indexes a fixed table of 16 int8 levels."""

from __future__ import annotations

import numpy as np

from lockstep_kernels.quants._bits import NIBBLES, f16

LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
_HIGH_SHIFTS = np.arange(0, 16, 2, dtype=np.uint16)


def _levels(qs: np.ndarray) -> np.ndarray:
    """16-byte groups: the levels of their low nibbles, then of their high nibbles, as float32."""
    n = qs.shape[0]
    idx = (qs.reshape(n, -1, 1, 16) >> NIBBLES[:, None]) & np.uint8(0x0F)
    return LEVELS[idx].astype(np.float32).reshape(n, -1, 32)


def dequantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    return f16(blocks, 0) * _levels(blocks[:, 2:]).reshape(n, 32)


def dequantize_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    high = np.ascontiguousarray(blocks[:, 2:4]).view(np.uint16)  # [n, 1]: 2 bits per sub-block
    high = ((high >> _HIGH_SHIFTS).astype(np.uint8) & np.uint8(0x03))
    low = ((blocks[:, 4:8].reshape(n, 4, 1) >> NIBBLES).reshape(n, 8)) & np.uint8(0x0F)
    scales = ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)
    dl = (f16(blocks, 0) * scales).reshape(n, 8, 1)
    return (dl * _levels(blocks[:, 8:])).reshape(n, 256)
