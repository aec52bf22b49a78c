"""CUDA ops against the NumPy reference, and row invariance bit for bit on the GPU.

Tolerances (relative L2 error against the float32 CPU reference on the same stored weights):
matmul f32 weights 1e-5 (float32 FMA); f16, q8_0 weights 2e-3 (activations rounded to f16 for the
tensor cores), q4_k, q5_k and q6_k 2e-3 (activations quantised to 15 bits a chunk); bf16 weights 1e-2
(activations rounded to bf16); RMSNorm and SiLU 1e-6; RoPE, add, embedding and the KV cache contents equal bit for bit.
"""

import numpy as np
import pytest

from tests.cuda_fixtures import cp, gpu, gpu_off  # noqa: F401 (gpu, gpu_off: fixtures)

pytestmark = pytest.mark.gpu

from lockstep_kernels.base import PAGE_SIZE, RopeTable  # noqa: E402
from lockstep_kernels.cpu.ops import CpuOps  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402
from lockstep_kernels.weights import Weight, f32_to_bf16  # noqa: E402

RNG = np.random.default_rng()  # fresh inputs every run; a failure prints what it needs
MATMUL_TOL = {"f32": 1e-5, "f16": 2e-3, "q8_0": 2e-3, "bf16": 1e-2, "q4_k": 2e-3, "q5_k": 2e-3, "q6_k": 2e-3}
MATMUL_SHAPES = [(96, 64), (40, 72), (37, 44), (40, 256), (2048, 2048), (512, 2048), (2048, 8192)]
from lockstep_kernels.cuda import plan as _plan  # noqa: E402

# types whose kernels read the blocks (repacked as planes; Q5_K on the integer kernels only)
KQUANTS = list(_plan.KQUANT_TYPES if _plan.KQ_INTEGER else _plan.F16_MMA_KQUANTS)
BLOCK = {"q8_0": 32, "q4_k": 256, "q5_k": 256, "q6_k": 256}  # values per block: rows are whole blocks
BATCHES = list(range(2, 65)) + [100, 512]


def _rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _rel(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def _weight(n, k, dtype):
    return Weight.from_f32(_rand(n, k, scale=k**-0.5), dtype)


def _skip_partial_blocks(dtype, *ks):
    if any(k % BLOCK.get(dtype, 1) for k in ks):
        pytest.skip(f"{dtype} rows are whole blocks of {BLOCK[dtype]}")


def _assert_same_bits(got, want, **_):
    assert got.shape == want.shape and got.tobytes() == want.tobytes()


def _row_alone_and_inside(op, row, pool, batch):
    """`row` computed alone, and as a random row of a batch of `batch` rows drawn from `pool`."""
    idx = RNG.integers(0, len(pool), batch)
    x = pool[idx].copy()
    i = int(RNG.integers(batch))
    x[i] = row
    return cp.asnumpy(op(cp.asarray(row[None])))[0], cp.asnumpy(op(cp.asarray(x)))[i]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", *KQUANTS])
@pytest.mark.parametrize("shape", MATMUL_SHAPES, ids=str)
def test_matmul_matches_cpu(gpu, gpu_off, dtype, shape):
    n, k = shape
    _skip_partial_blocks(dtype, k)
    w = _weight(n, k, dtype)
    bias = _rand(n)
    dw, db = gpu.upload(w), gpu.tensor(bias)
    for m in (1, 7, 64, 200):
        x = _rand(m, k)
        ref = CpuOps(exact=True).matmul(x, w, bias)
        for ops in (gpu, gpu_off):
            got = cp.asnumpy(ops.matmul(cp.asarray(x), dw, db))
            assert got.shape == ref.shape and np.isfinite(got).all()
            err = _rel(got, ref)
            assert err < MATMUL_TOL[dtype], f"m={m} exact={ops.exact}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", *KQUANTS])
@pytest.mark.parametrize("shape", [(96, 64), (40, 72), (40, 70), (40, 256), (2048, 2048), (512, 2048), (2048, 8192)],
                         ids=str)
