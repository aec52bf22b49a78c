// Q4_K / Q5_K / Q6_K matmuls on integer dot products, row invariant (the planes of lockstep_kernels/cuda/kquant.py).
//
// Activations are quantised per 32-value chunk (kq_quant_x): xq = rint(v * 16256 / amax), a 15-bit
// integer split as xq = 128 * xh + xl (xh in -127..127, xl in -64..63, two int8 planes), the chunk's
// dx = amax / 16256 and its integer sums S0, S1 of xq over each 16-value half. A value's error is
// at most amax / 32512 of its chunk: below the f16 rounding the 16-bit paths give activations.
// A weight row's chunk sum is then an integer, exact in any order (dp4a at one row, int8 MMAs for
// batches): Q4_K, Q5_K P = sum(q xq); Q6_K P_h = sum(q xq) - 32 S_h per 16-value half (q the
// unsigned 6-bit value). Every kernel turns it into a float the same way (kqi_q4, kqi_q6) and sums the
// chunks of a K slice in ascending order (acc + v); the S slices (plan.split_k: N, K and the
// device) are added in slice order, ((p0 + p1) + p2) + ... . No choice depends on M.
#include "common.cuh"

#define WT_Q4K 3
#define WT_Q6K 4
#define WT_Q5K 5  // Q4_K's scales, a fifth bit in Q6_K's top plane (kquant.py)
#define KQ_MASK 0x0F0F0F0Fu
#define KQX_MAX 16256  // 127 * 128: the largest |xq|
#ifndef KQI_V
#define KQI_V 2  // chunks a lane of the one-row kernel takes per batch (a batch is 4 * KQI_V chunks)
#endif

