"""lockstep_kernels/cpu/expf.py's float32 exp, which the CPU attention's softmax and the FFN's silu use: close to
float64's, clamped to normal floats, and the same bits in a vectorised loop as element by element."""

import numpy as np
from numba import njit

from lockstep_kernels.cpu import compiled
from lockstep_kernels.cpu.expf import HIGH, LOW, exp32


@njit
def _exp_each(x, out):
    for i in range(x.shape[0]):
        out[i] = exp32(x[i])


def test_within_two_ulp_of_float64_over_the_normal_range():
    x = np.random.default_rng(1).uniform(LOW, HIGH, 400_000).astype(np.float32)
    x[:4] = [0.0, -1e-7, 1e-7, -0.5]
    got = np.empty_like(x)
    _exp_each(x, got)
    ref = np.exp(x.astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - ref) / ulp) <= 2.0
    assert got[0] == 1.0


def test_clamped_to_normal_floats_outside_the_range():
    x = np.array([-1000.0, LOW - 1, HIGH + 1, 1000.0], np.float32)
    got = np.empty_like(x)
    _exp_each(x, got)
    assert got[0] == got[1] and np.float32(2.0) ** -126 <= got[0] < 2e-38  # exp(LOW), never 0
    assert np.all(np.isfinite(got)) and got[2] == got[3] > 1e38


def test_silu_of_a_wide_row_has_each_elements_bits_alone():
    """silu_mul_rows over 1000 values (a vectorised loop) and over each value alone (a scalar one)."""
    y = (np.random.default_rng(2).standard_normal((1, 2000)) * 8).astype(np.float32)
    wide = np.empty((1, 1000), np.float32)
    compiled.silu_mul_rows(y, 1000, wide)
    one = np.empty((1, 1), np.float32)
    for i in range(0, 1000, 7):
        compiled.silu_mul_rows(np.array([[y[0, i], y[0, 1000 + i]]], np.float32), 1, one)
        assert one[0, 0].tobytes() == wide[0, i].tobytes(), i
