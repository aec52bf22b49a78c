"""Prefill attention on wgmma (attention_wgmma.cu, LOCKSTEP_WGMMA_ATTN) on an sm_90 GPU.

The contract needs attn_mma's bits: a decode row (attn_mma's one-row blocks) and the same row inside a
prefill must agree, so every prefill output is compared bit for bit with attn_mma's (switch off) on the
same launch. Beside that: against the float32 CPU reference (relative error < 2e-3 for f16 caches,
< 1e-2 for bf16: both kernels round q and the softmax weights to 16 bits), and a row's bits whatever
chunking of its prompt or batch it is launched in, and whatever garbage lies past its sequence's end.
"""

import numpy as np
import pytest

from tests.cuda_fixtures import cp, gpu  # noqa: F401 (gpu: fixture)

pytestmark = pytest.mark.gpu

from lockstep_kernels.base import PAGE_SIZE, PagedRows  # noqa: E402
from lockstep_kernels.cpu.ops import CpuOps  # noqa: E402
from tests.test_cuda_attention import RNG, Cache, _attend, _kv, _tolerance  # noqa: E402

CONFIGS = [  # head dim, query heads, KV heads, KV type: the 8B shape, bf16, groups of 7, 16 and 2
    (128, 32, 8, "f16"), (128, 32, 8, "bf16"), (128, 28, 4, "f16"), (64, 32, 2, "bf16"), (64, 16, 8, "f16"),
]
LENGTHS = [1, 255, 256, 257, 700, 1300, 3000]


@pytest.fixture
def wgmma(gpu, monkeypatch):
    if not gpu.wgmma:
        pytest.skip("attention_wgmma.cu is sm_90a code")
    return lambda on: monkeypatch.setattr(gpu, "wgmma_attention", on)


def _both(gpu, wgmma, cache, q, seqs, positions, scale):
    """(attn_wgmma, attn_mma) outputs of one launch; checks the switch took the wgmma kernel."""
    n_heads, hd = q.shape[1:]
    n_kv = int(cache.layer.k.shape[2])
    wgmma(True)
    assert gpu.attention_build(len(seqs), n_heads, n_kv, hd, cache.width, cache.layer.kv_type) == "wgmma_tile"
    got = _attend(gpu, cache, q, seqs, positions, scale)
    wgmma(False)
    assert gpu.attention_build(len(seqs), n_heads, n_kv, hd, cache.width, cache.layer.kv_type) != "wgmma_tile"
    return got, _attend(gpu, cache, q, seqs, positions, scale)


def _launches(lengths):
    """Prefill-sized launches: a 512-row ubatch of the 3000-token prompt, 65 rows (one warpgroup a
    block), a mixed batch of rows of every sequence (passes per sequence inside blocks)."""
    long = len(lengths) - 1
    yield np.full(512, long), np.arange(2488, 3000)
    yield np.full(65, long - 1), np.arange(1235, 1300)
    seqs = RNG.integers(0, len(lengths), 300)
    yield seqs, np.array([RNG.integers(0, lengths[s]) for s in seqs])


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_wgmma_gives_attn_mma_bits_and_matches_the_reference(gpu, wgmma, config):
    hd, n_heads, n_kv, kv_type = config
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv, LENGTHS), lengths=LENGTHS)
    scale = hd**-0.5
    for seqs, positions in _launches(LENGTHS):
        q = RNG.standard_normal((len(seqs), n_heads, hd)).astype(np.float32)
        got, want = _both(gpu, wgmma, cache, q, seqs, positions, scale)
        cpu_rows = PagedRows(positions.astype(np.int32), seqs.astype(np.int32), cache.tables, np.zeros(len(seqs)))
        ref = CpuOps(exact=True).attention(q, cache.cpu_layer(gpu), cpu_rows, scale)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert np.isfinite(got).all() and err < _tolerance(hd, kv_type), f"relative error {err:.2e}"
        diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        assert not diff.size, f"{diff.size} values differ from attn_mma's, first at row {diff[0] // got.shape[1]}"


