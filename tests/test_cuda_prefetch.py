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


@pytest.mark.parametrize("ahead", [1, 2])
def test_delta_rule_prefetch_keeps_its_bits(budget, ahead):
    """The decode delta rule asking L2 for the next weights (plan.L2_PREFETCH_AHEAD) leaves its
    outputs and states as without."""
    from kernels.base import RecurrentRows

    kh, vh, kd, vd, kw, s = 4, 8, 128, 128, 4, 3
    qkv = 2 * kh * kd + vh * vd
    ops = CudaOps(exact=True)
    w_out = ops.upload(Weight.from_f32(_rand(512, vh * vd, scale=0.05), "f16"))
    gate_up = ops.upload_gate_up(*(Weight.from_f32(_rand(1024, 512, scale=0.05), "f16") for _ in range(2)))
    a_log, dt_bias = ops.tensor(np.log(np.linspace(1.0, 16.0, vh)).astype(np.float32)), ops.tensor(_rand(vh))
    mixed, a, b = (cp.asarray(_rand(s, n)) for n in (qkv, vh, vh))
    init = [_rand(kw - 1, qkv, scale=0.1), _rand(vh, kd, vd, scale=0.1)]
    got = []
    for level in (0, ahead):
        budget(1 << 30)
        saved = plan.L2_PREFETCH_AHEAD
        plan.L2_PREFETCH_AHEAD = level
        try:
            states = [ops.state_alloc(1, qkv, kw, vh, kd, vd) for _ in range(s)]
            for st in states:
                ops.state_write(st, init)
            rows = RecurrentRows([(i, i + 1) for i in range(s)], [100] * s, states, [False] * s, [()] * s)
            out = ops.gated_delta(mixed, a, b, a_log, dt_bias, rows, 0, kh, prefetch=(w_out, gate_up))
            got.append((cp.asnumpy(out).tobytes(), b"".join(cp.asnumpy(st.buf).tobytes() for st in states)))
        finally:
            plan.L2_PREFETCH_AHEAD = saved
    assert got[1] == got[0]
