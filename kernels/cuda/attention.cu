// Paged attention, one arithmetic for prefill and decode rows.
//
// Row r at position p attends to keys 0..p of its sequence. Keys are cut at page boundaries into
// chunks in logical order (chunk c = logical page c of the sequence, found through the block
// table, so where the page sits physically cannot matter). `attn_partial` reduces one chunk for
// one row and a group of query heads sharing a KV head, always the same way:
//   scores   thread j takes key j, dot product over d ascending (fmaf), q pre-scaled;
//   max      exact, any order;
//   weights  expf(s - max), exact zero for keys past p;
//   sum      warp butterfly, then warps in index order;
//   values   thread (d, part) sums keys part*D .. part*D+D-1 ascending; parts added in order.
// It writes (o, m, l) of the chunk to `part`. The chunks of a row are then folded in ascending
// order with merge_coeffs/merge_add from common.cuh (merge_row): by the last of a row's blocks to
// finish when `merge_here` (one launch), else by `attn_merge`. Which block computes which
// chunk (blockIdx.z strides by gridDim.z) and which block merges change no bits: every chunk's
// partial is stored as is and the merge order is fixed.
//
// Compiled once per (HEAD_DIM, GROUP_MAX, KV_T, V_STAGE) through -D options. Where a chunk's values fit
// (V_STAGE), they are copied into shared memory while the scores are computed; the value pass then
// reads them there, in the same order.
#include "common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef GROUP_MAX
#define GROUP_MAX 4
#endif
#ifndef KV_T
#define KV_T 1
#endif

#define D HEAD_DIM
#define GM GROUP_MAX
#define PARTS (PAGE / D)  // key ranges of the value pass
#define VBATCH (GM > 4 ? 16 : 32)  // value loads issued before their FMAs (latency, not order)
#define KV_BYTES (KV_T == 0 ? 4 : 2)
#ifndef V_STAGE
#define V_STAGE 0  // 1: values staged in PAGE * D * KV_BYTES of dynamic shared memory (plan.attention_smem)
#endif

#if KV_T == 0
typedef F32 KV;
#elif KV_T == 1
typedef F16 KV;
#else
typedef BF16 KV;
#endif
typedef KV::T kv_t;

// 8 consecutive cache values as floats (16-byte loads for 16-bit caches).
__device__ __forceinline__ void load8(const kv_t* __restrict__ p, float (&v)[8]) {
#if KV_T == 0
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
#else
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    KV::pair(q.x, v[0], v[1]);
    KV::pair(q.y, v[2], v[3]);
    KV::pair(q.z, v[4], v[5]);
    KV::pair(q.w, v[6], v[7]);
#endif
}

// Output element d of query head qh of row r from its chunks 0..last. Partials are read through L2
// (ld.cg): other blocks of this launch wrote them.
__device__ __forceinline__ float merge_row(const float* __restrict__ part, int r, int qh, int d, int last,
                                           int n_heads, int W) {
    const float* base = part + ((i64)r * n_heads + qh) * W * (D + 2);
    float m = __ldcg(base + D), l = __ldcg(base + D + 1), acc = __ldcg(base + d);
#pragma unroll 4
    for (int c = 1; c <= last; ++c) {
        const float* pc = base + (i64)c * (D + 2);
        float a, b, m_new;
        merge_coeffs(m, __ldcg(pc + D), a, b, m_new);
        l = merge_add(l, a, __ldcg(pc + D + 1), b);
        acc = merge_add(acc, a, __ldcg(pc + d), b);
        m = m_new;
    }
    return __fdiv_rn(acc, l);
}

