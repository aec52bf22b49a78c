// out[M, N] = x[M, K] @ w[N, K]^T (+ bias), float32 accumulation, row invariant.
//
// Tensor-core path (f16, bf16, q8_0 weights): one `mma.sync m16n8k16` family for every M. Weights
// are the 16-side (A: 16 output features), tokens the 8-side (B: 8 token rows), so decode (M = 1)
// and prefill run the same instruction on the same operands for a given token. The reduction over
// K for an output element is fixed by (N, K) alone:
//   * K is cut into chunks of 32 (weights padded with zeros to a multiple of 32);
//   * a block's S warps split the chunks into S contiguous ranges, each accumulated in ascending
//     chunk order through the MMA accumulator;
//   * the S partial sums are added in slice order: ((p0 + p1) + p2) + ... .
// S comes from (N, K) and the device (lockstep_kernels/cuda/plan.py); the number of token tiles a block
// carries (TM) only decides which columns ride along, never how one column is summed.
//
// Inside a chunk each lane loads 8 consecutive k of its weight row (one 16-byte load) and its
// token's 8 matching activations; the 32 k of a chunk are fed to two MMAs in a permuted k order
// that is the same for A and B, so the dot product is unchanged and every load is 16 bytes wide.
// Q6_K's odd nibble pairs scaled in an FMA (common.cuh's kq_pair): faster for its one- and 16-row
// kernels, slower for Q4_K's (bench/evidence/s27-kq-oneh)
#ifndef KQ_PAIR_FMA
#define KQ_PAIR_FMA 2
#endif
#include "common.cuh"

#define WT_F16 0
#define WT_BF16 1
#define WT_Q8 2
// K-quants (lockstep_kernels/cuda/kquant.py): the MMAs take the blocks' integers as exact f16 and each
// chunk's sums are scaled apart, as Q8_0's are. Q4_K: d*sc * sum(q x) - dmin*m * sum(x), the second
// sum from an MMA of ones; Q6_K: d*sc * sum((q - 32) x) per 16-value half, the halves as two MMAs
// with the other half's lanes zeroed (lanes t = 0, 1 hold the first half, t = 2, 3 the second).
#define WT_Q4K 3
#define WT_Q6K 4
#define KQ(WT) ((WT) == WT_Q4K || (WT) == WT_Q6K)
#ifndef KQ_U_ONE
#define KQ_U_ONE 4  // chunks a batch of the one-row K-quant kernels
#endif
#ifndef KQ_X16_PREFETCH
#define KQ_X16_PREFETCH 0  // 1: the 9-16-row K-quant kernels load a batch's weights while the one before is multiplied
#endif
#ifndef KQ_U12_RT
#define KQ_U12_RT 2  // chunks a batch of the two-tile 9-16-row K-quant kernels (mm_*_tm2h2)
#endif
#ifndef KQ_ONE_PREFETCH
#define KQ_ONE_PREFETCH 0  // 1: the same in the one-row K-quant kernels (a probe's build, with a higher KQ_REGS_ONE)
#endif
#ifndef KQ_LANE_SCALES
#define KQ_LANE_SCALES 0  // 1 (2: Q6_K only): a one-row K-quant batch's chunk scales made by one lane each, then shuffled (a probe's build)
#endif


// mma_f16 and mma_bf16: one m16n8k16 MMA accumulating into d, the 16-bit operand type T.
#define MMA_16(T)                                                                                         \
    __device__ __forceinline__ void mma_##T(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, \
                                            unsigned b0, unsigned b1) {                                  \
        asm volatile(                                                                                    \
            "mma.sync.aligned.m16n8k16.row.col.f32." #T "." #T ".f32 "                                   \
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                    \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                             \
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                                     \
    }
MMA_16(f16)
MMA_16(bf16)

// One-row streaming matmuls (PRO_ONE) load a batch's activations as one coalesced warp load and
// hand them to the MMA lanes by shuffles; they may also normalise their input row (PRO_NORM):
// rms_norm's expressions in rms_norm's order (rms_inv), so the bits of rms_norm then matmul.
#define PRO_ONE 2
#define PRO_NORM 4
// Activations already rounded to the MMA's 16-bit pairs by the kernel that wrote them (rms_norm_16:
// pack_act's rounding), [M, Kp] zero-padded past K: half the bytes and registers of float32 rows.
#define PRO_X16 8
// Token m's activations are row rows[m] of x (the grouped kernels' gather; rows null: row m).
#define PRO_ROWS 16
// With PRO_X16 (K-quants): two row tiles a block (mm_*_tm2h2).
#define PRO_RT2 32

template <int WT>
__device__ __forceinline__ unsigned pack_act(float lo, float hi) {
    return WT == WT_BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
}

// Two int8 weights (bytes 0/1 or 2/3 of `q` by `shift`) as an exact f16 pair.
__device__ __forceinline__ unsigned q8_pair(unsigned q, int shift) {
    float lo = (float)(int)(signed char)((q >> shift) & 0xffu);
    float hi = (float)(int)(signed char)((q >> (shift + 8)) & 0xffu);
    return pack_f16x2(lo, hi);
}

// A token's 8 activations x[row][k0 .. k0+7] (rows ldx floats apart); zeros past K or where !live
// (a token past M).
__device__ __forceinline__ void load_x8(const float* __restrict__ x, int row, bool live, int K, i64 ldx, int k0,
                                        bool vec, float (&v)[8]) {
    if (vec) {
        const bool ok = live && k0 < K;
        const float4* p = reinterpret_cast<const float4*>(x + (ok ? (i64)row * ldx + k0 : 0));
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 lo = ok ? p[0] : zero, hi = ok ? p[1] : zero;
        v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w;
        v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = (live && k0 + i < K) ? x[(i64)row * ldx + k0 + i] : 0.f;
    }
}

// A fragments of a 16-row tile for one 32-k chunk: `wa` holds row g's lane-t group (k 8t .. 8t+7),
// `wb` row g + 8's (16-bit weights: a uint4; int8: one byte each in .x and .y; K-quants: the low
// nibbles in .x, Q6_K's top bits of both rows in wa.y). a1 feeds the first MMA (k 8t .. 8t+3), a2
// the second (k 8t+4 .. 8t+7).
template <int WT>
__device__ __forceinline__ void a_frags(uint4 wa, uint4 wb, unsigned (&a1)[4], unsigned (&a2)[4]) {
    if (KQ(WT)) {
        const bool q6 = WT == WT_Q6K;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            a1[2 * j] = kq_pair(wa.x, wa.y, j, 0, q6);
            a1[2 * j + 1] = kq_pair(wb.x, wa.y, j, 8, q6);
            a2[2 * j] = kq_pair(wa.x, wa.y, j + 2, 0, q6);
            a2[2 * j + 1] = kq_pair(wb.x, wa.y, j + 2, 8, q6);
        }
    } else if (WT == WT_Q8) {
        a1[0] = q8_pair(wa.x, 0);  a1[1] = q8_pair(wb.x, 0);
        a1[2] = q8_pair(wa.x, 16); a1[3] = q8_pair(wb.x, 16);
        a2[0] = q8_pair(wa.y, 0);  a2[1] = q8_pair(wb.y, 0);
        a2[2] = q8_pair(wa.y, 16); a2[3] = q8_pair(wb.y, 16);
    } else {
        a1[0] = wa.x; a1[1] = wb.x; a1[2] = wa.y; a1[3] = wb.y;
        a2[0] = wa.z; a2[1] = wb.z; a2[2] = wa.w; a2[3] = wb.w;
    }
}

// Lane t's group of one staged weight row (shared memory, a chunk of WB bytes).
template <int WT>
__device__ __forceinline__ uint4 staged_group(const unsigned char* row, int t) {
    if (WT == WT_Q8) {
        const uint2 q = *reinterpret_cast<const uint2*>(row + 8 * t);
        return make_uint4(q.x, q.y, 0u, 0u);
    }
    return *reinterpret_cast<const uint4*>(row + 16 * t);
}

// Q4_K's second sums of a chunk, sum(x) of a token's pairs by an MMA of ones: the same for every weight
// row, so a kernel with several row tiles against one token tile may take them once.
__device__ __forceinline__ void q4k_ones(float (&e)[4], unsigned b0, unsigned b1, unsigned b2, unsigned b3) {
    const unsigned one = 0x3c003c00u;
    e[0] = e[1] = e[2] = e[3] = 0.f;
    mma_f16(e, one, one, one, one, b0, b1);
    mma_f16(e, one, one, one, one, b2, b3);
}

// A Q4_K chunk into an accumulator from its ones sums `e`: d*sc * sum(q x) - dmin*m * sum(x). COL0:
// only the first token column's elements (acc[0], acc[2]; a one-row kernel stores no other).
template <bool COL0 = false>
__device__ __forceinline__ void q4k_chunk(float (&acc)[4], const unsigned (&a1)[4], const unsigned (&a2)[4],
                                          unsigned b0, unsigned b1, unsigned b2, unsigned b3, float da, float db,
                                          float ea, float eb, const float (&e)[4]) {
    float p[4] = {0.f, 0.f, 0.f, 0.f};
    mma_f16(p, a1[0], a1[1], a1[2], a1[3], b0, b1);
    mma_f16(p, a2[0], a2[1], a2[2], a2[3], b2, b3);
    acc[0] = __fmaf_rn(-ea, e[0], __fmaf_rn(da, p[0], acc[0]));
    acc[2] = __fmaf_rn(-eb, e[2], __fmaf_rn(db, p[2], acc[2]));
    if (!COL0) {
        acc[1] = __fmaf_rn(-ea, e[1], __fmaf_rn(da, p[1], acc[1]));
        acc[3] = __fmaf_rn(-eb, e[3], __fmaf_rn(db, p[3], acc[3]));
    }
}