def test_matmul_row_invariant(gpu, dtype, shape):
    n, k = shape
    _skip_partial_blocks(dtype, k)
    dw = gpu.upload(_weight(n, k, dtype))
    db = gpu.tensor(_rand(n))
    pool = _rand(1024, k)
    row = _rand(k)
    for b in BATCHES:
        alone, inside = _row_alone_and_inside(lambda x: gpu.matmul(x, dw, db), row, pool, b)
        assert alone.tobytes() == inside.tobytes(), f"batch {b}: max diff {np.abs(alone - inside).max()}"


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0", *KQUANTS])
@pytest.mark.parametrize("shape", [(96, 64), (1000, 2048), (2048, 8192), (200, 4096), (300, 72)], ids=str)
def test_shared_memory_kernels_give_the_streaming_kernels_bits(dtype, shape, monkeypatch):
    """Wide batches take the tiled, the wide or (on sm_90) the wgmma kernel; every element must equal
    the streaming kernel's (the one decode uses), so a row's bits cannot depend on which kernel its
    batch got."""
    n, k = shape
    _skip_partial_blocks(dtype, k)
    from lockstep_kernels.cuda import plan

    monkeypatch.setattr(plan, "TILE_MIN_BLOCKS_PER_SM", 0)  # tile even where streaming would be faster
    monkeypatch.setattr(plan, "WGMMA_MIN_BLOCKS_PER_SM", 0)
    best, wide, tiled, streaming = (CudaOps(exact=True) for _ in range(4))
    wide.tiled, tiled.tiled, streaming.tiled = "wide", "tile", False
    dw, db = wide.upload(_weight(n, k, dtype)), wide.tensor(_rand(n))
    for m in (33, 64, 100, 128, 300, 512):
        x, r = cp.asarray(_rand(m, k)), cp.asarray(_rand(m, n))
        ref = cp.asnumpy(streaming.matmul(x, dw, db, residual=r))
        for ops, half in ((tiled, 1), (wide, 1), (best, 0), (best, 10**9)):  # mm_wgmma's 128- and 64-row tiles
            monkeypatch.setattr(plan, "WGMMA_HALF_TILES_BELOW", half)
            got = cp.asnumpy(ops.matmul(x, dw, db, residual=r))
            assert got.tobytes() == ref.tobytes(), f"{ops.tiled} m={m}: {np.count_nonzero(got != ref)} differ"