__device__ __forceinline__ int dp4a(unsigned a, unsigned b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ unsigned redux_max(unsigned v) {
    unsigned r;
    asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}

__device__ __forceinline__ int redux_add(int v) {
    int r;
    asm volatile("redux.sync.add.s32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}

__device__ __forceinline__ void mma_s8(int (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                       unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- activations: x[M, K] (rows ldx apart; with `norm`, rms_norm's values (weights nw) of each row) to the records
// the kernels read. Chunk c of row m: 64 bytes at xq + (m * C + c) * 64, four 16-byte groups, group j
// for k = 32c + 8j + i: xh at byte pos(i), xl at 8 + pos(i), pos = 0 2 4 6 1 3 5 7 (the order of a
// plane word's low nibbles, then its high nibbles: kquant.py's _NIB_SHIFT); xs[m * C + c] = (dx,
// dx * (S0 + S1), S0, S1), the integers as their bits. Grid (G, M), 256 threads: warp w of block b
// takes chunks 8b + w, then 8 G on (wide batches: few blocks a row, so that rms_inv runs fewer times).
extern "C" __global__ void __launch_bounds__(256)
kq_quant_x(const float* __restrict__ x, const float* __restrict__ nw, unsigned char* __restrict__ xq,
           float4* __restrict__ xs, int M, int K, int C, int ldx, float eps, int norm) {
    pdl_start();
    __shared__ float scratch[8];
    const int m = blockIdx.y, lane = threadIdx.x & 31;
    const float* xr = x + (i64)m * ldx;
    float inv = 0.f;
    if (norm) inv = rms_inv(xr, K, eps, scratch);  // a barrier: every thread of the block
    for (int c = blockIdx.x * 8 + (threadIdx.x >> 5); c < C; c += gridDim.x * 8) {
        const int k = c * 32 + lane;
        float v = k < K ? xr[k] : 0.f;
        if (norm && k < K) v = __fmul_rn(__fmul_rn(v, inv), nw[k]);
        const float amax = __uint_as_float(redux_max(__float_as_uint(fabsf(v))));
        const float id = amax > 0.f ? __fdiv_rn((float)KQX_MAX, amax) : 0.f;
        int q;
        asm("cvt.rni.s32.f32 %0, %1;" : "=r"(q) : "f"(__fmul_rn(v, id)));  // rint, ties to even
        q = q > KQX_MAX ? KQX_MAX : (q < -KQX_MAX ? -KQX_MAX : q);
        const int hi = (q + 64) >> 7, lo = q - hi * 128;
        const int s0 = redux_add(lane < 16 ? q : 0), s1 = redux_add(lane < 16 ? 0 : q);
        const int i = lane & 7, pos = ((i & 1) << 1 | (i >> 2)) + 4 * ((i >> 1) & 1);
        unsigned char* dst = xq + ((i64)m * C + c) * 64 + 16 * (lane >> 3);
        dst[pos] = (unsigned char)(hi & 0xff);
        dst[8 + pos] = (unsigned char)(lo & 0xff);
        if (lane == 0) {
            const float dx = __fdiv_rn(amax, (float)KQX_MAX);
            xs[(i64)m * C + c] = make_float4(dx, __fmul_rn(dx, (float)(s0 + s1)), __int_as_float(s0), __int_as_float(s1));
        }
    }
}

// ---- the one float step of a chunk: (scales of the row: kq_scale_pair), its integer sums, the
// token's chunk record. Q4_K: d*sc * dx*P - dmin*m * dx*(S0 + S1); Q6_K: d*sc1 * dx*P1 + d*sc0 * dx*P0.
__device__ __forceinline__ float kqi_q4(float2 sc, int p, float4 r) {
    return __fmaf_rn(sc.x, __fmul_rn(r.x, (float)p), -__fmul_rn(sc.y, r.y));
}

__device__ __forceinline__ float kqi_q6(float2 sc, int p0, int p1, float4 r) {
    return __fmaf_rn(sc.y, __fmul_rn(r.x, (float)p1), __fmul_rn(sc.x, __fmul_rn(r.x, (float)p0)));
}

// A plane word's 8 values (kquant.py: lane t's k 8t .. 8t+7 of one row) as two words of 4 bytes:
// lo = k 8t + (0, 4, 1, 5), hi = k 8t + (2, 6, 3, 7), the order kq_quant_x writes activations in.
// TOP (Q5_K, Q6_K): the top bits from the row's top word `tb` (row g: the word, row g + 8: >> 8).
template <bool TOP>
__device__ __forceinline__ void kq_bytes(unsigned w, unsigned tb, unsigned& lo, unsigned& hi) {
    lo = w & KQ_MASK;
    hi = (w >> 4) & KQ_MASK;
    if (TOP) {
        lo |= ((tb << 4) & 0x00300030u) | ((tb << 8) & 0x30003000u);
        hi |= ((tb << 2) & 0x00300030u) | ((tb << 6) & 0x30003000u);
    }
}

// A chunk's scales of rows g, g + 8 from the scale words (kq_scale_words).
template <bool Q6>
__device__ __forceinline__ void kq_row_scales(unsigned s, uint2 d, float2& sa, float2& sb) {
    sa = kq_scale_pair(s, d.x, Q6);
    sb = kq_scale_pair(s >> 16, Q6 ? d.x >> 16 : d.y, Q6);
}

// ---- epilogue: stream_stores of a part of a stack (kquant_ops.py), which writes its columns of a wider
// output (rows ldo apart, heads from h0 on); the pointers restrict as they were when the kernels were measured
template <int TM>
__device__ __forceinline__ void kqi_store(const float (&acc)[TM][4], int n0, int m_base, const float* __restrict__ bias,
                                          const float* __restrict__ res, float* __restrict__ out, int M, int N,
                                          int flags, const QkvOut& qkv, int kv, int ldo, int h0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    stream_stores<TM, 0>(acc, n0, h0, m_base, g, t, bias, res, out, M, N, ldo, flags, qkv, kv);
}

template <int V>
struct KqOneBatch {  // a lane's weights of a one-row batch: chunks c0 + t + 4v of rows g, g + 8
    uint4 w0[V], w1[V], tb[V];  // plane words of lanes 4g .. 4g+3 (rows g, g + 8 alternate); the top words
    unsigned sw[V];
    uint2 dw[V];
};

// ---- one row (dp4a): block = one 16-row tile, S warps = the K slices. A batch is 4V chunks; lane
// (g, t) takes chunks c0 + t + 4v whole for rows g and g + 8 (the four plane words of lanes 4g .. 4g+3,
// 32 contiguous bytes), so its sums need no other lane; lanes t = 0 then add the 4V chunk values in
// chunk order (the gather: every lane of the group adds the same values in the same order).
template <int WT>
__device__ __forceinline__ void mmq_one(const unsigned char* __restrict__ w, const unsigned char* __restrict__ aux,
                                        const unsigned char* __restrict__ xq, const float4* __restrict__ xs,
                                        const float* __restrict__ bias, const float* __restrict__ res,
                                        float* __restrict__ out, int N, int Kp, int flags, const QkvOut& qkv, int kv,
                                        int ldo, int h0) {
    extern __shared__ float red[];
    constexpr bool Q6 = WT == WT_Q6K, TOP = WT != WT_Q4K;
    constexpr int V = KQI_V;
    const int S = blockDim.x >> 5, s = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int C = Kp >> 5;
    const i64 tile = blockIdx.x;
    const int c_begin = (int)(((i64)s * C) / S), c_end = (int)(((i64)(s + 1) * C) / S);
    const KqPlanes kq = kq_planes(w, aux, TOP, (N + 15) >> 4, C);

    // A batch's weights; chunks past the slice load the slice's last (no branch: every load of a
    // batch in one basic block) and are never added.
    KqOneBatch<V> cur, next;
    auto load_weights = [&](KqOneBatch<V>& b, int c0) {
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const int c = imin(c0 + t + 4 * v, c_end - 1);
            const uint4* p = reinterpret_cast<const uint4*>(kq.nib + ((tile * C + c) * 32 + 4 * g) * 8);
            b.w0[v] = p[0];
            b.w1[v] = p[1];
            b.tb[v] = TOP ? *reinterpret_cast<const uint4*>(kq.top + ((tile * C + c) * 32 + 4 * g) * 4)
                         : make_uint4(0u, 0u, 0u, 0u);
            kq_scale_words(kq, Q6, tile, C, c, g, b.sw[v], b.dw[v]);
        }
    };

    if (c_begin < c_end) load_weights(cur, c_begin);
    pdl_start();  // activations are written by the kernel before
    float acc_a = 0.f, acc_b = 0.f;  // rows g, g + 8
    for (int c0 = c_begin; c0 < c_end; c0 += 4 * V) {
        uint4 a[V][4];
        float4 r[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const int c = imin(c0 + t + 4 * v, c_end - 1);
#pragma unroll
            for (int j = 0; j < 4; ++j) a[v][j] = reinterpret_cast<const uint4*>(xq + (i64)c * 64)[j];
            r[v] = xs[c];
        }
        const bool more = c0 + 4 * V < c_end;
        if (more) load_weights(next, c0 + 4 * V);  // in flight over this batch's arithmetic
        float va[V], vb[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const unsigned ga[4] = {cur.w0[v].x, cur.w0[v].z, cur.w1[v].x, cur.w1[v].z};
            const unsigned gb[4] = {cur.w0[v].y, cur.w0[v].w, cur.w1[v].y, cur.w1[v].w};
            const unsigned tw[4] = {cur.tb[v].x, cur.tb[v].y, cur.tb[v].z, cur.tb[v].w};
            int ha[2] = {0, 0}, la[2] = {0, 0}, hb[2] = {0, 0}, lb[2] = {0, 0};  // per half (Q4_K: both in [0])
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint4 x = a[v][j];
                const int h = Q6 ? j >> 1 : 0;
                unsigned lo, hi;
                kq_bytes<TOP>(ga[j], tw[j], lo, hi);
                ha[h] = dp4a(hi, x.y, dp4a(lo, x.x, ha[h]));
                la[h] = dp4a(hi, x.w, dp4a(lo, x.z, la[h]));
                kq_bytes<TOP>(gb[j], tw[j] >> 8, lo, hi);
                hb[h] = dp4a(hi, x.y, dp4a(lo, x.x, hb[h]));
                lb[h] = dp4a(hi, x.w, dp4a(lo, x.z, lb[h]));
            }
            float2 sa, sb;
            kq_row_scales<Q6>(cur.sw[v], cur.dw[v], sa, sb);
            if (Q6) {
                const int s0 = __float_as_int(r[v].z) * 32, s1 = __float_as_int(r[v].w) * 32;
                va[v] = kqi_q6(sa, ha[0] * 128 + la[0] - s0, ha[1] * 128 + la[1] - s1, r[v]);
                vb[v] = kqi_q6(sb, hb[0] * 128 + lb[0] - s0, hb[1] * 128 + lb[1] - s1, r[v]);
            } else {
                va[v] = kqi_q4(sa, ha[0] * 128 + la[0], r[v]);
                vb[v] = kqi_q4(sb, hb[0] * 128 + lb[0], r[v]);
            }
        }
#pragma unroll
        for (int v = 0; v < V; ++v)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float xa = __shfl_sync(0xffffffffu, va[v], (lane & ~3) | j);
                const float xb = __shfl_sync(0xffffffffu, vb[v], (lane & ~3) | j);
                if (c0 + 4 * v + j < c_end) {
                    acc_a = __fadd_rn(acc_a, xa);
                    acc_b = __fadd_rn(acc_b, xb);
                }
            }
        if (more) cur = next;
    }
    float acc[1][4] = {{acc_a, 0.f, acc_b, 0.f}};  // token 0 sits on lanes t = 0 (c0, c2)
    if (!combine_slices<1>(acc, red)) return;
    kqi_store<1>(acc, (int)tile * 16, 0, bias, res, out, 1, N, flags, qkv, kv, ldo, h0);
}

// One chunk of a 16-row tile against one token tile on int8 MMAs (A = the rows' bytes, x = the
// tokens' xh|xl words, r0, r1 = tokens 2t, 2t + 1's records), each element's value added to `acc`.
// Q6_K: one MMA per half (lanes t < 2 hold k 0 .. 15).
template <bool Q6>
__device__ __forceinline__ void kqi_mma_chunk(float (&acc)[4], const unsigned (&a)[4], uint4 x, float4 r0, float4 r1,
                                              float2 sa, float2 sb) {
    if (Q6) {
        const unsigned k0 = (threadIdx.x & 3) < 2 ? 0xffffffffu : 0u, k1 = ~k0;
        int hi0[4] = {0, 0, 0, 0}, lo0[4] = {0, 0, 0, 0}, hi1[4] = {0, 0, 0, 0}, lo1[4] = {0, 0, 0, 0};
        mma_s8(hi0, a[0] & k0, a[1] & k0, a[2] & k0, a[3] & k0, x.x, x.y);
        mma_s8(lo0, a[0] & k0, a[1] & k0, a[2] & k0, a[3] & k0, x.z, x.w);
        mma_s8(hi1, a[0] & k1, a[1] & k1, a[2] & k1, a[3] & k1, x.x, x.y);
        mma_s8(lo1, a[0] & k1, a[1] & k1, a[2] & k1, a[3] & k1, x.z, x.w);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float4 r = (i & 1) ? r1 : r0;
            const int p0 = hi0[i] * 128 + lo0[i] - __float_as_int(r.z) * 32;
            const int p1 = hi1[i] * 128 + lo1[i] - __float_as_int(r.w) * 32;
            acc[i] = __fadd_rn(acc[i], kqi_q6((i & 2) ? sb : sa, p0, p1, r));
        }
    } else {
        int hi[4] = {0, 0, 0, 0}, lo[4] = {0, 0, 0, 0};
        mma_s8(hi, a[0], a[1], a[2], a[3], x.x, x.y);
        mma_s8(lo, a[0], a[1], a[2], a[3], x.z, x.w);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            acc[i] = __fadd_rn(acc[i], kqi_q4((i & 2) ? sb : sa, hi[i] * 128 + lo[i], (i & 1) ? r1 : r0));
    }
}

// ---- batches (int8 MMA m16n8k32): block = one 16-row tile x TM token tiles of 8, S warps = the K
// slices. A = the tile's chunk (a0, a2: row g's lo, hi words; a1, a3: row g + 8's), B = a token's
// xh (then xl) words of group t, so MMA k 4t + b is k 8t + (0, 4, 1, 5)[b] and 16 + 4t + b is
// 8t + (2, 6, 3, 7)[b] on both sides (kqi_mma_chunk).
template <int U>
struct KqTcBatch {  // a lane's plane words of U chunks (rows g, g + 8; Q6_K's top word) and scale words
    uint2 q[U];
    unsigned tb[U], sw[U];
    uint2 dw[U];
};

// A lane's words of chunks c0 .. c0 + U - 1 of the tile (past `last`: chunk `last`, never added).
template <bool TOP, bool Q6, int U>
__device__ __forceinline__ void kq_tc_load(KqTcBatch<U>& b, const KqPlanes& kq, i64 tile, int C, int c0, int last) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = imin(c0 + u, last);
        const i64 lane_at = (tile * C + c) * 32 + lane;
        b.q[u] = *reinterpret_cast<const uint2*>(kq.nib + lane_at * 8);
        b.tb[u] = TOP ? *reinterpret_cast<const unsigned*>(kq.top + lane_at * 4) : 0u;
        kq_scale_words(kq, Q6, tile, C, c, lane >> 2, b.sw[u], b.dw[u]);
    }
}

