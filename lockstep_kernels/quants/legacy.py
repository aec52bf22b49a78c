"""The 32-value block types: Q4_0, Q4_1, Q5_0, Q5_1 (4 or 5 bits, scale or scale and minimum), Q8_0.

Byte order within a block: f16 scale d, [f16 minimum m], [32 high bits as a little-endian uint32],
then the quants (16 bytes of nibbles: value i in the low nibble of byte i, value 16 + i in its high one;
Q8_0: 32 int8).
"""

from __future__ import annotations

import numpy as np

from lockstep_kernels.quants._bits import f16, low_high, low_high_f32

_BIT_OF = np.arange(32, dtype=np.uint32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    return low_high(qs).reshape(qs.shape[0], 32)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    word = np.ascontiguousarray(qh).view(np.uint32)  # [n, 1]
    return ((word >> _BIT_OF) & np.uint32(1)).astype(np.uint8)


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    q = low_high_f32(blocks[:, 2:]).reshape(blocks.shape[0], 32)
    np.subtract(q, np.float32(8), out=q)  # small integers: exact, as gguf's int8 subtraction
    return np.multiply(q, f16(blocks, 0), out=q)


def dequantize_q4_1(blocks: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 4:]).astype(np.float32)
    return f16(blocks, 0) * q + f16(blocks, 2)


def dequantize_q5_0(blocks: np.ndarray) -> np.ndarray:
    q = (_nibbles(blocks[:, 6:]) | (_fifth_bits(blocks[:, 2:6]) << np.uint8(4))).astype(np.int8) - np.int8(16)
    return f16(blocks, 0) * q.astype(np.float32)


def dequantize_q5_1(blocks: np.ndarray) -> np.ndarray:
    q = (_nibbles(blocks[:, 8:]) | (_fifth_bits(blocks[:, 4:8]) << np.uint8(4))).astype(np.float32)
    return f16(blocks, 0) * q + f16(blocks, 2)


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32) * f16(blocks, 0)
