"""The one-row matmul's L2 prefetch (plan.L2_PREFETCH_BYTES: weights asked of L2 before the kernel
waits for its input) changes no bit: outputs with the prefetch of part or all of the matrix equal
those without, for plain, bias/residual and gated products, f16 and bf16, padded and odd shapes."""

import numpy as np
import pytest

from tests.cuda_fixtures import cp

pytestmark = pytest.mark.gpu

from kernels.cuda import plan  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402
from kernels.weights import Weight  # noqa: E402

RNG = np.random.default_rng()
# (n, k): splits 1 .. 16, K padded (1000) and odd (37); the 4B hybrid's out_proj and gate_up
SHAPES = [(37, 37), (300, 1000), (2560, 4096), (18432, 2560), (60000, 512)]
BUDGETS = [0, 1 << 20, 1 << 30]  # none, part of most matrices, all of each


def _rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.fixture
def budget():
    saved = plan.L2_PREFETCH_BYTES
    yield lambda b: setattr(plan, "L2_PREFETCH_BYTES", b)
    plan.L2_PREFETCH_BYTES = saved


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_prefetch_keeps_the_one_row_bits(budget, dtype, shape):
    n, k = shape
    ops = CudaOps(exact=True)
    dw = ops.upload(Weight.from_f32(_rand(n, k, scale=k**-0.5), dtype))
    assert plan.prefetch_chunks(n, k, plan.split_k(n, k, ops.sm_count)) >= 0
    bias, res = ops.tensor(_rand(n)), cp.asarray(_rand(1, n))
    x = cp.asarray(_rand(1, k, scale=3.0))
    for args in ((None, None), (bias, res)):
        outs = []
        for b in BUDGETS:
            budget(b)
            outs.append(cp.asnumpy(ops.matmul(x, dw, *args, prefetch=True)).tobytes())
        assert outs[1] == outs[0] and outs[2] == outs[0], f"bias/res {[a is not None for a in args]}"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_prefetch_keeps_the_gated_product_and_norm_bits(budget, dtype):
    n, k = 1024, 2560
    ops = CudaOps(exact=True)
    gu = ops.upload_gate_up(*(Weight.from_f32(_rand(n, k, scale=k**-0.5), dtype) for _ in range(2)))
    nw = ops.tensor(_rand(k))
    x = cp.asarray(_rand(1, k, scale=3.0))
    outs = []
    for b in BUDGETS:
        budget(b)
        outs.append(cp.asnumpy(ops.matmul(ops.rms_norm(x, nw, 1e-6), gu, prefetch=True)).tobytes())
    assert outs[1] == outs[0] and outs[2] == outs[0]
