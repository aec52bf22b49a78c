"""Launch shapes of the CUDA kernels, as plain arithmetic (testable without a GPU).

The exactness rule lives here: `split_k` — the only choice that changes how an output element of
a matmul is summed — is a function of the weight shape (N, K) and the device alone. Everything
that may depend on the number of rows M (`token_tiles`, grids, the attention worker count) only
decides which rows share a launch, never a row's arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

ROW_TILE = 16  # weight rows per MMA tile (the 16-side)
TOKEN_TILE = 8  # token rows per MMA tile (the 8-side)
K_CHUNK = 32  # k per chunk: two m16n8k16 MMAs, one Q8_0 block
MAX_SPLIT = 32  # warps per block
KQUANT_TYPES = ("q4_k", "q5_k", "q6_k")  # blocks the kernels read as planes (lockstep_kernels/cuda/kquant.py)
F16_MMA_KQUANTS = ("q4_k", "q6_k")  # of them, those matmul.cu's f16 MMA family reads too
KQ_MAX_SPLIT = 16  # their kernels' blocks: at most 512 threads, so that each may hold 128 registers
# One row of these at split KQ_MAX_SPLIT runs on matmul.cu's mm_*_one16 / mm_*_norm16 (two blocks an SM,
# same bits).
ONE16_TYPES = ("q4_k", "q6_k")
# 9-16 rows of these in 16-bit pairs run on mm_*_tm2h2: two row tiles a block sharing the tokens' loads
# (and Q4_K's ones sums), each tile's sums as mm_*_tm2h's. Empty until a GPU probe shows it faster.
X16_RT2_TYPES: tuple[str, ...] = ()
# One row of these takes 16-bit pairs where the kernel before can write them (attention's output, the
# gated product; rms_norm_16 where no norm prologue): mm_*_oneh / mm_*_one16h, the one-row kernel's
# bits without its activation shuffles (8B Q4_K_M step 3200 -> 3145 us on an H100).
ONE_X16_TYPES: tuple[str, ...] = ("q4_k", "q6_k")
# K-quants on kquant_mm.cu's integer kernels at every M (activations quantised per chunk); False: on
# matmul.cu's f16 MMA family (streaming, tiled, wide), whose sums differ. Off by default: the integer
# kernels win one row but lose batches and prefill (DECISIONS.md).
KQ_INTEGER = False
KQ_TILE_ROWS = 17  # batches of at least this many rows may take kquant_mm.cu's tiled kernel (same bits)
KQ_TILE_FILL = 0.5  # ... where its blocks (2 an SM fit) number at least this many times the SMs
KQ_TILE_SPLIT: bool | None = None  # its K slices in blocks of their own (True; kq_tile_grid)
KQT_ROWS = 4  # its row tiles a block (kquant_mm.cu's KQT_ROWS)
KQ_TILE8 = False  # its 4-token-tile blocks walking all of K as 8 row tiles (mmq_*_tile4r8, one an SM; same bits)
# Batches of 2-16 rows on mmq_*_tr (row tiles a warp, activations staged once per chunk): None: kq_tr_tiles
# picks the tiles a warp; 1, 2, 4: forced; 0: mmq_tc instead (same bits every way; mmq_*_tr the faster
# at 16 rows on the H200, bench/evidence/kquant-cuda-h200.md)
KQ_TR: int | None = None
KQ_TR_FILL = 0.5  # ... the most tiles a warp (<= 4) whose warps still number this many times WARPS_PER_SM an SM
KQ_TR_BLOCKS = 0.9  # ... and whose blocks this many times the SMs
KQR_STAGES = 2  # kquant_mm.cu's: a warp's ring stages
KQ_TR_SMEM = 200 * 1024  # mmq_*_tr's shared-memory opt-in, above kq_tr_shared's largest (179200 bytes)


def kquant_planes(dtype: str) -> bool:
    """Whether weights of this type reach the kernels as planes (else f16 at load): the types the
    kernels in use read."""
    return dtype in (KQUANT_TYPES if KQ_INTEGER else F16_MMA_KQUANTS)
KERNEL_NAMES = {"f16": "f16", "bf16": "bf16", "q8_0": "q8", "q4_k": "q4k", "q5_k": "q5k", "q6_k": "q6k"}  # suffixes
WARPS_PER_SM = 16  # warps in flight per SM that keep its load units busy for a weight stream
SMEM_LIMIT = 48 * 1024  # static + dynamic shared memory without an opt-in
F32_ROWS_PER_BLOCK = 8  # weight rows of the float32 kernel (one warp each)
F32_TOKENS_PER_Y = 32  # token rows per grid.y of the float32 kernel
ATTN_THREADS = 256  # one thread per key of a page-sized chunk
ATTN_PART_BYTES = 256 << 20  # scratch for chunk partials; larger batches run in row slices
BLOCKS_PER_SM = 4  # attention blocks wanted per SM before chunks are spread over workers
DELTA_CHUNK = 32  # prompt positions per chunk of the gated delta rule (deltanet.cu), from position 0


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def padded_shape(n: int, k: int) -> tuple[int, int]:
    """A 2-D weight as stored on the device: rows to whole 16-row tiles, columns to whole chunks."""
    return round_up(n, ROW_TILE), round_up(k, K_CHUNK)


def split_k(n: int, k: int, sm_count: int, dtype: str = "f16") -> int:
    """Warps that split one row tile's K (a power of two): enough warps in flight to stream the
    weights at full bandwidth, at least one chunk per warp. Never a function of M."""
    tiles = ceil_div(n, ROW_TILE)
    chunks = ceil_div(k, K_CHUNK)
    limit = KQ_MAX_SPLIT if dtype in KQUANT_TYPES else MAX_SPLIT
    s = 1
    while s < limit and tiles * s < WARPS_PER_SM * sm_count and 2 * s <= chunks:
        s *= 2
    return s


def max_token_tiles(split: int) -> int:
    """Token tiles a block may carry at this split (register bound of the kernel, shared memory of
    the combine tree)."""
    cap = 8 if split <= 8 else (4 if split <= 16 else 2)
    while cap > 1 and combine_bytes(split, cap) > SMEM_LIMIT:
        cap //= 2
    return cap


def combine_bytes(split: int, token_tiles: int) -> int:
    """Shared memory of the combine: the partial sums of warps 1 .. S-1."""
    return (split - 1) * 32 * token_tiles * 4 * 4


@dataclass(frozen=True)
class MatmulLaunch:
    kernel: str  # e.g. "mm_f16_tm2"
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int  # dynamic shared memory bytes
    split: int
    token_tiles: int
    defines: tuple[tuple[str, int], ...] = ()  # the source's -D defines (mm_wgmma_tma's build)


def matmul_launch(dtype: str, m: int, n: int, k: int, sm_count: int, split: int | None = None,
                  prologue: str | None = None) -> MatmulLaunch:
    """The tensor-core launch for x[m, k] @ w[n, k]^T. `split` overrides split_k (benchmarks only:
    a different split is a different summation order). `prologue="norm"` (one row only) picks the
    kernel that normalises its input row itself; any other single row gets the one-row kernel.
    `prologue="x16"` (where reads_16bit) picks the kernel whose activations come rounded to 16 bits."""
    if prologue == "norm" and m != 1:
        raise ValueError(f"a {prologue} prologue is for one row, not {m}")
    s = split_k(n, k, sm_count, dtype) if split is None else split
    want = ceil_div(max(m, 1), TOKEN_TILE)
    tm = 1
    while tm < want and tm < max_token_tiles(s):
        tm *= 2
    if prologue == "x16":
        if m == 1 and dtype in ONE_X16_TYPES:
            prologue = "oneh"
        elif tm != 2:
            raise ValueError(f"16-bit activations are for the 9-16-row kernel (one row: ONE_X16_TYPES), not {m} rows")
        else:
            prologue = "tm2h"
    name = KERNEL_NAMES[dtype]
    variant = prologue or ("one" if m == 1 else f"tm{tm}")
    tiles_a_block = 2 if variant == "tm2h" and dtype in X16_RT2_TYPES else 1
    grid = (ceil_div(n, ROW_TILE * tiles_a_block), ceil_div(max(m, 1), TOKEN_TILE * tm), 1)
    shared = combine_bytes(s, tm)
    if variant in ("one", "norm", "oneh") and s == KQ_MAX_SPLIT and dtype in ONE16_TYPES:
        variant = {"one": "one16", "norm": "norm16", "oneh": "one16h"}[variant]
    elif tiles_a_block == 2:
        variant += "2"
    return MatmulLaunch(f"mm_{name}_{variant}", grid, (32 * s, 1, 1), shared, s, tm)


def kq_tile_grid(m: int, n: int, k: int, sm_count: int, dtype: str) -> tuple[tuple[int, int, int], int] | None:
    """The tiled integer kernel's grid and token tiles a warp for m rows, if it takes them: from
    KQ_TILE_ROWS rows, when its blocks (KQT_ROWS row tiles x 16 tn tokens) fill KQ_TILE_FILL of the
    SMs walking all of K; else the streaming kernels (mmq_tc) keep more warps in flight. Which kernel
    never changes a bit. KQ_TILE_SPLIT True: a block per K slice (grid z = split_k) where the blocks
    do not fill (on the H200 at 16 rows 1.6x slower than mmq_tc); False: z = 1 at every m (tests)."""
    if m < KQ_TILE_ROWS:
        return None
    tn = 1
    while 16 * tn < m and tn < 4:
        tn *= 2
    gx, gy = ceil_div(ceil_div(n, ROW_TILE), KQT_ROWS), ceil_div(m, 16 * tn)
    s = split_k(n, k, sm_count, dtype)
    fill = KQ_TILE_FILL * sm_count
    if KQ_TILE_SPLIT is False or (KQ_TILE_SPLIT is None and gx * gy >= fill):
        return (gx, gy, 1), tn
    if s > 1 and KQ_TILE_SPLIT:
        return (gx, gy, s), tn
    return None


def kq_tr_tiles(m: int, n: int, k: int, sm_count: int, dtype: str) -> int:
    """Row tiles a warp of mmq_*_tr for m rows (2-16), 0 where mmq_tc takes them: the most (1, 2, 4)
    that keep KQ_TR_FILL of the streaming kernel's warps in flight and a block on KQ_TR_BLOCKS of the
    SMs, so each warp's reads of a chunk's activation records serve that many tiles. Decides which
    tiles share a warp, never a bit."""
    if not 2 <= m <= 2 * TOKEN_TILE or KQ_TR == 0:
        return 0
    if KQ_TR is not None:
        return KQ_TR
    tiles = ceil_div(n, ROW_TILE)
    warps = tiles * split_k(n, k, sm_count, dtype)
    r = 4
    while r > 1 and (warps / r < KQ_TR_FILL * WARPS_PER_SM * sm_count or tiles / r < KQ_TR_BLOCKS * sm_count):
        r //= 2
    return r


def kq_tr_shared(split: int, tiles: int, token_tiles: int) -> int:
    """mmq_*_tr's dynamic shared memory: combine_slices' partial sums of R tiles, then each warp's ring
    of KQR_STAGES stages of U chunks (KQR_U) x its tokens' records (64 + 16 bytes)."""
    u = {1: 4, 2: 2, 4: 1}[tiles]
    return combine_bytes(split, tiles * token_tiles) + split * KQR_STAGES * u * TOKEN_TILE * token_tiles * 80


