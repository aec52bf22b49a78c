"""Paged attention on the GPU: against the NumPy reference on the same cache contents (relative error
< 1e-5 for the scalar kernel of f32 caches and 256-dim heads; the tensor-core kernel rounds q and the
softmax weights to the cache's 16-bit type: < 2e-3 for f16, < 1e-2 for bf16), and bit for bit
whatever shares the launch or wherever the pages sit."""

import numpy as np
import pytest

from tests.cuda_fixtures import cp, gpu  # noqa: F401 (gpu: fixtures)

pytestmark = pytest.mark.gpu

from lockstep_kernels.base import PAGE_SIZE, PagedRows  # noqa: E402
from lockstep_kernels.cpu.ops import CpuKVLayer, CpuOps  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402

RNG = np.random.default_rng()
LENGTHS = [1, 255, 256, 257, 700, 1300]
CONFIGS = [  # head dim, query heads, KV heads, KV type
    (128, 32, 8, "f16"), (64, 32, 8, "bf16"), (32, 4, 2, "f32"), (128, 28, 4, "f16"),
    (64, 32, 2, "f16"), (256, 8, 8, "bf16"), (64, 8, 8, "f32"),
    (128, 8, 8, "f16"),  # a group of 1 on the tensor-core kernel: the most rows a block
]


def _pages_for(n):
    return -(-n // PAGE_SIZE)


class Cache:
    """Sequences of LENGTHS with random K/V, written through the GPU op into pages given by `order`."""

    def __init__(self, ops, hd, n_kv, kv_type, kv, order=None, lengths=LENGTHS):
        need = sum(_pages_for(n) for n in lengths)
        self.n_pages = need + 3
        order = RNG.permutation(self.n_pages) if order is None else order
        self.width = max(_pages_for(n) for n in lengths)
        self.tables = np.zeros((len(lengths), self.width), dtype=np.int32)
        at = 0
        self.layer = ops.kv_alloc(self.n_pages, n_kv, hd, kv_type)
        for s, n in enumerate(lengths):
            pages = order[at : at + _pages_for(n)]
            at += len(pages)
            self.tables[s, : len(pages)] = pages
            pos = np.arange(n)
            slots = pages[pos // PAGE_SIZE].astype(np.int64) * PAGE_SIZE + pos % PAGE_SIZE
            ops.kv_write(self.layer, cp.asarray(kv[s][0]), cp.asarray(kv[s][1]), cp.asarray(slots))

    def slots(self, seqs, positions):
        pos = np.asarray(positions, np.int64)
        return self.tables[np.asarray(seqs), pos // PAGE_SIZE].astype(np.int64) * PAGE_SIZE + pos % PAGE_SIZE

    def rows(self, seqs, positions):
        return PagedRows(positions=cp.asarray(np.asarray(positions, np.int32)),
                         seq=cp.asarray(np.asarray(seqs, np.int32)),
                         block_tables=cp.asarray(self.tables), slots=cp.asarray(self.slots(seqs, positions)))

    def cpu_layer(self, ops):
        k, v = ops.kv_read_pages(self.layer, list(range(self.n_pages)))
        return CpuKVLayer(self.layer.kv_type, self.layer.kv_type, k, v)


def _kv(hd, n_kv, lengths=LENGTHS):
    return [(RNG.standard_normal((n, n_kv, hd)).astype(np.float32),
             RNG.standard_normal((n, n_kv, hd)).astype(np.float32)) for n in lengths]


def _sample_rows(count):
    seqs = RNG.integers(0, len(LENGTHS), count)
    return seqs, np.array([RNG.integers(0, LENGTHS[s]) for s in seqs])


def _attend(ops, cache, q, seqs, positions, scale):
    return cp.asnumpy(ops.attention(cp.asarray(q), cache.layer, cache.rows(seqs, positions), scale))


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_attention_matches_cpu(gpu, config):
    hd, n_heads, n_kv, kv_type = config
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv))
    seqs, positions = _sample_rows(40)
    seqs = np.concatenate([seqs, [4, 4, 4, 5, 5, 0]])
    positions = np.concatenate([positions, [255, 256, 511, 1299, 768, 0]])
    q = RNG.standard_normal((len(seqs), n_heads, hd)).astype(np.float32)
    scale = hd**-0.5
    got = _attend(gpu, cache, q, seqs, positions, scale)
    cpu_rows = PagedRows(positions.astype(np.int32), seqs.astype(np.int32), cache.tables, np.zeros(len(seqs)))
    ref = CpuOps(exact=True).attention(q, cache.cpu_layer(gpu), cpu_rows, scale)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert np.isfinite(got).all() and err < _tolerance(hd, kv_type), f"relative error {err:.2e}"


def _tolerance(hd, kv_type):
    if kv_type == "f32" or hd not in plan.MMA_HEAD_DIMS:
        return 1e-5
    return 2e-3 if kv_type == "f16" else 1e-2


@pytest.mark.parametrize("config", CONFIGS[:4], ids=str)
def test_attention_row_invariant(gpu, config):
    hd, n_heads, n_kv, kv_type = config
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv))
    scale = hd**-0.5
    target_seq, target_pos = 5, 900
    q_row = RNG.standard_normal((n_heads, hd)).astype(np.float32)
    alone = _attend(gpu, cache, q_row[None], [target_seq], [target_pos], scale)[0]
    for b in list(range(2, 65)):
        seqs, positions = _sample_rows(b)
        q = RNG.standard_normal((b, n_heads, hd)).astype(np.float32)
        i = int(RNG.integers(b))
        seqs[i], positions[i], q[i] = target_seq, target_pos, q_row
        inside = _attend(gpu, cache, q, seqs, positions, scale)[i]
        assert inside.tobytes() == alone.tobytes(), f"batch {b}"
    # inside a 512-row prefill of its own sequence, and beside another sequence's prefill
    positions = np.arange(target_pos - 300, target_pos + 212)
    seqs = np.full(512, target_seq)
    q = RNG.standard_normal((512, n_heads, hd)).astype(np.float32)
    q[300] = q_row
    assert _attend(gpu, cache, q, seqs, positions, scale)[300].tobytes() == alone.tobytes()
    seqs = np.concatenate([np.full(512, 4)[:700 - 188], seqs[:300 + 1]])
    positions = np.concatenate([np.arange(188, 700), positions[:301]])
    q = RNG.standard_normal((len(seqs), n_heads, hd)).astype(np.float32)
    q[-1] = q_row
    assert _attend(gpu, cache, q, seqs, positions, scale)[-1].tobytes() == alone.tobytes()


