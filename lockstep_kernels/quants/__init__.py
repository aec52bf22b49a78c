"""GGUF block types: layouts and dequantisers (llama.cpp's ggml-common.h), one module per family.

A quantized weight is stored as its raw blocks, uint8 [rows, blocks_per_row * type_size]; `dequantize`
turns any number of whole rows into float32. Every dequantiser computes each value with the float32
operations of `gguf.quants.dequantize`, in its order, so the two agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lockstep_kernels.quants import iq4, kquants, legacy, mxfp4


@dataclass(frozen=True)
class BlockType:
    name: str  # ours, lower case: "q4_k"
    block_size: int  # values per block
    type_size: int  # bytes per block
    dequantize_blocks: Callable[[np.ndarray], np.ndarray]  # uint8 [n, type_size] -> float32 [n, block_size]


# Each family's types as "name values_per_block bytes_per_block"; a type's dequantiser is its module's
# `dequantize_<name>`.
_LAYOUTS = {
    legacy: "q4_0 32 18, q4_1 32 20, q5_0 32 22, q5_1 32 24, q8_0 32 34",
    kquants: "q2_k 256 84, q3_k 256 110, q4_k 256 144, q5_k 256 176, q6_k 256 210",
    iq4: "iq4_nl 32 18, iq4_xs 256 136",
    mxfp4: "mxfp4 32 17",
}
BLOCK_TYPES: dict[str, BlockType] = {
    name: BlockType(name, int(values), int(size), getattr(module, f"dequantize_{name}"))
    for module, layouts in _LAYOUTS.items()
    for name, values, size in (layout.split() for layout in layouts.split(", "))
}


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
