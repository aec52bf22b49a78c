// The exact prefill matmul on Hopper's warpgroup MMA (wgmma, sm_90a), fed by the Tensor Memory
// Accelerator: mm_tc's sums, element for element (tests/test_cuda_ops.py checks it against every
// other matmul kernel; why it has this shape: lockstep_kernels/cuda/DECISIONS.md).
//
// mm_tc's arithmetic (matmul.cu): K in chunks of 32; in each chunk one MMA takes the k set {0-3,
// 8-11, 16-19, 24-27}, the next {4-7, 12-15, 20-23, 28-31} (which order inside one instruction
// changes no bits, and wgmma rounds as mma.sync does: both checked on the device); chunks
// ascending inside each of S slices (bounds s * C / S), slices joined in order.
//
// A block's two consumer warpgroups compute 128 weight rows x 128 tokens (WG_GROUPS 1: one
// warpgroup, 64 rows, two blocks an SM, where 128-row tiles would leave SMs idle). Weights are
// wgmma's A operand, from registers: lane (g, t) of a warp reads k 8t..8t+7 of its rows g and g+8
// (16 bytes each) from shared memory, mm_tc's own fragment: words 0-1 feed the first MMA, 2-3 the
// second. The k slot each word fills fixes which k of the tokens must meet it, so the tokens (B,
// from shared memory, K-major) come permuted within each chunk (act_to_16 with `perm`): four
// 16-byte units per token and chunk, units 0-1 the first MMA's k slots 0-15, units 2-3 the
// second's. A pipeline stage holds WG_KC = 2 chunks; a stage's token rows (128 bytes) carry the
// hardware's 128-byte swizzle, without which the MMA's shared-memory reads conflict eightfold.
// Weights sit unswizzled, [chunk][row][64 bytes]: a quarter-warp's 16-byte reads are 128
// consecutive bytes.
//
// The warp after the consumers is the producer: per stage a TMA copy per chunk brings the block's
// weight rows x 64 bytes and one the stage's 128 tokens (a tensor map with the 128-byte swizzle); a
// `full` mbarrier counts their bytes. The consumer warps only wait, read their fragments and issue
// MMAs: no block-wide barrier, no copy instructions. Each consumer warp arrives on the stage's
// `empty` barrier once its MMAs on it are done; the producer refills the stage after all of them.
//
// Builds (plan.WGMMA_BUILDS), none changing a sum: 64-, 128- or 192-row tiles (WG_GROUPS); a grid of
// tiles or a persistent one (WG_PERSIST); the producer a warp or a warpgroup lending its registers
// (WG_SETMAXNREG); clusters of two blocks along the weights that share the token tile, each copying half
// of it to both by TMA multicast, their consumers releasing a stage in both blocks (WG_MC); the first
// stages' weights copied before the wait for the previous kernel (WG_EARLY).
#include "common.cuh"

typedef unsigned u32;

#ifndef WG_GROUPS
#define WG_GROUPS 2  // consumer warpgroups, 64 weight rows each (plan.wgmma_launch: 1 where tiles are few)
#endif
#ifndef WG_PERSIST
#define WG_PERSIST 0  // 1: a block per SM walks the tiles (plan.wgmma_launch's `persist`)
#endif
#ifndef WG_EARLY
#define WG_EARLY 0  // 1: the producer copies the first stages' weights before waiting for the previous kernel
#endif
#ifndef WG_MC
#define WG_MC 0  // 1: clusters of two blocks along the weight tiles, each bringing half the shared tokens to both
#endif
#define WG_ROWS (64 * WG_GROUPS)  // weight rows per block
#define WG_CONSUMERS (128 * WG_GROUPS)
// WG_SETMAXNREG 1: the producer is a warpgroup of its own that gives most of its registers to the
// consumers (setmaxnreg; one thread of it issues the copies). Three consumer warpgroups need it: a
// thirteenth warp would leave them 128 registers; a persistent block of two needs more than 168 too.
#ifndef WG_SETMAXNREG
#define WG_SETMAXNREG (WG_GROUPS == 3)
#endif
#define WG_PRODUCERS (WG_SETMAXNREG ? 128 : 32)
#define WG_REGS (WG_GROUPS == 3 ? 160 : 232)         // a consumer's, setmaxnreg: per scheduler 512 a lane
#define WG_PRODUCER_REGS (WG_GROUPS == 3 ? 24 : 40)  // 3 x 160 + 24 or 2 x 232 + 40
#define WG_THREADS (WG_CONSUMERS + WG_PRODUCERS)
#define WG_TOK 128   // tokens per block (the MMA's N)
#define WG_KC 2      // 32-k chunks per pipeline stage
#ifndef WG_STAGES
#define WG_STAGES 4  // stages in shared memory (plan.WGMMA_STAGES)
#endif
#define WG_DEPTH 2  // chunks whose MMAs may be in flight (3 made ptxas serialize the MMAs: C7513)
#define X_STAGE (WG_KC * WG_TOK * 64)
#define W_STAGE (WG_KC * WG_ROWS * 64)
#define ROW_BYTES (WG_KC * 64)  // one token's row of a stage