// Chunk u of a batch as the MMA's A fragment (a0, a2: row g's lo, hi words; a1, a3: row g + 8's) and
// the rows' scales.
template <bool TOP, bool Q6, int U>
__device__ __forceinline__ void kq_tc_chunk(const KqTcBatch<U>& b, int u, unsigned (&a)[4], float2& sa, float2& sb) {
    kq_bytes<TOP>(b.q[u].x, b.tb[u], a[0], a[2]);
    kq_bytes<TOP>(b.q[u].y, b.tb[u] >> 8, a[1], a[3]);
    kq_row_scales<Q6>(b.sw[u], b.dw[u], sa, sb);
}

// The batch's chunks c0 + u before c_end in order, each handed to mma(u, c, a, sa, sb) as kq_tc_chunk gives it
template <bool TOP, bool Q6, int U, class F>
__device__ __forceinline__ void kq_tc_chunks(const KqTcBatch<U>& b, int c0, int c_end, F&& mma) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = c0 + u;
        if (c >= c_end) break;
        unsigned a[4];
        float2 sa, sb;
        kq_tc_chunk<TOP, Q6>(b, u, a, sa, sb);
        mma(u, c, a, sa, sb);
    }
}

// Chunk c's MMAs for mmq_tc's TM token tiles from m_base, tokens past M read as zeros (xq and xs
// restrict here: read through the lambda that calls this, they would lose their read-only loads)
template <bool Q6, int TM>
__device__ __forceinline__ void mmq_tc_tiles(float (&acc)[TM][4], const unsigned (&a)[4], float2 sa, float2 sb,
                                             const unsigned char* __restrict__ xq, const float4* __restrict__ xs, int M,
                                             int C, int c, int m_base, int g, int t) {
#pragma unroll
    for (int tm = 0; tm < TM; ++tm) {
        const int mg = m_base + tm * 8 + g, m0 = m_base + tm * 8 + 2 * t;
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        const uint4 x = mg < M ? *reinterpret_cast<const uint4*>(xq + ((i64)mg * C + c) * 64 + 16 * t) : zero;
        const float4 fz = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 r0 = m0 < M ? xs[(i64)m0 * C + c] : fz, r1 = m0 + 1 < M ? xs[(i64)(m0 + 1) * C + c] : fz;
        kqi_mma_chunk<Q6>(acc[tm], a, x, r0, r1, sa, sb);
    }
}