def kq_integer_launch(dtype: str, m: int, n: int, k: int, sm_count: int) -> MatmulLaunch:
    """The launch of kquant_mm.cu's kernels for m rows: matmul_launch's split, grid and combine, the
    one-row dp4a kernel (mmq_*_one), the tiled one, or the int8-MMA one of its token tiles (2-16 rows
    mmq_*_tr*, several row tiles a warp; else mmq_*_tm*)."""
    mm = matmul_launch(dtype, m, n, k, sm_count)
    tiled = kq_tile_grid(m, n, k, sm_count, dtype)
    if tiled is not None:  # the tiled kernel (mmq_*_tileN): whole K a warp, the same S slices
        grid, tn = tiled
        if KQ_TILE8 and tn == 4 and grid[2] == 1:
            return MatmulLaunch(f"mmq_{KERNEL_NAMES[dtype]}_tile4r8", (ceil_div(grid[0], 2), *grid[1:]),
                                (128 * KQT_ROWS, 1, 1), 0, mm.split, 8)
        return MatmulLaunch(f"mmq_{KERNEL_NAMES[dtype]}_tile{tn}", grid, (64 * KQT_ROWS, 1, 1), 0, mm.split, 2 * tn)
    r = kq_tr_tiles(m, n, k, sm_count, dtype)
    if r:  # mmq_*_tr: r tiles a warp, the same slices
        grid = (ceil_div(mm.grid[0], r), *mm.grid[1:])
        return MatmulLaunch(f"mmq_{KERNEL_NAMES[dtype]}_tr{r}_tm{mm.token_tiles}", grid, mm.block,
                            kq_tr_shared(mm.split, r, mm.token_tiles), mm.split, mm.token_tiles)
    variant = "one" if m == 1 else f"tm{mm.token_tiles}"
    return MatmulLaunch(f"mmq_{KERNEL_NAMES[dtype]}_{variant}", mm.grid, mm.block, mm.shared, mm.split,
                        mm.token_tiles)