// K-major with the 128-byte swizzle: 8-token groups ROW_BYTES * 8 apart; the leading offset is unused.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr) {
    return (unsigned long long)((addr >> 4) & 0x3fff) | ((unsigned long long)(((ROW_BYTES * 8) >> 4) & 0x3fff) << 32) |
           (1ull << 62);
}

#define WGMMA_RA(T)                                                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db))

template <int BF16>
__device__ __forceinline__ void wgmma_ra(float (&d)[64], u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long db) {
    if constexpr (BF16) {
        WGMMA_RA("bf16");
    } else {
        WGMMA_RA("f16");
    }
}

// mm_tc's S slices over the C chunks: each summed from zero, joined in order once its MMAs are done.
// Slices are loops of their own so that no branch in the chunk loop touches the accumulators (see
// NOTES: ptxas waited for every MMA at the loop's back edge where one did). The loop goes a stage
// (two chunks) at a time, with each chunk's place in its stage known at compile time: a chunk loop
// that worked it out at run time (a wait test and stage arithmetic every chunk) issued the MMAs too
// slowly to keep the tensor cores busy (NOTES, session 12). `chunk(st, kc, a0, a1)` runs chunk kc of
// stage st with its fragments in a0, a1: none an MMA in flight still reads.
template <typename Chunk>
__device__ __forceinline__ void slices(Chunk& chunk, float (&part)[64], float (&total)[64], unsigned C, unsigned S) {
    static_assert(WG_KC == 2 && WG_DEPTH == 2, "a stage is two chunks, each with fragments of its own");
    uint4 a[2][2];
    for (unsigned s = 0; s < S; ++s) {
        const unsigned end = (unsigned)(((i64)(s + 1) * C) / S);
        for (unsigned c = (unsigned)(((i64)s * C) / S); c < end;) {
            if (!(c & 1) && c + 2 <= end) {
                for (; c + 2 <= end; c += 2) {
                    chunk(c >> 1, 0, a[0][0], a[0][1]);
                    chunk(c >> 1, 1, a[1][0], a[1][1]);
                }
            } else {  // a slice that begins or ends inside a stage: that chunk alone, all MMAs done first
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                chunk(c >> 1, c & 1, a[0][0], a[0][1]);
                ++c;
            }
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
        for (int i = 0; i < 64; ++i) {
            total[i] = s == 0 ? part[i] : __fadd_rn(total[i], part[i]);
            part[i] = 0.f;
        }
    }
}

#define MBAR_BRKPT WG_SETMAXNREG
#include "tma.cuh"

// TMA multicast: the box lands at `dst` and signals `bar` (offsets in this block's shared memory) in every
// block of the cluster named in `mask`
__device__ __forceinline__ void tma_2d_multicast(unsigned dst, const TensorMap* map, int c0, int c1, unsigned bar,
                                                 unsigned short mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
                 : "memory");
}

// arrives on the mbarrier at `bar` (an offset in this block's shared memory) of block `rank` of the cluster
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned rank) {
    asm volatile("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar), "r"(rank) : "memory");
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}


// EPI_SILU | EPI_OUT16: silu_times of each gate/up pair rounded to the MMA's 16 bits (act_to_16's
// rounding) and stored in act_to_16's `perm` order, so the down projection takes it as it is: [M, N / 2]
// 16-bit values, N / 2 a multiple of 32. Two neighbouring features are one 32-bit word: lane g + 1
// hands its value to lane g. total[16q + 4j + i] as in the plain store below.
template <int BF16>
__device__ __forceinline__ void silu_store16(const float (&total)[64], int n_first, int m_first,
                                             unsigned* __restrict__ out, int M, int N) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int f = (n_first >> 1) + g, word = perm_word(f >> 1);  // stored by even g only: f is a pair's first k
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float v = silu_times(total[16 * q + 4 * j + e], total[16 * q + 4 * j + 2 + e]);
                const float next = __shfl_down_sync(0xffffffffu, v, 4);
                const int m = m_first + 32 * q + 8 * j + 2 * t + e;
                if (!(g & 1) && m < M && 2 * f < N)
                    out[(i64)m * (N >> 2) + word] = BF16 ? pack_bf16x2(v, next) : pack_f16x2(v, next);
            }
}

