// K-quant prefill on Hopper's warpgroup MMA (wgmma, sm_90a): mm_tc's sums for WT_Q4K and WT_Q6K, element
// for element (tests/test_cuda_kq_wgmma.py compares them with mm_tc's and mm_wide's).
//
// mm_tc's K-quant arithmetic (matmul.cu: a_frags, q4k_ones, q4k_chunk, mma_chunk): per 32-k chunk,
// Q4_K p = MMA(k set 1) then MMA(k set 2) from zero on the chunk's integers as exact f16, then acc =
// fma(-dmin*m, e, fma(d*sc, p, acc)), e the token's sum of the chunk by an MMA of ones; Q6_K the same two
// MMAs on each 16-value half apart (the other half's lanes zeroed), p the first half's and e the second's,
// acc = fma(sc2, e, fma(sc1, p, acc)); chunks ascending inside plan.split_k's S slices (bounds s * C / S),
// each slice from zero, slices joined in order. Here p and e are wgmma's (scale-d 0, then 1: wgmma rounds
// as mma.sync does, wgmma.cu), A from registers in mm_tc's own fragment layout (a warp's wgmma A fragment
// is mma.sync m16n8k16's): each consumer warp builds its 16-row tile's fragments and scales from the
// tile's record as mm_tile / mm_wide do. The tokens (B) come permuted by act_to_16 (`perm`), as
// mm_wgmma_tma takes them. Q4_K's e depends on the tokens alone: matmul.cu's q4k_ones_sums takes it once
// per (token, chunk) with q4k_ones' own MMAs, and the producer copies it in with the tiles.
//
// A block: two consumer warpgroups of 64 weight rows (8 row tiles) x 128 tokens, and a producer warpgroup.
// A stage (KG_KC = 2 chunks) holds the 128 tokens' rows (TMA, 128-byte swizzle), each row tile's planes
// (nibbles, Q6_K's top bits, scale words, super-block scales: the producer warpgroup's cp.async) and Q4_K's
// ones sums (a bulk copy). The chunk step is FP32 work as large as the MMAs', so a warpgroup takes its 128
// tokens in KG_SLICES token slices, two in flight: a slice's FMA step runs while the next one's MMAs do, and the
// other warpgroup's MMAs fill the rest (KG_PIPE 0: each slice's MMAs, a wait, its step). The running slice
// sum of K stays in registers, the joined K slices in shared memory (a third 64-float accumulator does not
// fit beside two 64-token slices' accumulators; KG_TOTAL_REGS keeps it beside 32-token ones).
#include "common.cuh"

typedef unsigned u32;

#ifndef KG_STAGES
#define KG_STAGES 6  // pipeline stages (plan.WGMMA_KQ_STAGES)
#endif
#ifndef KG_PIPE
#define KG_PIPE 1  // 1: a token slice's FMA step during the next slice's MMAs; 0: in turn
#endif
#ifndef KG_SLICES
#define KG_SLICES 2  // Q4_K's token slices of a warpgroup's 128 (2: m64n64 MMAs, 4: m64n32); Q6_K's are 4
#endif
#define KG_GROUPS 2
#define KG_ROWS (64 * KG_GROUPS)
#define KG_TILES (KG_ROWS / 16)
#define KG_CONSUMERS (128 * KG_GROUPS)
// The producer is a warpgroup of its own that hands most of its registers to the consumers (setmaxnreg):
// with a lone producer warp one scheduler holds three warps, which leaves each
// 168 registers, and the accumulators with two chunks' fragments spill there.
#define KG_THREADS (KG_CONSUMERS + 128)
#define KG_REGS 232          // a consumer's (setmaxnreg)
#define KG_PRODUCER_REGS 40  // 2 x 232 + 40 = 3 x 168, what the launch gave a scheduler's three warps
// setmaxnreg.inc waits until the block's pool holds the registers: a budget past the launch's never runs
static_assert(KG_GROUPS * KG_REGS + KG_PRODUCER_REGS <= 3 * ((65536 / KG_THREADS) & ~7), "setmaxnreg budget");
#ifndef KG_TOTAL_REGS
#define KG_TOTAL_REGS 0  // 1: Q4_K's joined K slices in registers where its token slices are 4 (plan.WGMMA_KQ_TOTAL_REGS)
#endif
#ifndef KG_CPASYNC
#define KG_CPASYNC 1  // 1: the planes' runs by the producers' cp.async; 0: a bulk copy a run (plan.WGMMA_KQ_CPASYNC)
#endif
#define KG_TOK 128
#define KG_KC 2
#define KG_X_STAGE (KG_KC * KG_TOK * 64)  // tokens: 128 rows of 128 bytes
#define KG_E_STAGE (KG_KC * KG_TOK * 4)   // Q4_K's ones sums: a float per (chunk, token)