def _wgmma_builds_give_mm_tc_bits(dtype, builds):
    """Each (rows, persist, multicast, early weights) launch of plan.wgmma_build_launch (a persistent grid here of 5 blocks,
    4 in clusters, so that each walks several tiles) gives the streaming kernel's bits, plain and with bias and residual,
    and the first one's with SiLU into 16 bits. K of 65 chunks: slices that begin and end inside a stage."""
    import dataclasses

    from lockstep_kernels.cuda import plan
    from lockstep_kernels.cuda.ops import EPI_BIAS, EPI_OUT16, EPI_RESIDUAL, EPI_SILU

    ops, streaming = CudaOps(exact=True), CudaOps(exact=True)
    if not ops.wgmma:
        pytest.skip("sm_90a only")
    streaming.tiled = False
    n, k = 768, 2080
    dw, db = ops.upload(_weight(n, k, dtype)), ops.tensor(_rand(n))
    for m in (130, 512):
        x, r = cp.asarray(_rand(m, k)), cp.asarray(_rand(m, n))
        x16 = ops._act16(x, dw.kp, dtype == "bf16", perm=True)
        plain, fused = cp.asnumpy(streaming.matmul(x, dw)), cp.asnumpy(streaming.matmul(x, dw, db, residual=r))
        silu = None
        for rows, persist, mc, early in builds:
            wg = plan.wgmma_build_launch(dtype, m, n, k, ops.sm_count, rows, persist, mc)
            wg = dataclasses.replace(wg, grid=(4 if mc else 5, 1, 1)) if persist else wg  # mc: whole clusters
            wg = dataclasses.replace(wg, defines=(*wg.defines, ("WG_EARLY", 1))) if early else wg
            what = f"{rows} rows, persist {persist}, multicast {mc}, early weights {early}, m {m}"
            for flags, b, res, want in ((0, ops._dummy, ops._dummy, plain), (EPI_BIAS | EPI_RESIDUAL, db, r, fused)):
                got = cp.asnumpy(ops._wgmma(x16, dw, wg, b, res, cp.full((m, n), cp.nan, cp.float32), flags))
                assert got.tobytes() == want.tobytes(), f"{what}, flags {flags}: {np.count_nonzero(got != want)} differ"
            out16 = cp.asnumpy(ops._wgmma(x16, dw, wg, ops._dummy, ops._dummy, cp.full((m, n // 2), 0xFFFF, cp.uint16),
                                          EPI_SILU | EPI_OUT16))
            silu = out16 if silu is None else silu
            assert out16.tobytes() == silu.tobytes(), f"{what}: SiLU into 16 bits"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_wgmma_builds_give_the_streaming_kernels_bits(dtype):
    """Every mm_wgmma_tma build: 64-, 128- or 192-row tiles, a grid of tiles or a persistent grid."""
    _wgmma_builds_give_mm_tc_bits(dtype, ((64, False, False, False), (128, False, False, False),
                                          (128, True, False, False), (192, False, False, False),
                                          (192, True, False, False), (128, False, False, True), (128, True, False, True)))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_wgmma_multicast_gives_the_streaming_kernels_bits(dtype):
    """The builds in clusters of two blocks that multicast their tokens (WG_MC)."""
    _wgmma_builds_give_mm_tc_bits(dtype, ((128, False, False, False), (128, False, True, False), (128, True, True, False),
                                          (192, False, True, False), (128, True, True, True)))


@pytest.mark.parametrize("dtype", KQUANTS)
@pytest.mark.parametrize("shape", [(4096, 4096), (8192, 2048), (4096, 14336), (1000, 1024)], ids=str)
def test_kquant_one_row_gives_the_batch_bits(gpu, dtype, shape):
    """K-quant decode kernels: a row alone (plain and with the norm prologue) must have its bits
    inside batches (9-16 rows: the 16-bit-input kernels)."""
    n, k = shape
    dw = gpu.upload(_weight(n, k, dtype))
    nw = gpu.tensor(_rand(k))
    pool, row = _rand(64, k), _rand(k)
    for b in (2, 9, 16, 33, 64):
        alone, inside = _row_alone_and_inside(lambda x: gpu.matmul(x, dw), row, pool, b)
        assert alone.tobytes() == inside.tobytes(), f"batch {b}: max diff {np.abs(alone - inside).max()}"
        alone, inside = _row_alone_and_inside(lambda x: gpu.norm_matmul(x, nw, 1e-5, dw), row, pool, b)
        assert alone.tobytes() == inside.tobytes(), f"norm, batch {b}: max diff {np.abs(alone - inside).max()}"


@pytest.mark.parametrize("dtype", KQUANTS)
@pytest.mark.parametrize("shape", [(4096, 4096), (4096, 14336)], ids=str)
def test_kquant_one_row_512_thread_builds_keep_the_bits(gpu, dtype, shape, monkeypatch):
    """mm_*_one16 / mm_*_norm16 (plan.ONE16_TYPES, split KQ_MAX_SPLIT: two blocks an SM) are the one-row
    kernels' code under another register bound: the same bits, plain and with the norm prologue."""
    n, k = shape
    if _plan.split_k(n, k, gpu.sm_count, dtype) != _plan.KQ_MAX_SPLIT:
        pytest.skip(f"this shape splits K {_plan.split_k(n, k, gpu.sm_count, dtype)} ways here: no one16 launch")
    dw, nw, row = gpu.upload(_weight(n, k, dtype)), gpu.tensor(_rand(k)), gpu.tensor(_rand(1, k))
    outs = {}
    for types in ((), (dtype,)):
        monkeypatch.setattr(_plan, "ONE16_TYPES", types)
        outs[types] = [cp.asnumpy(gpu.matmul(row, dw)), cp.asnumpy(gpu.norm_matmul(row, nw, 1e-5, dw))]
    for alone, wide in zip(outs[()], outs[(dtype,)], strict=True):
        assert wide.tobytes() == alone.tobytes(), f"max diff {np.abs(wide - alone).max()}"


@pytest.mark.parametrize("dtype", KQUANTS)
@pytest.mark.parametrize("shape", [(4096, 4096), (4096, 14336)], ids=str)
def test_kquant_one_row_16bit_input_keeps_the_bits(gpu, dtype, shape, monkeypatch):
    """mm_*_oneh / mm_*_one16h (plan.ONE_X16_TYPES) on a row's 16-bit pairs give the one-row kernel's bits
    on its floats: a matmul of act_to_16's pairs, and the one-row FFN whose gated product reaches the
    down projection as 16-bit pairs (EPI_OUT16)."""
    n, k = shape
    dw, row, nw = gpu.upload(_weight(n, k, dtype)), gpu.tensor(_rand(1, k)), gpu.tensor(_rand(n))
    gated = gpu.upload_gate_up(_weight(k, n, dtype), _weight(k, n, dtype))
    monkeypatch.setattr(_plan, "ONE_X16_TYPES", (dtype,))
    out = cp.empty((1, n), dtype=cp.float32)
    h = gpu._streaming(CudaOps._act16(row, dw.kp, False), dw, out, gpu._dummy, None, 0, "x16")
    x = gpu.tensor(_rand(1, n))
    ffn = cp.asnumpy(gpu.ffn(x, nw, 1e-5, gated, dw))
    monkeypatch.setattr(_plan, "ONE_X16_TYPES", ())
    plain = cp.asnumpy(gpu.matmul(row, dw))
    assert cp.asnumpy(h).tobytes() == plain.tobytes(), f"max diff {np.abs(cp.asnumpy(h) - plain).max()}"
    want = cp.asnumpy(gpu.ffn(x, nw, 1e-5, gated, dw))
    assert ffn.tobytes() == want.tobytes(), f"ffn: max diff {np.abs(ffn - want).max()}"


@pytest.mark.parametrize("dtype", KQUANTS)
@pytest.mark.parametrize("shape", [(1008, 1024), (4096, 4096)], ids=str)
def test_kquant_two_tile_16_row_kernel_keeps_the_bits(gpu, dtype, shape, monkeypatch):
    """mm_*_tm2h2 (plan.X16_RT2_TYPES: two row tiles a block, an odd count leaving the last block one)
    gives each tile mm_*_tm2h's bits: 9-16 normalised rows, plain, with bias, and as a gated product."""
    from lockstep_kernels.cuda import plan

    n, k = shape
    w, gate, up = _weight(n, k, dtype), _weight(n // 2, k, dtype), _weight(n // 2, k, dtype)
    dw, gated = gpu.upload(w), gpu.upload_gate_up(gate, up)
    nw, db = gpu.tensor(_rand(k)), gpu.tensor(_rand(n))
    for m in (9, 16):
        assert plan.reads_16bit(m, n, k, gpu.sm_count, dtype)
        x = cp.asarray(_rand(m, k, scale=3.0))
        outs = {}
        for types in ((), (dtype,)):
            monkeypatch.setattr(plan, "X16_RT2_TYPES", types)
            outs[types] = [cp.asnumpy(gpu.norm_matmul(x, nw, 1e-5, dw, b)) for b in (None, db)]
            outs[types].append(cp.asnumpy(gpu.norm_matmul(x, nw, 1e-5, gated)))
        for i, (one, two) in enumerate(zip(outs[()], outs[(dtype,)], strict=True)):
            assert two.tobytes() == one.tobytes(), f"m={m} case {i}: max diff {np.abs(two - one).max()}"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("k, kp", [(40, 64), (4096, 4096), (14336, 14336)])
def test_activations_to_16_bits_round_pad_and_permute(k, kp, dtype):
    """act_to_16: each value rounded to nearest even, zeros past K; with perm, column j = 8a + 2b + e
    of a 32-k chunk holds k = 8b + 2a + e (mm_wgmma's token order)."""
    x = _rand(37, k)
    want = np.zeros((37, kp), np.float32)
    want[:, :k] = x
    if dtype == "f16":
        want = want.astype(np.float16).view(np.uint16)
    else:
        want = f32_to_bf16(want)
    j = np.arange(kp)
    a, b, e = (j % 32) // 8, (j % 8) // 2, j % 2
    perm = j - j % 32 + 8 * b + 2 * a + e
    for permuted, cols in ((False, j), (True, perm)):
        got = cp.asnumpy(CudaOps._act16(cp.asarray(x), kp, dtype == "bf16", perm=permuted))
        assert got.tobytes() == np.ascontiguousarray(want[:, cols]).tobytes()


def test_exact_off_matmul_diverges_somewhere(gpu_off):
    """The control: cuBLAS over a wide batch is not bound to a row's bits alone."""
    dw = gpu_off.upload(_weight(2048, 2048, "f16"))
    pool = _rand(1024, 2048)
    row = _rand(2048)
    diffs = 0
    for b in (100, 256, 512):
        alone, inside = _row_alone_and_inside(lambda x: gpu_off.matmul(x, dw), row, pool, b)
        diffs += alone.tobytes() != inside.tobytes()
    assert diffs > 0


def _rope_table(n_pos, half, neox):
    ang = np.outer(np.arange(n_pos), 1.0 / 10000 ** (np.arange(half) / half)).astype(np.float32)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32), neox


def _pointwise_cases():
    return {
        "rms_norm_2048": (2048, lambda o, x: o.rms_norm(x, o.tensor(NORM_W2048), 1e-5), 1e-6),
        "rms_norm_128": (128, lambda o, x: o.rms_norm(x, o.tensor(NORM_W128), 1e-6), 1e-6),
        "silu_mul": (512, lambda o, x: o.silu_mul(x[:, :256], x[:, 256:]), 1e-6),
        "add": (512, lambda o, x: o.add(x[:, :256], x[:, 256:]), 0.0),
    }


NORM_W2048 = _rand(2048)
NORM_W128 = _rand(128)
CASES = _pointwise_cases()


@pytest.mark.parametrize("name", list(CASES))
def test_row_ops_match_cpu_and_are_row_invariant(gpu, name):
    width, op, tol = CASES[name]
    cpu = CpuOps(exact=True)
    x = _rand(77, width)
    ref = op(cpu, x)
    got = cp.asnumpy(op(gpu, cp.asarray(x)))
    if tol == 0.0:
        assert got.tobytes() == np.ascontiguousarray(ref, dtype=np.float32).tobytes()
    else:
        assert _rel(got, ref) < tol
    pool = _rand(600, width)
    row = _rand(width)
    for b in BATCHES:
        alone, inside = _row_alone_and_inside(lambda a: op(gpu, a), row, pool, b)
        assert alone.tobytes() == inside.tobytes(), f"batch {b}"


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_rope_equals_cpu_bits(gpu, neox, head_dim):
    cos, sin, _ = _rope_table(4096, head_dim // 2, neox)
    cpu_t = RopeTable(cos, sin, neox)
    gpu_t = RopeTable(gpu.tensor(cos), gpu.tensor(sin), neox)
    for t in (1, 5, 512):
        x = _rand(t, 8, head_dim)
        pos = RNG.integers(0, 4096, t).astype(np.int32)
        ref = CpuOps(exact=True).rope(x, pos, cpu_t)
        got = cp.asnumpy(gpu.rope(cp.asarray(x), cp.asarray(pos), gpu_t))
        assert got.tobytes() == np.ascontiguousarray(ref, np.float32).tobytes()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", *KQUANTS])
def test_embedding_equals_cpu_bits(gpu, dtype):
    table = Weight.from_f32(_rand(300, 256 if dtype in KQUANTS else 96), dtype)
    dt = gpu.upload(table)
    ids = RNG.integers(0, 300, 700).astype(np.int32)
    ref = CpuOps(exact=True).embedding(table, ids)
    got = cp.asnumpy(gpu.embedding(dt, cp.asarray(ids)))
    assert got.tobytes() == np.ascontiguousarray(ref, np.float32).tobytes()


@pytest.mark.parametrize("vocab", [5, 2048, 2049, 128256])
def test_argmax_ties_to_lowest(gpu, vocab):
    x = _rand(9, vocab)
    x[3, [1, 3, vocab - 1]] = 50.0  # a three-way tie, across the first pass's blocks for large vocabularies
    x[5, :] = 1.0  # all equal
    x[6, vocab - 1] = 60.0  # the last element
    x[7, :] = -np.inf
    got = cp.asnumpy(gpu.argmax(cp.asarray(x)))
    assert got.tolist() == np.argmax(x, axis=1).tolist()
    assert got[3] == 1 and got[5] == 0 and got[6] == vocab - 1 and got[7] == 0


@pytest.mark.parametrize("kv_type", ["f32", "f16", "bf16"])
def test_kv_write_equals_cpu_cache_bits(gpu, kv_type):
    cpu = CpuOps(exact=True)
    n_pages, n_kv, hd = 6, 4, 64
    c_layer, g_layer = cpu.kv_alloc(n_pages, n_kv, hd, kv_type), gpu.kv_alloc(n_pages, n_kv, hd, kv_type)
    slots = RNG.choice(n_pages * PAGE_SIZE, 300, replace=False).astype(np.int64)
    k, v = _rand(300, n_kv, hd, scale=3.0), _rand(300, n_kv, hd, scale=3.0)
    cpu.kv_write(c_layer, k, v, slots)
    gpu.kv_write(g_layer, cp.asarray(k), cp.asarray(v), cp.asarray(slots))
    gk, gv = gpu.kv_read_pages(g_layer, list(range(n_pages)))
    assert gk.tobytes() == c_layer.k.tobytes() and gv.tobytes() == c_layer.v.tobytes()
    # negative slots (graph padding rows) write nothing
    gpu.kv_write(g_layer, cp.asarray(k[:2]), cp.asarray(v[:2]), cp.asarray(np.array([-1, -1], np.int64)))
    assert gpu.kv_read_pages(g_layer, list(range(n_pages)))[0].tobytes() == c_layer.k.tobytes()


def test_pages_park_restore_and_copy_keep_bits(gpu):
    layer = gpu.kv_alloc(8, 2, 32, "bf16")
    gpu.kv_write(layer, cp.asarray(_rand(2048, 2, 32)), cp.asarray(_rand(2048, 2, 32)),
                 cp.arange(2048, dtype=cp.int64))
    parked = gpu.kv_read_pages(layer, [1, 2])
    gpu.kv_write_pages(layer, [6, 7], parked)
    assert gpu.kv_read_pages(layer, [6, 7])[0].tobytes() == parked[0].tobytes()
    gpu.kv_copy_pages(layer, [1], [0])
    assert gpu.kv_read_pages(layer, [0])[1].tobytes() == parked[1][:1].tobytes()


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", *KQUANTS])
def test_matmul_residual_epilogue_equals_add(gpu, gpu_off, dtype, monkeypatch):
    """matmul(x, w, bias, residual=r) must give add(r, matmul(x, w, bias)) bit for bit on every path
    (streaming, tiled, float32, cuBLAS with exact off)."""
    from lockstep_kernels.cuda import plan

    monkeypatch.setattr(plan, "TILE_MIN_BLOCKS_PER_SM", 0)
    w = _weight(2048, 1024, dtype)
    for ops in (gpu, gpu_off):
        dw, db = ops.upload(w), ops.tensor(_rand(2048))
        for m in (1, 9, 64, 200):
            x, r = cp.asarray(_rand(m, 1024)), cp.asarray(_rand(m, 2048))
            fused = cp.asnumpy(ops.matmul(x, dw, db, residual=r))
            apart = cp.asnumpy(ops.add(r, ops.matmul(x, dw, db)))
            assert fused.tobytes() == apart.tobytes(), f"{dtype} exact={ops.exact} m={m}"


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", *KQUANTS])
@pytest.mark.parametrize("shape", [(3072, 2048), (40, 96), (37, 64), (40, 70), (520, 4096), (28672, 4096)], ids=str)
def test_norm_matmul_equals_the_separate_ops(gpu, gpu_off, dtype, shape, monkeypatch):
    """One row runs as one kernel that normalises its own input (where plan.norm_prologue says so),
    9-16 rows as rms_norm_16 then the kernel reading 16-bit pairs, long prompts on mm_wgmma as
    rms_norm_16 in its k order; the bits must be rms_norm's then matmul's, with and without bias,
    exact or not; other batches take the separate ops."""
    from lockstep_kernels.cuda import plan

    n, k = shape
    _skip_partial_blocks(dtype, k)
    if dtype in KQUANTS and n * k > 1 << 24:
        pytest.skip("NumPy quantises 117M values too slowly for a GPU session; the bench runs the 8B shape")
    monkeypatch.setattr(plan, "WGMMA_MIN_BLOCKS_PER_SM", 0)
    w = _weight(n, k, dtype)
    for ops in (gpu, gpu_off):
        dw, nw, db = ops.upload(w), ops.tensor(_rand(k)), ops.tensor(_rand(n))
        for m in (1, 2, 9, 16, 130):  # 9-16 rows: rms_norm_16's pairs into mm_*_tm2h; 130: mm_wgmma (f16, bf16)
            x = cp.asarray(_rand(m, k, scale=3.0))
            for bias in (None, db):
                fused = cp.asnumpy(ops.norm_matmul(x, nw, 1e-5, dw, bias))
                apart = cp.asnumpy(ops.matmul(ops.rms_norm(x, nw, 1e-5), dw, bias))
                assert fused.tobytes() == apart.tobytes(), f"{dtype} m={m} bias={bias is not None}"


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", *KQUANTS])
@pytest.mark.parametrize("ffn", [1024, 100, 20])
def test_gated_product_equals_silu_mul_of_the_stacked_product(gpu, gpu_off, dtype, ffn, monkeypatch):
    """upload_gate_up's weight (rows regrouped so that one thread holds a gate output and its up
    output): every kernel's epilogue must give silu_mul of the stacked weight's product, bit for
    bit, at every batch width, exact or not, with and without the norm prologue."""
    from lockstep_kernels.cuda import plan
    from lockstep_kernels.weights import concat_rows

    monkeypatch.setattr(plan, "TILE_MIN_BLOCKS_PER_SM", 0)
    k = 256 if dtype in BLOCK else 200
    gate, up = _weight(ffn, k, dtype), _weight(ffn, k, dtype)
    for ops in (gpu, gpu_off):
        gated, stacked = ops.upload_gate_up(gate, up), ops.upload(concat_rows([gate, up]))
        assert gated.gate_up == ("halves" if dtype == "f32" or ffn % 8 else "tiles")
        nw = ops.tensor(_rand(k))
        for m in (1, 2, 9, 64, 200, 512):
            x = cp.asarray(_rand(m, k))
            # exact off, wide: cuBLAS on the regrouped rows; it promises no bits, so only closeness
            same = np.testing.assert_allclose if not ops.exact and m >= 65 else _assert_same_bits
            y = ops.matmul(x, stacked)
            same(cp.asnumpy(ops.matmul(x, gated)), cp.asnumpy(ops.silu_mul(y[:, :ffn], y[:, ffn:])), rtol=1e-5)
            y = ops.matmul(ops.rms_norm(x, nw, 1e-5), stacked)
            same(cp.asnumpy(ops.norm_matmul(x, nw, 1e-5, gated)), cp.asnumpy(ops.silu_mul(y[:, :ffn], y[:, ffn:])),
                 rtol=1e-5)
        with pytest.raises(ValueError):
            ops.matmul(cp.asarray(_rand(1, k)), gated, residual=cp.asarray(_rand(1, ffn)))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", *KQUANTS])
@pytest.mark.parametrize("ffn", [1024, 96, 100])
def test_ffn_equals_norm_matmul_then_down_with_residual(gpu, gpu_off, dtype, ffn, monkeypatch):
    """ffn (at 9-16 rows the gated products reach the down projection as 16-bit pairs, and on
    mm_wgmma at 128 or more in its k order) must give matmul(norm_matmul(x, gate|up), down,
    residual=x) bit for bit at every batch width."""
    from lockstep_kernels.cuda import plan

    _skip_partial_blocks(dtype, ffn)
    monkeypatch.setattr(plan, "WGMMA_MIN_BLOCKS_PER_SM", 0)
    k = 256
    gate, up, down = _weight(ffn, k, dtype), _weight(ffn, k, dtype), _weight(k, ffn, dtype)
    for ops in (gpu, gpu_off):
        gated, dw, nw = ops.upload_gate_up(gate, up), ops.upload(down), ops.tensor(_rand(k))
        # 200 and 300 rows: mm_wgmma with 64-row tiles (few tiles), then 128-row ones
        for m, half in ((1, 1), (8, 1), (9, 1), (16, 1), (17, 1), (64, 1), (200, 1), (300, 1), (300, 0)):
            monkeypatch.setattr(plan, "WGMMA_HALF_TILES_BELOW", half)
            x = cp.asarray(_rand(m, k))
            want = ops.matmul(ops.norm_matmul(x, nw, 1e-5, gated), dw, residual=x)
            # exact off, wide: cuBLAS, which promises no bits, so only closeness
            same = np.testing.assert_allclose if not ops.exact and m >= 65 else _assert_same_bits
            same(cp.asnumpy(ops.ffn(x, nw, 1e-5, gated, dw)), cp.asnumpy(want), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", *KQUANTS])
@pytest.mark.parametrize("kv_type", ["f16", "bf16", "f32"])
def test_qkv_weight_in_rope_tiles_gives_the_separate_ops_bits(gpu, gpu_off, dtype, kv_type, monkeypatch):
    """upload_qkv's weight (each head's rows regrouped so that one thread holds both dims of a rope
    pair): norm_qkv_rope_write, one launch where the streaming kernel's epilogue rotates and stores,
    must give q and the cache cells of norm_matmul then qkv_rope_write on the stacked weight, bit for
    bit, at every batch width and on every kernel, exact or not, with and without a bias."""
    from lockstep_kernels.base import PagedRows
    from lockstep_kernels.cuda import plan
    from lockstep_kernels.weights import concat_rows

    monkeypatch.setattr(plan, "TILE_MIN_BLOCKS_PER_SM", 0)
    monkeypatch.setattr(plan, "WGMMA_MIN_BLOCKS_PER_SM", 0)
    n_heads, n_kv, hd = 4, 2, 64
    k = 256 if dtype in BLOCK else 200
    parts = [_weight(h * hd, k, dtype) for h in (n_heads, n_kv, n_kv)]
    cos, sin, _ = _rope_table(2048, hd // 2, True)
    for ops in (gpu, gpu_off):
        table = RopeTable(ops.tensor(cos), ops.tensor(sin), True)
        nw = ops.tensor(_rand(k))
        for bias in (None, Weight(_rand((n_heads + 2 * n_kv) * hd), "f32")):
            tiled, tiled_bias = ops.upload_qkv(*parts, bias, hd)
            stacked, stacked_bias = ops.upload(concat_rows(parts)), None if bias is None else ops.upload(bias)
            assert tiled.rope_tiles == hd
            for m, kernels in ((1, True), (2, True), (9, True), (16, True), (64, True), (200, True), (200, "wide")):
                monkeypatch.setattr(ops, "tiled", kernels)  # 200 rows: mm_wgmma (f16, bf16 on sm_90), then mm_wide
                x = cp.asarray(_rand(m, k))
                slots = RNG.choice(4 * PAGE_SIZE, m, replace=False).astype(np.int64)
                slots[RNG.random(m) < 0.1] = -1  # padding rows write nothing
                rows = PagedRows(positions=cp.asarray(RNG.integers(0, 2048, m).astype(np.int32)),
                                 seq=cp.zeros(m, cp.int32), block_tables=cp.zeros((1, 4), cp.int32),
                                 slots=cp.asarray(slots))
                fused_layer, split_layer = ops.kv_alloc(4, n_kv, hd, kv_type), ops.kv_alloc(4, n_kv, hd, kv_type)
                got = ops.norm_qkv_rope_write(x, nw, 1e-5, tiled, tiled_bias, rows, table, fused_layer, n_heads, n_kv)
                qkv = ops.norm_matmul(x, nw, 1e-5, stacked, stacked_bias)
                want = ops.qkv_rope_write(qkv, rows, table, split_layer, n_heads, n_kv)
                # exact off, wide: cuBLAS on the regrouped rows; it promises no bits, so only closeness
                same = np.testing.assert_allclose if not ops.exact and m >= 65 else _assert_same_bits
                same(cp.asnumpy(got), cp.asnumpy(want), rtol=1e-5, atol=1e-6)
                for a, b in zip(ops.kv_read_pages(fused_layer, list(range(4))),
                                ops.kv_read_pages(split_layer, list(range(4))), strict=True):
                    if kv_type == "f32" or ops.exact or m < 65:
                        same(a, b, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="neox"):  # the tiles pair dims d and d + head_dim/2 only
            ops.norm_qkv_rope_write(x, nw, 1e-5, tiled, tiled_bias, rows, RopeTable(table.cos, table.sin, False),
                                    fused_layer, n_heads, n_kv)


def test_silu_mul_reads_the_halves_in_place(gpu):
    gu = cp.asarray(_rand(33, 2 * 300))
    halves = cp.asnumpy(gpu.silu_mul(gu[:, :300], gu[:, 300:]))
    copies = cp.asnumpy(gpu.silu_mul(cp.ascontiguousarray(gu[:, :300]), cp.ascontiguousarray(gu[:, 300:])))
    assert halves.shape == (33, 300) and halves.tobytes() == copies.tobytes()


@pytest.mark.parametrize("kv_type", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("neox", [True, False])
def test_qkv_rope_write_equals_the_separate_ops(gpu, kv_type, neox):
    from lockstep_kernels.base import PagedRows, split_qkv_rope_write

    n_heads, n_kv, hd, t = 8, 2, 64, 37
    cos, sin, _ = _rope_table(2048, hd // 2, neox)
    table = RopeTable(gpu.tensor(cos), gpu.tensor(sin), neox)
    qkv = cp.asarray(_rand(t, (n_heads + 2 * n_kv) * hd, scale=3.0))
    slots = np.concatenate([RNG.choice(4 * PAGE_SIZE, t - 2, replace=False), [-1, -1]]).astype(np.int64)
    rows = PagedRows(positions=cp.asarray(RNG.integers(0, 2048, t).astype(np.int32)), seq=cp.zeros(t, cp.int32),
                     block_tables=cp.zeros((1, 4), cp.int32), slots=cp.asarray(slots))
    fused_layer, split_layer = gpu.kv_alloc(4, n_kv, hd, kv_type), gpu.kv_alloc(4, n_kv, hd, kv_type)
    q_fused = cp.asnumpy(gpu.qkv_rope_write(qkv, rows, table, fused_layer, n_heads, n_kv))
    q_split = cp.asnumpy(split_qkv_rope_write(gpu, qkv, rows, table, split_layer, n_heads, n_kv))
    assert q_fused.shape == (t, n_heads, hd) and q_fused.tobytes() == q_split.tobytes()
    pages = list(range(4))
    for a, b in zip(gpu.kv_read_pages(fused_layer, pages), gpu.kv_read_pages(split_layer, pages), strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kv_type", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("hd,t", [(64, 37), (128, 1), (128, 19), (32, 5)])
def test_qk_norm_rope_write_equals_the_separate_ops(gpu, kv_type, neox, hd, t):
    """Qwen3's per-head q/k norm, rope and cache write in one launch: the bits of rms_norm, rope and
    kv_write (q, and the cache cells; padding rows write nothing)."""
    from lockstep_kernels.base import PagedRows, split_qk_norm_rope_write

    n_heads, n_kv = 8, 2
    cos, sin, _ = _rope_table(2048, hd // 2, neox)
    table = RopeTable(gpu.tensor(cos), gpu.tensor(sin), neox)
    qkv = cp.asarray(_rand(t, (n_heads + 2 * n_kv) * hd, scale=3.0))
    qn, kn = cp.asarray(1.0 + 0.1 * _rand(hd)), cp.asarray(1.0 + 0.1 * _rand(hd))
    slots = RNG.choice(4 * PAGE_SIZE, t, replace=False).astype(np.int64)
    slots[-1] = -1
    rows = PagedRows(positions=cp.asarray(RNG.integers(0, 2048, t).astype(np.int32)), seq=cp.zeros(t, cp.int32),
                     block_tables=cp.zeros((1, 4), cp.int32), slots=cp.asarray(slots))
    fused_layer, split_layer = gpu.kv_alloc(4, n_kv, hd, kv_type), gpu.kv_alloc(4, n_kv, hd, kv_type)
    q_fused = cp.asnumpy(gpu.qk_norm_rope_write(qkv, qn, kn, 1e-6, rows, table, fused_layer, n_heads, n_kv))
    q_split = cp.asnumpy(split_qk_norm_rope_write(gpu, qkv, qn, kn, 1e-6, rows, table, split_layer, n_heads, n_kv))
    assert q_fused.shape == (t, n_heads, hd) and q_fused.tobytes() == q_split.tobytes()
    pages = list(range(4))
    for a, b in zip(gpu.kv_read_pages(fused_layer, pages), gpu.kv_read_pages(split_layer, pages), strict=True):
        assert a.tobytes() == b.tobytes()
