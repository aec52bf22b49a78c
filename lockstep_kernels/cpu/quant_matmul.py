"""Matmul straight from quantized blocks on the CPU: a weight's rows are dequantised a tile at a time,
multiplied, and dropped; no float32 copy of a quantized weight outlives its product.

A tile's row count is a function of the weight's shape alone, and each output element is one
dot product over the whole of K within its tile, so the reduction order never depends on how many
token rows share the call (exact mode multiplies each token row on its own, compiled.rows_matvec).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from lockstep_kernels.weights import RowStack, Weight

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
    for n0, part, rows_of in tile_slices(w, rows):
        yield n0, part.to_f32(rows_of)


def tile_slices(w: Weight | RowStack, rows: int) -> Iterator[tuple[int, Weight, slice]]:
    """f32_tiles' tiles before their conversion: (first row, the weight or RowStack part, its rows)."""
    if isinstance(w, RowStack):
        at = 0
        for part in w.parts:
            for n0, p, rows_of in tile_slices(part, rows):
                yield at + n0, p, rows_of
            at += part.shape[0]
        return
    n = w.shape[0]
    step = tile_rows(w, rows)
    for n0 in range(0, n, step):
        yield n0, w, slice(n0, n0 + step)