// A stage's weights: per row tile its two chunks' nibbles (512 bytes), Q6_K's top bits (256), scale words
// (64), then the super-block's scales (Q4_K 64, Q6_K 32); then the ones sums.
template <bool Q6>
struct KgLayout {
    static constexpr int top = KG_TILES * 512, sc = top + (Q6 ? KG_TILES * 256 : 0), d = sc + KG_TILES * 64;
    static constexpr int d_bytes = Q6 ? 32 : 64, tile_bytes = 512 + (Q6 ? 256 : 0) + 64 + d_bytes;
    static constexpr int w_stage = d + KG_TILES * d_bytes, e = KG_X_STAGE + w_stage;
    static constexpr int stage = (e + KG_E_STAGE + 1023) & ~1023;  // tokens 1024-aligned (the swizzle atoms)
};

__device__ __forceinline__ unsigned long long kg_desc(unsigned addr) {  // K-major, 128-byte swizzle
    return (unsigned long long)((addr >> 4) & 0x3fff) | ((unsigned long long)(((KG_KC * 64 * 8) >> 4) & 0x3fff) << 32) |
           (1ull << 62);
}

// d (+)= A B for 64 rows x 64 (32) tokens x 16 k, A from registers; ACC 0: d = A B (a sum's first MMA)
#define KG_WGMMA_N64(ACC)                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                          \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(ACC))

#define KG_WGMMA_N32(ACC)                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                          \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(ACC))

template <int W, int ACC>
__device__ __forceinline__ void kg_mma(float (&d)[W / 2], const u32 (&a)[4], unsigned long long db) {
    if constexpr (W == 64) {
        KG_WGMMA_N64(ACC);
    } else {
        static_assert(W == 32, "token slices of 64 or 32");
        KG_WGMMA_N32(ACC);
    }
}

__device__ __forceinline__ void kg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void kg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void kg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

#define MBAR_BRKPT 1  // setmaxnreg builds: no trap (tma.cuh)
#include "tma.cuh"

__device__ __forceinline__ void kg_bulk(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// One chunk's A fragments and scales of a warp's row tile: the words mm_tc's load_weights packs
// (kq_read_rec's) from the stage, then matmul.cu's a_frags<WT> and kq_chunk_scales; Q6_K's fragments
// masked to each 16-value half as mma_chunk masks them (lanes t = 0, 1 hold the first half).
template <bool Q6>
struct KgChunk {
    u32 a1[4], a2[4], h1[4], h2[4];  // h1, h2: Q6_K's second half (a1, a2 then its first)
    float da, db, ea, eb;
};

template <bool Q6>
__device__ __forceinline__ void kg_load(KgChunk<Q6>& k, const unsigned char* ws, int tile, int kc, int lane) {
    using L = KgLayout<Q6>;
    const int g = lane >> 2;
    const uint2 q = *reinterpret_cast<const uint2*>(ws + tile * 512 + kc * 256 + lane * 8);
    const unsigned top = Q6 ? *reinterpret_cast<const unsigned*>(ws + L::top + tile * 256 + kc * 128 + lane * 4) : 0u;
    const unsigned s = *reinterpret_cast<const unsigned*>(ws + L::sc + tile * 64 + kc * 32 + g * 4);
    const uint2 d = Q6 ? make_uint2(*reinterpret_cast<const unsigned*>(ws + L::d + tile * 32 + g * 4), 0u)
                       : *reinterpret_cast<const uint2*>(ws + L::d + tile * 64 + g * 8);
    const uint4 wa = make_uint4(q.x, top, s, 0u), wb = make_uint4(q.y, d.x, d.y, 0u);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        k.a1[2 * j] = kq_pair(wa.x, wa.y, j, 0, Q6);
        k.a1[2 * j + 1] = kq_pair(wb.x, wa.y, j, 8, Q6);
        k.a2[2 * j] = kq_pair(wa.x, wa.y, j + 2, 0, Q6);
        k.a2[2 * j + 1] = kq_pair(wb.x, wa.y, j + 2, 8, Q6);
    }
    if (Q6) {
        const unsigned lo = (lane & 3) < 2 ? 0xffffffffu : 0u, hi = ~lo;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            k.h1[i] = k.a1[i] & hi;
            k.h2[i] = k.a2[i] & hi;
            k.a1[i] &= lo;
            k.a2[i] &= lo;
        }
    }
    kq_chunk_scales(wa, wb, Q6, k.da, k.db, k.ea, k.eb);
}

