"""MXFP4 (OCP microscaling): 32 e2m1 values sharing one e8m0 exponent byte."""

from __future__ import annotations

import numpy as np

from lockstep_kernels.quants._bits import NIBBLES

# e2m1 values doubled; the exponent is halved to match (ggml_e8m0_to_fp32_half)
LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) as float32, exponents 0 and 1 as subnormals."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def dequantize_mxfp4(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    idx = (blocks[:, 1:].reshape(n, 1, 16) >> NIBBLES[:, None]) & np.uint8(0x0F)
    return e8m0_half(blocks[:, :1]) * LEVELS[idx].reshape(n, 32).astype(np.float32)
