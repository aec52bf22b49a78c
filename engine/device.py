"""Which compute backend this launch uses, and how much memory it has free."""

from __future__ import annotations

import logging

import psutil

from engine.exits import NO_CUDA, Fatal

log = logging.getLogger("engine.device")


def cuda_problem() -> str | None:
    """Why the CUDA backend cannot run here, or None when it can."""
    try:
        import cupy
        import kernels.cuda.ops  # noqa: F401 - importing it is the check
    except Exception as e:  # ImportError, or CuPy failing on a missing driver or toolkit
        return f"the CUDA backend does not import ({type(e).__name__}: {e})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device found"
        cupy.zeros(1, dtype=cupy.float32).sum().item()  # a listed device can still fail to run a kernel
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def resolve_device(requested: str) -> str:
    """'cpu' or 'cuda'. `auto` falls back to the CPU quietly; an explicit `cuda` that cannot run is fatal."""
    if requested == "cpu":
        return "cpu"
    problem = cuda_problem()
    if problem is None:
        return "cuda"
    if requested == "cuda":
        raise Fatal(NO_CUDA, f"error: no usable CUDA device: {problem}")
    log.info("device auto: using the CPU backend (%s)", problem)
    return "cpu"


def free_memory(device: str) -> int:
    """Bytes the KV pool may take on `device`."""
    if device == "cuda":
        import cupy

        free, _total = cupy.cuda.runtime.memGetInfo()
        return int(free)
    return int(psutil.virtual_memory().available)
