"""Which compute backend this launch uses, and how much memory it has free."""

from __future__ import annotations

import logging

import psutil

from engine.exits import NO_CUDA, Fatal

log = logging.getLogger("engine.device")


def cuda_problem() -> str | None:
    """Why the CUDA backend cannot run here, or None when it can."""
    try:
        from lockstep_kernels.cuda import available

        ok, detail = available()  # CuPy imports, a device is present, a compiled kernel runs on it
        if not ok:
            return detail
        import lockstep_kernels.cuda.ops  # noqa: F401 - the backend itself must import too
    except Exception as e:
        return f"the CUDA backend does not import ({type(e).__name__}: {e})"
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
        from lockstep_kernels.cuda import free_memory as cuda_free

        return cuda_free()[0]
    return int(psutil.virtual_memory().available)