template <int WT, int TM, int U>
__device__ __forceinline__ void mmq_tc(const unsigned char* __restrict__ w, const unsigned char* __restrict__ aux,
                                       const unsigned char* __restrict__ xq, const float4* __restrict__ xs,
                                       const float* __restrict__ bias, const float* __restrict__ res,
                                       float* __restrict__ out, int M, int N, int Kp, int flags, const QkvOut& qkv,
                                       int kv, int ldo, int h0, int m_base) {
    extern __shared__ float red[];
    constexpr bool Q6 = WT == WT_Q6K, TOP = WT != WT_Q4K;
    const int S = blockDim.x >> 5, s = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int C = Kp >> 5;
    const i64 tile = blockIdx.x;
    const int c_begin = (int)(((i64)s * C) / S), c_end = (int)(((i64)(s + 1) * C) / S);
    const KqPlanes kq = kq_planes(w, aux, TOP, (N + 15) >> 4, C);

    float acc[TM][4];
#pragma unroll
    for (int i = 0; i < TM; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    // Batches of U chunks, the next batch's weights in flight over this one's MMAs; chunks past the
    // slice load its last (one basic block of loads) and are skipped.
    KqTcBatch<U> cur, next;
    auto load_weights = [&](KqTcBatch<U>& b, int c0) { kq_tc_load<TOP, Q6>(b, kq, tile, C, c0, c_end - 1); };
    if (c_begin < c_end) load_weights(cur, c_begin);
    pdl_start();
    for (int c0 = c_begin; c0 < c_end; c0 += U) {
        const bool more = c0 + U < c_end;
        if (more) load_weights(next, c0 + U);
        kq_tc_chunks<TOP, Q6>(cur, c0, c_end, [&](int, int c, const unsigned (&a)[4], float2 sa, float2 sb) {
            mmq_tc_tiles<Q6, TM>(acc, a, sa, sb, xq, xs, M, C, c, m_base, g, t);
        });
        if (more) cur = next;
    }
    if (!combine_slices<TM>(acc, red)) return;
    kqi_store<TM>(acc, (int)tile * 16, m_base, bias, res, out, M, N, flags, qkv, kv, ldo, h0);
}

// ---- batches of 2-16 rows, R row tiles a warp: block = S warps (the K slices, as mmq_tc) x one group
// of R row tiles. A warp reads a chunk's activation records once and applies them to its R tiles (mmq_tc
// reads them once per tile: at 16 rows 5x the weight bytes, from L2): records of a batch of U chunks
// x the block's tokens reach the warp's own ring in shared memory (cp.async, a batch ahead), the R
// tiles' weights stream to registers a batch ahead. An element's chunks and slices are added as
// mmq_tc adds them (combine_slices over R * TM accumulators), so it has mmq_tc's bits. Tokens past M
// read row M - 1, tiles past N the last (never stored).
#define KQR_STAGES 2
#define KQR_U(R) ((R) == 1 ? 4 : (R) == 2 ? 2 : 1)

template <int N_>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N_));
}