// Token m (0..127) of a tile's ones sums sits at kg_epos(m): lane t's four of a 16-token group are one
// 16-byte read (tokens 8j + 2t, + 1 for j = 2J, 2J + 1). matmul.cu's q4k_ones_sums writes this order.
__device__ __forceinline__ int kg_epos(int m) {
    return (m & ~15) | (((m >> 1) & 3) << 2) | (((m >> 3) & 1) << 1) | (m & 1);
}

// A token slice's float step (q4k_chunk's, mma_chunk's for Q6_K) into the running sum: slice q of W tokens,
// p[4j + i] row g (+ 8 for i >= 2), token W q + 8j + 2t (+ 1 for odd i), at part[W / 2 q + 4j + i] (the
// layout store_tiles takes). Q4_K: e of rows g and g + 8 are one value (an MMA of ones gives every row the
// same); Q6_K: e[] the second half's sums.
template <bool Q6, int W>
__device__ __forceinline__ void kg_step(float (&part)[64], const float (&p)[W / 2], const float (&e)[W / 2], int q,
                                        const KgChunk<Q6>& k, const float* es, int t) {
#pragma unroll
    for (int J = 0; J < W / 16; ++J) {
        float4 ev = make_float4(0.f, 0.f, 0.f, 0.f);
        if (!Q6) ev = *reinterpret_cast<const float4*>(es + 16 * ((W / 16) * q + J) + 4 * t);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
            const int i = 4 * (2 * J + jj), o = (W / 2) * q + i;
            if (Q6) {
                part[o] = __fmaf_rn(k.ea, e[i], __fmaf_rn(k.da, p[i], part[o]));
                part[o + 1] = __fmaf_rn(k.ea, e[i + 1], __fmaf_rn(k.da, p[i + 1], part[o + 1]));
                part[o + 2] = __fmaf_rn(k.eb, e[i + 2], __fmaf_rn(k.db, p[i + 2], part[o + 2]));
                part[o + 3] = __fmaf_rn(k.eb, e[i + 3], __fmaf_rn(k.db, p[i + 3], part[o + 3]));
            } else {
                const float e0 = jj ? ev.z : ev.x, e1 = jj ? ev.w : ev.y;
                part[o] = __fmaf_rn(-k.ea, e0, __fmaf_rn(k.da, p[i], part[o]));
                part[o + 1] = __fmaf_rn(-k.ea, e1, __fmaf_rn(k.da, p[i + 1], part[o + 1]));
                part[o + 2] = __fmaf_rn(-k.eb, e0, __fmaf_rn(k.db, p[i + 2], part[o + 2]));
                part[o + 3] = __fmaf_rn(-k.eb, e1, __fmaf_rn(k.db, p[i + 3], part[o + 3]));
            }
        }
    }
}