extern "C" __global__ void __launch_bounds__(PAGE)
attn_partial(const float* __restrict__ q, const kv_t* __restrict__ kc, const kv_t* __restrict__ vc,
             const int* __restrict__ positions, const int* __restrict__ seq, const int* __restrict__ tables,
             float* __restrict__ part, int n_heads, int n_kv, int W, float scale, int merge_here,
             int* __restrict__ counters, float* __restrict__ out) {
    pdl_start();
    __shared__ float qs[GM][D];
    __shared__ float sc[GM][PAGE];
    __shared__ float ob[PARTS][GM][D];
    __shared__ float red_max[PAGE / 32][GM];
    __shared__ float red_sum[PAGE / 32][GM];
#if V_STAGE
    extern __shared__ __align__(16) unsigned char v_staged[];  // [n][D]: a chunk's values of this KV head
#endif

    const int r = blockIdx.x;
    const int G = n_heads / n_kv;
    const int sgs = (G + GM - 1) / GM;
    const int h = blockIdx.y / sgs, g0 = (blockIdx.y % sgs) * GM;
    const int ng = imin(GM, G - g0);
    const int p = positions[r], last = p / PAGE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int* table = tables + (i64)seq[r] * W;
    const i64 cell_stride = (i64)n_kv * D;

    for (int i = tid; i < GM * D; i += PAGE) {
        const int g = i / D, d = i % D;
        qs[g][d] = g < ng ? __fmul_rn(q[((i64)r * n_heads + h * G + g0 + g) * D + d], scale) : 0.f;
    }
    __syncthreads();

    for (int c = blockIdx.z; c <= last; c += gridDim.z) {
        const i64 page = table[c];
        const int n = c < last ? PAGE : p % PAGE + 1;
        const kv_t* kpage = kc + page * PAGE * cell_stride + (i64)h * D;
        const kv_t* vpage = vc + page * PAGE * cell_stride + (i64)h * D;
#if V_STAGE
        constexpr int SEGS = D * KV_BYTES / 16;
        for (int i = tid; i < n * SEGS; i += PAGE) {
            const int j = i / SEGS, seg = i % SEGS;
            cp_async16(v_staged + (j * SEGS + seg) * 16,
                       reinterpret_cast<const unsigned char*>(vpage + j * cell_stride) + seg * 16, 16);
        }
        cp_async_commit();
        const kv_t* vsrc = reinterpret_cast<const kv_t*>(v_staged);
        const i64 vstride = D;
#else
        const kv_t* vsrc = vpage;
        const i64 vstride = cell_stride;
#endif

        float s[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) s[g] = 0.f;
        if (tid < n) {
            const kv_t* kr = kpage + tid * cell_stride;
#pragma unroll
            for (int d0 = 0; d0 < D; d0 += 8) {
                float kv[8];
                load8(kr + d0, kv);
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int g = 0; g < GM; ++g) s[g] = __fmaf_rn(qs[g][d0 + i], kv[i], s[g]);
            }
        }
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            const float v = warp_max(tid < n ? s[g] : NEG_INF);
            if (lane == 0) red_max[warp][g] = v;
        }
        __syncthreads();
        float m[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            m[g] = red_max[0][g];
            for (int w = 1; w < PAGE / 32; ++w) m[g] = fmaxf(m[g], red_max[w][g]);
        }
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            const float e = tid < n ? expf(__fsub_rn(s[g], m[g])) : 0.f;
            sc[g][tid] = e;
            const float w = warp_sum(e);
            if (lane == 0) red_sum[warp][g] = w;
        }
#if V_STAGE
        cp_async_wait_all();  // this thread's copies; the barrier then makes everyone's visible
#endif
        __syncthreads();
        float l[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            l[g] = red_sum[0][g];
            for (int w = 1; w < PAGE / 32; ++w) l[g] = __fadd_rn(l[g], red_sum[w][g]);
        }

        const int d = tid % D, pt = tid / D;
        float acc[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) acc[g] = 0.f;
        const int j1 = imin(n, pt * D + D);
        const kv_t* vcol = vsrc + d;
        int j = pt * D;
        for (; j + VBATCH <= j1; j += VBATCH) {  // VBATCH loads in flight, then the same ascending FMA chain
            float v[VBATCH];
#pragma unroll
            for (int u = 0; u < VBATCH; ++u) v[u] = KV::load(vcol, (i64)(j + u) * vstride);
#pragma unroll
            for (int u = 0; u < VBATCH; ++u)
#pragma unroll
                for (int g = 0; g < GM; ++g) acc[g] = __fmaf_rn(sc[g][j + u], v[u], acc[g]);
        }
        for (; j < j1; ++j) {
            const float v = KV::load(vcol, (i64)j * vstride);
#pragma unroll
            for (int g = 0; g < GM; ++g) acc[g] = __fmaf_rn(sc[g][j], v, acc[g]);
        }
#pragma unroll
        for (int g = 0; g < GM; ++g) ob[pt][g][d] = acc[g];
        __syncthreads();
        if (tid < D) {
            for (int g = 0; g < ng; ++g) {
                float o = ob[0][g][d];
                for (int k = 1; k < PARTS; ++k) o = __fadd_rn(o, ob[k][g][d]);
                float* dst = part + (((i64)r * n_heads + h * G + g0 + g) * W + c) * (D + 2);
                dst[d] = o;
                if (d == 0) {
                    dst[D] = m[g];
                    dst[D + 1] = l[g];
                }
            }
        }
        __syncthreads();  // sc, ob and the reduction slots are reused by the next chunk
    }
    if (!merge_here) return;

    // The last block of (row, head group) to finish merges; it leaves the counter at zero for the
    // next launch (counters start zeroed and every launch returns them so).
    __shared__ int merging;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int* cnt = counters + (i64)r * gridDim.y + blockIdx.y;
        merging = atomicAdd(cnt, 1) == (int)gridDim.z - 1;
        if (merging) *cnt = 0;
    }
    __syncthreads();
    if (!merging) return;
    __threadfence();
    for (int i = tid; i < ng * D; i += PAGE) {
        const int g = i / D, d = i % D, qh = h * G + g0 + g;
        out[((i64)r * n_heads + qh) * D + d] = merge_row(part, r, qh, d, last, n_heads, W);
    }
}

// Folds a row's chunk partials in ascending order; one block per (row, query head), D threads.
extern "C" __global__ void __launch_bounds__(D)
attn_merge(const float* __restrict__ part, const int* __restrict__ positions, float* __restrict__ out,
           int n_heads, int W) {
    pdl_start();
    const int r = blockIdx.x, qh = blockIdx.y, d = threadIdx.x;
    out[((i64)r * n_heads + qh) * D + d] = merge_row(part, r, qh, d, positions[r] / PAGE, n_heads, W);
}