@pytest.mark.parametrize("config", CONFIGS[:2], ids=str)
def test_a_prompt_row_keeps_its_bits_whatever_the_chunking(gpu, wgmma, config):
    """The 3000-token prompt prefilled in one launch, in ubatches of 512, 100 and 65 rows, and beside
    another prompt's rows: every row the same bits; a row alone (a decode launch, attn_mma) too."""
    hd, n_heads, n_kv, kv_type = config
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv, LENGTHS), lengths=LENGTHS)
    scale = hd**-0.5
    n = LENGTHS[-1]
    q = RNG.standard_normal((n, n_heads, hd)).astype(np.float32)
    wgmma(True)
    whole = _attend(gpu, cache, q, np.full(n, 6), np.arange(n), scale)
    for ubatch in (512, 100, 65):
        starts = range(0, n - ubatch + 1, ubatch)  # whole ubatches only: every launch prefill-sized
        parts = [_attend(gpu, cache, q[a : a + ubatch], np.full(ubatch, 6), np.arange(a, a + ubatch), scale)
                 for a in starts]
        assert np.concatenate(parts).tobytes() == whole[: len(starts) * ubatch].tobytes(), f"ubatches of {ubatch}"
    other = 700
    mixed = _attend(gpu, cache, np.concatenate([RNG.standard_normal((other, n_heads, hd)).astype(np.float32), q[:400]]),
                    np.concatenate([np.full(other, 4), np.full(400, 6)]), np.concatenate([np.arange(other), np.arange(400)]),
                    scale)
    assert mixed[other:].tobytes() == whole[:400].tobytes()
    for row in (0, 255, 256, 1299, n - 1):
        alone = _attend(gpu, cache, q[row][None], [6], [row], scale)[0]
        assert alone.tobytes() == whole[row].tobytes(), f"row {row} alone"


# attention_ws.cu's knobs (plan.WGMMA_WS_*) per build the tests force: as planned, the lean build
# (LOCKSTEP_ATTN_WS_LEAN's: compares skipped, ex2.approx.ftz weights, float2 fold), that with the
# softmax overlap and that with its K/V by TMA (WGMMA_WS_TMA: the CudaOps' attention_ws_tma)
LEAN = {"WGMMA_WS_LEAN": True, "WGMMA_WS_FTZ": True, "WGMMA_WS_SKIP_MASK": True, "WGMMA_WS_VEC_FOLD": True,
        "WGMMA_WS_TMA": False}
WS_BUILDS = {"planned": {"WGMMA_WS_TMA": False}, "lean": LEAN, "lean_ov": {**LEAN, "WGMMA_WS_OVERLAP": True},
             "lean_tma": {**LEAN, "WGMMA_WS_TMA": True}}


def _ws_build(gpu, monkeypatch, build):
    from lockstep_kernels.cuda import plan

    for k, v in WS_BUILDS[build].items():
        monkeypatch.setattr(*((gpu, "attention_ws_tma") if k == "WGMMA_WS_TMA" else (plan, k)), v)