@pytest.mark.parametrize("config", CONFIGS[:4], ids=str)
def test_attention_pages_shuffled(gpu, config):
    hd, n_heads, n_kv, kv_type = config
    kv = _kv(hd, n_kv)
    a = Cache(gpu, hd, n_kv, kv_type, kv)
    b = Cache(gpu, hd, n_kv, kv_type, kv, order=RNG.permutation(a.n_pages))
    assert not np.array_equal(a.tables, b.tables)
    seqs, positions = _sample_rows(64)
    q = RNG.standard_normal((64, n_heads, hd)).astype(np.float32)
    scale = hd**-0.5
    assert _attend(gpu, a, q, seqs, positions, scale).tobytes() == _attend(gpu, b, q, seqs, positions, scale).tobytes()


def test_attention_work_split_changes_no_bits(gpu, monkeypatch):
    """How chunks are spread over blocks, rows over launches and registers over loads in flight is
    free; the bits are not."""
    hd, n_heads, n_kv, kv_type = CONFIGS[0]
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv))
    seqs, positions = _sample_rows(50)
    q = RNG.standard_normal((50, n_heads, hd)).astype(np.float32)
    base = _attend(gpu, cache, q, seqs, positions, 0.1)
    # 10_000 blocks an SM: every row gets the table's width of blocks, most past its last chunk
    # (they leave at once, and the merge must not wait for them)
    for blocks, part_bytes in ((1, plan.ATTN_PART_BYTES), (10_000, plan.ATTN_PART_BYTES), (4, 3 * 2**20)):
        monkeypatch.setattr(plan, "BLOCKS_PER_SM", blocks)
        monkeypatch.setattr(plan, "MMA_BLOCKS_PER_SM", blocks)
        monkeypatch.setattr(plan, "ATTN_PART_BYTES", part_bytes)
        assert _attend(gpu, cache, q, seqs, positions, 0.1).tobytes() == base.tobytes()
        assert int(gpu._attn_counters.sum()) == 0
    for dim_warps in (1, 2, 4, 8):  # warps sharing a decode row's MMA rows, each with its share of O
        monkeypatch.setattr(plan, "MMA_DIM_WARPS", dim_warps)
        for blocks in (0, 3):  # O folded in place, or the chunks' partials stored and merged
            monkeypatch.setattr(plan, "MMA_BLOCKS_PER_SM", blocks)
            for share_s in (0, 1):  # S's key tiles computed by every warp, or split and shared
                monkeypatch.setattr(plan, "MMA_SHARE_S", share_s)
                assert _attend(gpu, cache, q, seqs, positions, 0.1).tobytes() == base.tobytes()
    monkeypatch.setattr(plan, "MMA_DIM_WARPS", 4)
    monkeypatch.setattr(plan, "MMA_SHARE_S", 1)
    monkeypatch.setattr(plan, "MMA_BLOCKS_PER_SM", 3)
    monkeypatch.setattr(plan, "MERGE_SCAN", 0)  # the merge's running maxima by each thread's loop, not a scan
    assert _attend(gpu, cache, q, seqs, positions, 0.1).tobytes() == base.tobytes()
    monkeypatch.setattr(plan, "MERGE_SCAN", 1)
    for pairs in (0, 1e9):  # the throughput build for every launch, then the latency build
        monkeypatch.setattr(plan, "ATTN_LATENCY_PAIRS", pairs)
        assert _attend(gpu, cache, q, seqs, positions, 0.1).tobytes() == base.tobytes()
    monkeypatch.setattr(plan, "ATTN_SPREAD", 10**6)  # one query head a block
    assert _attend(gpu, cache, q, seqs, positions, 0.1).tobytes() == base.tobytes()
    # tensor-core kernel: prefill blocks over rows of many sequences (one pass each), other block sizes
    for one_row_max, prefill_rows in ((0, 64), (0, 16), (0, 32), (10**6, 64)):
        monkeypatch.setattr(plan, "MMA_ONE_ROW_MAX", one_row_max)
        monkeypatch.setattr(plan, "MMA_PREFILL_ROWS", prefill_rows)
        assert _attend(gpu, cache, q, seqs, positions, 0.1).tobytes() == base.tobytes()
        assert int(gpu._attn_counters.sum()) == 0


