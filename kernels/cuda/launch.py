"""Kernel launches, with programmatic dependent launch (PDL) inside captured CUDA graphs.

A decode step is a chain of ~150 (1B) to ~300 (8B) short kernels; between two of them the device
idles while the first drains and the second starts and waits for its first weights. Launched with
PDL (sm_90 and later), a kernel may start while its predecessor still runs: it issues its first
weight loads, then `pdl_start()` (common.cuh) waits for the predecessor's results. Results cannot
change: every kernel touches memory that another kernel writes only after that wait.

CuPy's launch cannot set launch attributes, so captured launches go through the driver's
cuLaunchKernelEx (ctypes); capture happens once per graph, so its host cost does not matter.
Outside a capture every launch is CuPy's own, except those passing tensor maps by value.
LOCKSTEP_PDL=0 turns PDL off (for comparisons).
"""

from __future__ import annotations

import ctypes
import functools
import os

import cupy as cp
import numpy as np

from kernels.cuda.tensor_map import TensorMap

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class _Attribute(ctypes.Structure):
    # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union (as words: a c_char array
    # would take bytes only up to the first zero)
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]


@functools.cache
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuLaunchKernelEx
    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def pdl_supported() -> bool:
    if os.environ.get("LOCKSTEP_PDL", "1") == "0":
        return False
    if int(cp.cuda.Device().compute_capability) < 90:
        return False
    try:
        _driver()
    except (OSError, AttributeError):
        return False
    return True


def _c_arg(a):
    if isinstance(a, TensorMap):
        return a
    if isinstance(a, cp.ndarray):
        return ctypes.c_void_p(a.data.ptr)
    if isinstance(a, np.int32):
        return ctypes.c_int32(int(a))
    if isinstance(a, np.int64):
        return ctypes.c_int64(int(a))
    if isinstance(a, np.float32):
        return ctypes.c_float(float(a))
    raise TypeError(f"kernel argument of type {type(a).__name__}: pass arrays, TensorMap, np.int32, np.int64 or "
                    "np.float32")


def _function(fn) -> int:
    """The CUfunction of a CuPy RawKernel (compiled on first use)."""
    return int(fn.kernel.ptr if hasattr(fn, "kernel") else fn.ptr)


def _driver_launch(fn, grid, block, args, shared: int, stream, pdl: bool) -> None:
    values = [_c_arg(a) for a in args]
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    attr = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1
    grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
    cfg = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared, ctypes.c_void_p(stream.ptr),
                  ctypes.pointer(attr), 1 if pdl else 0)
    err = _driver()(ctypes.byref(cfg), ctypes.c_void_p(_function(fn)), params, None)
    if err:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUDA error {err}")


def launch(fn, grid, block, args, shared: int = 0) -> None:
    """fn(grid, block, args) on the current stream; with PDL while that stream is being captured.
    Arguments that CuPy cannot pass (tensor maps) go through the driver's launch as well."""
    stream = cp.cuda.get_current_stream()
    pdl = bool(stream.ptr) and pdl_supported() and stream.is_capturing()
    if pdl or any(isinstance(a, TensorMap) for a in args):
        _driver_launch(fn, grid, block, args, shared, stream, pdl)
    else:
        fn(grid, block, args, shared_mem=shared)
