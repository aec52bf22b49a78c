"""CPU thread counts, set once per engine process (`-t/--threads`) before any kernel runs.

Two pools compute on the CPU: BLAS (exact mode off, steps of many rows) and the compiled kernels
(numba, and kernels/cpu/workers.py). Left to their defaults both start one thread per core and spin
between calls, taking the cores the compute thread and the HTTP loop need. The engine gives the
compiled kernels the flag's count and BLAS one thread a call; the flag's threads split BLAS products
by weight tiles instead (kernels/cpu/blas_split.py).
"""

from __future__ import annotations

import os
import sys

DEFAULT_THREADS = 1
BLAS_THREADS = 1  # per BLAS call: its own threads stall each other at barriers on busy cores
THREADS_HELP = (f"CPU threads for computation: BLAS and the compiled kernels (default: {DEFAULT_THREADS}). More split "
                "large matmuls across cores: faster on idle cores, slower when other processes compete for them")


def configure_threads(n: int) -> None:
    """Before numba's pool starts (it reads its size at import) and before BLAS's first call."""
    # idle OpenMP workers sleep rather than spin: a spinning one takes a core from the compute thread
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "numba" not in sys.modules:
        os.environ["NUMBA_NUM_THREADS"] = str(n)
    import numpy  # noqa: F401  (threadpoolctl limits the BLAS libraries loaded so far: NumPy's)
    from threadpoolctl import threadpool_limits

    threadpool_limits(BLAS_THREADS)  # the engine's threads split BLAS products instead (kernels/cpu/blas_split.py)


def threads_report() -> dict:
    """What the libraries in this process say they use (so /props shows what was granted)."""
    from threadpoolctl import threadpool_info

    blas = sorted({p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"})
    compiled = None
    if "numba" in sys.modules:
        import numba

        compiled = numba.config.NUMBA_NUM_THREADS
    return {"blas": blas, "compiled_pool": compiled}
