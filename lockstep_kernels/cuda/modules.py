"""The `.cu` sources beside this file, compiled by NVRTC through CuPy, once per set of defines."""

from __future__ import annotations

import functools
import re
import time
from pathlib import Path

HERE = Path(__file__).parent
COMMON = "common.cuh"
# No fast math anywhere: exact paths depend on IEEE division, square root and expf, and on FMA
# contraction being off unless a kernel asks for __fmaf_rn.
OPTIONS = ("-std=c++17", "-fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")
ARCH = {"wgmma.cu": "sm_90a", "wgmma_kq.cu": "sm_90a", "attention_wgmma.cu": "sm_90a", "attention_ws.cu": "sm_90a"}  # sources with instructions of one architecture only (wgmma: H100/H200)


def source(name: str) -> str:
    """A kernel source with its headers (common.cuh, attention_tc.cuh) pasted in: CuPy's cache keys on
    the text it compiles, so an edit of a header must change that text; NVRTC gets no include path."""
    text = (HERE / name).read_text()
    for header in re.findall(r'^#include "(\w+\.cuh)"$', text, flags=re.M):
        text = text.replace(f'#include "{header}"', (HERE / header).read_text())
    return text


def sources() -> list[Path]:
    return sorted(HERE.glob("*.cu"))


@functools.cache
def module(name: str, defines: tuple[tuple[str, int], ...] = ()):
    import cupy

    opts = OPTIONS + tuple(f"-D{k}={v}" for k, v in defines) + ((f"-arch={ARCH[name]}",) if name in ARCH else ())
    return cupy.RawModule(code=source(name), options=opts)


_built = [0.0]  # seconds first uses of kernels spent in NVRTC (or CuPy's disk cache) and the driver's load


def build_seconds() -> float:
    """Seconds this process has spent building and loading kernels so far: the exactness self-check
    pays them for the kernels it runs first, the warm-up for the rest."""
    return _built[0]


@functools.cache
def kernel(name: str, function: str, defines: tuple[tuple[str, int], ...] = ()):
    t0 = time.perf_counter()
    fn = module(name, defines).get_function(function)
    _built[0] += time.perf_counter() - t0
    return fn


@functools.cache
def big_smem_kernel(name: str, function: str, shared: int, defines: tuple[tuple[str, int], ...] = ()):
    """A kernel allowed `shared` bytes of dynamic shared memory (over 48 KB needs the opt-in)."""
    fn = kernel(name, function, defines)
    fn.max_dynamic_shared_size_bytes = shared
    return fn
