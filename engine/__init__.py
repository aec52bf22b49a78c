"""The inference engine (`python -m engine`, `lockstep-engine`)."""

import os

# OpenBLAS reads this once, when it loads (NumPy's import, which follows this package's): after each call
# its idle threads otherwise spin for 2**28 cycles (about 0.1 s), taking a core from the compute thread
# and the kernel workers (lockstep_kernels/cpu/workers.py) through the first decode steps after every prompt that
# exact mode off multiplied with BLAS. 2**4 cycles: they sleep at once and wake for the next call.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