// One chunk into an accumulator; b0, b1 (k 8t .. 8t+3) and b2, b3 (k 8t+4 .. 8t+7) are a token's
// activation pairs. q8_0 sums the chunk apart and scales it by its rows' block scales da, db;
// K-quants also take ea, eb (Q4_K: dmin*m; Q6_K: the second half's scales) of rows g, g + 8.
// COL0: q4k_chunk's (the scaled types' float step for token column 0 only).
template <int WT, bool COL0 = false>
__device__ __forceinline__ void mma_chunk(float (&acc)[4], const unsigned (&a1)[4], const unsigned (&a2)[4],
                                          unsigned b0, unsigned b1, unsigned b2, unsigned b3, float da, float db,
                                          float ea = 0.f, float eb = 0.f) {
    if (WT == WT_Q4K) {
        float e[4];
        q4k_ones(e, b0, b1, b2, b3);
        q4k_chunk<COL0>(acc, a1, a2, b0, b1, b2, b3, da, db, ea, eb, e);
    } else if (KQ(WT)) {  // Q6_K: the halves' sums apart
        float p[4] = {0.f, 0.f, 0.f, 0.f}, e[4] = {0.f, 0.f, 0.f, 0.f};
        const unsigned lo = (threadIdx.x & 3) < 2 ? 0xffffffffu : 0u, hi = ~lo;
        if (COL0) {  // one row: lane t holds the same k in A and B, so the other half zeroed in B (4 registers, not 8)
            mma_f16(p, a1[0], a1[1], a1[2], a1[3], b0 & lo, b1 & lo);
            mma_f16(p, a2[0], a2[1], a2[2], a2[3], b2 & lo, b3 & lo);
            mma_f16(e, a1[0], a1[1], a1[2], a1[3], b0 & hi, b1 & hi);
            mma_f16(e, a2[0], a2[1], a2[2], a2[3], b2 & hi, b3 & hi);
        } else {
            mma_f16(p, a1[0] & lo, a1[1] & lo, a1[2] & lo, a1[3] & lo, b0, b1);
            mma_f16(p, a2[0] & lo, a2[1] & lo, a2[2] & lo, a2[3] & lo, b2, b3);
            mma_f16(e, a1[0] & hi, a1[1] & hi, a1[2] & hi, a1[3] & hi, b0, b1);
            mma_f16(e, a2[0] & hi, a2[1] & hi, a2[2] & hi, a2[3] & hi, b2, b3);
        }
        acc[0] = __fmaf_rn(ea, e[0], __fmaf_rn(da, p[0], acc[0]));
        acc[2] = __fmaf_rn(eb, e[2], __fmaf_rn(db, p[2], acc[2]));
        if (!COL0) {
            acc[1] = __fmaf_rn(ea, e[1], __fmaf_rn(da, p[1], acc[1]));
            acc[3] = __fmaf_rn(eb, e[3], __fmaf_rn(db, p[3], acc[3]));
        }
    } else if (WT == WT_Q8) {
        float p[4] = {0.f, 0.f, 0.f, 0.f};
        mma_f16(p, a1[0], a1[1], a1[2], a1[3], b0, b1);
        mma_f16(p, a2[0], a2[1], a2[2], a2[3], b2, b3);
        acc[0] = __fmaf_rn(da, p[0], acc[0]);
        acc[2] = __fmaf_rn(db, p[2], acc[2]);
        if (!COL0) {
            acc[1] = __fmaf_rn(da, p[1], acc[1]);
            acc[3] = __fmaf_rn(db, p[3], acc[3]);
        }
    } else if (WT == WT_BF16) {
        mma_bf16(acc, a1[0], a1[1], a1[2], a1[3], b0, b1);
        mma_bf16(acc, a2[0], a2[1], a2[2], a2[3], b2, b3);
    } else {
        mma_f16(acc, a1[0], a1[1], a1[2], a1[3], b0, b1);
        mma_f16(acc, a2[0], a2[1], a2[2], a2[3], b2, b3);
    }
}

// The end of K slice `s` in the shared-memory kernels: the slice's partial joins the total in slice
// order (total = p0, then total + p1, ...), as mm_tc's warp 0 adds its warps' slices; then the
// next slice's bounds (the s * C / S of mm_tc).
template <int R, int T>
__device__ __forceinline__ void join_slice(float (&total)[R][T][4], float (&part)[R][T][4], int& s, int& slice_end,
                                           int C, int S) {
    const bool first = s == 0;
    FOR_TILES(R, T, 4, a, b, i) {
        total[a][b][i] = first ? part[a][b][i] : __fadd_rn(total[a][b][i], part[a][b][i]);
        part[a][b][i] = 0.f;
    }
    ++s;
    slice_end = (int)(((i64)(s + 1) * C) / S);
}

// A cp.async pipeline of STG shared-memory stages over n loads, load(i, stage): the first STG - 1
// loads in flight (an empty group for each one past n, so the wait counts stay fixed) ...
template <int STG, class Load>
__device__ __forceinline__ void pipeline_fill(int n, const Load& load) {
#pragma unroll
    for (int st = 0; st < STG - 1; ++st) {
        if (st < n) load(st, st);
        cp_async_commit();
    }
}

// ... then, before step i reads its stage: wait for its group, let every thread see it, and start
// load i + STG - 1 into the stage step i - 1 read.
template <int STG, class Load>
__device__ __forceinline__ void pipeline_step(int i, int n, const Load& load) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STG - 2));
    __syncthreads();
    if (i + STG - 1 < n) load(i + STG - 1, (i + STG - 1) % STG);
    cp_async_commit();
}

// One staged chunk of a warp's share of a shared-memory tile: RT row tiles (staged rows r0 + 16 rt,
// global rows n0 + r0 + 16 rt) against 4 token tiles whose activation pairs are b1, b2.
template <int WT, int RT>
__device__ __forceinline__ void tile_chunk(float (&part)[RT][4][4], const unsigned char* wst, int r0,
                                           const unsigned (&b1)[4][2], const unsigned (&b2)[4][2],
                                           const u16* __restrict__ scales, int n0, int Np, int C, int c) {
    constexpr int WB = WT == WT_Q8 ? 32 : 64;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float ones[4][4];  // Q4_K: each token tile's ones sums, taken once for the RT row tiles
    if (WT == WT_Q4K)
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) q4k_ones(ones[tt], b1[tt][0], b1[tt][1], b2[tt][0], b2[tt][1]);
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
        const int ra = r0 + rt * 16 + g;
        unsigned a1[4], a2[4];
        float da = 0.f, db = 0.f, ea = 0.f, eb = 0.f;
        if (KQ(WT)) {  // the staged record of row tile (r0 >> 4) + rt (kq_read_rec)
            uint4 wa, wb;
            kq_read_rec(wst + ((r0 >> 4) + rt) * kq_rec_bytes(WT == WT_Q6K), WT == WT_Q6K, lane, wa, wb);
            a_frags<WT>(wa, wb, a1, a2);
            kq_chunk_scales(wa, wb, WT == WT_Q6K, da, db, ea, eb);
        } else {
            a_frags<WT>(staged_group<WT>(wst + ra * WB, t), staged_group<WT>(wst + (ra + 8) * WB, t), a1, a2);
        }
        if (WT == WT_Q8) {
            if (n0 + ra < Np) da = f16_to_f32(scales[(i64)(n0 + ra) * C + c]);
            if (n0 + ra + 8 < Np) db = f16_to_f32(scales[(i64)(n0 + ra + 8) * C + c]);
        }
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
            if (WT == WT_Q4K)
                q4k_chunk(part[rt][tt], a1, a2, b1[tt][0], b1[tt][1], b2[tt][0], b2[tt][1], da, db, ea, eb, ones[tt]);
            else
                mma_chunk<WT>(part[rt][tt], a1, a2, b1[tt][0], b1[tt][1], b2[tt][0], b2[tt][1], da, db, ea, eb);
        }
    }
}

// A staged chunk's weights for the shared-memory kernels: ROWS rows from n0 into `dst` by `threads`
// threads, rows past Np zero. K-quants: the ROWS / 16 tiles' records (kq_issue_seg, tiles past Np
// zero); other types: each row's WB bytes of the chunk.
template <int WT, int ROWS>
__device__ __forceinline__ void stage_weights(unsigned char* dst, const void* __restrict__ w,
                                              const u16* __restrict__ scales, int n0, int Np, int C, int c,
                                              int threads) {
    const int tid = threadIdx.x;
    if (KQ(WT)) {
        constexpr bool q6 = WT == WT_Q6K;
        constexpr int SEGS = kq_rec_bytes(q6) / 16;
        const KqPlanes kq = kq_planes(w, scales, q6, Np >> 4, C);
        for (int i = tid; i < (ROWS / 16) * SEGS; i += threads) {
            const int j = i / SEGS, seg = i % SEGS, tile = (n0 >> 4) + j;
            kq_issue_seg(dst + j * kq_rec_bytes(q6) + 16 * seg, kq_seg(kq, q6, seg), q6, tile, C, c, tile < (Np >> 4));
        }
        return;
    }
    constexpr int WB = WT == WT_Q8 ? 32 : 64;
    const unsigned char* wb = reinterpret_cast<const unsigned char*>(w);
    const i64 row_bytes = (i64)C * WB;
    for (int i = tid; i < ROWS * WB / 16; i += threads) {
        const int r = i / (WB / 16), seg = i % (WB / 16);
        const int row = n0 + r;
        const bool ok = row < Np;
        cp_async16(dst + r * WB + seg * 16, ok ? wb + row * row_bytes + c * WB + seg * 16 : wb, ok ? 16 : 0);
    }
}