ALL_ROWS_TOKENS = 16  # steps of at most this many tokens get tiles that hold every row an expert can take


def moe_token_tiles(pairs: int, experts: int, cap: int, tokens: int = 0) -> int:
    """Token tiles a block of the grouped expert matmul (mmg_*) carries: enough for the mean rows of
    an expert that got any and, in a step of at most ALL_ROWS_TOKENS tokens, for all of them (an
    expert takes a token once), so that every routed expert's weights are read once; at most `cap`
    (max_token_tiles of the experts' splits). It decides which rows share a block, never a row's sums."""
    rows = ceil_div(pairs, max(1, min(experts, pairs)))
    if tokens <= ALL_ROWS_TOKENS:
        rows = max(rows, tokens)
    want = ceil_div(rows, TOKEN_TILE)
    tm = 1
    while tm < want and tm < cap:
        tm *= 2
    return tm


def moe_tiles(pairs: int, experts: int, rows: int) -> int:
    """Tiles of at most `rows` rows the grouped matmul's grid holds for `pairs` (token, expert) pairs
    however they route: sum over experts of ceil(c_e / rows) <= pairs / rows + the experts used."""
    return ceil_div(pairs, rows) + min(experts, pairs)


def reads_16bit(m: int, n: int, k: int, sm_count: int, dtype: str = "f16") -> bool:
    """Whether a normalised input of m rows reaches the streaming kernel rounded to 16 bits already
    (rms_norm_16, the pairs the MMAs take): the 9-16-row kernel, whose float32 rows with a batch's
    loads in flight do not fit its 64 registers (lockstep_kernels/cuda/DECISIONS.md); one row of
    ONE_X16_TYPES (mm_*_oneh)."""
    if m == 1:
        return dtype in ONE_X16_TYPES
    return matmul_launch(dtype, m, n, k, sm_count).token_tiles == 2


NORM_PROLOGUE_BYTES = 8 << 20  # L2 reads of a matmul whose every block normalises the input row itself


def norm_prologue(n: int, k: int) -> bool:
    """Whether a one-row matmul normalises its input row itself (kernel mm_*_norm) instead of after a
    separate rms_norm launch. Every block reads the whole row: past ~8 MB in all that burst costs
    more than the launch saves."""
    return ceil_div(n, ROW_TILE) * k * 4 <= NORM_PROLOGUE_BYTES


# matvec.cu's builds, the first whose largest split fits a launch's: (largest split (its MV_MAX_WARPS),
# the build's defines, warps of it an SM holds at its register count). A split none fits, or whose
# defines are None, runs mm_tc.
MV_BUILDS: tuple[tuple[int, tuple[tuple[str, int], ...] | None, int], ...] = ((16, (), 16),)
MV_TYPES = ("f16", "bf16")
MV_MAX_SEGS = 128  # matvec.cu's: segments a gated norm prologue normalises apart
MV_GATED = True  # one-row gated_norm_matmul as one launch (mv_*_gated) rather than gated_rms_norm, then matvec


def matvec_smem(k: int, split: int, norm: bool) -> int:
    """Dynamic shared memory of matvec.cu: the row's 16-bit pairs, its float32 copy (norm, gated), and two
    buffers of warps 1 .. S-1's partials (8 rows' two sums each)."""
    kp = round_up(k, K_CHUNK)
    return kp * 2 + (kp * 4 if norm else 0) + 2 * (split - 1) * 16 * 4


def matvec_build(split: int) -> tuple[tuple[tuple[str, int], ...], int] | None:
    """The defines and warps an SM of the matvec.cu build for this split, or None."""
    d, wps = next(((d, wps) for top, d, wps in MV_BUILDS if split <= top), (None, 0))
    return None if d is None else (d, wps)


