"""Arrays as the kernels take them (shared by the op modules)."""

from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np


def i32(v: int) -> np.int32:
    return np.int32(v)


def f32_rows(x) -> Any:
    """float32, C-contiguous, 16-byte aligned (the matmul reads rows 16 bytes at a time)."""
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    return x if x.data.ptr % 16 == 0 else x.copy()


def index(a, dtype=cp.int32) -> Any:
    return cp.ascontiguousarray(cp.asarray(a), dtype=dtype)