// The weights are K-quant planes (lockstep_kernels/cuda/kquant.py: nib, and aux = Q6_K's top bits, scale words,
// super-block scales); row tiles past the weight are not copied (their rows are never stored). e (Q4_K):
// q4k_ones_sums' [token tiles][C][128]. Grid (token tiles, weight tiles), token tiles fastest: the blocks
// sharing a weight tile run together.
template <bool Q6>
__device__ __forceinline__ void mm_wgmma_kq(const TensorMap* xmap, const unsigned char* __restrict__ nib,
                                            const unsigned char* __restrict__ aux, const float* __restrict__ e,
                                            const float* __restrict__ bias, const float* __restrict__ res,
                                            float* __restrict__ out, int M, int N, int Kp, int flags, int S) {
    using L = KgLayout<Q6>;
    constexpr int NQ = Q6 ? 4 : KG_SLICES, W = KG_TOK / NQ;  // Q6_K's two sums a slice: 64-token slices spill
    extern __shared__ unsigned char smem_raw[];
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, t = lane & 3;
    const int C = Kp >> 5, stages = C / KG_KC;  // K-quant rows are whole 256-value blocks: C % 8 == 0
    const int T = (N + 15) >> 4, m_tile = blockIdx.x, n0 = blockIdx.y * KG_ROWS, m0 = m_tile * KG_TOK;
    const unsigned raw = (unsigned)__cvta_generic_to_shared(smem_raw);
    const unsigned base = (raw + 1023) & ~1023u;  // swizzle atoms aligned (plan.wgmma_kq_smem has the slack)
    unsigned char* const sbase = smem_raw + (base - raw);
    // the stages, then the joined K slices (64 floats a consumer thread), then the barriers
    float* const joined = reinterpret_cast<float*>(sbase + KG_STAGES * L::stage);
    const unsigned full = base + KG_STAGES * L::stage + 64 * KG_CONSUMERS * 4, empty = full + 8 * KG_STAGES;
    if (tid == 0) {
        for (int s = 0; s < KG_STAGES; ++s) {
            mbar_init(full + 8 * s, KG_CPASYNC ? 1 + 128 : 1);  // expect_tx (and the producers' cp.async)
            mbar_init(empty + 8 * s, 4 * KG_GROUPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    pdl_start();

    if (tid >= KG_CONSUMERS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(KG_PRODUCER_REGS) : "memory");
        const int pt = tid - KG_CONSUMERS;
        const unsigned char* top = aux;  // Q6_K: 128 bytes a (tile, chunk), then the scale words
        const unsigned char* sc = aux + (Q6 ? (i64)T * C * 128 : 0);
        const unsigned char* dp = sc + (i64)T * C * 32;
#if KG_CPASYNC
        // The planes' short runs (32-512 bytes a tile) by cp.async, 16 bytes a thread, tiles past the weight
        // zero: with a bulk copy a run (KG_CPASYNC 0) a chunk's time grew with the copies of its stage.
        constexpr int SEGS = L::tile_bytes / 16, NIB = 32, TOP = Q6 ? 16 : 0, SC = 4;
        for (int st = 0; st < stages; ++st) {
            const unsigned s = st % KG_STAGES, at = base + s * L::stage, bar = full + 8 * s;
            if (st >= KG_STAGES) mbar_wait(empty + 8 * s, ((st / KG_STAGES) - 1) & 1);
            const int c0 = st * KG_KC;
            if (pt == 0) {
                mbar_expect(bar, KG_X_STAGE + (Q6 ? 0 : KG_E_STAGE));
                tma_2d(at, xmap, c0 * 32, m0, bar);
                if (!Q6) kg_bulk(at + L::e, e + ((i64)m_tile * C + c0) * KG_TOK, KG_E_STAGE, bar);
            }
            unsigned char* w = sbase + s * L::stage + KG_X_STAGE;
            for (int i = pt; i < KG_TILES * SEGS; i += 128) {
                // 32-bit offsets (planes under 4 GB): 64-bit ones spill the producers' 40 registers
                const unsigned j = (unsigned)i / SEGS, g = (unsigned)i % SEGS, tile = (unsigned)(n0 >> 4) + j;
                const unsigned tc = tile * (unsigned)C + (unsigned)c0;
                const unsigned char* src;
                unsigned dst;
                if (g < NIB) {
                    src = nib + tc * 256u + g * 16, dst = j * 512 + g * 16;
                } else if (g < NIB + TOP) {
                    src = top + tc * 128u + (g - NIB) * 16, dst = L::top + j * 256 + (g - NIB) * 16;
                } else if (g < NIB + TOP + SC) {
                    src = sc + tc * 32u + (g - NIB - TOP) * 16, dst = L::sc + j * 64 + (g - NIB - TOP) * 16;
                } else {
                    const unsigned o = (g - NIB - TOP - SC) * 16;
                    src = dp + (tile * (unsigned)(C >> 3) + (unsigned)(c0 >> 3)) * L::d_bytes + o;
                    dst = L::d + j * L::d_bytes + o;
                }
                const bool ok = tile < (unsigned)T;
                cp_async16(w + dst, ok ? src : nib, ok ? 16 : 0);
            }
            // this thread's copies count as one arrival once they land (the barrier expects all 128 and the
            // expect_tx above)
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
        }
#else  // one thread, a bulk copy a run
        if (pt == 0) {
            const int tiles = imin(KG_TILES, T - (n0 >> 4));
            const unsigned bytes = KG_X_STAGE + (Q6 ? 0 : KG_E_STAGE) + tiles * L::tile_bytes;
            for (int st = 0; st < stages; ++st) {
                const unsigned s = st % KG_STAGES, at = base + s * L::stage, bar = full + 8 * s;
                if (st >= KG_STAGES) mbar_wait(empty + 8 * s, ((st / KG_STAGES) - 1) & 1);
                const int c0 = st * KG_KC;
                mbar_expect(bar, bytes);
                tma_2d(at, xmap, c0 * 32, m0, bar);
                if (!Q6) kg_bulk(at + L::e, e + ((i64)m_tile * C + c0) * KG_TOK, KG_E_STAGE, bar);
                const unsigned w = at + KG_X_STAGE;
                for (int j = 0; j < tiles; ++j) {
                    const i64 tile = (n0 >> 4) + j, tc = tile * C + c0;
                    kg_bulk(w + j * 512, nib + tc * 256, 512, bar);
                    if (Q6) kg_bulk(w + L::top + j * 256, top + tc * 128, 256, bar);
                    kg_bulk(w + L::sc + j * 64, sc + tc * 32, 64, bar);
                    kg_bulk(w + L::d + j * L::d_bytes, dp + (tile * (C >> 3) + (c0 >> 3)) * L::d_bytes, L::d_bytes, bar);
                }
            }
        }
#endif
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(KG_REGS) : "memory");
    const int tile = wg * 4 + warp, ctid = tid;
    // KG_TOTAL_REGS (Q4_K with 32-token slices): the joined K slices in registers too. Shared memory's are
    // 128 KB of traffic a join, a stage's worth of time where K slices are 8 chunks (plan.split_k's 16).
    constexpr bool REGS = KG_TOTAL_REGS && !Q6 && NQ == 4;
    float part[64], total[REGS ? 64 : 1], p[2][W / 2], pe[Q6 ? 2 : 1][W / 2];
#pragma unroll
    for (int i = 0; i < 64; ++i) part[i] = 0.f;
    int slice = 0, slice_end = C / S;  // C * S fits 32 bits: no 64-bit division call
    // the K slice's sum joins the others (total = p0, then total + p1, ...), the last one left in `part`
    auto join = [&]() {
        if (S > 1) {
            const bool first = slice == 0, last = slice == S - 1;
#pragma unroll
            for (int i = 0; i < 64; ++i) {
                float& at = REGS ? total[REGS ? i : 0] : joined[i * KG_CONSUMERS + ctid];
                if (first) {
                    at = part[i];
                    part[i] = 0.f;
                } else if (last) {
                    part[i] = __fadd_rn(at, part[i]);
                } else {
                    at = __fadd_rn(at, part[i]);
                    part[i] = 0.f;
                }
            }
        }
        ++slice;
        slice_end = (int)((unsigned)((slice + 1) * C) / (unsigned)S);
    };
    auto stage_at = [&](int c) -> unsigned { return (unsigned)((c >> 1) % KG_STAGES) * L::stage; };
    // chunk c's fragments from its stage, after the stage's wait when c opens it
    auto load = [&](KgChunk<Q6>& k, int c) {
        const unsigned s = (c >> 1) % KG_STAGES;
        if (!(c & 1)) mbar_wait(full + 8 * s, ((c >> 1) / KG_STAGES) & 1);
        kg_load<Q6>(k, sbase + stage_at(c) + KG_X_STAGE, tile, c & 1, lane);
    };
    // chunk c's MMAs of token slice q into accumulator set b (Q6_K: both halves' sums)
    auto issue = [&](const KgChunk<Q6>& k, int c, int q, int b) {
        const unsigned xs = base + stage_at(c) + (c & 1) * 64 + q * W * 128;
        kg_mma<W, 0>(p[b], k.a1, kg_desc(xs));
        kg_mma<W, 1>(p[b], k.a2, kg_desc(xs + 32));
        if (Q6) {
            kg_mma<W, 0>(pe[Q6 ? b : 0], k.h1, kg_desc(xs));
            kg_mma<W, 1>(pe[Q6 ? b : 0], k.h2, kg_desc(xs + 32));
        }
        kg_commit();
    };
    auto ones = [&](int c) -> const float* {
        return reinterpret_cast<const float*>(sbase + stage_at(c) + L::e) + (c & 1) * KG_TOK;
    };
    auto release = [&](int c) {  // the stage's last chunk is done: its reads of tokens, weights and sums
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * ((c >> 1) % KG_STAGES));
    };

    KgChunk<Q6> k0, k1;
    // chunk c: slices 0 and 1's MMAs, the next chunk's fragments while they run, each slice's step while the
    // next one's MMAs run, slice q + 2's MMAs issued as slice q's accumulators free up. Nothing is in flight
    // across the loop's back edge: where MMAs were, ptxas serialised every MMA (C7514).
    auto chunk = [&](int c, const KgChunk<Q6>& cur, KgChunk<Q6>& next) {
#if KG_PIPE
        kg_fence();
        issue(cur, c, 0, 0);
        if (NQ > 1) issue(cur, c, 1, 1);
#endif
        if (c + 1 < C) load(next, c + 1);
#pragma unroll
        for (int q = 0; q < NQ; ++q) {
#if KG_PIPE
            if (q + 1 < NQ) {
                kg_wait<1>();
            } else {
                kg_wait<0>();
            }
#else
            kg_fence();
            issue(cur, c, q, q & 1);
            kg_wait<0>();
#endif
            kg_step<Q6, W>(part, p[q & 1], pe[Q6 ? (q & 1) : 0], q, cur, ones(c), t);
#if KG_PIPE
            if (q + 2 < NQ) {
                kg_fence();
                issue(cur, c, q + 2, q & 1);
            }
#endif
        }
        if (c & 1) release(c);
        if (c + 1 == slice_end) join();
    };
    load(k0, 0);
    for (int c = 0; c < C; c += 2) {
        chunk(c, k0, k1);
        chunk(c + 1, k1, k0);
    }

    // part[16q + 4j + i]: row g (+ 8 for i >= 2), token 32q + 8j + 2t (+ 1 for odd i), store_tiles' layout
#pragma unroll
    for (int q = 0; q < 4; ++q)
        store_tiles<1>(*reinterpret_cast<const float(*)[1][4][4]>(part + 16 * q), n0 + wg * 64 + warp * 16, m0 + 32 * q,
                       bias, res, out, M, N, flags);
}

#define MM_WGMMA_KQ(NAME, Q6)                                                                                 \
    extern "C" __global__ void __launch_bounds__(KG_THREADS, 1)                                               \
        NAME(const __grid_constant__ TensorMap xmap, const unsigned char* nib, const unsigned char* aux,   \
             const float* e, const float* bias, const float* res, float* out, int M, int N, int Kp, int flags, \
             int S) {                                                                                         \
        mm_wgmma_kq<Q6>(&xmap, nib, aux, e, bias, res, out, M, N, Kp, flags, S);                             \
    }

MM_WGMMA_KQ(mm_wgmma_kq_q4k, false)
MM_WGMMA_KQ(mm_wgmma_kq_q6k, true)