def test_single_launch_merge_equals_the_merge_kernel(gpu, monkeypatch):
    """The last block of a row merging in place gives the bits of the separate attn_merge launch,
    and leaves its tickets at zero for the next launch."""
    from lockstep_kernels.cuda import ops as cuda_ops

    hd, n_heads, n_kv, kv_type = CONFIGS[2]  # the scalar kernel (an f32 cache)
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv))
    seqs, positions = _sample_rows(40)
    q = RNG.standard_normal((40, n_heads, hd)).astype(np.float32)
    one_launch = [_attend(gpu, cache, q, seqs, positions, 0.125) for _ in range(3)]
    assert int(gpu._attn_counters.sum()) == 0
    monkeypatch.setattr(cuda_ops, "ATTN_COUNTERS", 0)
    two_launches = _attend(gpu, cache, q, seqs, positions, 0.125)
    assert all(o.tobytes() == two_launches.tobytes() for o in one_launch)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0"])
def test_attention_out_equals_attention_then_o_projection(gpu, monkeypatch, dtype):
    """attention_out (at 9-16 rows attention stores the o projection's 16-bit input, OUT16) gives the
    bits of attention then matmul with the residual, at every batch width, with the merge kernel or
    the in-place merge."""
    from lockstep_kernels.cuda import ops as cuda_ops
    from lockstep_kernels.weights import Weight

    hd, n_heads, n_kv, kv_type = CONFIGS[1]
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv))
    wo = gpu.upload(Weight.from_f32(RNG.standard_normal((512, n_heads * hd)).astype(np.float32) * 0.05, dtype))
    for counters in (cuda_ops.ATTN_COUNTERS, 0):
        monkeypatch.setattr(cuda_ops, "ATTN_COUNTERS", counters)
        for m in (1, 8, 9, 16, 17):
            seqs, positions = _sample_rows(m)
            q = cp.asarray(RNG.standard_normal((m, n_heads, hd)).astype(np.float32))
            res = cp.asarray(RNG.standard_normal((m, 512)).astype(np.float32))
            rows = cache.rows(seqs, positions)
            want = gpu.matmul(gpu.attention(q, cache.layer, rows, 0.125), wo, residual=res)
            got = gpu.attention_out(q, cache.layer, rows, 0.125, wo, res)
            assert cp.asnumpy(got).tobytes() == cp.asnumpy(want).tobytes(), f"{dtype} m={m} counters={counters}"


