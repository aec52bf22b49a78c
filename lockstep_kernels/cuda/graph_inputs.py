"""The static inputs of a replayed decode step, laid out on the host (no CuPy needed)."""

from __future__ import annotations

import numpy as np

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= n), None)


def pack_inputs(host: np.ndarray, slots_host: np.ndarray, bucket: int, width: int, tokens, positions,
                block_tables, slots) -> None:
    """Fills the pinned staging arrays of one bucket: [ids | positions | seq | tables] as int32 and
    slots as int64, padding rows included."""
    n = len(tokens)
    tables = np.asarray(block_tables, dtype=np.int32)
    if tables.ndim != 2 or tables.shape[0] != n:
        raise ValueError(f"block tables of shape {tables.shape} for {n} rows")
    if tables.shape[1] > width:
        raise ValueError(f"a sequence holds {tables.shape[1]} pages; the graphs were built for {width}")
    host[: 2 * bucket] = 0
    host[:n] = tokens
    host[bucket : bucket + n] = positions
    host[2 * bucket : 3 * bucket] = np.arange(bucket, dtype=np.int32)
    grid = host[3 * bucket :].reshape(bucket, width)
    grid[:] = 0
    grid[:n, : tables.shape[1]] = tables
    slots_host[:] = -1
    slots_host[:n] = slots