// One row's activation pairs of chunk u of a four-chunk warp load (lane l packed k 4l .. 4l + 3 into q0,
// q1), as the lanes of token 0 (g = 0) feed them to the MMA (load_x8's pairs). The other lanes take
// the same pairs: the MMA's other token columns repeat column 0, whose sums do not depend on them,
// and a one-row kernel neither scales (COL0) nor stores them.
__device__ __forceinline__ void row_pairs(unsigned q0, unsigned q1, int u, unsigned (&b)[4]) {
    const int lane = threadIdx.x & 31, src = (u & 3) * 8 + 2 * (lane & 3);
    b[0] = __shfl_sync(0xffffffffu, q0, src);
    b[1] = __shfl_sync(0xffffffffu, q1, src);
    b[2] = __shfl_sync(0xffffffffu, q0, src + 1);
    b[3] = __shfl_sync(0xffffffffu, q1, src + 1);
}

template <int WT, int TM, int U, int PRO>
__device__ __forceinline__ void mm_tc(const void* __restrict__ w, const u16* __restrict__ scales,
                                      const float* __restrict__ x, const float* __restrict__ bias,
                                      const float* __restrict__ res, float* __restrict__ out, int M, int N,
                                      int K, int Kp, int flags, const float* __restrict__ nw, float eps,
                                      int ldx, const QkvOut& qkv, int kv, int m_base,
                                      const int* __restrict__ rows = nullptr) {
    extern __shared__ float red[];
    const int S = blockDim.x >> 5;
    const int s = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    // RT (PRO_RT2): block b takes row tiles 2b and 2b + 1 (plan.matmul_launch's grid; blocks past the
    // tiles idle), each tile's sums as alone; the tokens' loads and Q4_K's ones sums serve both. acc2:
    // the second tile's accumulators.
    constexpr int RT = PRO & PRO_RT2 ? 2 : 1;
    static_assert(RT == 1 || ((PRO & PRO_X16) && KQ(WT)), "two row tiles: 16-bit K-quant input");
    const int tile0 = blockIdx.x * RT;
    if (RT > 1 && tile0 >= ((N + 15) >> 4)) return;
    const bool second = RT > 1 && tile0 + 1 < ((N + 15) >> 4);
    const int n0 = RT == 1 ? blockIdx.x * 16 : tile0 * 16;  // RT 1 spelled as measured: the same SASS
    const int C = Kp >> 5;
    const int c_begin = (int)(((i64)s * C) / S), c_end = (int)(((i64)(s + 1) * C) / S);
    const bool vec = (K & 7) == 0 && (ldx & 3) == 0;

    float acc[TM][4];
#pragma unroll
    for (int i = 0; i < TM; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float acc2[TM][4];
#pragma unroll
    for (int i = 0; i < TM; ++i) acc2[i][0] = acc2[i][1] = acc2[i][2] = acc2[i][3] = 0.f;

    // uint4 (16-bit weights) or uint2 (int8 weights) per row and chunk: lane t holds k 8t .. 8t+7.
    const i64 row_a = (i64)(n0 + g) * Kp, row_b = (i64)(n0 + g + 8) * Kp;
    uint4 wa[U], wb[U], wa2[U], wb2[U];
    float da[U] = {}, db[U] = {};
    const KqPlanes kq = kq_planes(w, scales, WT == WT_Q6K, (N + 15) >> 4, C);
    // This lane's words of the tile's chunk 0 in each plane (kq_scale_words' places); chunk c lies
    // c times a plane's bytes per chunk further, so a batch's loads take immediate offsets.
    const i64 at = RT == 1 ? (i64)blockIdx.x : (i64)tile0;  // as n0
    const i64 lane0 = at * C * 32 + lane;
    const unsigned char* nib_at = kq.nib + lane0 * 8;
    const unsigned char* top_at = kq.top + lane0 * 4;
    const unsigned char* sc_at = kq.sc + (at * C * 8 + g) * 4;
    const unsigned char* d_at = kq.d + (at * (C >> 3) * 8 + g) * (WT == WT_Q6K ? 4 : 8);
    // tn: tiles further in every plane (the second tile: 1, or 0 where there is none, whose loads then
    // repeat the first's and are never stored)
    auto super_scales = [&](int c, i64 tn = 0) {  // the super-block scale words of rows g, g + 8 at chunk c
        return WT == WT_Q6K ? make_uint2(*reinterpret_cast<const unsigned*>(d_at + tn * (C >> 3) * 32 + (c >> 3) * 32), 0u)
                            : *reinterpret_cast<const uint2*>(d_at + tn * (C >> 3) * 64 + (c >> 3) * 64);
    };
    // One chunk's K-quant words into A[u], B[u]: one 8-byte load a lane covers the tile's chunk, 256
    // bytes a warp; the scale words converted where the chunk is multiplied (fewer registers in flight).
    // one_sb: d0 holds the chunk's super-block scale words.
    auto kq_load = [&](int u, int c, bool one_sb, uint2 d0, uint4 (&A)[U], uint4 (&B)[U], i64 tn) {
        const uint2 q = *reinterpret_cast<const uint2*>(nib_at + tn * C * 256 + c * 256);
        const unsigned top = WT == WT_Q6K ? *reinterpret_cast<const unsigned*>(top_at + tn * C * 128 + c * 128) : 0u;
        A[u] = make_uint4(q.x, top, 0u, 0u);
        B[u] = make_uint4(q.y, 0u, 0u, 0u);
        const uint2 d = one_sb ? d0 : super_scales(c, tn);
        A[u].z = *reinterpret_cast<const unsigned*>(sc_at + tn * C * 32 + c * 32);
        B[u].y = d.x;
        B[u].z = d.y;
    };
    auto load_second = [&](int c0) {  // the second tile's batch, bound-checked
        const i64 tn = second ? 1 : 0;
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (c0 + u < c_end) kq_load(u, c0 + u, false, make_uint2(0u, 0u), wa2, wb2, tn);
    };
    // full: every chunk of the batch lies in the slice (no bound checks); one_sb: and in one super-block,
    // so its scale words are loaded once (and, the same registers, converted once)
    auto load_weights = [&](int c0, auto full, auto one_sb) {
        const uint2 d0 = KQ(WT) && decltype(one_sb)::value ? super_scales(c0) : make_uint2(0u, 0u);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u;
            if (!decltype(full)::value && c >= c_end) continue;
            if (KQ(WT)) {
                kq_load(u, c, decltype(one_sb)::value, d0, wa, wb, 0);
            } else if (WT == WT_Q8) {
                const signed char* q = reinterpret_cast<const signed char*>(w);
                uint2 qa = *reinterpret_cast<const uint2*>(q + row_a + c * 32 + 8 * t);
                uint2 qb = *reinterpret_cast<const uint2*>(q + row_b + c * 32 + 8 * t);
                wa[u] = make_uint4(qa.x, qa.y, 0u, 0u);
                wb[u] = make_uint4(qb.x, qb.y, 0u, 0u);
                da[u] = f16_to_f32(scales[(i64)(n0 + g) * C + c]);
                db[u] = f16_to_f32(scales[(i64)(n0 + g + 8) * C + c]);
            } else {
                const u16* h = reinterpret_cast<const u16*>(w);
                wa[u] = *reinterpret_cast<const uint4*>(h + row_a + c * 32 + 8 * t);
                wb[u] = *reinterpret_cast<const uint4*>(h + row_b + c * 32 + 8 * t);
            }
        }
    };

    // The first weights are in flight while the previous kernel finishes (weights are never written).
    load_weights(c_begin, Bool<false>{}, Bool<false>{});
    if (RT > 1) load_second(c_begin);
    pdl_start();
    // PRO_NORM (one row): the row's rms_norm scale, while the first weights arrive.
    __shared__ float norm_scratch[8];
    float inv = 0.f;
    if (PRO == PRO_NORM) inv = rms_inv(x, K, eps, norm_scratch);
    // Each token tile's row of x for this lane (token m_base + 8 tm + g), read once: PRO_ROWS takes
    // it from `rows` (written by the kernel before, so after pdl_start).
    int xrow[TM];
#pragma unroll
    for (int tm = 0; tm < TM; ++tm) {
        const int m = m_base + tm * 8 + g;
        xrow[tm] = (PRO & PRO_ROWS) && rows != nullptr ? (m < M ? rows[m] : 0) : m;
    }
    // One chunk into the accumulators from its activations' 16-bit pairs (b: k 8t .. 8t+3, then
    // 8t+4 .. 8t+7, per token tile). No branch on the token tiles (a tile past M multiplies zeros
    // into accumulators nobody stores), so the compiler may issue a batch's activation loads together.
    // A chunk's scales of rows g, g + 8 (Q8_0: da, db; K-quants: kq_scale_pair's pairs from the words).
    // one_sb (K-quants): the batch's chunks share a super-block, whose scales `dd` batch_supers
    // converted once. A, B: the batch's words (wa, wb, or their copy where the next batch is loading).
    using Words = uint4[U];
    auto batch_supers = [&](auto one_sb, const Words& B) {
        return KQ(WT) && decltype(one_sb)::value ? kq_super_floats(B[0].y, B[0].z, WT == WT_Q6K)
                                                 : make_float4(0.f, 0.f, 0.f, 0.f);
    };
    auto chunk_scales = [&](int u, float& sa, float& sb, float& xa, float& xb, auto one_sb, float4 dd, const Words& A,
                            const Words& B) {
        sa = da[u]; sb = db[u]; xa = xb = 0.f;
        if (KQ(WT) && decltype(one_sb)::value)
            kq_chunk_scales_f(A[u].z, dd, WT == WT_Q6K, sa, sb, xa, xb);
        else if (KQ(WT))
            kq_chunk_scales(A[u], B[u], WT == WT_Q6K, sa, sb, xa, xb);
    };
    auto chunk_mma = [&](int u, const unsigned (&b)[TM][4], auto one_sb, float4 dd, const Words& A, const Words& B) {
        unsigned a1[4], a2[4];
        a_frags<WT>(A[u], B[u], a1, a2);
        float sa, sb, xa, xb;
        chunk_scales(u, sa, sb, xa, xb, one_sb, dd, A, B);
#pragma unroll
        for (int tm = 0; tm < TM; ++tm)
            mma_chunk<WT>(acc[tm], a1, a2, b[tm][0], b[tm][1], b[tm][2], b[tm][3], sa, sb, xa, xb);
    };
    // The prefetching builds' step: batch c0's words into ca, cb, then the next batch's loads sent.
    auto hand_over = [&](int c0, Words& ca, Words& cb) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            ca[u] = wa[u];
            cb[u] = wb[u];
        }
        if (c0 + U < c_end) load_weights(c0 + U, Bool<false>{}, Bool<false>{});
    };
    auto pack_chunk = [&](const float (&xv)[TM][8], unsigned (&b)[TM][4]) {
#pragma unroll
        for (int tm = 0; tm < TM; ++tm)
#pragma unroll
            for (int i = 0; i < 4; ++i) b[tm][i] = pack_act<WT>(xv[tm][2 * i], xv[tm][2 * i + 1]);
    };
    auto chunk = [&](int u, int c) {
        float xv[TM][8];
#pragma unroll
        for (int tm = 0; tm < TM; ++tm) load_x8(x, xrow[tm], m_base + tm * 8 + g < M, K, ldx, c * 32 + 8 * t, vec, xv[tm]);
        unsigned b[TM][4];
        pack_chunk(xv, b);
        chunk_mma(u, b, Bool<false>{}, float4{}, wa, wb);
    };
    // One row: lane l loads and packs activations k0 + 4l .. k0 + 4l + 3 of the batch (chunk c0 +
    // l / 8) in one coalesced warp load, so every chunk's pairs are ready when its weights arrive;
    // the lanes of token 0 (g = 0) take theirs by shuffles, the pairs load_x8 would give. Loaded per
    // chunk, each chunk's activations waited behind the previous chunk's MMAs.
    static_assert(!(PRO & (PRO_ONE | PRO_NORM)) || (TM == 1 && U % 4 == 0), "one warp load covers four chunks");
    // A batch of one row's chunks; `full` (every chunk in the slice) drops the bound checks.
    auto one_row_batch = [&](int c0, auto full, auto one_sb) {
        constexpr bool all = decltype(full)::value;
        constexpr bool prefetch = KQ_ONE_PREFETCH && KQ(WT);  // as x16_batch's, below
        // KQ_LANE_SCALES: lane t of a row pair makes chunk c0 + t's four scales from its own scale
        // word (the same float ops), and each chunk takes them from that lane: a chunk's conversions
        // and products once a batch instead of in all four lanes.
        constexpr bool lane_sc = (KQ_LANE_SCALES == 1 || (KQ_LANE_SCALES == 2 && WT == WT_Q6K)) && KQ(WT) && all &&
                                 decltype(one_sb)::value && U == 4 && !prefetch;
        if (c0 != c_begin && !prefetch) load_weights(c0, full, one_sb);
        const unsigned sw = lane_sc ? *reinterpret_cast<const unsigned*>(sc_at + (c0 + t) * 32) : 0u;
        // PRO_X16 (mm_*_oneh): the row's 16-bit pairs as the kernel before wrote them, lane t's 8 of a
        // chunk in one load where the chunk is multiplied (load_x8's k, so the pairs row_pairs would give)
        constexpr bool h16 = (PRO & PRO_X16) != 0;
        const u16* x16 = reinterpret_cast<const u16*>(x) + 8 * t;
        unsigned p0[(U + 3) / 4], p1[(U + 3) / 4];
#pragma unroll
        for (int h = 0; h < U / 4 && !h16; ++h) {
            const int k = (c0 + 4 * h) * 32 + 4 * lane;
            float v[4] = {0.f, 0.f, 0.f, 0.f};
            if (all || c0 + 4 * h + (lane >> 3) < c_end) {
                if (vec && k + 3 < K) {
                    const float4 f = *reinterpret_cast<const float4*>(x + k);
                    v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
                } else {
#pragma unroll
                    for (int i = 0; i < 4; ++i) v[i] = k + i < K ? x[k + i] : 0.f;
                }
                if (PRO == PRO_NORM) {
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        if (k + i < K) v[i] = __fmul_rn(__fmul_rn(v[i], inv), nw[k + i]);
                }
            }
            p0[h] = pack_act<WT>(v[0], v[1]);
            p1[h] = pack_act<WT>(v[2], v[3]);
        }
        Words ca, cb;
        if (prefetch) hand_over(c0, ca, cb);
        const Words& A = prefetch ? ca : wa;
        const Words& B = prefetch ? cb : wb;
        const float4 dd = batch_supers(one_sb, B);
        float4 mine = make_float4(0.f, 0.f, 0.f, 0.f);
        if (lane_sc) kq_chunk_scales_f(sw, dd, WT == WT_Q6K, mine.x, mine.y, mine.z, mine.w);
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (all || c0 + u < c_end) {
                unsigned b[4];
                if (h16) {
                    const uint4 q = *reinterpret_cast<const uint4*>(x16 + (c0 + u) * 32);
                    b[0] = q.x; b[1] = q.y; b[2] = q.z; b[3] = q.w;
                } else {
                    row_pairs(p0[u >> 2], p1[u >> 2], u, b);
                }
                unsigned a1[4], a2[4];
                a_frags<WT>(A[u], B[u], a1, a2);
                float sa, sb, xa, xb;
                if (lane_sc) {
                    sa = __shfl_sync(0xffffffffu, mine.x, u, 4);
                    sb = __shfl_sync(0xffffffffu, mine.y, u, 4);
                    xa = __shfl_sync(0xffffffffu, mine.z, u, 4);
                    xb = __shfl_sync(0xffffffffu, mine.w, u, 4);
                } else {
                    chunk_scales(u, sa, sb, xa, xb, one_sb, dd, A, B);
                }
                mma_chunk<WT, true>(acc[0], a1, a2, b[0], b[1], b[2], b[3], sa, sb, xa, xb);
            }
    };
    // K-quants: batches from a multiple of U (U dividing the 8 chunks of a super-block) each lie in
    // one; a warp whose slice starts elsewhere takes the checked path (no third copy: registers).
    const bool fast = !KQ(WT) || (8 % U == 0 && c_begin % U == 0);
    if (PRO & (PRO_ONE | PRO_NORM)) {
        for (int c0 = c_begin; c0 < c_end; c0 += U) {
            if (fast && c0 + U <= c_end)
                one_row_batch(c0, Bool<true>{}, Bool<KQ(WT)>{});
            else
                one_row_batch(c0, Bool<false>{}, Bool<false>{});
        }
    }
    // PRO_X16: the batch's activations first, then its weights behind a branch: ptxas keeps loads in
    // their basic block, so every load is out before the first MMA waits (it moved each chunk's
    // activation loads behind the previous chunk's MMAs when they shared a block). Bound checks in
    // every batch: without them ptxas wanted ~128 registers and the 16-row step ran no faster.
    //
    // KQ_X16_PREFETCH (K-quants): the batch's weights came in the batch before, which now sends the
    // next batch's before its MMAs, so a warp's loads stay in flight while it multiplies (a copy of
    // the words a chunk, registers for a second batch). The same operations on the same words.
    auto x16_batch = [&](int c0) {
        constexpr Bool<false> checked{};
        constexpr bool prefetch = KQ_X16_PREFETCH && KQ(WT) && RT == 1;  // mm_*_tm2h2 never (registers)
        const u16* x16 = reinterpret_cast<const u16*>(x);
        uint4 xq[U][TM];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int tm = 0; tm < TM; ++tm) {
                const int m = m_base + tm * 8 + g;
                xq[u][tm] = m < M && c0 + u < c_end
                                ? *reinterpret_cast<const uint4*>(x16 + (i64)m * ldx + (c0 + u) * 32 + 8 * t)
                                : make_uint4(0u, 0u, 0u, 0u);
            }
        Words ca, cb;
        if (prefetch) {
            hand_over(c0, ca, cb);
        } else if (c0 != c_begin) {
            load_weights(c0, checked, checked);
            if (RT > 1) load_second(c0);
        }
        const Words& A = prefetch ? ca : wa;
        const Words& B = prefetch ? cb : wb;
        const float4 dd = batch_supers(checked, B);
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (c0 + u < c_end) {
                unsigned b[TM][4];
#pragma unroll
                for (int tm = 0; tm < TM; ++tm) {
                    b[tm][0] = xq[u][tm].x; b[tm][1] = xq[u][tm].y; b[tm][2] = xq[u][tm].z; b[tm][3] = xq[u][tm].w;
                }
                if (RT == 1) {
                    chunk_mma(u, b, checked, dd, A, B);
                    continue;
                }
                float e[TM][4];  // Q4_K's ones sums, the tokens' alone
                if (WT == WT_Q4K) {
#pragma unroll
                    for (int tm = 0; tm < TM; ++tm) q4k_ones(e[tm], b[tm][0], b[tm][1], b[tm][2], b[tm][3]);
                }
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const Words& Ar = r ? wa2 : wa;
                    const Words& Br = r ? wb2 : wb;
                    unsigned a1[4], a2[4];
                    a_frags<WT>(Ar[u], Br[u], a1, a2);
                    float sa, sb, xa, xb;
                    chunk_scales(u, sa, sb, xa, xb, checked, dd, Ar, Br);
#pragma unroll
                    for (int tm = 0; tm < TM; ++tm) {
                        float (&to)[4] = r ? acc2[tm] : acc[tm];
                        if (WT == WT_Q4K)
                            q4k_chunk(to, a1, a2, b[tm][0], b[tm][1], b[tm][2], b[tm][3], sa, sb, xa, xb, e[tm]);
                        else
                            mma_chunk<WT>(to, a1, a2, b[tm][0], b[tm][1], b[tm][2], b[tm][3], sa, sb, xa, xb);
                    }
                }
            }
    };
    for (int c0 = c_begin; c0 < c_end && !(PRO & (PRO_ONE | PRO_NORM)); c0 += U) {
        if (PRO & PRO_X16) {
            x16_batch(c0);
            continue;
        }
        if (c0 != c_begin) load_weights(c0, Bool<false>{}, Bool<false>{});
        // A whole batch's activation loads issued with its weights' before any MMA: one round trip a
        // batch. Left to the compiler (a branch on `vec` in each load), the next chunk's loads went
        // out only after the previous chunk's MMAs had waited for the weights (at 16 rows the 64
        // registers forbid it).
        if (vec && c0 + U <= c_end) {
            float xv[U][TM][8];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int tm = 0; tm < TM; ++tm)
                    load_x8(x, xrow[tm], m_base + tm * 8 + g < M, K, ldx, (c0 + u) * 32 + 8 * t, true, xv[u][tm]);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                unsigned b[TM][4];
                pack_chunk(xv[u], b);
                chunk_mma(u, b, Bool<false>{}, float4{}, wa, wb);
            }
            continue;
        }
        if (c0 + U <= c_end) {
#pragma unroll
            for (int u = 0; u < U; ++u) chunk(u, c0 + u);
        } else {
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (c0 + u < c_end) chunk(u, c0 + u);
        }
    }

    // The fixed combine: warp 0 adds the S partial sums in slice order (combine_slices); the second
    // tile's first, every warp staying for the first's.
    if (RT > 1) {
        combine_slices<TM>(acc2, red);
        __syncthreads();
    }
    if (!combine_slices<TM>(acc, red)) return;

    stream_stores<TM, WT == WT_BF16 ? 2 : 1>(acc, n0, 0, m_base, g, t, bias, res, out, M, N, N, flags, qkv, kv);
    if (second)
        stream_stores<TM, WT == WT_BF16 ? 2 : 1>(acc2, n0 + 16, 0, m_base, g, t, bias, res, out, M, N, N, flags, qkv, kv);
}

