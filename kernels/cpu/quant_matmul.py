"""Matmul straight from quantized blocks on the CPU: a weight's rows are dequantised a tile at a time,
multiplied, and dropped; no float32 copy of a quantized weight outlives its product.

A tile's row count is a function of the weight's shape alone, and each output element is one
dot product over the whole of K within its tile, so the reduction order never depends on how many
token rows share the call (exact mode multiplies each token row on its own, compiled.rows_matvec).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from kernels.weights import RowStack, Weight

TILE_VALUES = 1 << 20  # float32 values dequantised at a time (4 MiB of scratch per tile)


def tile_rows(w: Weight, rows: int) -> int:
    """Rows per tile: `rows` for stored layouts NumPy converts cheaply, about TILE_VALUES values
    for raw blocks (their dequantisation makes several temporaries per value)."""
    n, k = w.shape
    if not w.blocks:
        return rows
    return max(1, min(n, TILE_VALUES // k))


def f32_tiles(w: Weight | RowStack, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, float32 rows [r, K]) over the weight in row order; a RowStack part by part."""
    if isinstance(w, RowStack):
        at = 0
        for part in w.parts:
            for n0, tile in f32_tiles(part, rows):
                yield at + n0, tile
            at += part.shape[0]
        return
    n = w.shape[0]
    step = tile_rows(w, rows)
    for n0 in range(0, n, step):
        yield n0, w.to_f32(slice(n0, n0 + step))
