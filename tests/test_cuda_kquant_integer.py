"""The integer Q4_K / Q5_K / Q6_K kernels (kquant_mm.cu) on the GPU give lockstep_kernels/cuda/kquant_ref.py's bits:
the activation records of kq_quant_x byte for byte, every matmul element at every row count (the
one-row dp4a kernel, the int8-MMA kernels of 1-8 token tiles, those of 1-4 row tiles a warp and the
tiled one), exact mode on and off, and
norm_matmul's fused quantisation the bits of rms_norm's rows quantised."""

import numpy as np
import pytest

from tests.cuda_fixtures import cp, gpu, gpu_off  # noqa: F401 (gpu, gpu_off: fixtures)

pytestmark = pytest.mark.gpu

from lockstep_kernels.cuda import kquant_ref, plan  # noqa: E402
from lockstep_kernels.quants.writer import quantize  # noqa: E402
from lockstep_kernels.weights import Weight  # noqa: E402

RNG = np.random.default_rng()


@pytest.fixture(autouse=True)
def integer_kernels(monkeypatch):
    """The integer family, with mmq_*_tr at 2-16 rows as its rule picks (plan.KQ_TR: mmq_tc until measured)."""
    monkeypatch.setattr(plan, "KQ_INTEGER", True)
    monkeypatch.setattr(plan, "KQ_TR", None)


@pytest.fixture(params=[None, False, True], ids=["dispatch", "tiled", "tiled-split"])
def tiled(request, monkeypatch):
    """The dispatch's kernels, or the tiled kernel forced at every batch of 2 rows or more (a block
    walking all of K, or a block per K slice where split_k > 1)."""
    if request.param is not None:
        monkeypatch.setattr(plan, "KQ_TILE_ROWS", 2)
        monkeypatch.setattr(plan, "KQ_TILE_SPLIT", request.param)
    return request.param
KQUANTS = ["q4_k", "q5_k", "q6_k"]
ROWS = (1, 2, 8, 9, 16, 17, 33, 64, 100, 300)  # the tiled kernel where it fills the SMs (plan.kq_tile_grid)


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
    for m in (37, 100):  # a warp a chunk; 8 chunks a warp (wide batches)
        x = _acts(m, 1024)
        xq, xs = gpu._kq_act(cp.asarray(x), dw)
        rec, want = kquant_ref.records(x)
        assert cp.asnumpy(xq).tobytes() == rec.tobytes()
        assert cp.asnumpy(xs).tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", KQUANTS)
@pytest.mark.parametrize("shape", [(40, 512), (256, 1024), (1000, 2048), (4096, 256)], ids=str)
def test_matmul_gives_the_reference_bits_at_every_row_count(gpu, gpu_off, monkeypatch, dtype, shape):
    """The dispatch's kernel at each row count, then the tiled kernel forced from 2 rows on (its
    partial row blocks, partial token blocks, dead warps past N), a block walking all of K (4 or, from
    33 rows, 8 row tiles a block: plan.KQ_TILE8) and (where split_k > 1) a block per K slice."""
    n, k = shape
    raw = _raw(n, k, dtype)
    split = plan.split_k(n, k, gpu.sm_count, dtype)
    dw = gpu.upload(Weight(raw, dtype))
    for m in ROWS:
        x = _acts(m, k)
        want = kquant_ref.matmul(raw, dtype, x, split)
        # the dispatch; 2-16 rows also on mmq_tc and mmq_*_tr at 1, 2, 4 tiles a warp; the tiled kernel forced
        trs = (None, 0, 1, 2, 4) if 2 <= m <= 16 else (None,)
        for forced, by_slice, tr, tile8 in ([(False, None, tr, False) for tr in trs]
                                            + [(True, False, None, False), (True, True, None, False), (True, False, None, True)]):
            monkeypatch.setattr(plan, "KQ_TILE_ROWS", 2 if forced else 17)
            monkeypatch.setattr(plan, "KQ_TILE_SPLIT", by_slice)
            monkeypatch.setattr(plan, "KQ_TR", tr)
            monkeypatch.setattr(plan, "KQ_TILE8", tile8)
            if tile8 and m > 32:
                assert plan.kq_integer_launch(dtype, m, n, k, gpu.sm_count).kernel.endswith("_tile4r8")
            want_tr = tr if tr is not None else plan.kq_tr_tiles(m, n, k, gpu.sm_count, dtype)
            for ops in (gpu, gpu_off):
                if forced and m > 1:  # a block per slice needs slices
                    assert ops.matmul_family(m, dw) == ("mmq_tile" if not by_slice or split > 1 else "mmq_tc")
                elif 2 <= m <= 16:
                    name = plan.kq_integer_launch(dtype, m, n, k, gpu.sm_count).kernel
                    assert ("_tr" in name) == bool(want_tr) and (not want_tr or f"_tr{want_tr}_" in name), name
                got = cp.asnumpy(ops.matmul(cp.asarray(x), dw))
                diff = np.count_nonzero(got != want)
                assert got.tobytes() == want.tobytes(), (f"m={m} tiled={forced} by_slice={by_slice} tr={tr} "
                                                         f"tile8={tile8} exact={ops.exact}: {diff} of {got.size} differ")


