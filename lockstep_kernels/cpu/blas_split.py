"""BLAS products of many token rows (exact mode off) split across the engine's threads by weight tiles.

BLAS runs one thread per call (engine/threads.py): OpenBLAS's own threads meet at barriers inside each
call, where a core taken by another process stalls all of them (a 128-token prompt of the bundled model
on two busy cores: 0.6-1.1 s with two of its threads, about 0.2 s with one). Here each of N threads (the
caller and N - 1 helpers) converts and multiplies its own tiles of the weight's rows, so a stalled thread
delays only its tiles, and the only meeting point is the end of the product.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lockstep_kernels.cpu.quant_matmul import tile_slices
from lockstep_kernels.weights import RowStack, Weight

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0


def _helpers(n: int) -> ThreadPoolExecutor:
    global _POOL, _POOL_SIZE
    if _POOL is None or _POOL_SIZE != n:
        _POOL, _POOL_SIZE = ThreadPoolExecutor(n, thread_name_prefix="lockstep-blas"), n
    return _POOL


def blas_matmul(x: np.ndarray, w: Weight | RowStack, out: np.ndarray, threads: int, block_rows: int) -> None:
    """out[:, j] = x . w[j] through NumPy's BLAS, tiles of at most block_rows weight rows (fewer where
    that gives each of `threads` threads a tile) dealt round-robin to the threads."""
    n = w.shape[0]
    rows = min(block_rows, -(-n // threads)) if threads > 1 else block_rows
    tiles = list(tile_slices(w, rows))
    k = min(threads, len(tiles))

    def run(first: int) -> None:
        for n0, part, rows_of in tiles[first::k]:
            block = part.to_f32(rows_of)
            out[:, n0 : n0 + block.shape[0]] = x @ block.T

    helpers = [_helpers(threads - 1).submit(run, i) for i in range(1, k)]
    try:
        run(0)
    finally:
        for f in helpers:
            f.result()
