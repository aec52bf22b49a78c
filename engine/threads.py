"""CPU thread counts, set once per engine process (`-t/--threads`) before any kernel runs.

Two pools compute on the CPU: BLAS (exact mode off, steps of many rows) and the compiled kernels
(numba, and lockstep_kernels/cpu/workers.py). Left to their defaults both start one thread per core and spin
between calls, taking the cores the compute thread and the HTTP loop need. The engine gives the
compiled kernels the flag's count and BLAS one thread a call; the flag's threads split BLAS products
by weight tiles instead (lockstep_kernels/cpu/blas_split.py).

The default, as llama-server's, is one thread per physical core this process may run on (SMT siblings
share a core's multiply units, so a second thread on one only adds barrier waits), at most THREADS_CAP.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping

from contract.env import THREADS as ENV_THREADS

THREADS_CAP = 8  # beyond it a decode step's row work is too small to split further
BLAS_THREADS = 1  # per BLAS call: its own threads stall each other at barriers on busy cores
THREADS_HELP = (f"CPU threads for computation: BLAS and the compiled kernels; -1 = the default: {ENV_THREADS} when "
                f"set, else one per physical core this process may use (its CPU affinity), at most {THREADS_CAP}. "
                "More split large matmuls across cores: faster on idle cores, slower when other processes compete "
                "for them")
_TOPOLOGY = "/sys/devices/system/cpu/cpu{}/topology/{}"


def physical_cores(cpus: Iterable[int] | None = None, topology: str = _TOPOLOGY) -> int:
    """Distinct (package, core) pairs among `cpus` (default: this process's affinity); a CPU whose
    topology cannot be read counts as a core of its own."""
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        try:
            with open(topology.format(cpu, "physical_package_id")) as pkg, open(topology.format(cpu, "core_id")) as core:
                cores.add((pkg.read().strip(), core.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def resolve_threads(flag: int | None, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(count, where it came from): -t N (N >= 1), else LLAMA_ARG_THREADS (llama-server's variable), else
    the physical cores. A -1 from either means the default; a bad variable is a ValueError naming it."""
    env = os.environ if env is None else env
    if flag is not None and flag >= 1:
        return flag, "-t"
    raw = env.get(ENV_THREADS, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value == 0 or value < -1:
            raise ValueError(f"{ENV_THREADS}={raw!r}: expects an integer >= 1, or -1 for the default")
        if value >= 1:
            return value, ENV_THREADS
    return min(physical_cores(), THREADS_CAP), f"physical cores, at most {THREADS_CAP}"


def configure_threads(n: int) -> None:
    """Before numba's pool starts (it reads its size at import) and before BLAS's first call."""
    # idle OpenMP workers sleep rather than spin: a spinning one takes a core from the compute thread
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "numba" not in sys.modules:
        os.environ["NUMBA_NUM_THREADS"] = str(n)
    import numpy  # noqa: F401  (threadpoolctl limits the BLAS libraries loaded so far: NumPy's)
    from threadpoolctl import threadpool_limits

    threadpool_limits(BLAS_THREADS)  # the engine's threads split BLAS products instead (lockstep_kernels/cpu/blas_split.py)


def threads_report() -> dict:
    """What the libraries in this process say they use (so /props shows what was granted)."""
    from threadpoolctl import threadpool_info

    blas = sorted({p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"})
    compiled = None
    if "numba" in sys.modules:
        import numba

        compiled = numba.config.NUMBA_NUM_THREADS
    return {"blas": blas, "compiled_pool": compiled}
