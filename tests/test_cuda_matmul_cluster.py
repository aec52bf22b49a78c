"""matmul.cu's one-row kernel on clusters (mm_*_one_cN, plan.cluster_launch: a row tile's K slices over
N blocks, combined through distributed shared memory) against the one-row kernel itself: the same sums,
so the same bits, at every split it takes, padded K, with bias and residual, inside a graph of PDL
launches too, and in a tiny hybrid model's decode."""

import numpy as np
import pytest

from tests.cuda_fixtures import cp

pytestmark = pytest.mark.gpu

from kernels.cuda import plan  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402
from kernels.weights import Weight  # noqa: E402

RNG = np.random.default_rng()
# (n, k): splits 2 (40 x 70: K padded), 16, 32 (300 x 1000), and the 4B hybrid's out_proj and down
SHAPES = [(40, 70), (300, 1000), (2560, 4096), (2560, 9216), (4096, 2560)]


def _rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.fixture
def every_shape(monkeypatch):
    """Clusters for every one-row launch whose split allows them, not only those with an idle last wave."""
    monkeypatch.setattr(plan, "CLUSTER_WASTE", 0.0)


def _ops(cluster: int) -> CudaOps:
    ops = CudaOps(exact=True)
    ops.mm_cluster = cluster
    return ops


@pytest.mark.parametrize("cluster", plan.CLUSTER_SIZES)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cluster_kernel_gives_the_one_row_kernels_bits(every_shape, cluster, dtype, shape):
    n, k = shape
    new, old = _ops(cluster), _ops(0)
    dw = new.upload(Weight.from_f32(_rand(n, k, scale=k**-0.5), dtype))
    mm = plan.matmul_launch(dtype, 1, n, k, new.sm_count)
    if plan.cluster_launch(mm, dtype, cluster, new.sm_count) is None:
        pytest.skip(f"split {mm.split} < cluster {cluster}")
    bias, res = new.tensor(_rand(n)), cp.asarray(_rand(1, n))
    for _ in range(3):
        x = cp.asarray(_rand(1, k, scale=3.0))
        for args in ((None, None), (bias, None), (None, res), (bias, res)):
            got, want = (cp.asnumpy(o.matmul(x, dw, *args)) for o in (new, old))
            assert got.tobytes() == want.tobytes(), f"bias/res {[a is not None for a in args]}"


@pytest.mark.parametrize("cluster", [4, 8])
def test_cluster_kernel_in_a_graph_of_pdl_launches(cluster):
    """Back to back in a captured graph (the decode step's PDL launches), each reading the one before."""
    n = k = 2560
    new, old = _ops(cluster), _ops(0)
    ws = [new.upload(Weight.from_f32(_rand(n, k, scale=k**-0.5), "f16")) for _ in range(4)]
    mm = plan.matmul_launch("f16", 1, n, k, new.sm_count)
    if plan.cluster_launch(mm, "f16", cluster, new.sm_count) is None:  # 160 tiles: clusters on an H200's 132 SMs
        pytest.skip(f"{n} rows fill this device's waves")
    x0 = cp.asarray(_rand(1, k))

    def chain(ops):
        x = x0
        for w in ws:
            x = ops.matmul(x, w, None, x)
        return x

    want = cp.asnumpy(chain(old))
    assert cp.asnumpy(chain(new)).tobytes() == want.tobytes()  # also builds the kernel before the capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = chain(new)
        g = stream.end_capture()
        for _ in range(3):
            g.launch(stream)
            stream.synchronize()
            assert cp.asnumpy(out).tobytes() == want.tobytes()