// Block size is 32 * S threads; lockstep_kernels/cuda/plan.py keeps S <= 32 / max(1, TM / 2) (K-quants: 16, 8 at
// TM = 8) so the bounds hold and the accumulators stay in registers. PRO is 0 (any rows), PRO_ONE or PRO_NORM (one row), PRO_X16 (16-bit
// activations, 9-16 rows). kc .. kv: where EPI_ROPE stores (k and v caches, kv their type: 0 f32, 1 f16,
// 2 bf16); unused otherwise.
#ifndef KQ_BOUND
#define KQ_BOUND 512  // threads of a K-quant block at 1-16 rows (plan.KQ_MAX_SPLIT warps)
#endif

#define MM_THREADS(WT, TM) (KQ(WT) ? ((TM) > 4 ? 256 : (TM) > 2 ? 512 : KQ_BOUND) : 1024 / ((TM) > 2 ? (TM) / 2 : 1))
// min blocks 1 spelled out: ptxas allocates registers differently without it (the SASS these kernels were
// measured with).
#define MM_TC(NAME, WT, TM, U, PRO) MM_TC_AT(NAME, WT, TM, U, PRO, __launch_bounds__(MM_THREADS(WT, TM), 1))
#define MM_TC_AT(NAME, WT, TM, U, PRO, BOUND)                                                            \
    extern "C" __global__ void BOUND NAME(                                                               \
        const void* w, const u16* scales, const float* x, const float* bias, const float* res, float* out, \
        int M, int N, int K, int Kp, int flags, const float* nw, float eps, int ldx, void* kc, void* vc,     \
        const int* positions, const i64* slots, const float* cos_t, const float* sin_t, int H, int Hkv, int D, \
        int kv) {                                                                                        \
        mm_tc<WT, TM, U, PRO>(w, scales, x, bias, res, out, M, N, K, Kp, flags, nw, eps, ldx,         \
                              QkvOut{out, kc, vc, positions, slots, cos_t, sin_t, H, Hkv, D}, kv,         \
                              blockIdx.y * (8 * TM));                                                    \
    }