template <int BF16>
__device__ __forceinline__ void mm_wgmma_tma(const TensorMap* wmap, const TensorMap* xmap,
                                             const float* __restrict__ bias, const float* __restrict__ res,
                                             float* __restrict__ out, int M, int N, int Kp, int flags, int S) {
    extern __shared__ unsigned char smem_raw[];
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    // Tiles are numbered token tile fastest: the blocks that share a weight tile run together, so it comes
    // from DRAM once (weight tiles first: every tile read once per token tile, 8B gate|up at 512 rows 4x
    // its bytes). A grid of tiles runs one a block; a persistent grid (WG_PERSIST) walks them block by
    // block, its producer filling the next tile's stages while the consumers store this one's.
#if WG_PERSIST && WG_MC  // a cluster walks pairs of tiles that share their tokens, block `rank` the pair's rank-th
#define TILES for (int tile = blockIdx.x >> 1; tile < ((M + WG_TOK - 1) / WG_TOK) * ((N + WG_ROWS - 1) / WG_ROWS / 2); tile += gridDim.x >> 1)
#define TILE_N0 (((tile / ((M + WG_TOK - 1) / WG_TOK)) * 2 + (int)rank) * WG_ROWS)
#define TILE_M0 ((tile % ((M + WG_TOK - 1) / WG_TOK)) * WG_TOK)
#elif WG_PERSIST
#define TILES for (int tile = blockIdx.x; tile < ((M + WG_TOK - 1) / WG_TOK) * ((N + WG_ROWS - 1) / WG_ROWS); tile += gridDim.x)
#define TILE_N0 ((tile / ((M + WG_TOK - 1) / WG_TOK)) * WG_ROWS)
#define TILE_M0 ((tile % ((M + WG_TOK - 1) / WG_TOK)) * WG_TOK)
#else
#define TILES for (int tile = 0; tile < 1; ++tile)
#define TILE_N0 ((int)blockIdx.y * WG_ROWS)
#define TILE_M0 ((int)blockIdx.x * WG_TOK)
#endif
    const int C = Kp >> 5, stages = (C + WG_KC - 1) / WG_KC;
    const unsigned raw = (unsigned)__cvta_generic_to_shared(smem_raw);
    const unsigned base = (raw + 1023) & ~1023u;  // swizzle atoms aligned (plan.wgmma_smem has the slack)
    const unsigned char* const wsmem = smem_raw + (base - raw) + WG_STAGES * X_STAGE;
    const unsigned wbase = base + WG_STAGES * X_STAGE;
    const unsigned full = wbase + WG_STAGES * W_STAGE, empty = full + 8 * WG_STAGES;  // mbarriers
    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 4 * WG_GROUPS * (WG_MC ? 2 : 1));  // WG_MC: both blocks' consumers
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#if WG_MC
    cluster_sync();  // the partner's barriers exist before any copy signals them
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#else
    __syncthreads();
#endif
#if !WG_EARLY
    pdl_start();
#endif

    if (tid >= WG_CONSUMERS) {  // the producer warp (warpgroup); one thread issues everything
#if WG_SETMAXNREG
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WG_PRODUCER_REGS) : "memory");
#endif
        if (tid == WG_CONSUMERS) {
            unsigned it = 0;  // stages filled so far, over all of this block's tiles
#if WG_EARLY
            // The first stages' weights before the wait for the previous kernel (no kernel writes weights):
            // their DRAM latency hides behind that kernel's last blocks.
            const unsigned early = stages < WG_STAGES ? stages : WG_STAGES;
            TILES {
                const int n0 = TILE_N0;
                for (unsigned st = 0; st < early; ++st) {
                    mbar_expect(full + 8 * st, X_STAGE + W_STAGE);
#pragma unroll
                    for (int kc = 0; kc < WG_KC; ++kc)
                        tma_2d(wbase + st * W_STAGE + kc * WG_ROWS * 64, wmap, (st * WG_KC + kc) * 32, n0, full + 8 * st);
                }
                break;  // the block's first tile
            }
            pdl_start();
#endif
            TILES {
                const int n0 = TILE_N0, m0 = TILE_M0;
                for (int st = 0; st < stages; ++st, ++it) {
                    const unsigned s = it % WG_STAGES;
                    if (it >= WG_STAGES) mbar_wait(empty + 8 * s, ((it / WG_STAGES) - 1) & 1);
#if WG_EARLY
                    if (it >= early) {
#endif
                    mbar_expect(full + 8 * s, X_STAGE + W_STAGE);
#pragma unroll
                    for (int kc = 0; kc < WG_KC; ++kc)
                        tma_2d(wbase + s * W_STAGE + kc * WG_ROWS * 64, wmap, (st * WG_KC + kc) * 32, n0, full + 8 * s);
#if WG_EARLY
                    }
#endif
#if WG_MC
                    tma_2d_multicast(base + s * X_STAGE + rank * (X_STAGE / 2), xmap, st * WG_KC * 32,
                                     m0 + rank * (WG_TOK / 2), full + 8 * s, 3);
#else
                    tma_2d(base + s * X_STAGE, xmap, st * WG_KC * 32, m0, full + 8 * s);
#endif
                }
            }
        }
