"""matvec.cu's one-row ring kernel against matmul.cu's one-row kernel: the same sums, so the same bits,
at every split it takes (1 .. 16 warps), rows of any length (padded K, K not a multiple of 4), with
bias, residual, the gated product and the norm prologue."""

import numpy as np
import pytest

from tests.cuda_fixtures import cp

pytestmark = pytest.mark.gpu

from lockstep_kernels.cuda import dispatch, plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402
from lockstep_kernels.weights import Weight  # noqa: E402


@pytest.fixture(scope="module")
def ring():
    ops = CudaOps(exact=True)
    ops.matvec = True  # off by default (LOCKSTEP_MATVEC)
    return ops

RNG = np.random.default_rng()
# (n, k): splits 1 (many tiles), 2, 4, 8, 16; K padded (70, 1000) and odd (37)
SHAPES = [(40, 70), (37, 37), (300, 1000), (2560, 4096), (4096, 2560), (12352, 2560), (18432, 2560), (2560, 9216),
          (60000, 512)]


def _rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_ring_kernel_gives_the_one_row_kernels_bits(ring, dtype, shape):
    n, k = shape
    old = CudaOps(exact=True)
    old.matvec = False
    w = Weight.from_f32(_rand(n, k, scale=k**-0.5), dtype)
    dw = ring.upload(w)
    # a split no build takes (300 x 1000 splits past 16 warps) runs mm_tc by design: same bits either way
    mv = plan.matvec_launch(dtype, n, k, ring.sm_count)
    assert dispatch.matmul_family(ring, 1, dw) == ("mv" if mv is not None else "mm_tc"), mv
    assert dispatch.matmul_family(old, 1, dw) == "mm_tc"
    nw, bias, res = ring.tensor(_rand(k)), ring.tensor(_rand(n)), cp.asarray(_rand(1, n))
    for _ in range(3):
        x = cp.asarray(_rand(1, k, scale=3.0))
        for args in ((None, None), (bias, None), (None, res), (bias, res)):
            got, want = (cp.asnumpy(o.matmul(x, dw, *args)) for o in (ring, old))
            assert got.tobytes() == want.tobytes(), f"bias/res {[a is not None for a in args]}"
        got, want = (cp.asnumpy(o.norm_matmul(x, nw, 1e-5, dw)) for o in (ring, old))
        apart = cp.asnumpy(old.matmul(old.rms_norm(x, nw, 1e-5), dw))
        assert got.tobytes() == want.tobytes() == apart.tobytes()


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("ffn", [1024, 9216])
def test_ring_kernel_gated_product_and_ffn(ring, dtype, ffn):
    k = 2560
    old = CudaOps(exact=True)
    old.matvec = False
    gu = ring.upload_gate_up(Weight.from_f32(_rand(ffn, k, scale=k**-0.5), dtype),
                             Weight.from_f32(_rand(ffn, k, scale=k**-0.5), dtype))
    down = ring.upload(Weight.from_f32(_rand(k, ffn, scale=ffn**-0.5), dtype))
    nw = ring.tensor(_rand(k))
    for _ in range(3):
        x = cp.asarray(_rand(1, k, scale=3.0))
        got, want = (cp.asnumpy(o.matmul(x, gu)) for o in (ring, old))
        assert got.tobytes() == want.tobytes()
        got, want = (cp.asnumpy(o.ffn(x, nw, 1e-6, gu, down)) for o in (ring, old))
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("n, heads, d", [(2560, 32, 128), (64, 8, 32), (300, 3, 100)], ids=str)
def test_gated_norm_prologue_gives_the_separate_ops_bits(ring, dtype, n, heads, d):
    """One row of a DeltaNet layer's out_proj: gated_rms_norm of each head's values, then the matmul
    with its residual, in one ring-kernel launch (mv_*_gated); the bits of the two ops apart."""
    k = heads * d
    old = CudaOps(exact=True)
    old.matvec = False
    dw = ring.upload(Weight.from_f32(_rand(n, k, scale=k**-0.5), dtype))
    assert plan.matvec_launch(dtype, n, k, ring.sm_count, "gated") is not None
    nw = ring.tensor(_rand(d))
    for _ in range(3):
        x, gate, res = (cp.asarray(_rand(*s, scale=2.0)) for s in ((heads, d), (heads, d), (1, n)))
        got = cp.asnumpy(ring.gated_norm_matmul(x, nw, gate, 1e-6, dw, res))
        want = cp.asnumpy(old.matmul(old.gated_rms_norm(x, nw, gate, 1e-6).reshape(1, k), dw, residual=res))
        assert got.tobytes() == want.tobytes()
        two = cp.asnumpy(ring.gated_norm_matmul(cp.concatenate([x, x]), nw, cp.concatenate([gate, gate]), 1e-6, dw,
                                                cp.concatenate([res, res])))
        assert two[1].tobytes() == got[0].tobytes()  # two rows take the separate ops: the same bits