template <int WT, int TM, int R>
__device__ __forceinline__ void mmq_tr(const unsigned char* __restrict__ w, const unsigned char* __restrict__ aux,
                                       const unsigned char* __restrict__ xq, const float4* __restrict__ xs,
                                       const float* __restrict__ bias, const float* __restrict__ res,
                                       float* __restrict__ out, int M, int N, int Kp, int flags, const QkvOut& qkv,
                                       int kv, int ldo, int h0, int m_base) {
    extern __shared__ float red[];  // combine_slices' floats, then each warp's ring (plan.kq_tr_shared)
    constexpr bool Q6 = WT == WT_Q6K, TOP = WT != WT_Q4K;
    constexpr int U = KQR_U(R), BM = 8 * TM, XQ = U * BM * 64, STAGE = U * BM * 80;
    const int S = blockDim.x >> 5, s = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int C = Kp >> 5, tiles = (N + 15) >> 4, tile0 = blockIdx.x * R;
    const int c_begin = (int)(((i64)s * C) / S), c_end = (int)(((i64)(s + 1) * C) / S);
    const KqPlanes kq = kq_planes(w, aux, TOP, tiles, C);
    unsigned char* ring = reinterpret_cast<unsigned char*>(red + (S - 1) * 32 * 4 * R * TM) + s * (KQR_STAGES * STAGE);

    float acc[R * TM][4];
#pragma unroll
    for (int i = 0; i < R * TM; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    KqTcBatch<U> cur[R], next[R];
    auto load_weights = [&](KqTcBatch<U>(&b)[R], int c0) {
#pragma unroll
        for (int r = 0; r < R; ++r) kq_tc_load<TOP, Q6>(b[r], kq, imin(tile0 + r, tiles - 1), C, c0, c_end - 1);
    };
    // A stage: xq pieces [U][BM][4] (16 bytes each), then the records [U][BM]
    auto stage_acts = [&](int st, int c0) {
        unsigned char* q = ring + st * STAGE;
#pragma unroll
        for (int p = lane; p < U * BM * 5; p += 32) {
            const bool rec = p >= U * BM * 4;
            const int e = rec ? p - U * BM * 4 : p >> 2, u = e / BM, tok = e % BM;
            const i64 m = imin(m_base + tok, M - 1), c = imin(c0 + u, c_end - 1);
            if (rec)
                cp_async16(q + XQ + 16 * e, xs + m * C + c, 16);
            else
                cp_async16(q + 64 * e + 16 * (p & 3), xq + (m * C + c) * 64 + 16 * (p & 3), 16);
        }
        cp_async_commit();
    };
    if (c_begin < c_end) load_weights(cur, c_begin);
    pdl_start();
    if (c_begin < c_end) stage_acts(0, c_begin);
    int st = 0;
    for (int c0 = c_begin; c0 < c_end; c0 += U, st ^= 1) {
        const bool more = c0 + U < c_end;
        if (more) {
            stage_acts(st ^ 1, c0 + U);
            load_weights(next, c0 + U);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();  // the stage's copies of every lane
        const unsigned char* q = ring + st * STAGE;
        const float4* rs = reinterpret_cast<const float4*>(q + XQ);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u >= c_end) break;
            uint4 x[TM];
            float4 r0[TM], r1[TM];
#pragma unroll
            for (int tm = 0; tm < TM; ++tm) {
                x[tm] = *reinterpret_cast<const uint4*>(q + (u * BM + tm * 8 + g) * 64 + 16 * t);
                r0[tm] = rs[u * BM + tm * 8 + 2 * t];
                r1[tm] = rs[u * BM + tm * 8 + 2 * t + 1];
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                unsigned a[4];
                float2 sa, sb;
                kq_tc_chunk<TOP, Q6>(cur[r], u, a, sa, sb);
#pragma unroll
                for (int tm = 0; tm < TM; ++tm) kqi_mma_chunk<Q6>(acc[r * TM + tm], a, x[tm], r0[tm], r1[tm], sa, sb);
            }
        }
        __syncwarp();  // every lane's reads of the stage, before the next batch's copies overwrite it
        if (more) {
#pragma unroll
            for (int r = 0; r < R; ++r) cur[r] = next[r];
        }
    }
    if (!combine_slices<R * TM>(acc, red)) return;
#pragma unroll
    for (int r = 0; r < R; ++r)
        if (tile0 + r < tiles)
            kqi_store<TM>(*reinterpret_cast<const float(*)[TM][4]>(acc[r * TM]), (tile0 + r) * 16, m_base, bias, res,
                          out, M, N, flags, qkv, kv, ldo, h0);
}