// The variants of one weight type; U12, U4, U8, U1: chunks a batch at 1-2, 4, 8 token tiles and one row;
// ONE: the one-row kernels' bound.
#define MM_TC_SET_AT(T, WT, U12, U4, U8, U1, ONE)    \
    MM_TC(mm_##T##_tm1, WT, 1, U12, 0)               \
    MM_TC(mm_##T##_tm2, WT, 2, U12, 0)               \
    MM_TC(mm_##T##_tm2h, WT, 2, U12, PRO_X16)        \
    MM_TC(mm_##T##_tm4, WT, 4, U4, 0)                \
    MM_TC(mm_##T##_tm8, WT, 8, U8, 0)                \
    MM_TC_AT(mm_##T##_one, WT, 1, U1, PRO_ONE, ONE)  \
    MM_TC_AT(mm_##T##_norm, WT, 1, U1, PRO_NORM, ONE)
#define MM_TC_SET(T, WT, U12, U4, U8, U1) MM_TC_SET_AT(T, WT, U12, U4, U8, U1, __launch_bounds__(MM_THREADS(WT, 1), 1))

MM_TC_SET(f16, WT_F16, 2, 2, 1, 4)
MM_TC_SET(bf16, WT_BF16, 2, 2, 1, 4)
MM_TC_SET(q8, WT_Q8, 2, 2, 1, 4)
// K-quants: 8 bytes a lane a chunk (f16: 32), so more chunks a batch at 1-2 token tiles; blocks of at
// most 16 warps (plan.KQ_MAX_SPLIT) so that the registers they need are there. The one-row kernels
// capped (__maxnreg__: Q4_K KQ_REGS_ONE, Q6_K KQ6_REGS_ONE, the fewest without spills): without their
// full batches' bound checks ptxas took 110-128, which would leave fewer warps an SM to keep the
// weights streaming.
#ifndef KQ_REGS_ONE
#define KQ_REGS_ONE 72
#endif
#ifndef KQ6_REGS_ONE
#define KQ6_REGS_ONE 80
#endif
// __maxnreg__ is CUDA 12.4's; an older NVRTC gets the launch bounds (slower, the same bits)
#if defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ * 100 + __CUDACC_VER_MINOR__ >= 1204
#define KQ_ONE_BOUND(REGS) __maxnreg__(REGS)
#else
#define KQ_ONE_BOUND(REGS) __launch_bounds__(KQ_BOUND, 1)
#endif
MM_TC_SET_AT(q4k, WT_Q4K, 4, 2, 1, KQ_U_ONE, KQ_ONE_BOUND(KQ_REGS_ONE))
MM_TC_SET_AT(q6k, WT_Q6K, 4, 2, 1, KQ_U_ONE, KQ_ONE_BOUND(KQ6_REGS_ONE))
// One row of 16-bit pairs (plan.ONE_X16_TYPES: the o and down projections after attention's and the
// gated product's 16-bit outputs): the pairs mm_*_one makes of the same floats, so its bits.
MM_TC_AT(mm_q4k_oneh, WT_Q4K, 1, KQ_U_ONE, PRO_ONE | PRO_X16, KQ_ONE_BOUND(KQ_REGS_ONE))
MM_TC_AT(mm_q6k_oneh, WT_Q6K, 1, KQ_U_ONE, PRO_ONE | PRO_X16, KQ_ONE_BOUND(KQ6_REGS_ONE))
// The one-row kernels again for blocks of KQ_BOUND threads (plan.ONE16_TYPES at split KQ_MAX_SPLIT):
// two such blocks an SM only at <= 64 registers a thread, worth the few that spill (twice the warps
// streaming the weights). The same code: the same bits.
#define MM_TC_ONE16(T, WT)                                                               \
    MM_TC_AT(mm_##T##_one16, WT, 1, KQ_U_ONE, PRO_ONE, __launch_bounds__(KQ_BOUND, 2)) \
    MM_TC_AT(mm_##T##_norm16, WT, 1, KQ_U_ONE, PRO_NORM, __launch_bounds__(KQ_BOUND, 2)) \
    MM_TC_AT(mm_##T##_one16h, WT, 1, KQ_U_ONE, PRO_ONE | PRO_X16, __launch_bounds__(KQ_BOUND, 2))
MM_TC_ONE16(q4k, WT_Q4K)
MM_TC_ONE16(q6k, WT_Q6K)
MM_TC(mm_q4k_tm2h2, WT_Q4K, 2, KQ_U12_RT, PRO_X16 | PRO_RT2)
MM_TC(mm_q6k_tm2h2, WT_Q6K, 2, KQ_U12_RT, PRO_X16 | PRO_RT2)

// Grouped (mixture of experts): the experts' weights stacked [E, Np, Kp] (w_stride bytes, s_stride
// scale words apart) and a tile table of int4 (expert, first place, rows, 0) written on the device
// (moe.cu's schedule); block y takes tile y, places first .. first + rows - 1 of out, and runs mm_tc
// on its expert's weights as if they were one weight of rows M = rows. mm_tc's sums do not depend
// on M, the tile's place, TM or the prologue (a one-row kernel has the bits of the others), so a
// (token, expert) pair has the bits of a dense matmul of its row on that expert, however many rows
// chose it. With `gather` (the gate|up projection) place q's input is token row src[q] of x, else
// row q (the down projection: the gated products, in place order). The table is read after
// pdl_start (the kernel before wrote it), unless flags has MMG_TILES_EARLY: a kernel at least two
// back wrote it (and src), which had finished before the kernel just before passed its own
// pdl_start, that is before this one could start; then the expert's first weights are in flight
// before the wait (the down projection).
//
// With `sum` (the down projection of at most moe.py's SUM_ROWS tokens) the block that completes a
// token's k pairs for its 16 features also writes their weighted sum (moe_weighted_sum, the bits of
// moe_combine): every block counts its tokens in counts[t, blockIdx.x] after its stores are visible
// (__threadfence), and the one that counts the k-th reads the others' outputs through L2 and sets the
// count back to 0 for the next launch.
__device__ __forceinline__ void moe_sum_tail(const float* __restrict__ y, int4 tile, int N, const int* __restrict__ src,
                                             const int* __restrict__ pos, const float* __restrict__ weights,
                                             const float* __restrict__ shared, const float* __restrict__ gate,
                                             const float* __restrict__ res, float* __restrict__ sum,
                                             int* __restrict__ counts, int k, int has_shared, int has_res) {
    const int lane = threadIdx.x & 31, n = blockIdx.x * 16 + (lane & 15);
    __threadfence();
    __syncwarp();
    for (int m0 = 0; m0 < tile.z; m0 += 32) {
        const int m = m0 + lane;
        int t = 0;
        bool last = false;
        if (m < tile.z) {
            t = src[tile.y + m];
            last = atomicAdd(counts + (i64)t * gridDim.x + blockIdx.x, 1) == k - 1;
        }
        const unsigned done = __ballot_sync(0xffffffffu, last);
        if (done) __threadfence();  // the other blocks' outputs are read after their counts
        for (unsigned mask = done; mask; mask &= mask - 1) {
            const int tt = __shfl_sync(0xffffffffu, t, __ffs(mask) - 1);
            if (lane < 16 && n < N)
                sum[(i64)tt * N + n] = moe_weighted_sum(y, pos, weights, shared, gate, res, tt, n, N, k, has_shared,
                                                        has_res);
            if (lane == 0) counts[(i64)tt * gridDim.x + blockIdx.x] = 0;
        }
    }
}

#define MMG_TILES_EARLY 1024  // a flag beside the EPI_* ones, for MM_TCG only
#define MM_TCG(NAME, WT, TM, U, PRO)                                                                     \
    extern "C" __global__ void __launch_bounds__(MM_THREADS(WT, TM)) NAME(                               \
        const unsigned char* w, const u16* scales, i64 w_stride, i64 s_stride, const int4* tiles,        \
        const float* x, float* out, int N, int K, int Kp, int flags, int ldx, int ldo, const int* src,   \
        int gather, const int* pos, const float* weights, const float* shared, const float* gate,        \
        const float* res, float* sum, int* counts, int k, int has_shared, int has_res) {                 \
        if (!(flags & MMG_TILES_EARLY)) pdl_start();                                                     \
        const int4 tile = tiles[blockIdx.y];                                                             \
        if (tile.z <= 0) return;                                                                         \
        const float* xt = (PRO & PRO_ROWS) ? (gather ? x : x + (i64)tile.y * ldx)                         \
                                           : x + (i64)(gather ? src[tile.y] : tile.y) * ldx;  /* PRO_ONE */ \
        mm_tc<WT, TM, U, PRO>(w + tile.x * w_stride, scales + tile.x * s_stride, xt, nullptr, nullptr,     \
                              out + (i64)tile.y * ldo, tile.z, N, K, Kp, flags & ~MMG_TILES_EARLY, nullptr, 0.f, ldx, \
                              QkvOut{}, 0, 0,                                                            \
                              gather ? src + tile.y : nullptr);                                          \
        if (sum != nullptr && threadIdx.x < 32)                                                          \
            moe_sum_tail(out, tile, N, src, pos, weights, shared, gate, res, sum, counts, k, has_shared,  \
                         has_res);                                                                       \
    }
// tm*: any rows; one: tiles of one row (one token in the step).
#define MM_TCG_SET(T, WT, U12, U4, U8, U1)      \
    MM_TCG(mmg_##T##_tm1, WT, 1, U12, PRO_ROWS) \
    MM_TCG(mmg_##T##_tm2, WT, 2, U12, PRO_ROWS) \
    MM_TCG(mmg_##T##_tm4, WT, 4, U4, PRO_ROWS)  \
    MM_TCG(mmg_##T##_tm8, WT, 8, U8, PRO_ROWS)  \
    MM_TCG(mmg_##T##_one, WT, 1, U1, PRO_ONE)

MM_TCG_SET(f16, WT_F16, 2, 2, 1, 4)
MM_TCG_SET(bf16, WT_BF16, 2, 2, 1, 4)
MM_TCG_SET(q8, WT_Q8, 2, 2, 1, 4)

// A one-token step's gate|up launch that routes its token itself (no routing launch before it): every
// block routes the row of router logits (route_row, the routing of every other kernel), block y takes
// slot y's expert and runs mm_tc on the token's row normalised by nw, eps (PRO_NORM: rms_norm's
// bits, as the one-row dense kernels). Blocks (0, y) write what the down launch and its sum read:
// slot y's id and weight, tile y = (expert, place y, 1 row), pos[y] = y, src[y] = 0. Grid (N / 16, k).
// Block y's slot of the row of router logits that warp 0 routes (route_row): its expert, its weight in *w.
__device__ __forceinline__ int routed_slot(const float* __restrict__ logits, int E, int k, int renorm, int y,
                                           float* w) {
    __shared__ float p[MOE_MAX_E];
    __shared__ float chosen[32], slot_w[32];
    __shared__ int slot_id[32];
    if (threadIdx.x < 32) route_row(logits, slot_id, slot_w, E, k, renorm, p, chosen);
    __syncthreads();
    *w = slot_w[y];
    return slot_id[y];
}

#define MM_TCG_ROUTE(NAME, WT)                                                                            \
    extern "C" __global__ void __launch_bounds__(MM_THREADS(WT, 1)) NAME(                                 \
        const unsigned char* w, const u16* scales, i64 w_stride, i64 s_stride, const float* logits, int E,  \
        int k, int renorm, const float* x, float* out, int N, int K, int Kp, int flags, int ldo,          \
        const float* nw, float eps, int* ids, float* weights, int4* tiles, int* pos, int* src) {         \
        pdl_start();                                                                                      \
        float slot_w;                                                                                     \
        const int y = blockIdx.y, e = routed_slot(logits, E, k, renorm, y, &slot_w);                      \
        if (blockIdx.x == 0 && threadIdx.x == 0) {                                                        \
            ids[y] = e, weights[y] = slot_w, pos[y] = y, src[y] = 0;                                      \
            tiles[y] = make_int4(e, y, 1, 0);                                                             \
        }                                                                                                 \
        mm_tc<WT, 1, 4, PRO_NORM>(w + e * w_stride, scales + e * s_stride, x, nullptr, nullptr,            \
                                  out + (i64)y * ldo, 1, N, K, Kp, flags, nw, eps, K, QkvOut{}, 0, 0);     \
    }
MM_TCG_ROUTE(mmg_f16_route, WT_F16)
MM_TCG_ROUTE(mmg_bf16_route, WT_BF16)
MM_TCG_ROUTE(mmg_q8_route, WT_Q8)

// A one-token step routed once (no routing in the expert launches): the router's launch routes the
// row, then the gate|up launch reads the tile table it wrote, and the down launch, two back from it,
// has its first weights in flight before it waits (MMG_TILES_EARLY).
//
// The router (mm_*_norm: the row normalised by nw, eps, then its E logits), whose blocks count
// themselves done in *counter after their stores are visible (__threadfence, as moe_sum_tail's
// counts); the one that counts the last routes the row (route_row on the logits read through L2)
// and writes what mmg_*_route would have: slot y's id and weight, tile y = (expert, place y, 1 row),
// pos[y] = y, src[y] = 0, and sets the counter back to 0 for the next launch. Grid (E / 16).
__device__ __forceinline__ void route_tail(const float* __restrict__ logits, int E, int k, int renorm,
                                           int* __restrict__ counter, int* __restrict__ ids,
                                           float* __restrict__ weights, int4* __restrict__ tiles,
                                           int* __restrict__ pos, int* __restrict__ src) {
    __shared__ float row[MOE_MAX_E], p[MOE_MAX_E];
    __shared__ float chosen[32], slot_w[32];
    __shared__ int slot_id[32];
    const int lane = threadIdx.x & 31;
    __threadfence();
    __syncwarp();
    int last = 0;
    if (lane == 0) last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
    if (!__shfl_sync(0xffffffffu, last, 0)) return;
    __threadfence();  // the other blocks' logits are read after their counts
    for (int e = lane; e < E; e += 32) row[e] = __ldcg(logits + e);
    __syncwarp();
    route_row(row, slot_id, slot_w, E, k, renorm, p, chosen);
    if (lane < k) {
        const int e = slot_id[lane];
        ids[lane] = e, weights[lane] = slot_w[lane], pos[lane] = lane, src[lane] = 0;
        tiles[lane] = make_int4(e, lane, 1, 0);
    }
    if (lane == 0) *counter = 0;
}

#define MM_TC_ROUTE(NAME, WT)                                                                             \
    extern "C" __global__ void __launch_bounds__(MM_THREADS(WT, 1), 1) NAME(                              \
        const void* w, const u16* scales, const float* x, float* logits, int E, int K, int Kp,            \
        const float* nw, float eps, int k, int renorm, int* counter, int* ids, float* weights,            \
        int4* tiles, int* pos, int* src) {                                                                \
        mm_tc<WT, 1, 4, PRO_NORM>(w, scales, x, nullptr, nullptr, logits, 1, E, K, Kp, 0, nw, eps, K,    \
                                  QkvOut{}, 0, 0);                                                        \
        if (threadIdx.x < 32) route_tail(logits, E, k, renorm, counter, ids, weights, tiles, pos, src);   \
    }
MM_TC_ROUTE(mm_f16_norm_route, WT_F16)
MM_TC_ROUTE(mm_bf16_norm_route, WT_BF16)
MM_TC_ROUTE(mm_q8_norm_route, WT_Q8)

// Its gate|up launch: mmg_*_route's matmul (PRO_NORM on the token's row) on tile y's expert, the
// table read after pdl_start (the router, just before, wrote it). Grid (N / 16, k).
#define MM_TCG_NORM(NAME, WT)                                                                             \
    extern "C" __global__ void __launch_bounds__(MM_THREADS(WT, 1)) NAME(                                 \
        const unsigned char* w, const u16* scales, i64 w_stride, i64 s_stride, const int4* tiles,         \
        const float* x, float* out, int N, int K, int Kp, int flags, int ldo, const float* nw, float eps) { \
        pdl_start();                                                                                      \
        const int4 tile = tiles[blockIdx.y];                                                              \
        mm_tc<WT, 1, 4, PRO_NORM>(w + tile.x * w_stride, scales + tile.x * s_stride, x, nullptr, nullptr, \
                                  out + (i64)tile.y * ldo, 1, N, K, Kp, flags, nw, eps, K, QkvOut{}, 0, 0); \
    }
MM_TCG_NORM(mmg_f16_norm, WT_F16)
MM_TCG_NORM(mmg_bf16_norm, WT_BF16)
MM_TCG_NORM(mmg_q8_norm, WT_Q8)


// Float32 weights: plain FMA, one warp per weight row. Lane l accumulates k = 4l + 128i + j in
// ascending i, j; the lanes then meet in the fixed butterfly. Rows of x are looped inside with
// the same per-row arithmetic, so M never changes a row's bits.
#define F32_TOKENS 4
__device__ __forceinline__ void mm_f32_rows(const float* __restrict__ w, const float* __restrict__ x,
                                            const float* __restrict__ bias, const float* __restrict__ res,
                                            float* __restrict__ out, int N, int K, int Kp, int flags, int m_first,
                                            int m_last, const int* __restrict__ rows = nullptr) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + warp;
    if (n >= N) return;  // no block-wide barrier below
    const float* wr = w + (i64)n * Kp;
    for (int m0 = m_first; m0 < m_last; m0 += F32_TOKENS) {
        float acc[F32_TOKENS];
#pragma unroll
        for (int i = 0; i < F32_TOKENS; ++i) acc[i] = 0.f;
        for (int k = lane * 4; k < Kp; k += 128) {
            const float4 wv = *reinterpret_cast<const float4*>(wr + k);
            const float wk[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int i = 0; i < F32_TOKENS; ++i) {
                const int m = m0 + i;
                if (m >= m_last) break;
                const float* xr = x + (i64)(rows != nullptr ? rows[m] : m) * K;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float xv = (k + j < K) ? xr[k + j] : 0.f;
                    acc[i] = __fmaf_rn(wk[j], xv, acc[i]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < F32_TOKENS; ++i) {
            const float v = warp_sum(acc[i]);
            const int m = m0 + i;
            if (lane == 0 && m < m_last) out[(i64)m * N + n] = epilogue(v, bias, res, m, n, N, flags);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) mm_f32(const float* __restrict__ w, const float* __restrict__ x,
                                                         const float* __restrict__ bias, const float* __restrict__ res,
                                                         float* __restrict__ out, int M, int N, int K, int Kp,
                                                         int flags, int rows_per_y) {
    pdl_start();
    const int m_first = blockIdx.y * rows_per_y;
    mm_f32_rows(w, x, bias, res, out, N, K, Kp, flags, m_first, imin(M, m_first + rows_per_y));
}

// mm_f32 grouped as MM_TCG is, without the sum (w_stride in floats; x rows K apart, out rows N apart).
extern "C" __global__ void __launch_bounds__(256) mmg_f32(const float* __restrict__ w, i64 w_stride,
                                                          const int4* __restrict__ tiles, const float* __restrict__ x,
                                                          float* __restrict__ out, int N, int K, int Kp, int flags,
                                                          const int* __restrict__ src, int gather) {
    pdl_start();
    const int4 tile = tiles[blockIdx.y];
    if (tile.z <= 0) return;
    mm_f32_rows(w + tile.x * w_stride, gather ? x : x + (i64)tile.y * K, nullptr, nullptr, out + (i64)tile.y * N, N, K,
                Kp, flags, 0, tile.z, gather ? src + tile.y : nullptr);
}

// Activations to 16 bits, zero-padded to Kp columns (a multiple of 32), with pack_act's rounding:
// the operands of mm_wide (exact) and of cuBLAS (exact mode off). With `perm`, column j of each
// 32-k chunk holds k = 8b + 2a + e for j = 8a + 2b + e: the k order mm_wgmma's token operand needs
// (wgmma.cu).
extern "C" __global__ void act_to_16(const float* __restrict__ x, u16* __restrict__ y, int M, int K, int Kp,
                                     int bf16, int perm) {
    pdl_start();
    // one 16-byte unit of output per thread: with `perm`, unit 4c + a of a row holds chunk c's
    // k = 32c + 8b + 2a + e (b = 0..3, e = 0..1), pairs that sit side by side in x
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= Kp / 8) return;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        const float* xr = x + (i64)m * K;
        unsigned w[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int k = perm ? (u >> 2) * 32 + 8 * b + 2 * (u & 3) : u * 8 + 2 * b;
            const float lo = k < K ? xr[k] : 0.f, hi = k + 1 < K ? xr[k + 1] : 0.f;
            w[b] = bf16 ? pack_act<WT_BF16>(lo, hi) : pack_act<WT_F16>(lo, hi);
        }
        *reinterpret_cast<uint4*>(y + (i64)m * Kp + u * 8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// Q4_K's ones sums (q4k_ones: the same two MMAs on the same pairs) of every (token, chunk) of 16-bit
// activations in act_to_16's `perm` order, for mm_wgmma_kq (wgmma_kq.cu), which adds them in as
// tile_chunk does: e [ceil(M / 128)][C][128] floats, token m of a 128-token tile at wgmma_kq.cu's
// kg_epos(m % 128), tokens past M zero. A warp takes 8 tokens (its g) through 8 chunks.
extern "C" __global__ void __launch_bounds__(256) q4k_ones_sums(const u16* __restrict__ x16, float* __restrict__ e,
                                                                int M, int Kp) {
    pdl_start();
    const int C = Kp >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m8 = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;  // 8-token group
    if (m8 * 8 >= ((M + 127) & ~127)) return;
    const int m = m8 * 8 + g, ml = (m8 * 8) & 127;
    const unsigned* row = reinterpret_cast<const unsigned*>(x16 + (i64)(m < M ? m : 0) * Kp);
    for (int c = blockIdx.y * 8; c < imin(C, blockIdx.y * 8 + 8); ++c) {
        // the words mm_wide's lane (g, t) feeds its MMAs (k 8t .. 8t+7 of the chunk): words t, 4+t, 8+t, 12+t
        unsigned b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = m < M ? row[16 * c + 4 * i + t] : 0u;
        float s[4];
        q4k_ones(s, b[0], b[1], b[2], b[3]);
        if (g == 0) {  // row 0's sums of tokens 2t, 2t + 1 (every row of an MMA of ones has them)
            float* at = e + ((i64)((m8 * 8) >> 7) * C + c) * 128;
            const int m0 = ml + 2 * t;
            at[(m0 & ~15) | (((m0 >> 1) & 3) << 2) | (((m0 >> 3) & 1) << 1)] = s[0];
            at[(m0 & ~15) | (((m0 >> 1) & 3) << 2) | (((m0 >> 3) & 1) << 1) | 1] = s[1];
        }
    }
}

// ---- the tiled kernel for wide batches (prefill): the same sums as mm_tc, element for element.
// A block computes 64 weight rows x 64 tokens with 4 warps (each 32 x 32: 2 row tiles x 4 token
// tiles), staging each 32-k chunk of weights and activations in shared memory through a 3-deep
// cp.async pipeline. It walks the chunks in ascending order; at the end of each of the S slices
// (the same bounds s*C/S as mm_tc) the slice's partial joins the total exactly as mm_tc's warp 0
// adds the slices: total = p0, then total + p1, ... . Fragments are built with the same permuted
// k order, so every MMA sees the operands mm_tc gives it.
#define TILE_N 64
#define TILE_M 64
#define STAGES 3
#define XS_STRIDE 36  // floats per token row in shared memory: 32 + 4 keeps 16-byte reads conflict-free

template <int WT>
__device__ __forceinline__ void mm_tile(const void* __restrict__ w, const u16* __restrict__ scales,
                                        const float* __restrict__ x, const float* __restrict__ bias,
                                        const float* __restrict__ res, float* __restrict__ out, int M, int N,
                                        int K, int Kp, int Np, int flags, int S) {
    pdl_start();
    constexpr int WB = WT == WT_Q8 ? 32 : 64;  // bytes of one weight row in one chunk
    __shared__ __align__(16) unsigned char ws[STAGES][TILE_N * WB];
    __shared__ __align__(16) float xs[STAGES][TILE_M * XS_STRIDE];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wn = warp & 1, wm = warp >> 1;
    const int n0 = blockIdx.x * TILE_N, m0 = blockIdx.y * TILE_M;
    const int C = Kp >> 5;

    auto load_chunk = [&](int c, int stage) {
        stage_weights<WT, TILE_N>(ws[stage], w, scales, n0, Np, C, c, 128);
        for (int i = tid; i < TILE_M * 8; i += 128) {
            const int r = i >> 3, seg = i & 7;
            const int m = m0 + r, k = c * 32 + seg * 4;
            const bool ok = m < M && k < K;
            cp_async16(&xs[stage][r * XS_STRIDE + seg * 4], ok ? x + (i64)m * K + k : x, ok ? 16 : 0);
        }
    };

    float total[2][4][4] = {}, part[2][4][4] = {};
    pipeline_fill<STAGES>(C, load_chunk);
    int s = 0, slice_end = (int)((i64)C / S);
    for (int c = 0; c < C; ++c) {
        pipeline_step<STAGES>(c, C, load_chunk);
        const unsigned char* wst = ws[c % STAGES];
        const float* xst = xs[c % STAGES];

        unsigned b1[4][2], b2[4][2];
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
            const float* xr = xst + (wm * 32 + tt * 8 + g) * XS_STRIDE + 8 * t;
            const float4 lo = *reinterpret_cast<const float4*>(xr), hi = *reinterpret_cast<const float4*>(xr + 4);
            b1[tt][0] = pack_act<WT>(lo.x, lo.y);
            b1[tt][1] = pack_act<WT>(lo.z, lo.w);
            b2[tt][0] = pack_act<WT>(hi.x, hi.y);
            b2[tt][1] = pack_act<WT>(hi.z, hi.w);
        }
        tile_chunk<WT, 2>(part, wst, wn * 32, b1, b2, scales, n0, Np, C, c);
        if (c + 1 == slice_end) join_slice(total, part, s, slice_end, C, S);
    }

    store_tiles<2>(total, n0 + wn * 32, m0 + wm * 32, bias, res, out, M, N, flags);
}

// ---- the wide kernel for long prefills: the same sums again, on 128 weight rows x 128 tokens per
// block (8 warps, each 64 x 32: 4 row tiles x 4 token tiles). Activations arrive already rounded
// to the MMA's 16-bit type (act_to_16: the rounding pack_act does), so both operands are staged as
// raw 16-bit chunks and every fragment is one 16-byte shared-memory read. A pipeline stage holds
// WIDE_KC chunks; WIDE_STAGES stages sit in dynamic shared memory (plan.wide_smem). Chunk order,
// slice bounds and the slice join are mm_tile's.
#define WIDE_N 128
#define WIDE_M 128
#ifndef WIDE_STAGES
#define WIDE_STAGES 4
#endif
#ifndef WIDE_KC
#define WIDE_KC 1
#endif

template <int WT>
__device__ __forceinline__ void mm_wide(const void* __restrict__ w, const u16* __restrict__ scales,
                                        const u16* __restrict__ x16, const float* __restrict__ bias,
                                        const float* __restrict__ res, float* __restrict__ out, int M, int N,
                                        int Kp, int Np, int flags, int S) {
    pdl_start();
    constexpr int WB = WT == WT_Q8 ? 32 : 64;  // bytes of one weight row in one chunk
    constexpr int W_STAGE = WIDE_KC * WIDE_N * WB, X_STAGE = WIDE_KC * WIDE_M * 64;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* ws = smem;                           // [WIDE_STAGES][WIDE_KC][WIDE_N * WB]
    unsigned char* xs = smem + WIDE_STAGES * W_STAGE;  // [WIDE_STAGES][WIDE_KC][WIDE_M * 64]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wn = warp & 1, wm = warp >> 1;
    const int n0 = blockIdx.x * WIDE_N, m0 = blockIdx.y * WIDE_M;
    const int C = Kp >> 5;
    const int CS = (C + WIDE_KC - 1) / WIDE_KC;  // pipeline stages' worth of chunks
    const unsigned char* xb = reinterpret_cast<const unsigned char*>(x16);

    auto load_stage = [&](int cs, int stage) {
#pragma unroll
        for (int kc = 0; kc < WIDE_KC; ++kc) {
            const int c = cs * WIDE_KC + kc;
            if (c >= C) break;
            unsigned char* wdst = ws + stage * W_STAGE + kc * WIDE_N * WB;
            unsigned char* xdst = xs + stage * X_STAGE + kc * WIDE_M * 64;
            stage_weights<WT, WIDE_N>(wdst, w, scales, n0, Np, C, c, 256);
            for (int i = tid; i < WIDE_M * 4; i += 256) {
                const int r = i >> 2, seg = i & 3;
                const bool ok = m0 + r < M;
                cp_async16(xdst + r * 64 + seg * 16, ok ? xb + (i64)(m0 + r) * Kp * 2 + c * 64 + seg * 16 : xb,
                           ok ? 16 : 0);
            }
        }
    };

    float total[4][4][4] = {}, part[4][4][4] = {};
    pipeline_fill<WIDE_STAGES>(CS, load_stage);
    int s = 0, slice_end = (int)((i64)C / S);
    for (int cs = 0; cs < CS; ++cs) {
        pipeline_step<WIDE_STAGES>(cs, CS, load_stage);
#pragma unroll
        for (int kc = 0; kc < WIDE_KC; ++kc) {
            const int c = cs * WIDE_KC + kc;
            if (c >= C) break;
            const unsigned char* wst = ws + (cs % WIDE_STAGES) * W_STAGE + kc * WIDE_N * WB;
            const unsigned char* xst = xs + (cs % WIDE_STAGES) * X_STAGE + kc * WIDE_M * 64;
            unsigned b1[4][2], b2[4][2];
#pragma unroll
            for (int tt = 0; tt < 4; ++tt) {
                const uint4 u = *reinterpret_cast<const uint4*>(xst + (wm * 32 + tt * 8 + g) * 64 + 16 * t);
                b1[tt][0] = u.x; b1[tt][1] = u.y; b2[tt][0] = u.z; b2[tt][1] = u.w;
            }
            tile_chunk<WT, 4>(part, wst, wn * 64, b1, b2, scales, n0, Np, C, c);
            if (c + 1 == slice_end) join_slice(total, part, s, slice_end, C, S);
        }
    }

    store_tiles<4>(total, n0 + wn * 64, m0 + wm * 32, bias, res, out, M, N, flags);
}

// Both tiled families for each weight type (the kernel names ops.py launches).
#define MM_TILED(T, WT)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) mm_tile_##T(const void* w, const u16* scales, const float* x, \
                                                                  const float* bias, const float* res, float* out, \
                                                                  int M, int N, int K, int Kp, int Np, int flags, int S) { \
        mm_tile<WT>(w, scales, x, bias, res, out, M, N, K, Kp, Np, flags, S);                             \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(256) mm_wide_##T(const void* w, const u16* scales, const u16* x16, \
                                                                  const float* bias, const float* res, float* out, \
                                                                  int M, int N, int Kp, int Np, int flags, int S) { \
        mm_wide<WT>(w, scales, x16, bias, res, out, M, N, Kp, Np, flags, S);                              \
    }

MM_TILED(f16, WT_F16)
MM_TILED(bf16, WT_BF16)
MM_TILED(q8, WT_Q8)
MM_TILED(q4k, WT_Q4K)
MM_TILED(q6k, WT_Q6K)
