"""The integer Q4_K / Q6_K kernels (kquant_mm.cu) on the GPU give kernels/cuda/kquant_ref.py's bits:
the activation records of kq_quant_x byte for byte, every matmul element at every row count (the
one-row dp4a kernel and the int8-MMA kernels of 1-8 token tiles), exact mode on and off, and
norm_matmul's fused quantisation the bits of rms_norm's rows quantised."""

import numpy as np
import pytest

from tests.cuda_fixtures import cp, gpu, gpu_off  # noqa: F401 (gpu, gpu_off: fixtures)

pytestmark = pytest.mark.gpu

from kernels.cuda import kquant_ref, plan  # noqa: E402
from kernels.quants.writer import quantize  # noqa: E402
from kernels.weights import Weight  # noqa: E402

RNG = np.random.default_rng()
KQUANTS = ["q4_k", "q6_k"]
ROWS = (1, 2, 8, 9, 17, 33, 64, 100)


def _raw(n, k, dtype):
    w = RNG.standard_normal((n, k)) * RNG.choice([1e-2, 1.0, 30.0], (n, 1)) * k**-0.5
    return quantize(w.astype(np.float32), dtype)


def _acts(m, k):
    x = RNG.standard_normal((m, k)).astype(np.float32)
    x[:, RNG.integers(0, k, 4)] *= 50
    x[0, :32] = 0  # an all-zero chunk
    return x


@pytest.mark.parametrize("dtype", KQUANTS)
def test_activation_records_are_the_reference_bytes(gpu, dtype):
    dw = gpu.upload(Weight(_raw(16, 1024, dtype), dtype))
    x = _acts(37, 1024)
    xq, xs = gpu._kq_act(cp.asarray(x), dw)
    rec, want = kquant_ref.records(x)
    assert cp.asnumpy(xq).tobytes() == rec.tobytes()
    assert cp.asnumpy(xs).tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", KQUANTS)
@pytest.mark.parametrize("shape", [(40, 512), (256, 1024), (1000, 2048), (4096, 256)], ids=str)
def test_matmul_gives_the_reference_bits_at_every_row_count(gpu, gpu_off, dtype, shape):
    n, k = shape
    raw = _raw(n, k, dtype)
    split = plan.split_k(n, k, gpu.sm_count, dtype)
    dw = gpu.upload(Weight(raw, dtype))
    for m in ROWS:
        x = _acts(m, k)
        want = kquant_ref.matmul(raw, dtype, x, split)
        for ops in (gpu, gpu_off):
            got = cp.asnumpy(ops.matmul(cp.asarray(x), dw))
            diff = np.count_nonzero(got != want)
            assert got.tobytes() == want.tobytes(), f"m={m} exact={ops.exact}: {diff} of {got.size} differ"


@pytest.mark.parametrize("dtype", KQUANTS)
def test_norm_matmul_quantises_rms_norm_rows(gpu, dtype):
    n, k = 512, 2048
    raw = _raw(n, k, dtype)
    dw, nw = gpu.upload(Weight(raw, dtype)), gpu.tensor(RNG.standard_normal(k).astype(np.float32))
    for m in (1, 16, 64):
        x = cp.asarray(_acts(m, k) * 3)
        normed = cp.asnumpy(gpu.rms_norm(x, nw, 1e-5))
        want = kquant_ref.matmul(raw, dtype, normed, plan.split_k(n, k, gpu.sm_count, dtype))
        assert cp.asnumpy(gpu.norm_matmul(x, nw, 1e-5, dw)).tobytes() == want.tobytes()