@pytest.mark.parametrize("cluster", (0, *plan.CLUSTER_SIZES))
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("n, heads", [(2560, 32), (4096, 32), (2560, 64)], ids=str)
def test_gated_prologue_gives_the_separate_ops_bits(every_shape, cluster, dtype, n, heads):
    """A DeltaNet out_proj's row: gated_rms_norm of each 128-value head, then the matmul with its residual,
    in one launch (mm_*_gated, alone or on clusters): the bits of the two launches."""
    d = plan.GATED_SEG
    k = heads * d
    new, old = _ops(cluster), _ops(0)
    new.gated_prologue = True
    dw = new.upload(Weight.from_f32(_rand(n, k, scale=k**-0.5), dtype))
    mm = plan.gated_launch(dtype, 1, n, k, dw.kp, d, new.sm_count, cluster)
    assert mm is not None and mm.kernel.startswith(f"mm_{dtype}_gated")
    nw = new.tensor(_rand(d))
    for _ in range(3):
        x, gate = cp.asarray(_rand(heads, d, scale=2.0)), cp.asarray(_rand(heads, d, scale=2.0))
        res = cp.asarray(_rand(1, n))
        got = cp.asnumpy(new.gated_norm_matmul(x, nw, gate, 1e-6, dw, res))
        apart = cp.asnumpy(old.matmul(old.gated_rms_norm(x, nw, gate, 1e-6).reshape(1, k), dw, residual=res))
        assert got.tobytes() == apart.tobytes()
        assert cp.asnumpy(new.gated_norm_matmul(x, nw, gate, 1e-6, dw, None)).tobytes() == \
            cp.asnumpy(old.matmul(old.gated_rms_norm(x, nw, gate, 1e-6).reshape(1, k), dw)).tobytes()


def _layer(ops, x, g, r, ws, nw, eps=1e-6):
    """A hybrid layer's one-row matmuls around its norms: out_proj (gated) with the residual, the FFN (norm,
    gate|up, down with the residual), the next layer's normed in_proj and a normed q|k|v-sized one."""
    w_out, gate_up, down, w_in = ws
    heads = w_out.shape[1] // plan.GATED_SEG
    h = ops.gated_norm_matmul(x.reshape(heads, plan.GATED_SEG), nw[: plan.GATED_SEG], g.reshape(heads, -1), eps,
                              w_out, r)
    h2 = ops.ffn(h, nw, eps, gate_up, down)
    return h, h2, ops.norm_matmul(h2, nw, eps, w_in)


@pytest.mark.parametrize("build", ["s", "c4s", "gs", "c4gs"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_row_sums_give_the_norms_bits(build, dtype):
    """Producers taking their row's sums (mm_*_s) and the norms that then take them (mm_*_sums, the FFN's
    and in_proj's): the bits of the launches without them, plain and in a graph of PDL launches."""
    hidden, ffn, k_out = 2560, 9216, 4096
    new, old = _ops(4 if "c4" in build else 0), _ops(0)
    new.row_sums, new.gated_prologue = True, "g" in build
    up = new.upload
    ws = (up(Weight.from_f32(_rand(hidden, k_out, scale=k_out**-0.5), dtype)),
          new.upload_gate_up(Weight.from_f32(_rand(ffn, hidden, scale=hidden**-0.5), dtype),
                             Weight.from_f32(_rand(ffn, hidden, scale=hidden**-0.5), dtype)),
          up(Weight.from_f32(_rand(hidden, ffn, scale=ffn**-0.5), dtype)),
          up(Weight.from_f32(_rand(2048, hidden, scale=hidden**-0.5), dtype)))
    nw = new.tensor(_rand(hidden))
    x, g, r = cp.asarray(_rand(1, k_out, scale=2.0)), cp.asarray(_rand(1, k_out)), cp.asarray(_rand(1, hidden))
    want = [cp.asnumpy(a).tobytes() for a in _layer(old, x, g, r, ws, nw)]
    got = _layer(new, x, g, r, ws, nw)
    assert new._sums_of(got[1]) is not None  # the down projection took its row's sums
    assert [cp.asnumpy(a).tobytes() for a in got] == want
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        outs = _layer(new, x, g, r, ws, nw)
        graph = stream.end_capture()
        for _ in range(3):
            graph.launch(stream)
            stream.synchronize()
            assert [cp.asnumpy(a).tobytes() for a in outs] == want
