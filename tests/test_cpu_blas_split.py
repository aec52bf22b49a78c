"""lockstep_kernels/cpu/blas_split.py: exact mode off's BLAS products of many rows, the weight's tiles dealt to the
engine's threads, agree with the row kernel's products (float32 tolerance) for every weight layout."""

import threading

import numpy as np
import pytest

from lockstep_kernels.cpu.ops import KERNEL_ROWS_16, CpuOps
from lockstep_kernels.weights import RowStack, Weight, concat_rows

RNG = np.random.default_rng(20261202)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
def test_split_products_match_the_row_kernel(dtype, threads):
    fast, exact = CpuOps(exact=False, threads=threads), CpuOps(exact=True)
    w = Weight.from_f32(_rand(301, 64), dtype)  # 301 rows: tiles of unequal size
    x = _rand(KERNEL_ROWS_16 + 9, 64)
    assert fast.matmul_family(x.shape[0], w) == "blas"
    bias, residual = _rand(301), _rand(x.shape[0], 301)
    got = fast.matmul(x, w, bias=bias, residual=residual)
    np.testing.assert_allclose(got, exact.matmul(x, w, bias=bias, residual=residual), rtol=1e-4, atol=1e-4)
    if threads > 1:  # the tiles really went to helper threads
        assert any(t.name.startswith("lockstep-blas") for t in threading.enumerate())


def test_a_row_stack_is_split_across_its_parts():
    fast, exact = CpuOps(exact=False, threads=2), CpuOps(exact=True)
    parts = [Weight.from_f32(_rand(n, 32), dt) for n, dt in ((40, "f32"), (7, "q8_0"), (90, "f16"))]
    w = concat_rows(parts)
    assert isinstance(w, RowStack)
    x = _rand(80, 32)
    np.testing.assert_allclose(fast.matmul(x, w), exact.matmul(x, w), rtol=1e-4, atol=1e-4)