@pytest.mark.parametrize("build", ["default", "lean", "lean_tma"])
def test_cells_past_the_sequence_end_are_never_read(gpu, wgmma, monkeypatch, build):
    """NaN in every cell past each sequence's last position (pages of other sequences, stale data)
    changes no output: the sub-tile past a pass's last position is zero-filled, its scores -inf (the
    default build, and attention_ws.cu's lean builds forced: the TMA one copies that sub-tile)."""
    if build != "default":
        monkeypatch.setattr(gpu, "attention_ws", True)
        _ws_build(gpu, monkeypatch, build)
    hd, n_heads, n_kv, kv_type = CONFIGS[0]
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv, LENGTHS), lengths=LENGTHS)
    scale = hd**-0.5
    seqs, positions = next(_launches(LENGTHS))
    q = RNG.standard_normal((len(seqs), n_heads, hd)).astype(np.float32)
    wgmma(True)
    clean = _attend(gpu, cache, q, seqs, positions, scale)
    for s, n in enumerate(LENGTHS):
        last = cache.tables[s, (n - 1) // PAGE_SIZE]
        for a in (cache.layer.k, cache.layer.v):
            a.view(cp.uint16)[int(last), (n - 1) % PAGE_SIZE + 1 :] = 0xFFFF  # NaN in f16 and bf16
    used = {int(p) for s, n in enumerate(LENGTHS) for p in cache.tables[s, : -(-n // PAGE_SIZE)]}
    for p in set(range(cache.n_pages)) - used:
        for a in (cache.layer.k, cache.layer.v):
            a.view(cp.uint16)[p] = 0xFFFF
    dirty = _attend(gpu, cache, q, seqs, positions, scale)
    assert np.isfinite(dirty).all() and dirty.tobytes() == clean.tobytes()


@pytest.mark.parametrize("build", WS_BUILDS)
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_warp_specialised_kernel_gives_attn_mma_bits_on_every_launch(gpu, wgmma, monkeypatch, config, build):
    """attention_ws.cu (the producer/ping-pong build) on every launch of two warpgroups a block, its
    fill threshold forced to 0 so the 65-row and mixed launches (several passes a block) take it too;
    a group of 2 (64 rows a warpgroup past 32 query rows a block) keeps one warpgroup."""
    from lockstep_kernels.cuda import plan

    hd, n_heads, n_kv, kv_type = config
    monkeypatch.setattr(plan, "WGMMA_ATTN_FILL", 0.0)
    monkeypatch.setattr(gpu, "attention_ws", True)
    _ws_build(gpu, monkeypatch, build)
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv, LENGTHS), lengths=LENGTHS)
    scale = hd**-0.5
    for seqs, positions in _launches(LENGTHS):
        wt = plan.wgmma_attention_launch(len(seqs), n_heads, n_kv, hd, cache.width, gpu.sm_count, kv_type, True)
        assert wt.ws == (wt.groups == 2) and wt.ws == (128 // wt.gp <= plan.MMA_MAX_RB)
        q = RNG.standard_normal((len(seqs), n_heads, hd)).astype(np.float32)
        got, want = _both(gpu, wgmma, cache, q, seqs, positions, scale)
        diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        assert np.isfinite(got).all() and not diff.size, f"{diff.size} values differ from attn_mma's"


@pytest.mark.parametrize("build", ["planned", "lean"])
@pytest.mark.parametrize("config", CONFIGS[:2], ids=str)
def test_warp_specialised_kernel_keeps_the_bits_of_subnormal_weights(gpu, wgmma, monkeypatch, config, build):
    """Scores spread over hundreds (q times 40): many softmax weights under 2^-126, which the lean
    build's ex2.approx.ftz makes +0 (f16 caches only); P in f16 and a sum of at least 1 lose them
    anyway, so the bits stay attn_mma's."""
    from lockstep_kernels.cuda import plan

    hd, n_heads, n_kv, kv_type = config
    monkeypatch.setattr(plan, "WGMMA_ATTN_FILL", 0.0)
    monkeypatch.setattr(gpu, "attention_ws", True)
    _ws_build(gpu, monkeypatch, build)
    cache = Cache(gpu, hd, n_kv, kv_type, _kv(hd, n_kv, LENGTHS), lengths=LENGTHS)
    seqs, positions = next(_launches(LENGTHS))
    q = 40 * RNG.standard_normal((len(seqs), n_heads, hd)).astype(np.float32)
    got, want = _both(gpu, wgmma, cache, q, seqs, positions, hd**-0.5)
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert np.isfinite(got).all() and not diff.size, f"{diff.size} values differ from attn_mma's"
