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
import struct

import cupy as cp
import numpy as np

from contract.env import PDL, switch
from lockstep_kernels.cuda.tensor_map import TensorMap

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
    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def pdl_supported() -> bool:
    if not switch(os.environ, PDL, default=True):
        return False
    if int(cp.cuda.Device().compute_capability) < 90:
        return False
    try:
        _driver()
    except (OSError, AttributeError):
        return False
    return True


# A scalar or pointer argument goes into an 8-byte slot of one buffer and the driver is handed a
# pointer to it (it copies each parameter's own size); a tensor map is handed its cached structure.
_SLOT_FORMAT = {np.int32: "i4x", np.int64: "q", np.float32: "f4x"}


@functools.lru_cache(maxsize=1024)
def _slots(types: tuple) -> tuple[str, tuple[int, ...]]:
    """The struct format of the non-map arguments and each argument's slot (-1: a tensor map)."""
    fmt, where, n = "<", [], 0
    for t in types:
        if issubclass(t, TensorMap):
            where.append(-1)
            continue
        if issubclass(t, cp.ndarray):
            fmt += "Q"
        elif t in _SLOT_FORMAT:
            fmt += _SLOT_FORMAT[t]
        else:
            raise TypeError(f"kernel argument of type {t.__name__}: pass arrays, TensorMap, np.int32, np.int64 or "
                            "np.float32")
        where.append(n)
        n += 1
    return fmt, tuple(where)


def _function(fn) -> int:
    """The CUfunction of a CuPy RawKernel (compiled on first use)."""
    return int(fn.kernel.ptr if hasattr(fn, "kernel") else fn.ptr)


@functools.lru_cache(maxsize=4096)
def _config(grid: tuple, block: tuple, shared: int, stream: int, pdl: bool) -> _Config:
    """Launch configurations repeat layer after layer; the driver only reads them."""
    attr = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1
    grid, block = grid + (1,) * (3 - len(grid)), block + (1,) * (3 - len(block))
    cfg = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared, ctypes.c_void_p(stream),
                  ctypes.pointer(attr), 1 if pdl else 0)
    cfg._attr = attr  # kept alive with the configuration
    return cfg


def _driver_launch(fn, grid, block, args, shared: int, stream, pdl: bool) -> None:
    fmt, where = _slots(tuple(map(type, args)))
    n = len(args)
    buf = ctypes.create_string_buffer(16 * n)  # the slots, then the pointer to each parameter
    struct.pack_into(fmt, buf, 0, *[a.data.ptr if isinstance(a, cp.ndarray) else a
                                    for a, w in zip(args, where, strict=True) if w >= 0])
    base = ctypes.addressof(buf)
    struct.pack_into(f"<{n}Q", buf, 8 * n, *[base + 8 * w if w >= 0 else ctypes.addressof(a)
                                             for a, w in zip(args, where, strict=True)])
    cfg = _config(tuple(grid), tuple(block), shared, stream.ptr, pdl)
    err = _driver()(ctypes.byref(cfg), _function(fn), base + 8 * n, None)
    if err:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUDA error {err}")


def launch(fn, grid, block, args, shared: int = 0, early: bool = True) -> None:
    """fn(grid, block, args) on the current stream; with PDL while that stream is being captured,
    unless `early` is False (the kernel then starts once the one before has finished). Arguments that
    CuPy cannot pass (tensor maps) go through the driver's launch as well."""
    stream = cp.cuda.get_current_stream()
    pdl = early and bool(stream.ptr) and pdl_supported() and stream.is_capturing()
    if pdl or any(isinstance(a, TensorMap) for a in args):
        _driver_launch(fn, grid, block, args, shared, stream, pdl)
    else:
        fn(grid, block, args, shared_mem=shared)
