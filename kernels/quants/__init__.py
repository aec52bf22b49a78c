"""GGUF block types: layouts and dequantisers (llama.cpp's ggml-common.h), one module per family.

A quantized weight is stored as its raw blocks, uint8 [rows, blocks_per_row * type_size]; `dequantize`
turns any number of whole rows into float32. Every dequantiser computes each value with the float32
operations of `gguf.quants.dequantize`, in its order, so the two agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kernels.quants import iq4, kquants, legacy, mxfp4


@dataclass(frozen=True)
class BlockType:
    name: str  # ours, lower case: "q4_k"
    block_size: int  # values per block
    type_size: int  # bytes per block
    dequantize_blocks: Callable[[np.ndarray], np.ndarray]  # uint8 [n, type_size] -> float32 [n, block_size]


BLOCK_TYPES: dict[str, BlockType] = {t.name: t for t in (
    BlockType("q4_0", 32, 18, legacy.dequantize_q4_0),
    BlockType("q4_1", 32, 20, legacy.dequantize_q4_1),
    BlockType("q5_0", 32, 22, legacy.dequantize_q5_0),
    BlockType("q5_1", 32, 24, legacy.dequantize_q5_1),
    BlockType("q8_0", 32, 34, legacy.dequantize_q8_0),
    BlockType("q2_k", 256, 84, kquants.dequantize_q2_k),
    BlockType("q3_k", 256, 110, kquants.dequantize_q3_k),
    BlockType("q4_k", 256, 144, kquants.dequantize_q4_k),
    BlockType("q5_k", 256, 176, kquants.dequantize_q5_k),
    BlockType("q6_k", 256, 210, kquants.dequantize_q6_k),
    BlockType("iq4_nl", 32, 18, iq4.dequantize_iq4_nl),
    BlockType("iq4_xs", 256, 136, iq4.dequantize_iq4_xs),
    BlockType("mxfp4", 32, 17, mxfp4.dequantize_mxfp4),
)}


def row_values(raw: np.ndarray, kind: BlockType) -> int:
    """Values per row of raw blocks uint8 [rows, bytes]."""
    return raw.shape[-1] // kind.type_size * kind.block_size


def dequantize(raw: np.ndarray, name: str) -> np.ndarray:
    """Raw blocks uint8 [..., bytes] (whole blocks per row) -> float32 [..., values]."""
    kind = BLOCK_TYPES[name]
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.shape[-1] % kind.type_size:
        raise ValueError(f"{name}: a row of {raw.shape[-1]} bytes is not whole {kind.type_size}-byte blocks")
    lead = raw.shape[:-1]
    blocks = kind.dequantize_blocks(raw.reshape(-1, kind.type_size))
    return blocks.reshape(*lead, row_values(raw, kind))
