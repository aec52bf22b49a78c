"""CUDA backend: CuPy with kernels from the `.cu` sources here (see ops.CudaOps).

Importing this package needs no CuPy; `available()` says whether this machine can run it.
"""

from __future__ import annotations


def available() -> tuple[bool, str]:
    """(True, device description) when CuPy imports, a device is present and a compiled kernel
    runs on it; otherwise (False, the reason)."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a CuPy build that cannot find its CUDA libraries
        return False, f"CuPy is not importable: {e}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return False, f"no CUDA device: {e}"
    if n < 1:
        return False, "no CUDA device"
    try:
        probe = cupy.RawKernel(
            'extern "C" __global__ void probe(int* x) { x[threadIdx.x] = threadIdx.x * 2; }', "probe"
        )
        x = cupy.zeros(4, dtype=cupy.int32)
        probe((1,), (4,), (x,))
        if x.get().tolist() != [0, 2, 4, 6]:
            return False, "a test kernel ran but returned wrong values"
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    except Exception as e:
        return False, f"CUDA device present but a kernel could not run: {e}"
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    gib = props["totalGlobalMem"] / 2**30
    return True, f"{name}, {gib:.0f} GiB, compute capability {props['major']}.{props['minor']}"


def free_memory() -> tuple[int, int]:
    """(free, total) bytes of the current device: what the driver reports free plus what CuPy's
    pool holds unused (this process can reuse it)."""
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    return int(free) + int(cupy.get_default_memory_pool().free_bytes()), int(total)


def release_cached() -> None:
    """Hands the blocks CuPy's pools keep for reuse back to the driver (after the arrays using them are gone)."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