@pytest.mark.parametrize("dtype", KQUANTS)
def test_norm_matmul_quantises_rms_norm_rows(gpu, tiled, dtype):
    n, k = 512, 2048
    raw = _raw(n, k, dtype)
    dw, nw = gpu.upload(Weight(raw, dtype)), gpu.tensor(RNG.standard_normal(k).astype(np.float32))
    for m in (1, 16, 64, 130):
        x = cp.asarray(_acts(m, k) * 3)
        normed = cp.asnumpy(gpu.rms_norm(x, nw, 1e-5))
        want = kquant_ref.matmul(raw, dtype, normed, plan.split_k(n, k, gpu.sm_count, dtype))
        assert cp.asnumpy(gpu.norm_matmul(x, nw, 1e-5, dw)).tobytes() == want.tobytes()


def test_mixed_qkv_stays_blocks_and_gives_each_runs_bits(gpu, gpu_off, tiled):
    """Q4_K_M's q|k (Q4_K) with v (Q6_K): a CudaStack of the two runs' planes, sized as stack_bytes
    says; norm_matmul gives each run's own product in its columns, and norm_qkv_rope_write (the runs
    in rope tiles, heads from each run's first on) the bits of that product rotated and stored."""
    from lockstep_kernels.base import PAGE_SIZE, PagedRows, RopeTable
    from lockstep_kernels.cuda.weights import CudaStack, stack_bytes
    from lockstep_kernels.weights import concat_rows

    n_heads, n_kv, hd, k = 8, 2, 64, 512
    parts = [Weight(_raw(h * hd, k, t), t) for h, t in ((n_heads, "q4_k"), (n_kv, "q4_k"), (n_kv, "q6_k"))]
    ang = np.outer(np.arange(1024), 1.0 / 10000 ** (np.arange(hd // 2) / (hd // 2)))
    for ops in (gpu, gpu_off):
        table = RopeTable(ops.tensor(np.cos(ang).astype(np.float32)), ops.tensor(np.sin(ang).astype(np.float32)), True)
        nw = ops.tensor(RNG.standard_normal(k).astype(np.float32))
        bias = Weight(RNG.standard_normal((n_heads + 2 * n_kv) * hd).astype(np.float32), "f32")
        tiled, tiled_bias = ops.upload_qkv(*parts, bias, hd)
        stacked, runs = ops.upload(concat_rows(parts)), [ops.upload(concat_rows(parts[:2])), ops.upload(parts[2])]
        assert isinstance(tiled, CudaStack) and isinstance(stacked, CudaStack) and len(tiled.parts) == 2
        assert tiled.nbytes == stacked.nbytes == stack_bytes(parts)
        for m in (1, 2, 16, 64, 200):
            x = cp.asarray(_acts(m, k))
            got = cp.asnumpy(ops.norm_matmul(x, nw, 1e-5, stacked, ops.upload(bias)))
            want = np.concatenate([cp.asnumpy(ops.norm_matmul(x, nw, 1e-5, r)) for r in runs], axis=1)  # then + bias
            assert got.tobytes() == (want + bias.data).astype(np.float32).tobytes(), f"norm_matmul m={m}"
            slots = RNG.choice(4 * PAGE_SIZE, m, replace=False).astype(np.int64)
            rows = PagedRows(positions=cp.asarray(RNG.integers(0, 1024, m).astype(np.int32)), seq=cp.zeros(m, cp.int32),
                             block_tables=cp.zeros((1, 4), cp.int32), slots=cp.asarray(slots))
            fused, split = ops.kv_alloc(4, n_kv, hd, "f16"), ops.kv_alloc(4, n_kv, hd, "f16")
            q = ops.norm_qkv_rope_write(x, nw, 1e-5, tiled, tiled_bias, rows, table, fused, n_heads, n_kv)
            want_q = ops.qkv_rope_write(ops.norm_matmul(x, nw, 1e-5, stacked, ops.upload(bias)), rows, table, split,
                                        n_heads, n_kv)
            assert cp.asnumpy(q).tobytes() == cp.asnumpy(want_q).tobytes(), f"q m={m}"
            for a, b in zip(ops.kv_read_pages(fused, list(range(4))), ops.kv_read_pages(split, list(range(4))),
                            strict=True):
                assert a.tobytes() == b.tobytes(), f"cache m={m}"