LATE_WRITE = r"""
extern "C" __global__ void late_write(unsigned short* k, unsigned short* v, const unsigned short* nk,
                                      const unsigned short* nv, const long long* at, int cells, int n,
                                      long long spin) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // attention may start now
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (int c = 0; c < cells; ++c)
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            k[at[c] * n + i] = nk[c * n + i];
            v[at[c] * n + i] = nv[c * n + i];
        }
}
"""


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("positions", [[699], [520], [510, 511, 512, 513]], ids=["decode", "decode_first_subtile", "verify"])
def test_cells_written_just_before_are_read_after_the_wait(gpu, hd, positions):
    """In a captured step attention starts while the KV write before it still runs (PDL); here that
    write is held back ~50 us. The cells this step writes (a decode row's own; a verify step's rows
    of one sequence, across a page boundary) must come from after the wait, never from a line
    loaded before it: the replay must give the uncaptured step's bits. (The tensor-core kernel loads a
    one-row block's first sub-tile before the wait where it ends T positions before the row: not at
    520, whose own cell is in its chunk's first sub-tile.)"""
    from lockstep_kernels.cuda import launch as kernel_launch

    if not kernel_launch.pdl_supported():
        pytest.skip("programmatic dependent launch needs sm_90")
    n_heads, n_kv, t = 8, 2, len(positions)
    cache = Cache(gpu, hd, n_kv, "f16", _kv(hd, n_kv))
    seqs = [LENGTHS.index(700)] * t
    rows = cache.rows(seqs, positions)
    cells = cp.asarray(cache.slots(seqs, positions))
    k16, v16 = cache.layer.k.view(cp.uint16).ravel(), cache.layer.v.view(cp.uint16).ravel()
    n = n_kv * hd
    stale_k, stale_v = k16.reshape(-1, n)[cells].copy(), v16.reshape(-1, n)[cells].copy()
    new_k = cp.asarray(RNG.standard_normal(t * n).astype(np.float16)).view(cp.uint16)
    new_v = cp.asarray(RNG.standard_normal(t * n).astype(np.float16)).view(cp.uint16)
    q = cp.asarray(RNG.standard_normal((t, n_heads, hd)).astype(np.float32))
    writer = cp.RawKernel(LATE_WRITE, "late_write")

    def step(spin):
        kernel_launch.launch(writer, (1,), (128,), (k16, v16, new_k, new_v, cells, np.int32(t), np.int32(n),
                                                   np.int64(spin)))
        return gpu.attention(q, cache.layer, rows, hd**-0.5)

    def restore():
        k16.reshape(-1, n)[cells] = stale_k
        v16.reshape(-1, n)[cells] = stale_v

    stream = cp.cuda.Stream(non_blocking=False)
    with stream:
        want = cp.asnumpy(step(0))  # uncaptured: the write is done before attention starts
        restore()
        step(0)  # sizes the memory pool outside the capture
        stream.begin_capture()
        out = step(100_000)
        graph = stream.end_capture()
        for _ in range(5):
            restore()
            graph.launch(stream)
            assert cp.asnumpy(out).tobytes() == want.tobytes()


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[1]], ids=str)
def test_long_context_row_alone_in_a_prefill_tile_and_padded(gpu, monkeypatch, config):
    """A row at a long context (9000 keys) gets the same bits alone (chunks spread over workers, or
    folded in one block), inside a 512-row prefill of its sequence, and beside padding rows (position
    0, as a decode graph pads); and matches the float64 reference within the stated tolerance."""
    hd, n_heads, n_kv, kv_type = config
    lengths = [9000, 8]
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv, lengths), lengths=lengths)
    scale = hd**-0.5
    pos = 8999 - 37
    q_row = RNG.standard_normal((n_heads, hd)).astype(np.float32)
    alone = _attend(gpu, cache, q_row[None], [0], [pos], scale)[0]
    monkeypatch.setattr(plan, "MMA_SHARE_S", 1 - plan.MMA_SHARE_S)  # every warp computing all of S, or shared
    assert _attend(gpu, cache, q_row[None], [0], [pos], scale)[0].tobytes() == alone.tobytes()
    monkeypatch.setattr(plan, "MERGE_SCAN", 1 - plan.MERGE_SCAN)  # the merge's running maxima: loop or scan
    assert _attend(gpu, cache, q_row[None], [0], [pos], scale)[0].tobytes() == alone.tobytes()
    monkeypatch.undo()
    monkeypatch.setattr(plan, "BLOCKS_PER_SM", 0)  # one block a row: the chunks folded in registers
    monkeypatch.setattr(plan, "MMA_BLOCKS_PER_SM", 0)
    assert _attend(gpu, cache, q_row[None], [0], [pos], scale)[0].tobytes() == alone.tobytes()
    monkeypatch.setattr(plan, "MMA_DIM_WARPS", 1)  # one warp keeping all of O, folded in place
    assert _attend(gpu, cache, q_row[None], [0], [pos], scale)[0].tobytes() == alone.tobytes()
    monkeypatch.setattr(plan, "MMA_BLOCKS_PER_SM", 1000)  # one warp, a block a chunk
    assert _attend(gpu, cache, q_row[None], [0], [pos], scale)[0].tobytes() == alone.tobytes()
    monkeypatch.undo()
    padded = _attend(gpu, cache, np.concatenate([q_row[None], np.zeros((7, n_heads, hd), np.float32)]),
                     [0] + [1] * 7, [pos] + [0] * 7, scale)[0]
    assert padded.tobytes() == alone.tobytes()
    for at in (0, 200, 511):
        positions = np.arange(pos - at, pos - at + 512)
        positions = positions[positions < 9000]
        q = RNG.standard_normal((len(positions), n_heads, hd)).astype(np.float32)
        q[at] = q_row
        got = _attend(gpu, cache, q, np.zeros(len(positions), int), positions, scale)
        assert got[at].tobytes() == alone.tobytes(), f"row {at} of the prefill"
    # float64 reference from the cache's own 16-bit contents
    layer = cache.cpu_layer(gpu)
    kc, vc = (np.asarray(a).view(np.float16 if kv_type == "f16" else np.uint16) for a in (layer.k, layer.v))
    if kv_type == "bf16":
        kc, vc = ((a.astype(np.uint32) << 16).view(np.float32) for a in (kc, vc))
    pages = cache.tables[0, : _pages_for(pos + 1)]
    keys = kc[pages].reshape(-1, n_kv, hd)[: pos + 1].astype(np.float64)
    vals = vc[pages].reshape(-1, n_kv, hd)[: pos + 1].astype(np.float64)
    group = n_heads // n_kv
    ref = np.empty((n_heads, hd))
    for hq in range(n_heads):
        s = keys[:, hq // group] @ q_row[hq].astype(np.float64) * scale
        w = np.exp(s - s.max())
        ref[hq] = w @ vals[:, hq // group] / w.sum()
    err = np.linalg.norm(alone.reshape(n_heads, hd) - ref) / np.linalg.norm(ref)
    assert err < _tolerance(hd, kv_type), f"relative error {err:.2e} against float64"