def matvec_launch(dtype: str, n: int, k: int, sm_count: int, prologue: str | None = None,
                  warps_per_sm: int | None = None, max_split: int | None = None) -> MatmulLaunch | None:
    """The one-row launch of matvec.cu (mm_tc's sums at split_k's split; `prologue` "norm" or "gated":
    the kernel normalises its row, see matvec.cu), or None where it does not apply: other weight types, a split no build takes, or a row too long for shared memory. One wave
    of blocks, each walking an equal share of the row tiles (grid-stride). `warps_per_sm` and
    `max_split` override the build's (benchmarks)."""
    if dtype not in MV_TYPES:
        return None
    s = split_k(n, k, sm_count, dtype)
    build = matvec_build(s)
    shared = matvec_smem(k, s, prologue in ("norm", "gated"))
    if (build is None and max_split is None) or s > (max_split or s) or shared > SMEM_LIMIT:
        return None
    wps = warps_per_sm or (build[1] if build else MV_BUILDS[0][2])
    tiles = ceil_div(n, ROW_TILE)
    per = ceil_div(tiles, sm_count * max(1, wps // s))
    return MatmulLaunch(f"mv_{dtype}_{prologue or 'one'}", (ceil_div(tiles, per), 1, 1), (32 * s, 1, 1), shared, s, 1)


MV_NORM_BYTES = NORM_PROLOGUE_BYTES  # L2 reads of the row by every block up to which matvec.cu normalises it


def matvec_norm(n: int, k: int, sm_count: int, dtype: str = "f16") -> bool:
    """Whether the ring kernel normalises its input row itself: each block reads the row once,
    whatever the tiles it walks, so the bound is on blocks x row bytes."""
    mv = matvec_launch(dtype, n, k, sm_count, "norm")
    return mv is not None and mv.grid[0] * round_up(k, K_CHUNK) * 4 <= MV_NORM_BYTES


# Weight types the shared-memory kernels (mm_tile, mm_wide) read (K-quants as staged plane records),
# with the streaming kernel's sums per element.
SHARED_MEMORY_TYPES = ("f16", "bf16", "q8_0", *KQUANT_TYPES)
TILE_N = 64  # weight rows per block of the tiled kernel (mm_tile_*)
TILE_M = 64  # token rows per block of the tiled kernel
TILE_MIN_ROWS = 33  # from this many rows the tiled kernel can beat the streaming one (same bits)
TILE_MIN_BLOCKS_PER_SM = 0.75  # fewer tiles than this leave the device idle: stream instead


def tile_launch(dtype: str, m: int, n: int, k: int, sm_count: int) -> MatmulLaunch | None:
    """The tiled launch for wide batches, or None where it does not apply (narrow batches, too few
    tiles to fill the device, or rows of activations that are not whole 16-byte groups)."""
    if dtype not in SHARED_MEMORY_TYPES or m < TILE_MIN_ROWS or k % 8 or ceil_div(n, TILE_N) * ceil_div(m, TILE_M) < TILE_MIN_BLOCKS_PER_SM * sm_count:
        return None
    grid = (ceil_div(n, TILE_N), ceil_div(m, TILE_M), 1)
    return MatmulLaunch(f"mm_tile_{KERNEL_NAMES[dtype]}", grid, (128, 1, 1), 0, split_k(n, k, sm_count, dtype),
                        TILE_M // TOKEN_TILE)


WIDE_N = 128  # weight rows per block of the wide kernel (mm_wide_*)
WIDE_M = 128  # token rows per block of the wide kernel
WIDE_MIN_ROWS = 128
WIDE_STAGES = 4  # pipeline stages in shared memory
WIDE_KC = 1  # 32-k chunks per stage


def wide_smem(dtype: str, stages: int = WIDE_STAGES, kc: int = WIDE_KC) -> int:
    """Dynamic shared memory of mm_wide: per stage and chunk, 128 weight rows and 128 token rows."""
    return stages * kc * (WIDE_N * (32 if dtype == "q8_0" else 64) + WIDE_M * 64)


def wide_launch(dtype: str, m: int, n: int, k: int, sm_count: int) -> MatmulLaunch | None:
    """The wide launch for long prefills (activations converted to 16 bits first), or None where the
    batch is too short or its tiles would leave the device idle."""
    if dtype not in SHARED_MEMORY_TYPES or m < WIDE_MIN_ROWS or ceil_div(n, WIDE_N) * ceil_div(m, WIDE_M) < TILE_MIN_BLOCKS_PER_SM * sm_count:
        return None
    grid = (ceil_div(n, WIDE_N), ceil_div(m, WIDE_M), 1)
    return MatmulLaunch(f"mm_wide_{KERNEL_NAMES[dtype]}", grid, (256, 1, 1), wide_smem(dtype),
                        split_k(n, k, sm_count, dtype), WIDE_M // TOKEN_TILE)


WGMMA_STAGES = 4  # more stages cost more shared memory than their latency hiding returns
WGMMA_MIN_BLOCKS_PER_SM = 0.45  # fewer tiles than this: the tiled kernels do better
WGMMA_HALF_TILES_BELOW = 0.75  # 128-row tiles per SM below which blocks take 64 weight rows (1B, not 8B)
# mm_wgmma_tma's builds, the same sums (LOCKSTEP_WGMMA_BUILD): "tiles" a block a tile; "persist" a block an
# SM walking the tiles, its producer filling the next tile's stages during this one's stores; "g3" 192-row
# tiles (three consumer warpgroups) where they take fewer waves of the SMs than 128-row ones; "g3p" both;
# "mc" tiles in clusters of two along the weights, each block bringing half the shared tokens to both (TMA
# multicast: a quarter less L2 traffic), where the tiles pair up; "mcp", "g3mc" the combinations (three
# persistent consumer warpgroups with multicast spill at their 160 registers).
WGMMA_BUILDS = ("tiles", "persist", "g3", "g3p", "mc", "mcp", "g3mc")
WGMMA_BUILD = "g3p"  # the H200: 8B layer at 512 rows 461 -> 422 us, 8k prefill 1.065x, bits equal (bench/evidence/s22-mm-wgmma)


def wgmma_smem(rows: int = WIDE_N) -> int:
    """Dynamic shared memory of mm_wgmma_tma: per stage two 32-k chunks of `rows` weight rows and 128
    tokens (wgmma.cu's WG_KC, fixed by its swizzle) and a full and an empty mbarrier; the slack
    that aligns its swizzled tiles to 1024 bytes."""
    return WGMMA_STAGES * (2 * (rows + WIDE_M) * 64 + 16) + 1024


def wgmma_rows(launch: MatmulLaunch) -> int:
    """Weight rows per block of an mm_wgmma_tma launch: 64 per consumer warpgroup."""
    return 64 * dict(launch.defines)["WG_GROUPS"]


def wgmma_token_box(launch: MatmulLaunch) -> int:
    """Tokens a TMA copy of an mm_wgmma_tma stage brings: the block's 128, or half of them (WG_MC)."""
    return WIDE_M // 2 if dict(launch.defines).get("WG_MC") else WIDE_M


def wgmma_launch(dtype: str, m: int, n: int, k: int, sm_count: int, build: str | None = None) -> MatmulLaunch | None:
    """The launch of mm_wgmma_tma (sm_90 only; 16-bit weights) for long prefills, or None where the
    batch is too short or its tiles too few. Under WGMMA_HALF_TILES_BELOW 128-row tiles an SM: 64-row
    tiles, two blocks an SM (faster for 1B-sized weights, slower for 8B's). `build`: WGMMA_BUILDS."""
    blocks = ceil_div(n, WIDE_N) * ceil_div(m, WIDE_M)
    if dtype not in ("f16", "bf16") or m < WIDE_MIN_ROWS or blocks < WGMMA_MIN_BLOCKS_PER_SM * sm_count:
        return None
    build = build or WGMMA_BUILD
    if build not in WGMMA_BUILDS:
        raise ValueError(f"mm_wgmma_tma build {build!r}: one of {WGMMA_BUILDS}")
    rows = WIDE_N // 2 if blocks < WGMMA_HALF_TILES_BELOW * sm_count else WIDE_N
    if rows == WIDE_N and build.startswith("g3") and n % (3 * 64) == 0 and (  # waves x tile height
            ceil_div(ceil_div(n, 192) * ceil_div(m, WIDE_M), sm_count) * 192 < ceil_div(blocks, sm_count) * WIDE_N):
        rows = 192
    mc = "mc" in build and rows > 64 and ceil_div(n, rows) % 2 == 0
    persist = build in ("persist", "g3p", "mcp") and rows > 64
    return wgmma_build_launch(dtype, m, n, k, sm_count, rows, persist, mc)


def wgmma_build_launch(dtype: str, m: int, n: int, k: int, sm_count: int, rows: int, persist: bool,
                       mc: bool = False) -> MatmulLaunch:
    """mm_wgmma_tma with `rows` weight rows a block (64, 128 or 192), a grid of tiles or (`persist`) a block
    per SM over them. Three consumer warpgroups, and two in a persistent block, take a producer warpgroup
    that hands them its registers (wgmma.cu's WG_SETMAXNREG). `mc`: blocks in clusters of two along the
    weights (an even number of weight tiles), each multicasting half the tokens to both (wgmma.cu's WG_MC)."""
    groups = rows // 64
    setmaxnreg = groups == 3 or persist
    tiles = (ceil_div(m, WIDE_M), ceil_div(n, rows), 1)  # token tiles fastest (wgmma.cu)
    if mc and (rows == 64 or tiles[1] % 2 or (persist and rows == 192)):
        raise ValueError(f"multicast pairs need an even number of 128- or 192-row tiles (not persistent: 128), "
                         f"not {tiles[1]} of {rows}")
    blocks = min(tiles[0] * tiles[1], sm_count)
    grid = (blocks - blocks % 2 if mc else blocks, 1, 1) if persist else tiles  # mc: whole clusters
    defines = (("WG_STAGES", WGMMA_STAGES), ("WG_GROUPS", groups), ("WG_PERSIST", int(persist)),
               ("WG_SETMAXNREG", int(setmaxnreg))) + ((("WG_MC", 1),) if mc else ())
    return MatmulLaunch(f"mm_wgmma_tma_{dtype}", grid, (128 * groups + (128 if setmaxnreg else 32), 1, 1),
                        wgmma_smem(rows), split_k(n, k, sm_count), WIDE_M // TOKEN_TILE, defines)


# K-quant prefills on wgmma (wgmma_kq.cu, mm_tc's sums) where mm_wide would take them (8B Q4_K_M 512-token
# prompts 7547 -> 13766 tok/s, bench/evidence/s25-kq-engine); False keeps mm_wide.
WGMMA_KQ = True
WGMMA_KQ_TYPES = ("q4_k", "q6_k")
WGMMA_KQ_STAGES = 6  # wgmma_kq.cu's KG_STAGES (H200: 2-6 % faster than 4, bench/evidence/s24-kqwg)
WGMMA_KQ_PIPE = 1  # wgmma_kq.cu's KG_PIPE: a token slice's FMA step while the next slice's MMAs run
WGMMA_KQ_SLICES = 2  # wgmma_kq.cu's KG_SLICES: Q4_K's token slices a warpgroup (Q6_K's are 4)
WGMMA_KQ_CPASYNC = 1  # wgmma_kq.cu's KG_CPASYNC: the planes by the producers' cp.async (0: a bulk copy a run)
WGMMA_KQ_TOTAL_REGS = 0  # wgmma_kq.cu's KG_TOTAL_REGS (with 4 token slices): the joined K slices in registers; untimed


def wgmma_kq_stage(dtype: str) -> int:
    """One stage of mm_wgmma_kq: two chunks of 128 tokens, 8 row tiles' planes (nibbles 512 bytes, Q6_K's
    top bits 256, scale words 64, super-block scales 64 / 32) and Q4_K's ones sums, to whole 1024 bytes."""
    tile = 512 + 64 + (256 + 32 if dtype == "q6_k" else 64)
    return round_up(2 * WIDE_M * 64 + 8 * tile + 2 * WIDE_M * 4, 1024)


def wgmma_kq_smem(dtype: str, stages: int) -> int:
    """Dynamic shared memory of mm_wgmma_kq: the stages and their two mbarriers, the joined K slices (64
    floats a consumer thread), the swizzle's alignment slack."""
    return stages * (wgmma_kq_stage(dtype) + 16) + 64 * 256 * 4 + 1024


def wgmma_kq_launch(dtype: str, m: int, n: int, k: int, sm_count: int, stages: int | None = None,
                    pipe: int | None = None, slices: int | None = None) -> MatmulLaunch | None:
    """The launch of mm_wgmma_kq (sm_90 only) where mm_wide would take the batch: grid (token tiles,
    128-row weight tiles), mm_wide's split (plan.split_k of the weight), so mm_tc's bits. `stages`,
    `pipe`, `slices`: the build (default WGMMA_KQ_STAGES, _PIPE, _SLICES; and WGMMA_KQ_CPASYNC, _TOTAL_REGS)."""
    wide = wide_launch(dtype, m, n, k, sm_count)
    if dtype not in WGMMA_KQ_TYPES or wide is None or k % 256:
        return None
    stages = WGMMA_KQ_STAGES if stages is None else stages
    pipe = WGMMA_KQ_PIPE if pipe is None else pipe
    slices = WGMMA_KQ_SLICES if slices is None else slices
    grid = (ceil_div(m, WIDE_M), ceil_div(n, WIDE_N), 1)
    defines = (("KG_STAGES", stages), ("KG_PIPE", pipe), ("KG_SLICES", slices), ("KG_CPASYNC", WGMMA_KQ_CPASYNC),
               ("KG_TOTAL_REGS", WGMMA_KQ_TOTAL_REGS))
    return MatmulLaunch(f"mm_wgmma_kq_{KERNEL_NAMES[dtype]}", grid, (384, 1, 1), wgmma_kq_smem(dtype, stages),
                        wide.split, WIDE_M // TOKEN_TILE, defines)


def q4k_ones_grid(m: int, kp: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """matmul.cu's q4k_ones_sums: a warp per 8 tokens and 8 chunks, over whole 128-token tiles."""
    return (ceil_div(m, WIDE_M) * WIDE_M // 64, ceil_div(kp // K_CHUNK, 8), 1), (256, 1, 1)


def f32_matmul_grid(m: int, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return (ceil_div(n, F32_ROWS_PER_BLOCK), ceil_div(max(m, 1), F32_TOKENS_PER_Y), 1), (256, 1, 1)


def group_max(group: int) -> int:
    """Query heads per attention block: the next power of two of the GQA group, at most 8 (larger
    groups are cut into sub-groups; each head's arithmetic is its own)."""
    g = 1
    while g < group and g < 8:
        g *= 2
    return g


@dataclass(frozen=True)
class AttentionLaunch:
    row_slice: int  # rows per launch (bounds the partials' scratch)
    workers: int  # grid.z: blocks that share a row's chunks (bits do not depend on it)
    subgroups: int
    gm: int
    build: tuple[tuple[str, int], ...]  # register budget of attn_partial (bits do not depend on it)


# Blocks (x 128 / head_dim) below which a block takes fewer query heads of its group: with few rows
# more blocks keep more SMs busy; from 4 rows, 4 heads a block are as fast or faster.
ATTN_SPREAD = 32
ATTN_LATENCY_PAIRS = 0.25  # (row, head group) pairs per SM up to which attention is built for latency
LATENCY_BUILD = (("MIN_BLOCKS", 1), ("K_EARLY_OK", 1), ("VBATCH", 16))
THROUGHPUT_BUILD = (("MIN_BLOCKS", 3), ("K_EARLY_OK", 0), ("VBATCH", 8))
# Key rows of up to 64 dims fit in registers whole beside the throughput build's other state: loaded
# before the scores, the values after them. At 128 dims that build is slower.
LATE_VALUES_BUILD = THROUGHPUT_BUILD + (("V_LATE", 1),)


def attention_launch(t: int, n_heads: int, n_kv: int, head_dim: int, width: int, sm_count: int) -> AttentionLaunch:
    """Few (row, head group) pairs: every load of a chunk in flight at once, one block per SM
    and query heads spread over more blocks. Many:
    three blocks per SM, values in batches, so that a whole batch's blocks are resident."""
    group = n_heads // n_kv
    per_row = n_heads * width * (head_dim + 2) * 4
    row_slice = max(1, min(t, ATTN_PART_BYTES // per_row))
    rows = min(t, row_slice)
    gm = group_max(group)
    while gm > 1 and rows * n_kv * ceil_div(group, gm) * 128 < ATTN_SPREAD * head_dim:
        gm //= 2  # few pairs: fewer query heads a block, more blocks (each head's arithmetic is its own)
    sub = ceil_div(group, gm)
    blocks = max(1, rows * n_kv * sub)
    workers = max(1, min(width, ceil_div(BLOCKS_PER_SM * sm_count, blocks)))
    if blocks <= ATTN_LATENCY_PAIRS * sm_count:
        build = LATENCY_BUILD
    else:
        build = LATE_VALUES_BUILD if head_dim <= 64 else THROUGHPUT_BUILD
    return AttentionLaunch(row_slice, workers, sub, gm, build)


def argmax_parts(vocab: int) -> int:
    """Blocks per row of the argmax's first pass: about 2048 values each."""
    return max(1, min(256, ceil_div(vocab, 2048)))


def act16_grid(m: int, kp: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """act_to_16: a thread per 16-byte unit of a row, a grid row per token (rows past 65535 loop)."""
    return (ceil_div(kp // 8, 128), max(1, min(m, 65535)), 1), (128, 1, 1)


def elementwise_grid(n: int, threads: int = 256) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return (max(1, ceil_div(n, threads)), 1, 1), (threads, 1, 1)


# --- tensor-core attention (attention_mma.cu): 16-bit caches, head dims up to 128
MMA_HEAD_DIMS = (32, 64, 128)
MMA_KT = 64  # keys per sub-tile (the kernel's KT)
MMA_PREFILL_ROWS = 64  # MMA rows a prefill block takes (four warps, the most: q is staged in one K/V stage)
MMA_ONE_ROW_MAX = 64  # launches of at most this many rows (decode buckets, verify steps) take one row a block
MMA_MAX_RB = 32  # attn_mma keeps a block's rows in 32-bit masks (todo, act): a 33rd row would never be served
MMA_EX2 = 1  # attn_mma's softmax weights by ex2.approx (1) or expf (0): part of the arithmetic, one value always
MMA_DIM_WARPS = 4  # warps of a one-row block: each computes S and keeps a quarter of O (more warps to stream K/V)
# One-row blocks an SM: the three that fit without the folded O, in one wave. Six (two waves) was faster
# launched alone and slower in the engine's captured steps (bench/evidence/longctx-h200-workers6.md).
MMA_BLOCKS_PER_SM = 3
# A one-row block's warps each compute a quarter of S's key tiles and read the whole S from shared memory
# (SHARE_S), in place of each computing all of S: a quarter of the K reads from shared memory and of the
# score MMAs (the same MMAs: the same bits)
MMA_SHARE_S = 1
MMA_REGISTER_THREADS = 384  # threads an SM whose registers (64K) give each ~170, what a one-row block uses
SM_SHARED = 227 * 1024  # shared memory an SM gives its blocks (sm_90), 1 KB of it reserved per block


# attn_merge's running max before each chunk by a scan over the tile (1) or each thread's own loop (0):
# the same values, the loop a serial chain of up to MT shared loads at long contexts
MERGE_SCAN = 1


def merge_build() -> tuple[tuple[str, int], ...]:
    """attn_merge's defines beyond the head dim and output type (the default build takes none)."""
    return () if MERGE_SCAN else (("MERGE_SCAN", 0),)


def mma_attention(kv_type: str, head_dim: int) -> bool:
    """Whether attention of this cache runs on the tensor-core kernel (16-bit caches)."""
    return kv_type in ("f16", "bf16") and head_dim in MMA_HEAD_DIMS


@dataclass(frozen=True)
class MmaAttentionLaunch:
    gp: int  # MMA rows per query row: the GQA group rounded up to a power of two, at most 16
    rb: int  # query rows per block (bits do not depend on it)
    subgroups: int
    workers: int  # grid.z: blocks that share a row's chunks (bits do not depend on it)
    row_slice: int  # rows per launch when chunk partials are stored (bounds their scratch)
    threads: int
    shared: int  # dynamic shared memory bytes
    dim_warps: int = 1  # warps that share 16 MMA rows (DW; bits do not depend on it)
    min_blocks: int = 1  # blocks an SM the registers must allow (MIN_BLOCKS)
    share_s: int = 0  # the dim warps split S's key tiles (SHARE_S; bits do not depend on it)


def mma_group(group: int) -> int:
    g = 1
    while g < group and g < 16:
        g *= 2
    return g


def mma_attention_smem(head_dim: int, row_warps: int, split: bool = False, share_s: bool = False) -> int:
    """Two stages of K and V sub-tiles (16-bit, rows padded by 8), with share_s a sub-tile's S (f32, rows
    padded by 8) of each row warp's 16 rows, then, unless the chunk partials are stored (split), the
    folded O (f32) of each row warp's 16 rows."""
    s = row_warps * 16 * (MMA_KT + 8) * 4 if share_s else 0
    return 4 * MMA_KT * (head_dim + 8) * 2 + s + (0 if split else (head_dim // 2) * row_warps * 32 * 4)


def mma_attention_launch(t: int, n_heads: int, n_kv: int, head_dim: int, width: int,
                         sm_count: int) -> MmaAttentionLaunch:
    """Decode-sized launches: one query row a block (rows are of different sequences), MMA_DIM_WARPS
    warps sharing its MMA rows, chunks spread over workers until MMA_BLOCKS_PER_SM blocks an SM (a long
    context keeps every SM busy, many short rows still share a row's chunks); prefill: 64 MMA rows a
    block, at most MMA_MAX_RB query rows, chunks spread only where the blocks are fewer than the SMs."""
    group = n_heads // n_kv
    gp = mma_group(group)
    sub = ceil_div(group, gp)
    rb = 1 if t <= MMA_ONE_ROW_MAX else max(1, min(min(MMA_PREFILL_ROWS, MMA_KT) // gp, MMA_MAX_RB))
    row_warps = ceil_div(rb * gp, 16)
    blocks = ceil_div(t, rb) * n_kv * sub
    if rb == 1:
        dim_warps = max(1, min(MMA_DIM_WARPS, head_dim // 16))
        workers = max(1, min(width, MMA_BLOCKS_PER_SM * sm_count // blocks))  # floor: one wave
    else:
        dim_warps = 1
        workers = 1 if blocks >= sm_count else max(1, min(width, ceil_div(BLOCKS_PER_SM * sm_count, blocks)))
    row_slice = t
    if workers > 1:
        per_row = n_heads * width * (head_dim + 2) * 4
        row_slice = max(rb, min(t, ATTN_PART_BYTES // per_row) // rb * rb)
    share_s = int(bool(MMA_SHARE_S) and dim_warps > 1 and (MMA_KT // 16) % dim_warps == 0)  # whole pairs of key tiles
    shared = mma_attention_smem(head_dim, row_warps, workers > 1, bool(share_s))
    # as many as their shared memory allows, while each thread may still hold ~170 registers
    min_blocks = max(1, min(SM_SHARED // (shared + 1024), MMA_REGISTER_THREADS // (row_warps * dim_warps * 32)))
    min_blocks = min_blocks if rb == 1 else 1
    return MmaAttentionLaunch(gp, rb, sub, workers, row_slice, row_warps * dim_warps * 32, shared, dim_warps,
                              min_blocks, share_s)


# --- prefill attention on Hopper's wgmma (attention_wgmma.cu): attn_mma's arithmetic, 64 MMA rows a
# warpgroup. On by default on sm_90 (dispatch.wgmma_attention_on; LOCKSTEP_WGMMA_ATTN=0 turns it off): attn_mma's
# bits on the H200 and 1.4x its speed on a 512-row prefill (bench/evidence/attn-wgmma-ab-h200.json); the
# engine's self-check compares a row's bits under it with the row alone.
WGMMA_ATTN_HEAD_DIMS = (64, 128)  # the swizzled K/V tiles are 64-dim halves
WGMMA_ATTN_FILL = 0.9  # two warpgroups a block (sharing K/V tiles) while their blocks fill this share of the SMs
WGMMA_ATTN_STAGES = {1: 2, 2: 3}  # K/V stages by warpgroups: one-warpgroup blocks fit two an SM
WGMMA_WS_STAGES = 4  # attention_ws.cu's ring: its block is alone on an SM
WGMMA_WS_PINGPONG = True  # its consumers take turns issuing MMAs (PP)
WGMMA_WS_OVERLAP = False  # a consumer's softmax of sub-tile i + 1 beside its P V of i (OV): 0.786 ms at
# 30000 keys without it against 0.819 with it (attn-ws-ab-h200.json), bits equal either way
WGMMA_WS_SKIP_MASK = False  # no position compares where a row sees the whole sub-tile (MK)
WGMMA_WS_LEAN = False  # fewer instructions a sub-tile, the same arithmetic (LN: attention_ws.cu says which)
WGMMA_WS_FTZ = False  # softmax weights by ex2.approx.ftz where P is f16 (FZ; the same bits: row_weights)
WGMMA_WS_VEC_FOLD = False  # the folded O in shared memory as float2s (VF: attention_tc.cuh's fold_vec)
WGMMA_WS_TMA = True  # the lean build's K/V sub-tiles by TMA (TK), a pass's last one by copies (zero past it)


@dataclass(frozen=True)
class WgmmaAttentionLaunch:
    gp: int  # MMA rows per query row (mma_group)
    groups: int  # consumer warpgroups a block (WQ; bits do not depend on it)
    rb: int  # query rows a block: 64 * groups / gp
    subgroups: int
    stages: int  # NS
    threads: int
    shared: int
    ws: bool = False  # attention_ws.cu (two consumer warpgroups and a producer; the same bits)


def wgmma_attention_smem(head_dim: int, groups: int, stages: int) -> int:
    """The K and V rings (16-bit, unpadded, swizzled), then the folded O (f32) of the block's MMA rows,
    where q is staged first; 1 KB to align the swizzle atoms."""
    return 1024 + 2 * stages * MMA_KT * head_dim * 2 + 64 * groups * head_dim * 4


def wgmma_attention_launch(t: int, n_heads: int, n_kv: int, head_dim: int, width: int, sm_count: int,
                           kv_type: str = "f16", ws: bool = False) -> WgmmaAttentionLaunch | None:
    """Prefill-sized launches of a 16-bit cache whose group fills 64-row warpgroups with at most
    MMA_MAX_RB query rows a block (a group of 1 stays on attn_mma); decode-sized ones (attn_mma's
    one-row blocks) never. No split over blocks: the chunks are folded in registers. With ws, the
    two-warpgroup launches take attention_ws.cu (a third warpgroup loads)."""
    if kv_type not in ("f16", "bf16") or head_dim not in WGMMA_ATTN_HEAD_DIMS or t <= MMA_ONE_ROW_MAX:
        return None
    group = n_heads // n_kv
    gp = mma_group(group)
    sub = ceil_div(group, gp)
    if 64 // gp > MMA_MAX_RB:
        return None
    two = 128 // gp <= MMA_MAX_RB and ceil_div(t, 128 // gp) * n_kv * sub >= WGMMA_ATTN_FILL * sm_count
    groups = 2 if two else 1
    if ws and two:
        return WgmmaAttentionLaunch(gp, 2, 128 // gp, sub, WGMMA_WS_STAGES, 384,
                                    wgmma_attention_smem(head_dim, 2, WGMMA_WS_STAGES), True)
    stages = WGMMA_ATTN_STAGES[groups]
    return WgmmaAttentionLaunch(gp, groups, 64 * groups // gp, sub, stages, 128 * groups,
                                wgmma_attention_smem(head_dim, groups, stages))
