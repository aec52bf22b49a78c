"""TMA tensor maps (CUtensorMap), encoded by the driver and passed by value as kernel parameters.

CuPy has no binding for cuTensorMapEncodeTiled, so it is called through ctypes; a map is 128 bytes
that lockstep_kernels/cuda/launch.py hands to cuLaunchKernelEx as a parameter (`__grid_constant__`).
"""

from __future__ import annotations

import ctypes
import functools

UINT16 = 1  # CUtensorMapDataType: the 16-bit values are copied, never converted
SWIZZLE_NONE, SWIZZLE_128B = 0, 3
L2_PROMOTION_256B = 3
OOB_ZERO = 0  # boxes reaching past the tensor read zeros there


class TensorMap(ctypes.Structure):
    _fields_ = [("words", ctypes.c_uint64 * 16)]


@functools.cache
def _encode():
    fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.POINTER(TensorMap), ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def tiled_2d(a, box: tuple[int, int], swizzle: int) -> TensorMap:
    """A map of the 2-d 16-bit CuPy array `a` (rows, columns) copied in boxes of (columns, rows)."""
    rows, cols = (int(s) for s in a.shape)
    if a.dtype.itemsize != 2 or not a.flags.c_contiguous or a.data.ptr % 16 or cols * 2 % 16:
        raise ValueError(f"a tensor map needs a contiguous 16-bit array with 16-byte rows, got {a.dtype} {a.shape}")
    return _encoded(a.data.ptr, rows, cols, tuple(box), swizzle)


@functools.lru_cache(maxsize=4096)
def _encoded(ptr: int, rows: int, cols: int, box: tuple[int, int], swizzle: int) -> TensorMap:
    """A map is a function of these alone, so a prompt's every layer reuses its weights' maps (and
    an address the memory pool hands out again, its map)."""
    m = TensorMap()
    err = _encode()(ctypes.byref(m), UINT16, 2, ctypes.c_void_p(ptr), (ctypes.c_uint64 * 2)(cols, rows),
                    (ctypes.c_uint64 * 1)(cols * 2), (ctypes.c_uint32 * 2)(*box), (ctypes.c_uint32 * 2)(1, 1), 0,
                    swizzle, L2_PROMOTION_256B, OOB_ZERO)
    if err:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUDA error {err} for {(rows, cols)}, box {box}")
    return m