// ---- batches, tiled: block = ROWS row tiles (KQT_ROWS; warp % ROWS) x 2 token groups of TN token tiles
// (warp >> 2); no K slices among warps: a warp walks its K and closes plan.split_k's S slices as
// mmq_one and mmq_tc do (a slice's chunks summed from 0 in order; slices added in order: p0, then
// total + p1, ...), so an element gets their bits. Grid z = 1: a block walks all of K; z = S: block
// z takes slice z, writes it to `part` and the last of a tile's S blocks (the counter `count`, left
// at 0) adds the S slices in order and stores. The activation records of KQT_BK chunks x the block's
// tokens are staged in shared memory (cp.async, two stages), read by every row-tile warp; a warp's
// weights stream to registers a stage ahead. Tokens past M read row M - 1 (never stored).
#define KQT_BK 4
#define KQT_ROWS 4
#define KQT_THREADS (64 * KQT_ROWS)

template <int WT, int TN, int ROWS>
__device__ __forceinline__ void mmq_tile(const unsigned char* __restrict__ w, const unsigned char* __restrict__ aux,
                                         const unsigned char* __restrict__ xq, const float4* __restrict__ xs,
                                         const float* __restrict__ bias, const float* __restrict__ res,
                                         float* __restrict__ out, int M, int N, int Kp, int flags, const QkvOut& qkv,
                                         int kv, int ldo, int h0, float* __restrict__ part,
                                         int* __restrict__ count, int S) {
    constexpr bool Q6 = WT == WT_Q6K, TOP = WT != WT_Q4K;
    constexpr int BM = 16 * TN;  // the block's tokens
    // A token's 16-byte pieces j sit at j ^ 4 on odd tokens (tokens g, g + 1 of a warp's read in
    // distinct banks); xs rows padded to 80 bytes (tokens 2t: distinct banks).
    __shared__ __align__(16) unsigned char xq_s[2][BM][KQT_BK * 64];
    __shared__ __align__(16) float4 xs_s[2][BM][KQT_BK + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int C = Kp >> 5, tiles = (N + 15) >> 4, m_block = blockIdx.y * BM;
    const int tile_at = blockIdx.x * ROWS + warp % ROWS;
    const i64 tile = tile_at < tiles ? tile_at : tiles - 1;
    const int tok0 = (warp / ROWS) * 8 * TN;  // the warp's first token in the block
    const int SZ = gridDim.z, z = blockIdx.z, first = SZ > 1 ? z : 0;  // the block's first slice
    const int c_first = SZ > 1 ? (int)((i64)z * C / S) : 0, c_last = SZ > 1 ? (int)((i64)(z + 1) * C / S) : C;
    const KqPlanes kq = kq_planes(w, aux, TOP, tiles, C);

    // A stage: each token's KQT_BK records (contiguous in xq and xs), 16 bytes a copy.
    auto stage_acts = [&](int st, int c0) {
        constexpr int NQ = BM * KQT_BK * 4, NS = BM * KQT_BK;
        for (int p = threadIdx.x; p < NQ + NS; p += 64 * ROWS) {
            const int q = p < NQ ? p : p - NQ, per = p < NQ ? 4 * KQT_BK : KQT_BK;
            const int tok = q / per, j = q % per, cc = p < NQ ? j >> 2 : j;
            const i64 m = imin(m_block + tok, M - 1), c = imin(c0 + cc, C - 1);
            if (p < NQ)
                cp_async16(&xq_s[st][tok][16 * (j ^ ((tok & 1) << 2))], xq + (m * C + c) * 64 + 16 * (j & 3), 16);
            else
                cp_async16(&xs_s[st][tok][j], xs + m * C + c, 16);
        }
        cp_async_commit();
    };
    KqTcBatch<KQT_BK> cur, next;
    auto load_weights = [&](KqTcBatch<KQT_BK>& b, int c0) { kq_tc_load<TOP, Q6>(b, kq, tile, C, c0, C - 1); };
    load_weights(cur, c_first);
    pdl_start();
    stage_acts(0, c_first);

    float acc[TN][4], total[TN][4];
#pragma unroll
    for (int i = 0; i < TN; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = total[i][j] = 0.f;
    int slice = first, bound = (int)(((i64)(first + 1) * C) / S);  // the chunk that ends slice `slice`
    const int stages = (c_last - c_first + KQT_BK - 1) / KQT_BK;
    for (int it = 0; it < stages; ++it) {
        const int c0 = c_first + it * KQT_BK, st = it & 1;
        const bool more = it + 1 < stages;
        if (more) {
            stage_acts(st ^ 1, c0 + KQT_BK);
            load_weights(next, c0 + KQT_BK);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        kq_tc_chunks<TOP, Q6>(cur, c0, c_last, [&](int u, int c, const unsigned (&a)[4], float2 sa, float2 sb) {
#pragma unroll
            for (int tm = 0; tm < TN; ++tm) {
                const int tb = tok0 + tm * 8;
                const int piece = (4 * u + t) ^ ((g & 1) << 2);
                const uint4 x = *reinterpret_cast<const uint4*>(&xq_s[st][tb + g][16 * piece]);
                const float4 r0 = xs_s[st][tb + 2 * t][u], r1 = xs_s[st][tb + 2 * t + 1][u];
                kqi_mma_chunk<Q6>(acc[tm], a, x, r0, r1, sa, sb);
            }
            if (c + 1 == bound) {  // the slice ends: as combine_slices adds it
#pragma unroll
                for (int tm = 0; tm < TN; ++tm)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        total[tm][i] = slice == first ? acc[tm][i] : __fadd_rn(total[tm][i], acc[tm][i]);
                        acc[tm][i] = 0.f;
                    }
                ++slice;
                bound = (int)(((i64)(slice + 1) * C) / S);
            }
        });
        __syncthreads();  // the next stage's copies overwrite this one
        if (more) cur = next;
    }
    if (SZ > 1) {  // slice z to part[z][m][n]; the tile's last block adds p0 + p1 + ... in order
        __shared__ int last;
        const i64 np = (i64)gridDim.x * ROWS * 16, plane = (i64)gridDim.y * BM * np;
        const int n = tile_at * 16 + g, m = m_block + tok0 + 2 * t;
#pragma unroll
        for (int tm = 0; tm < TN; ++tm)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                part[z * plane + (i64)(m + tm * 8 + (i & 1)) * np + n + ((i & 2) ? 8 : 0)] = total[tm][i];
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            const int id = blockIdx.y * gridDim.x + blockIdx.x;
            last = atomicAdd(count + id, 1) == SZ - 1;
            if (last) count[id] = 0;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
#pragma unroll
        for (int tm = 0; tm < TN; ++tm)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const i64 at = (i64)(m + tm * 8 + (i & 1)) * np + n + ((i & 2) ? 8 : 0);
                float sum = 0.f;
                for (int p = 0; p < SZ; ++p) {
                    const float v = p == z ? total[tm][i] : __ldcg(part + p * plane + at);
                    sum = p == 0 ? v : __fadd_rn(sum, v);
                }
                total[tm][i] = sum;
            }
    }
    if (tile_at < tiles)
        kqi_store<TN>(total, tile_at * 16, m_block + tok0, bias, res, out, M, N, flags, qkv, kv, ldo, h0);
}

// Block size 32 * S (plan.split_k, at most plan.KQ_MAX_SPLIT warps; 8 at TM = 8); U chunks a batch.
#define KQI_THREADS(TM) ((TM) > 4 ? 256 : 512)
#ifndef KQI_U_TM12
#define KQI_U_TM12 4
#endif
#define KQI_U(TM) ((TM) <= 2 ? KQI_U_TM12 : (TM) == 4 ? 2 : 1)
#define KQI_ARGS                                                                                             \
    const unsigned char *w, const unsigned char *aux, const unsigned char *xq, const float4 *xs, const float *bias, \
        const float *res, float *out, int M, int N, int Kp, int flags, void *kc, void *vc, const int *positions, \
        const i64 *slots, const float *cos_t, const float *sin_t, int H, int Hkv, int D, int kv, int ldo, int h0
#define KQI_QKV QkvOut{out, kc, vc, positions, slots, cos_t, sin_t, H, Hkv, D}

#define MMQ_ONE(NAME, WT)                                                                                    \
    extern "C" __global__ void __launch_bounds__(512, 1) NAME(KQI_ARGS) {                                    \
        mmq_one<WT>(w, aux, xq, xs, bias, res, out, N, Kp, flags, KQI_QKV, kv, ldo, h0);                     \
    }
#define MMQ_TC(NAME, WT, TM)                                                                                 \
    extern "C" __global__ void __launch_bounds__(KQI_THREADS(TM), 1) NAME(KQI_ARGS) {                        \
        mmq_tc<WT, TM, KQI_U(TM)>(w, aux, xq, xs, bias, res, out, M, N, Kp, flags, KQI_QKV, kv, ldo, h0,    \
                       blockIdx.y * (8 * TM));                                                                \
    }
#define MMQ_TR(NAME, WT, TM, R)                                                                              \
    extern "C" __global__ void __launch_bounds__(512, 1) NAME(KQI_ARGS) {                                    \
        mmq_tr<WT, TM, R>(w, aux, xq, xs, bias, res, out, M, N, Kp, flags, KQI_QKV, kv, ldo, h0, blockIdx.y * (8 * TM)); \
    }
#define MMQ_TILE(NAME, WT, TN)                                                                               \
    extern "C" __global__ void __launch_bounds__(KQT_THREADS, 2) NAME(KQI_ARGS, float* part, int* count, int S) { \
        mmq_tile<WT, TN, KQT_ROWS>(w, aux, xq, xs, bias, res, out, M, N, Kp, flags, KQI_QKV, kv, ldo, h0, part, count, \
                                   S);                                                                        \
    }
// 8 row tiles a block (one block an SM): every stage's activation records serve twice the rows
// (plan.KQ_TILE8; bench/kquant_mm.py times them against the 4-row blocks)
#define MMQ_TILE8(NAME, WT, TN)                                                                              \
    extern "C" __global__ void __launch_bounds__(512, 1) NAME(KQI_ARGS, float* part, int* count, int S) {     \
        mmq_tile<WT, TN, 8>(w, aux, xq, xs, bias, res, out, M, N, Kp, flags, KQI_QKV, kv, ldo, h0, part, count, S); \
    }
#define MMQ_SET(T, WT)         \
    MMQ_ONE(mmq_##T##_one, WT) \
    MMQ_TILE(mmq_##T##_tile1, WT, 1) \
    MMQ_TILE(mmq_##T##_tile2, WT, 2) \
    MMQ_TILE(mmq_##T##_tile4, WT, 4) \
    MMQ_TC(mmq_##T##_tm1, WT, 1) \
    MMQ_TC(mmq_##T##_tm2, WT, 2) \
    MMQ_TC(mmq_##T##_tm4, WT, 4) \
    MMQ_TC(mmq_##T##_tm8, WT, 8) \
    MMQ_TR(mmq_##T##_tr1_tm1, WT, 1, 1) \
    MMQ_TR(mmq_##T##_tr2_tm1, WT, 1, 2) \
    MMQ_TR(mmq_##T##_tr4_tm1, WT, 1, 4) \
    MMQ_TR(mmq_##T##_tr1_tm2, WT, 2, 1) \
    MMQ_TR(mmq_##T##_tr2_tm2, WT, 2, 2) \
    MMQ_TR(mmq_##T##_tr4_tm2, WT, 2, 4)

MMQ_SET(q4k, WT_Q4K)
MMQ_SET(q5k, WT_Q5K)
MMQ_SET(q6k, WT_Q6K)
MMQ_TILE8(mmq_q4k_tile4r8, WT_Q4K, 4)
MMQ_TILE8(mmq_q5k_tile4r8, WT_Q5K, 4)
MMQ_TILE8(mmq_q6k_tile4r8, WT_Q6K, 4)
