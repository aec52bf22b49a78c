"""The NumPy backend.

On an x86 CPU without F16C (a baseline x86-64, or a VM that hides the flag) LLVM turns float16 <->
float32 conversions into calls of __extendhfsf2 / __truncsfhf2, and numba's JIT aborts the process
when it cannot find them. libgcc_s (GCC 12 on) defines them; loading it puts them where the JIT looks.
"""

import contextlib
import sys

if sys.platform.startswith("linux"):
    import llvmlite.binding

    with contextlib.suppress(RuntimeError):  # not there: a CPU with F16C never calls them
        llvmlite.binding.load_library_permanently("libgcc_s.so.1")
