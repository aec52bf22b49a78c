"""CPU thread counts, set once per engine process (`-t/--threads`) before any kernel runs.

Two pools compute on the CPU: BLAS (exact mode off, steps of many rows) and the compiled kernels
(numba). Left to their defaults both start one thread per core and spin between calls, taking the
cores the compute thread and the HTTP loop need; the engine sets both to the flag's count instead.
"""

from __future__ import annotations

import os
import sys

DEFAULT_THREADS = 1
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

    threadpool_limits(n)


def threads_report() -> dict:
    """What the libraries in this process say they use (so /props shows what was granted)."""
    from threadpoolctl import threadpool_info

    blas = sorted({p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"})
    compiled = None
    if "numba" in sys.modules:
        import numba

        compiled = numba.config.NUMBA_NUM_THREADS
    return {"blas": blas, "compiled_pool": compiled}
