"""The CUDA backend's launch planning and host-side layouts, checked without a GPU."""

from types import SimpleNamespace

import numpy as np
import pytest

from lockstep_kernels.cuda import available, dispatch, plan
from lockstep_kernels.cuda.graph_inputs import bucket_for, pack_inputs
from lockstep_kernels.cuda.weights import device_bytes, pad_host
from lockstep_kernels.weights import Weight

SHAPES = [(96, 64), (40, 72), (2048, 2048), (512, 2048), (8192, 2048), (2048, 8192), (128256, 2048),
          (4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]
ROWS = [1, 2, 3, 8, 9, 16, 17, 33, 64, 65, 128, 512, 4096]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_split_is_a_function_of_the_weight_shape_only(shape):
    n, k = shape
    for dtype in ("f16", "bf16", "q8_0"):
        splits = {plan.matmul_launch(dtype, m, n, k, 132).split for m in ROWS}
        assert splits == {plan.split_k(n, k, 132)}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_launches_respect_the_kernel_limits(shape):
    n, k = shape
    for m in ROWS:
        launch = plan.matmul_launch("f16", m, n, k, 132)
        s, tm = launch.split, launch.token_tiles
        assert s & (s - 1) == 0 and 1 <= s <= 32
        assert s <= plan.ceil_div(k, plan.K_CHUNK)  # every warp owns at least one chunk
        assert launch.block[0] * max(1, tm // 2) <= 1024  # the __launch_bounds__ of mm_tc
        assert launch.shared <= plan.SMEM_LIMIT
        assert launch.grid[0] * 16 >= n and launch.grid[1] * 8 * tm >= m
        assert launch.kernel == ("mm_f16_one" if m == 1 else f"mm_f16_tm{tm}")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tiled_launch_uses_the_same_split(shape):
    n, k = shape
    for m in ROWS:
        tiled = plan.tile_launch("f16", m, n, k, 132)
        blocks = plan.ceil_div(n, plan.TILE_N) * plan.ceil_div(m, plan.TILE_M)
        assert (tiled is None) == (m < plan.TILE_MIN_ROWS or k % 8 != 0 or blocks < 0.75 * 132)
        if tiled:
            assert tiled.split == plan.split_k(n, k, 132)
            assert tiled.grid[0] * plan.TILE_N >= n and tiled.grid[1] * plan.TILE_M >= m


@pytest.mark.parametrize("shape", SHAPES[2:], ids=str)
def test_kquant_launches_share_one_split_and_fit_the_device(shape):
    """Q4_K / Q6_K: streaming, tiled and wide launches sum in the split of (N, K, type) whatever the rows;
    the one-row kernel needs only its combine's shared memory."""
    n, k = shape
    for dtype in plan.KQUANT_TYPES:
        split = plan.split_k(n, k, 132, dtype)
        launches = [plan.matmul_launch(dtype, m, n, k, 132) for m in ROWS]
        launches += [plan.matmul_launch(dtype, 1, n, k, 132, prologue="norm")]
        launches += [f(dtype, m, n, k, 132) for f in (plan.tile_launch, plan.wide_launch) for m in ROWS]
        assert {launch.split for launch in launches if launch} == {split}
        name = plan.KERNEL_NAMES[dtype]
        plain = plan.matmul_launch(dtype, 1, n, k, 132)
        normed = plan.matmul_launch(dtype, 1, n, k, 132, prologue="norm")
        wide = "16" if split == plan.KQ_MAX_SPLIT and dtype in plan.ONE16_TYPES else ""
        assert plain.kernel == f"mm_{name}_one{wide}" and normed.kernel == f"mm_{name}_norm{wide}"
        assert plain.shared == plan.combine_bytes(split, 1)


@pytest.mark.parametrize("shape", SHAPES[2:], ids=str)
def test_integer_kquant_launches_share_one_split_and_cover_the_rows(shape):
    """kquant_mm.cu's kernels (one row, 2-16 rows on mmq_*_tr or mmq_tc, the tiled one) sum in the split
    of (N, K, type) at every row count, whatever tiles a warp KQ_TR forces; mmq_*_tr's grid covers N and
    its shared memory fits the opt-in kquant_ops asks for."""
    n, k = shape
    for dtype in plan.KQUANT_TYPES:
        split = plan.split_k(n, k, 132, dtype)
        for tr in (None, 0, 1, 2, 4):
            for m in ROWS:
                default, plan.KQ_TR = plan.KQ_TR, tr
                try:
                    launch = plan.kq_integer_launch(dtype, m, n, k, 132)
                    r = plan.kq_tr_tiles(m, n, k, 132, dtype)
                finally:
                    plan.KQ_TR = default
                assert launch.split == split
                if "_tr" not in launch.kernel:
                    assert r == 0 and not (2 <= m <= 16 and tr != 0 and "_tile" not in launch.kernel)
                    continue
                assert 2 <= m <= 16 and r in (1, 2, 4) and (tr is None or r == tr)
                assert launch.kernel == f"mmq_{plan.KERNEL_NAMES[dtype]}_tr{r}_tm{launch.token_tiles}"
                assert launch.grid[0] * 16 * r >= n and launch.grid[1] * 8 * launch.token_tiles >= m
                assert launch.block[0] == 32 * split <= 512 and launch.shared <= plan.KQ_TR_SMEM <= 227 * 1024


@pytest.mark.parametrize("group", [1, 2, 3, 4, 6, 7, 8, 16])
def test_attention_groups(group):
    launch = plan.attention_launch(5, 4 * group, 4, 128, 3, 132)
    assert launch.gm * launch.subgroups >= group and launch.gm <= 8
    assert launch.gm & (launch.gm - 1) == 0


def test_attention_spreads_the_heads_of_few_rows_over_more_blocks():
    """Grouping decides only which heads share a block (each head's arithmetic is its own)."""
    assert plan.attention_launch(1, 32, 8, 128, 4, 132).gm == 1  # 8B decode, one row
    assert plan.attention_launch(1, 32, 8, 64, 4, 132).gm == 2  # 1B
    assert plan.attention_launch(4, 32, 8, 128, 4, 132).gm == 4
    assert plan.attention_launch(512, 32, 8, 64, 4, 132).gm == 4
    launch = plan.attention_launch(1, 28, 4, 128, 4, 132)  # a group of 7: one head a block
    assert (launch.gm, launch.subgroups) == (1, 7)


def test_attention_build_follows_the_batch_not_the_row():
    """Decode of one or a few rows is built for latency, batches for throughput (same arithmetic)."""
    assert plan.attention_launch(1, 32, 8, 128, 4, 132).build == plan.LATENCY_BUILD
    assert plan.attention_launch(16, 32, 8, 128, 4, 132).build == plan.THROUGHPUT_BUILD
    assert plan.attention_launch(512, 32, 8, 64, 4, 132).build == plan.LATE_VALUES_BUILD


def test_mma_attention_launch_follows_the_batch_not_the_row():
    """Tensor-core attention of 16-bit caches: decode-sized launches take one row a block in four warps
    (chunks over workers up to three blocks an SM in one wave, which fit without the folded O); prefills 64 MMA
    rows a block in two blocks an SM."""
    assert plan.mma_attention("f16", 128) and plan.mma_attention("bf16", 64)
    assert not plan.mma_attention("f32", 128) and not plan.mma_attention("f16", 256)
    one = plan.mma_attention_launch(1, 32, 8, 128, 128, 132)  # 8B decode at 32k
    assert (one.gp, one.rb, one.threads, one.dim_warps, one.workers) == (4, 1, 128, 4, 49)
    assert one.min_blocks == 3 and 3 * (one.shared + 1024) <= plan.SM_SHARED
    assert one.share_s == 1  # its four warps split S's key tiles (a pair each)
    chats = plan.mma_attention_launch(24, 32, 8, 128, 128, 132)  # more rows than SMs still share chunks
    assert chats.workers == 2 and chats.row_slice == 24
    lone = plan.mma_attention_launch(64, 32, 8, 128, 128, 132)  # enough blocks: no split, O folded in place
    assert lone.workers == 1 and lone.shared > one.shared and lone.min_blocks == 2
    assert plan.mma_attention_launch(1, 4, 2, 32, 8, 132).dim_warps == 2  # whole pairs of dim tiles a warp
    tile = plan.mma_attention_launch(512, 32, 8, 128, 128, 132)
    assert (tile.rb, tile.threads, tile.workers, tile.row_slice, tile.share_s) == (16, 128, 1, 512, 0)
    assert 2 * tile.shared <= 227 * 1024  # two blocks an SM on an H100/H200
    odd = plan.mma_attention_launch(100, 28, 4, 128, 16, 132)  # a group of 7: 8 MMA rows a query row
    assert (odd.gp, odd.rb, odd.subgroups) == (8, 8, 1) and odd.row_slice % odd.rb == 0


@pytest.mark.parametrize("group", range(1, 17))
def test_mma_attention_blocks_fit_the_kernels_row_masks(group):
    """attn_mma marks a block's rows in 32-bit masks: without a cap, a group of 1 (n_heads == n_kv, e.g.
    Llama 2 7B) would take 64 rows a block and leave rows 32-63 of each uncomputed."""
    for t in (65, 512, 4096):
        at = plan.mma_attention_launch(t, 8 * group, 8, 128, 64, 132)
        assert 1 <= at.rb <= plan.MMA_MAX_RB and at.rb * at.gp <= plan.MMA_KT, at
        assert at.threads == plan.ceil_div(at.rb * at.gp, 16) * 32, at


def test_norm_prologue_only_where_its_reads_stay_small():
    assert plan.norm_prologue(3072, 2048) and plan.norm_prologue(6144, 4096)  # q|k|v of 1B, 8B
    assert not plan.norm_prologue(28672, 4096) and not plan.norm_prologue(128256, 2048)  # 8B gate|up, lm_head
    assert plan.matmul_launch("f16", 1, 3072, 2048, 132, prologue="norm").kernel == "mm_f16_norm"
    with pytest.raises(ValueError):
        plan.matmul_launch("f16", 2, 3072, 2048, 132, prologue="norm")


def test_16bit_activations_only_for_the_token_tile_pair_kernel():
    """rms_norm_16 feeds the 9-16-row kernel alone (the other kernels read float32 rows)."""
    for n, k in ((6144, 4096), (28672, 4096), (128256, 4096), (3072, 2048)):
        assert [m for m in range(1, 40) if plan.reads_16bit(m, n, k, 132)] == list(range(9, 17))
        assert plan.matmul_launch("bf16", 12, n, k, 132, prologue="x16").kernel == "mm_bf16_tm2h"
    with pytest.raises(ValueError, match="9-16-row"):
        plan.matmul_launch("f16", 8, 4096, 4096, 132, prologue="x16")


def test_two_tile_16_row_kernels_cover_the_rows_in_half_the_blocks(monkeypatch):
    """plan.X16_RT2_TYPES: the 16-bit-input K-quant launch names mm_*_tm2h2 and gives a block two row
    tiles (the last one alone where the count is odd), its split and shared memory mm_*_tm2h's."""
    for n, k in ((1008, 1024), (4096, 4096), (28672, 4096)):
        for dtype in plan.F16_MMA_KQUANTS:
            monkeypatch.setattr(plan, "X16_RT2_TYPES", ())
            one = plan.matmul_launch(dtype, 16, n, k, 132, prologue="x16")
            monkeypatch.setattr(plan, "X16_RT2_TYPES", (dtype,))
            two = plan.matmul_launch(dtype, 16, n, k, 132, prologue="x16")
            assert two.kernel == one.kernel + "2" == f"mm_{plan.KERNEL_NAMES[dtype]}_tm2h2"
            assert two.grid[0] == -(-one.grid[0] // 2) and two.grid[1:] == one.grid[1:]
            assert (two.block, two.split, two.shared) == (one.block, one.split, one.shared)
            assert plan.matmul_launch(dtype, 1, n, k, 132).kernel.startswith(f"mm_{plan.KERNEL_NAMES[dtype]}_one")
        assert plan.matmul_launch("f16", 16, n, k, 132, prologue="x16").kernel == "mm_f16_tm2h"


def test_one_row_16_bit_input_launch_is_the_one_row_launch_on_other_loads(monkeypatch):
    """plan.ONE_X16_TYPES: one row of 16-bit pairs names mm_*_oneh (mm_*_one16h where the one-row launch is
    mm_*_one16) with that launch's grid, block, split and shared memory; other types and rows keep theirs."""
    for n, k in ((1008, 1024), (4096, 4096), (4096, 14336), (28672, 4096)):
        for dtype in plan.F16_MMA_KQUANTS:
            monkeypatch.setattr(plan, "ONE_X16_TYPES", ())
            assert not plan.reads_16bit(1, n, k, 132, dtype)
            with pytest.raises(ValueError, match="ONE_X16_TYPES"):
                plan.matmul_launch(dtype, 1, n, k, 132, prologue="x16")
            monkeypatch.setattr(plan, "ONE_X16_TYPES", (dtype,))
            assert plan.reads_16bit(1, n, k, 132, dtype)
            one = plan.matmul_launch(dtype, 1, n, k, 132)
            h = plan.matmul_launch(dtype, 1, n, k, 132, prologue="x16")
            name = plan.KERNEL_NAMES[dtype]
            assert h.kernel == {f"mm_{name}_one": f"mm_{name}_oneh", f"mm_{name}_one16": f"mm_{name}_one16h"}[one.kernel]
            assert (h.grid, h.block, h.split, h.shared) == (one.grid, one.block, one.split, one.shared)
            assert plan.matmul_launch(dtype, 16, n, k, 132, prologue="x16").kernel.endswith("_tm2h")
            assert not plan.reads_16bit(1, n, k, 132, "f16")


def test_attention_scratch_is_bounded():
    launch = plan.attention_launch(100_000, 32, 8, 128, 128, 132)
    assert launch.row_slice * 32 * 128 * 130 * 4 <= plan.ATTN_PART_BYTES
    assert 1 <= launch.workers <= 128


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
def test_padding_keeps_values_and_adds_zeros(dtype):
    rng = np.random.default_rng(0)
    w = Weight.from_f32(rng.standard_normal((40, 96)).astype(np.float32), dtype)
    data, scales = pad_host(w)
    assert data.shape == (48, 96)
    assert data.nbytes + (scales.nbytes if scales is not None else 0) == device_bytes(w)
    raw = w.data.view(np.uint16) if dtype == "f16" else w.data
    assert np.array_equal(data[:40], raw) and not data[40:].any()
    if dtype == "q8_0":
        assert np.array_equal(scales[:40], w.scales.view(np.uint16)) and not scales[40:].any()


def test_graph_inputs_pad_rows_harmlessly():
    b, width = 4, 3
    host = np.full(3 * b + b * width, 7, dtype=np.int32)
    slots = np.full(b, 7, dtype=np.int64)
    pack_inputs(host, slots, b, width, [11, 12], [300, 5], np.array([[4, 9], [2, 0]]), [9 * 256 + 44, 517])
    assert host[:b].tolist() == [11, 12, 0, 0]
    assert host[b : 2 * b].tolist() == [300, 5, 0, 0]
    assert host[2 * b : 3 * b].tolist() == [0, 1, 2, 3]
    assert host[3 * b :].reshape(b, width).tolist() == [[4, 9, 0], [2, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert slots.tolist() == [9 * 256 + 44, 517, -1, -1]
    with pytest.raises(ValueError):
        pack_inputs(host, slots, b, width, [1], [0], np.zeros((1, 4), np.int32), [0])
    assert bucket_for(3, (1, 2, 4, 8)) == 4 and bucket_for(9, (1, 2, 4, 8)) is None


def test_available_answers_with_a_reason():
    ok, why = available()
    assert isinstance(ok, bool) and why


@pytest.mark.parametrize("shape", [(4096, 4096), (28672, 4096), (3072, 2048), (128256, 2048)], ids=str)
def test_wide_launch_covers_the_batch_with_the_same_split(shape):
    n, k = shape
    for m in (1, 64, 127, 128, 512, 2048):
        wide = plan.wide_launch("f16", m, n, k, 132)
        blocks = plan.ceil_div(n, plan.WIDE_N) * plan.ceil_div(m, plan.WIDE_M)
        assert (wide is None) == (m < plan.WIDE_MIN_ROWS or blocks < 0.75 * 132)
        if wide:
            assert wide.split == plan.split_k(n, k, 132) and wide.kernel == "mm_wide_f16"
            assert wide.grid[0] * plan.WIDE_N >= n and wide.grid[1] * plan.WIDE_M >= m


@pytest.mark.parametrize("shape", [(4096, 4096), (2048, 8192), (1024, 4096), (128256, 2048)], ids=str)
def test_wgmma_launch_covers_the_batch_with_the_same_split(shape):
    n, k = shape
    for dtype in ("f16", "bf16", "q8_0"):
        for m in (1, 127, 128, 512, 2048):
            wg = plan.wgmma_launch(dtype, m, n, k, 132)
            blocks = plan.ceil_div(n, plan.WIDE_N) * plan.ceil_div(m, plan.WIDE_M)
            assert (wg is None) == (dtype == "q8_0" or m < plan.WIDE_MIN_ROWS or blocks < 0.45 * 132)
            if wg:
                rows = plan.wgmma_rows(wg)
                assert rows == 64 if blocks < 0.75 * 132 else rows in (128, 192)  # few tiles: half-height ones
                assert wg.split == plan.split_k(n, k, 132) and wg.kernel == f"mm_wgmma_tma_{dtype}"
                tiles = plan.ceil_div(n, rows) * plan.ceil_div(m, plan.WIDE_M)
                assert wg.grid[0] * wg.grid[1] >= (min(tiles, 132) if dict(wg.defines)["WG_PERSIST"] else tiles)
                assert wg.shared == plan.wgmma_smem(rows) <= (227 * 1024) // (2 if rows == 64 else 1)


@pytest.mark.parametrize("shape", [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (1000, 2816)], ids=str)
def test_wgmma_kq_launch_takes_mm_wides_batches_with_its_split(shape):
    """mm_wgmma_kq (Q4_K, Q6_K) where mm_wide would run, with mm_wide's (so mm_tc's) split, covering every
    tile, in the SM's shared memory; the ones sums' grid covers whole 128-token tiles and every chunk."""
    n, k = shape
    for dtype in ("q4_k", "q6_k", "q8_0", "f16"):
        for m in (1, 127, 128, 512, 2048):
            kq, wide = plan.wgmma_kq_launch(dtype, m, n, k, 132), plan.wide_launch(dtype, m, n, k, 132)
            assert (kq is None) == (dtype not in ("q4_k", "q6_k") or wide is None)
            if kq is None:
                continue
            assert kq.split == wide.split == plan.split_k(n, k, 132, dtype)
            assert kq.kernel == f"mm_wgmma_kq_{plan.KERNEL_NAMES[dtype]}"
            assert kq.grid == (plan.ceil_div(m, 128), plan.ceil_div(n, 128), 1) and kq.block == (384, 1, 1)
            assert kq.shared == plan.wgmma_kq_smem(dtype, plan.WGMMA_KQ_STAGES) <= 227 * 1024
            (gx, gy, _), (threads, _, _) = plan.q4k_ones_grid(m, k)
            assert gx * threads // 32 * 8 == plan.ceil_div(m, 128) * 128 and gy * 8 >= k // 32
    assert max(plan.wgmma_kq_smem(d, 6) for d in ("q4_k", "q6_k")) <= 227 * 1024
    assert all(plan.wgmma_kq_stage(d) % 1024 == 0 for d in ("q4_k", "q6_k"))  # the token tiles' swizzle atoms
    dev = SimpleNamespace(sm_count=132, exact=True, tiled=True, wgmma=True)
    w = SimpleNamespace(dtype="q4_k", shape=(4096, 4096), gate_up=None, rope_tiles=0)
    assert dispatch.matmul_family(dev, 512, w) == ("mm_wgmma_kq" if plan.WGMMA_KQ else "mm_wide")
    for switched in (True, False):  # LOCKSTEP_WGMMA_KQ's say (CudaOps.wgmma_kq) outranks the plan's
        dev.wgmma_kq = switched
        assert dispatch.matmul_family(dev, 512, w) == ("mm_wgmma_kq" if switched else "mm_wide")
        assert dispatch.matmul_family(dev, 1, w) == "mm_tc"


@pytest.mark.parametrize("build", ["persist", "g3", "g3p", "mc", "mcp", "g3mc"])
def test_wgmma_builds_cover_the_tiles_with_the_same_split(build):
    """Every mm_wgmma_tma build sums as the default does (plan.split_k), covers every tile and fits the
    SM: a persistent grid a block an SM at most, 192-row tiles only where they take fewer waves x rows."""
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (2048, 8192)):
        for m in (128, 512, 2048):
            base, wg = plan.wgmma_launch("f16", m, n, k, 132), plan.wgmma_launch("f16", m, n, k, 132, build)
            if base is None:
                assert wg is None
                continue
            d, rows = dict(wg.defines), plan.wgmma_rows(wg)
            assert wg.split == base.split and wg.kernel == base.kernel
            tiles = plan.ceil_div(m, plan.WIDE_M) * plan.ceil_div(n, rows)
            mc = "mc" in build and rows > 64 and plan.ceil_div(n, rows) % 2 == 0
            if d["WG_PERSIST"]:
                assert build in ("persist", "g3p", "mcp") and wg.grid == (min(tiles, 132) // (1 + mc) * (1 + mc), 1, 1)
            else:
                assert wg.grid[0] * wg.grid[1] == tiles
            assert (rows == 192) == (build.startswith("g3") and n % 192 == 0 and (n, m) == (6144, 512))
            assert wg.block[0] == 128 * d["WG_GROUPS"] + (128 if d["WG_SETMAXNREG"] else 32)
            assert d["WG_SETMAXNREG"] == (rows == 192 or d["WG_PERSIST"])
            assert wg.shared == plan.wgmma_smem(rows) <= 227 * 1024
            assert d.get("WG_MC", 0) == mc and plan.wgmma_token_box(wg) == (64 if mc else 128)
    with pytest.raises(ValueError, match="build"):
        plan.wgmma_launch("f16", 512, 4096, 4096, 132, "fast")


def test_moe_tiles_bound_every_routing():
    """The grouped matmul's grid holds the tiles of any routing: each expert's rows in tiles of `rows`."""
    rng = np.random.default_rng(0)
    for t, k, e in [(1, 8, 128), (16, 8, 128), (512, 8, 128), (7, 2, 8), (300, 4, 16)]:
        for rows in (8, 16, 32, 64):
            bound = plan.moe_tiles(t * k, e, rows)
            routings = [rng.permuted(np.tile(np.arange(e), (t, 1)), axis=1)[:, :k],  # spread
                        np.tile(np.arange(k), (t, 1))]  # every token to the same k experts
            for ids in routings:
                counts = np.bincount(ids.ravel(), minlength=e)
                assert sum(-(-c // rows) for c in counts) <= bound


def test_moe_token_tiles_follow_rows_per_expert_within_the_cap():
    assert plan.moe_token_tiles(8, 128, 8) == 1  # one decode token: one row per expert
    assert plan.moe_token_tiles(16 * 8, 128, 8) == 1
    assert plan.moe_token_tiles(8 * 8, 128, 8, tokens=8) == 1  # an expert takes at most the step's 8 tokens
    assert plan.moe_token_tiles(16 * 8, 128, 8, tokens=16) == 2  # 16 tokens: all of an expert's rows in one tile
    assert plan.moe_token_tiles(16 * 8, 128, 1, tokens=16) == 1  # within the cap
    assert plan.moe_token_tiles(32 * 8, 128, 8, tokens=32) == 1  # past ALL_ROWS_TOKENS: the mean
    assert plan.moe_token_tiles(512 * 8, 128, 8) == 4  # 32 rows an expert
    assert plan.moe_token_tiles(512 * 8, 128, 2) == 2


def test_routed_experts_are_planned_at_their_f16_size():
    """K-quant experts are f16 on the device (the grouped kernels read no planes); dense K-quants stay planes."""
    from engine.launch import cuda_weight_bytes

    w = Weight.from_f32(np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32), "q4_k")
    got = cuda_weight_bytes({"model.layers.0.mlp.experts.3.up_proj.weight": w,
                             "model.layers.0.self_attn.o_proj.weight": w})
    assert device_bytes(w) < 64 * 256 * 2
    assert got == 64 * 256 * 2 + device_bytes(w)


def test_wgmma_attention_is_on_by_default_on_sm_90_only():
    """attention_wgmma.cu is the default on sm_90 (LOCKSTEP_WGMMA_ATTN=0 turns it off there); every other
    GPU keeps attn_mma whatever the variable says."""
    from contract.env import WGMMA_ATTN
    from lockstep_kernels.cuda import dispatch

    assert dispatch.wgmma_attention_on("90", {}) is True
    assert dispatch.wgmma_attention_on("90", {WGMMA_ATTN: ""}) is True
    assert dispatch.wgmma_attention_on("90", {WGMMA_ATTN: "1"}) is True
    for off in ("0", "off", "false", "no"):
        assert dispatch.wgmma_attention_on("90", {WGMMA_ATTN: off}) is False
    for cc in ("80", "86", "89", "100", "120"):
        for env in ({}, {WGMMA_ATTN: "1"}, {WGMMA_ATTN: "0"}):
            assert dispatch.wgmma_attention_on(cc, env) is False
    with pytest.raises(ValueError):
        dispatch.wgmma_attention_on("90", {WGMMA_ATTN: "maybe"})


def test_the_wgmma_attention_switch_takes_prefills_only():
    """Where attention_wgmma.cu is on, prefill-sized launches of 16-bit caches take it; decode-sized
    ones, f32 caches and groups of 1 stay where they were."""
    from types import SimpleNamespace

    from lockstep_kernels.cuda import dispatch

    off, on = SimpleNamespace(sm_count=132), SimpleNamespace(sm_count=132, wgmma_attention=True)
    for t in (1, 16, 64, 65, 512, 4096):
        default = dispatch.attention_build(off, t, 32, 8, 128, 128)
        assert default == dispatch.attention_build(SimpleNamespace(sm_count=132, wgmma_attention=False), t, 32, 8, 128, 128)
        assert default != "wgmma_tile"
        assert dispatch.attention_build(on, t, 32, 8, 128, 128) == ("wgmma_tile" if t > 64 else default)
        assert dispatch.attention_build(on, t, 32, 8, 128, 128, "bf16") == ("wgmma_tile" if t > 64 else default)
        assert dispatch.attention_build(on, t, 32, 8, 128, 128, "f32") == dispatch.attention_build(off, t, 32, 8, 128, 128, "f32")
        assert dispatch.attention_build(on, t, 32, 32, 128, 128) == dispatch.attention_build(off, t, 32, 32, 128, 128)
        assert dispatch.attention_build(on, t, 32, 8, 32, 128) == dispatch.attention_build(off, t, 32, 8, 32, 128)


@pytest.mark.parametrize("t", [65, 100, 512, 4096])
def test_wgmma_attention_blocks_fit_an_sm(t):
    for heads, kv, d in ((32, 8, 128), (28, 4, 128), (32, 2, 64), (16, 8, 64)):
        wt = plan.wgmma_attention_launch(t, heads, kv, d, 128, 132)
        assert wt.rb * wt.gp == 64 * wt.groups and wt.rb <= plan.MMA_MAX_RB and wt.threads == 128 * wt.groups
        # two one-warpgroup blocks an SM; and the kernel's own static shared memory beside
        assert (wt.shared + 1024 + 256) * (2 if wt.groups == 1 else 1) <= plan.SM_SHARED
        assert wt.subgroups * wt.gp >= heads // kv
        ws = plan.wgmma_attention_launch(t, heads, kv, d, 128, 132, ws=True)
        # attention_ws.cu serves the two-warpgroup launches alone, with a producer warpgroup beside
        assert ws.ws == (wt.groups == 2) and (ws == wt if not ws.ws else ws.threads == 384 and ws.rb == wt.rb)
        assert ws.shared + 1024 + 512 <= plan.SM_SHARED


def test_attention_ws_is_on_unless_switched_off():
    from contract.env import ATTN_WS
    from lockstep_kernels.cuda import dispatch

    assert dispatch.attention_ws_on({}) is True
    assert dispatch.attention_ws_on({ATTN_WS: "1"}) is True
    assert dispatch.attention_ws_on({ATTN_WS: "0"}) is False


def test_attention_ws_lean_build_is_on_unless_switched_off():
    from contract.env import ATTN_WS_LEAN
    from lockstep_kernels.cuda import dispatch

    assert not (plan.WGMMA_WS_LEAN or plan.WGMMA_WS_FTZ or plan.WGMMA_WS_VEC_FOLD)
    assert dispatch.attention_ws_lean({}) is True
    assert dispatch.attention_ws_lean({ATTN_WS_LEAN: "1"}) is True
    assert dispatch.attention_ws_lean({ATTN_WS_LEAN: "0"}) is False


def test_wgmma_kq_follows_the_plan_unless_switched():
    from contract.env import WGMMA_KQ
    from lockstep_kernels.cuda import dispatch

    assert dispatch.wgmma_kq_switch({}) is None
    assert dispatch.wgmma_kq_switch({WGMMA_KQ: "1"}) is True
    assert dispatch.wgmma_kq_switch({WGMMA_KQ: "0"}) is False


def test_attention_ws_tma_follows_the_plan_unless_switched():
    from contract.env import ATTN_WS_TMA
    from lockstep_kernels.cuda import dispatch

    assert dispatch.attention_ws_tma({}) is bool(plan.WGMMA_WS_TMA)
    assert dispatch.attention_ws_tma({ATTN_WS_TMA: "1"}) is True
    assert dispatch.attention_ws_tma({ATTN_WS_TMA: "0"}) is False