#if WG_MC
        cluster_sync();  // neither block leaves while the other may still signal its barriers
#endif
        return;
    }
#if WG_SETMAXNREG
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WG_REGS) : "memory");
#endif
#if WG_EARLY
    pdl_start();  // before the epilogue's residual and stores
#endif

#ifdef WG_LAG
    // odd warpgroups start WG_LAG clocks late, so that the two drain their slices at different times (probe)
    if (wg & 1)
        for (const long long t0 = clock64(); clock64() - t0 < WG_LAG;) {
        }
#endif
    // a warp's MMAs on stage use `it` are done: one arrival on its empty barrier (WG_MC: the partner's too, for
    // the partner's half of its tokens)
    auto release = [&](unsigned it) {
        mbar_arrive(empty + 8 * (it % WG_STAGES));
#if WG_MC
        mbar_arrive_cluster(empty + 8 * (it % WG_STAGES), rank ^ 1);
#endif
    };
    const int frag = (wg * 64 + warp * 16 + g) * 64 + t * 16;  // this lane's weights within a chunk
    unsigned done = 0;  // stages consumed by this block's earlier tiles
    TILES {
        float part[64], total[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) part[i] = total[i] = 0.f;

        // One chunk: the wait for its stage when it opens one, then two MMAs; afterwards at most
        // WG_DEPTH chunks' MMAs are in flight, so the stage before this one is free to refill.
        auto chunk = [&](unsigned st, unsigned kc, uint4& a0, uint4& a1) {
            const unsigned it = done + st, s = it % WG_STAGES;
            if (kc == 0) mbar_wait(full + 8 * s, (it / WG_STAGES) & 1);
            const unsigned char* ws = wsmem + s * W_STAGE + kc * WG_ROWS * 64;
            a0 = *reinterpret_cast<const uint4*>(ws + frag);
            a1 = *reinterpret_cast<const uint4*>(ws + frag + 8 * 64);
            const unsigned xs = base + s * X_STAGE + kc * 64;
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            wgmma_ra<BF16>(part, a0.x, a1.x, a0.y, a1.y, smem_desc(xs));
            wgmma_ra<BF16>(part, a0.z, a1.z, a0.w, a1.w, smem_desc(xs + 32));
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(WG_DEPTH - 1) : "memory");
            if (kc == 0 && st > 0 && lane == 0) release(it - 1);
        };
        slices(chunk, part, total, (unsigned)C, (unsigned)S);
        done += stages;
        // every MMA is done (slices): the tile's last stage is free for the next tile's copies
        if (WG_PERSIST && lane == 0) release(done - 1);
        const int n0 = TILE_N0, m0 = TILE_M0;
#ifdef WG_NOSTORE
        if (M > 0) continue;  // timing only: what the stores cost (bench/probes/mm_wgmma_ab.py)
#endif
        if ((flags & (EPI_SILU | EPI_OUT16)) == (EPI_SILU | EPI_OUT16)) {
            silu_store16<BF16>(total, n0 + wg * 64 + warp * 16, m0, reinterpret_cast<unsigned*>(out), M, N);
            continue;
        }
        // total[16q + 4j + i] (row g, + 8 for i >= 2; token 32q + 8j + 2t, + 1 for odd i): store_tiles' layout
#pragma unroll
        for (int q = 0; q < 4; ++q)
            store_tiles<1>(*reinterpret_cast<const float(*)[1][4][4]>(total + 16 * q), n0 + wg * 64 + warp * 16,
                           m0 + 32 * q, bias, res, out, M, N, flags);
    }
#if WG_MC
    cluster_sync();
#endif
#undef TILES
#undef TILE_N0
#undef TILE_M0
}

#if WG_MC && WG_PERSIST
#define WG_CLUSTER __cluster_dims__(2, 1, 1)
#elif WG_MC
#define WG_CLUSTER __cluster_dims__(1, 2, 1)
#else
#define WG_CLUSTER
#endif
#define MM_WGMMA_TMA(NAME, BF16)                                                                              \
    extern "C" __global__ void __launch_bounds__(WG_THREADS, WG_GROUPS == 1 ? 2 : 1) WG_CLUSTER                   \
        NAME(const __grid_constant__ TensorMap wmap, const __grid_constant__ TensorMap xmap, const float* bias, \
             const float* res, float* out, int M, int N, int Kp, int flags, int S) {                          \
        mm_wgmma_tma<BF16>(&wmap, &xmap, bias, res, out, M, N, Kp, flags, S);                                 \
    }

MM_WGMMA_TMA(mm_wgmma_tma_f16, 0)
MM_WGMMA_TMA(mm_wgmma_tma_bf16, 1)
