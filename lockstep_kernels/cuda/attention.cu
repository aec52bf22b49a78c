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
//   values   thread (dg, part) takes dims 8 dg .. 8 dg + 7 and keys part * KP .. part * KP + KP - 1
//            (KP = D / 8), summed ascending (fmaf); the parts of a warp meet in an xor butterfly,
//            then the warps are added in index order.
// It writes (o, m, l) of the chunk to `part`. The chunks of a row are then folded in ascending
// order with merge_coeffs/merge_add from common.cuh (merge_chunks): by the last of a row's blocks to
// finish when `merge_here` (one launch), else by `attn_merge`. Which block computes which
// chunk (blockIdx.z strides by gridDim.z) and which block merges change no bits: every chunk's
// partial is stored as is and the merge order is fixed.
//
// Loads are issued as early as they may be: a block's first chunk's keys before pdl_start (a
// captured step launches this kernel while the KV write before it runs; the cells that write
// touches, a row's own and those of the rows before it in its sequence, are loaded after the wait,
// never before), its values right after the wait, so that both arrive while the scores are computed. Compiled per (HEAD_DIM, GROUP_MAX,
// KV_T) and register budget (MIN_BLOCKS, K_EARLY_OK, VBATCH, V_LATE: which loads are in flight when,
// never the arithmetic) through -D options.
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
#define KV_BYTES (KV_T == 0 ? 4 : 2)
#define NDG (D / 8)                    // dim groups of the value pass
#define KP NDG                         // keys per part: PAGE / (PAGE / NDG)
#define PER_U (16 / KV_BYTES)          // cache values per 16-byte load
#define KU (D / PER_U)                 // 16-byte loads per key row
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1  // blocks per SM the registers must allow (plan.attention_launch's build)
#endif
#ifndef K_EARLY_OK
#define K_EARLY_OK 1
#endif
#ifndef OUT16
#define OUT16 0  // the output as floats (0) or as the o projection's 16-bit MMA values: 1 f16, 2 bf16
#endif
#ifndef VBATCH
#define VBATCH 16  // 16-byte value loads in flight per thread
#endif
#ifndef V_LATE
#define V_LATE 0  // the first value batch issued after the scores (the key registers free again), not before
#endif
#define K_EARLY (K_EARLY_OK && KU <= 16)  // the key row kept in registers, loaded before the wait
#define K_REG (K_EARLY || (V_LATE && KU <= 16))  // the key row loaded whole into registers before the scores
#define VU (8 / PER_U)                 // 16-byte loads per 8 values
#define VB (KP * VU <= VBATCH ? KP : VBATCH / VU)  // keys per batch of value loads
#define GB (GM * D * 8 <= 4096 ? GM : (4096 / (8 * D) > 0 ? 4096 / (8 * D) : 1))  // heads per fold of ob

#if KV_T == 0
typedef F32 KV;
#elif KV_T == 1
typedef F16 KV;
#else
typedef BF16 KV;
#endif
typedef KV::T kv_t;

// The cache values of one 16-byte load as floats (PER_U of them).
__device__ __forceinline__ void unpack(const uint4& u, float (&v)[PER_U]) {
#if KV_T == 0
    v[0] = __uint_as_float(u.x); v[1] = __uint_as_float(u.y); v[2] = __uint_as_float(u.z); v[3] = __uint_as_float(u.w);
#else
    KV::pair(u.x, v[0], v[1]);
    KV::pair(u.y, v[2], v[3]);
    KV::pair(u.z, v[4], v[5]);
    KV::pair(u.w, v[6], v[7]);
#endif
}

struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
    __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};

// Each head's value over the block's PAGE threads: a warp's xor butterfly (warp_max / warp_sum's),
// then the warps in index order, into every thread's v. Contains a barrier.
template <class Op>
__device__ __forceinline__ void block_fold(float (&v)[GM], float (&red)[PAGE / 32][GM], Op op) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        float x = v[g];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, off));
        if (lane == 0) red[warp][g] = x;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        v[g] = red[0][g];
        for (int w = 1; w < PAGE / 32; ++w) v[g] = op(v[g], red[w][g]);
    }
}

// Cache cells through L2 only (ld.global.cg): a line an SM's L1 held from before the wait (or from
// an earlier step) can never stand in for a cell written since.
__device__ __forceinline__ uint4 ld16(const kv_t* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

extern "C" __global__ void __launch_bounds__(PAGE, MIN_BLOCKS)
attn_partial(const float* __restrict__ q, const kv_t* __restrict__ kc, const kv_t* __restrict__ vc,
             const int* __restrict__ positions, const int* __restrict__ seq, const int* __restrict__ tables,
             const i64* __restrict__ slots, float* __restrict__ part, int n_heads, int n_kv, int W, float scale,
             int merge_here, int* __restrict__ counters, float* __restrict__ out) {
    __shared__ float qs[GM][D];
    __shared__ float sc[GM][PAGE];
    __shared__ float ob[PAGE / 32][GB][D];
    __shared__ float red_max[PAGE / 32][GM];
    __shared__ float red_sum[PAGE / 32][GM];
    __shared__ float ml[GM][2];  // the chunk's max and sum per head, for the partial's tail

    const int r = blockIdx.x;
    const int G = n_heads / n_kv;
    const int sgs = (G + GM - 1) / GM;
    const int h = blockIdx.y / sgs, g0 = (blockIdx.y % sgs) * GM;
    const int ng = imin(GM, G - g0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int dg = tid % NDG, pt = tid / NDG;
    const i64 cell_stride = (i64)n_kv * D;
    // Step inputs (positions, tables) are copied in before a captured step's first kernel runs.
    const int p = positions[r], last = p / PAGE;
    const int* table = tables + (i64)seq[r] * W;
    // A decode graph sizes gridDim.z for the longest context a sequence may reach, so a short row's
    // blocks past its last chunk have nothing to do: they leave at once and the merge counts the
    // others (positions are step inputs, readable before the wait).
    if ((int)blockIdx.z > last) return;

    auto key_row = [&](int c) { return kc + (i64)table[c] * PAGE * cell_stride + (i64)h * D + tid * cell_stride; };
    uint4 kr[K_REG ? KU : 1];
    // Before the wait only cells that existed before this step: the kernel before this one may
    // still be writing this step's cells, the row's own (p) and, in a verify or prompt step, those
    // of the rows before it in its sequence (consecutive rows whose slots are this table's cells
    // first-1, first-2, ...). Later row slices start after the first has waited.
    int first = p;
    if (K_EARLY)
        for (int j = r - 1; j >= 0 && positions[j] == first - 1 &&
                            slots[j] == (i64)table[(first - 1) / PAGE] * PAGE + (first - 1) % PAGE; --j)
            --first;
    const int early = first - blockIdx.z * PAGE;  // cells of chunk blockIdx.z loaded before the wait
    if (K_EARLY && blockIdx.z <= last && tid < early) {
        const kv_t* k = key_row(blockIdx.z);
#pragma unroll
        for (int u = 0; u < (K_REG ? KU : 1); ++u) kr[u] = ld16(k + u * PER_U);
    }
    pdl_start();

    for (int i = tid; i < GM * D; i += PAGE) {
        const int g = i / D, d = i % D;
        qs[g][d] = g < ng ? __fmul_rn(q[((i64)r * n_heads + h * G + g0 + g) * D + d], scale) : 0.f;
    }

    for (int c = blockIdx.z; c <= last; c += gridDim.z) {
        const int n = c < last ? PAGE : p % PAGE + 1;
        const kv_t* vpage = vc + (i64)table[c] * PAGE * cell_stride + (i64)h * D + dg * 8;
        const kv_t* krow = key_row(c);
        // a later chunk or this step's cells (K_EARLY), else the whole row (every thread: cells past n
        // are the page's own memory, loaded and never used)
        if (K_REG && (!K_EARLY || c != blockIdx.z || (tid >= early && tid < n))) {
#pragma unroll
            for (int u = 0; u < (K_REG ? KU : 1); ++u) kr[u] = ld16(krow + u * PER_U);
        }
        uint4 vr[VB][VU];
        auto first_values = [&] {
#pragma unroll
            for (int b = 0; b < VB; ++b)
#pragma unroll
                for (int u = 0; u < VU; ++u) vr[b][u] = ld16(vpage + (pt * KP + b) * cell_stride + u * PER_U);
        };
        if (!V_LATE) first_values();
        __syncthreads();  // qs written; sc, ob and the reduction slots free again

        float s[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) s[g] = 0.f;
        if (tid < n) {
#pragma unroll
            for (int u = 0; u < KU; ++u) {
                float kv[PER_U];
                unpack(K_REG ? kr[K_REG ? u : 0] : ld16(krow + u * PER_U), kv);
#pragma unroll
                for (int i = 0; i < PER_U; ++i)
#pragma unroll
                    for (int g = 0; g < GM; ++g) s[g] = __fmaf_rn(qs[g][u * PER_U + i], kv[i], s[g]);
            }
        }
        if (V_LATE) first_values();
        float m[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) m[g] = tid < n ? s[g] : NEG_INF;
        block_fold(m, red_max, MaxOp());
        float l[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            l[g] = tid < n ? expf(__fsub_rn(s[g], m[g])) : 0.f;
            sc[g][tid] = l[g];
        }
        block_fold(l, red_sum, SumOp());
        if (tid == 0)
#pragma unroll
            for (int g = 0; g < GM; ++g) ml[g][0] = m[g], ml[g][1] = l[g];

        float acc[GM][8];
        zero_regs(acc);
#pragma unroll
        for (int b0 = 0; b0 < KP; b0 += VB) {
#pragma unroll
            for (int b = 0; b < VB; ++b) {
                const int j = pt * KP + b0 + b;
                float v[8];
#pragma unroll
                for (int u = 0; u < VU; ++u) {
                    float t[PER_U];
                    unpack(vr[b][u], t);
#pragma unroll
                    for (int i = 0; i < PER_U; ++i) v[u * PER_U + i] = t[i];
                }
                if (b0 + VB < KP)  // the register is free: the next batch's value for it goes out now
#pragma unroll
                    for (int u = 0; u < VU; ++u) vr[b][u] = ld16(vpage + (j + VB) * cell_stride + u * PER_U);
                if (j < n) {
#pragma unroll
                    for (int g = 0; g < GM; ++g) {
                        const float e = sc[g][j];
#pragma unroll
                        for (int i = 0; i < 8; ++i) acc[g][i] = __fmaf_rn(e, v[i], acc[g][i]);
                    }
                }
            }
        }
        // the parts of a warp: xor butterfly over the lanes that share dg
#pragma unroll
        for (int off = NDG; off < 32; off <<= 1)
#pragma unroll
            for (int g = 0; g < GM; ++g)
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] = __fadd_rn(acc[g][i], __shfl_xor_sync(0xffffffffu, acc[g][i], off));
        // then the warps in order, GB heads at a time
#pragma unroll
        for (int gb = 0; gb < GM; gb += GB) {
            if (lane < NDG) {
#pragma unroll
                for (int g = 0; g < GB; ++g)
#pragma unroll
                    for (int i = 0; i < 8; ++i) ob[warp][g][dg * 8 + i] = acc[gb + g][i];
            }
            __syncthreads();
            for (int idx = tid; idx < GB * D; idx += PAGE) {
                const int g = idx / D, d = idx % D;
                if (gb + g >= ng) continue;
                float o = ob[0][g][d];
                for (int w = 1; w < PAGE / 32; ++w) o = __fadd_rn(o, ob[w][g][d]);
                float* dst = part + (((i64)r * n_heads + h * G + g0 + gb + g) * W + c) * (D + 2);
                dst[d] = o;
                if (d == 0) {
                    dst[D] = ml[gb + g][0];
                    dst[D + 1] = ml[gb + g][1];
                }
            }
            __syncthreads();
        }
    }
    if (!merge_here) return;

    // The last block of (row, head group) to finish merges; it leaves the counter at zero for the
    // next launch (counters start zeroed and every launch returns them so).
    __shared__ int merging;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int* cnt = counters + (i64)r * gridDim.y + blockIdx.y;
        merging = atomicAdd(cnt, 1) == imin((int)gridDim.z, last + 1) - 1;
        if (merging) *cnt = 0;
    }
    __syncthreads();
    if (!merging) return;
    __threadfence();
    for (int i = tid; i < ng * D; i += PAGE) {
        const int g = i / D, d = i % D, qh = h * G + g0 + g;
        store_attn<OUT16>(out, ((i64)r * n_heads + qh) * D + d, merge_chunks<D, 8>(part, r, qh, d, last, n_heads, W));
    }
}

// Folds a row's chunk partials in ascending order; one block per (row, query head), D threads: the
// arithmetic of merge_chunks, with the fold's coefficients first computed for MT chunks at once (the
// running max before chunk c is the max of chunks 0..c-1, exact in any order: a scan) and each thread's
// values loaded MB chunks ahead, so the serial chain is two multiplies and an add a chunk.
#define MT 256
#define MB 32
#ifndef MERGE_SCAN
#define MERGE_SCAN 1  // 0: each thread's running max over chunks 0..i by a loop (plan.MERGE_SCAN; the same values)
#endif
extern "C" __global__ void __launch_bounds__(D)
attn_merge(const float* __restrict__ part, const int* __restrict__ positions, float* __restrict__ out,
           int n_heads, int W) {
    pdl_start();
    __shared__ float sm[MT], sl[MT], sa[MT], sb[MT];
#if MERGE_SCAN
    __shared__ float px[MT];
#endif
    const int r = blockIdx.x, qh = blockIdx.y, d = threadIdx.x;
    const int last = positions[r] / PAGE;
    const float* base = part + ((i64)r * n_heads + qh) * W * (D + 2);
    float m = __ldcg(base + D), l = __ldcg(base + D + 1), acc = __ldcg(base + d);
    for (int t0 = 1; t0 <= last; t0 += MT) {
        const int n = imin(MT, last + 1 - t0);
        for (int i = d; i < n; i += D) {
            const float* pc = base + (i64)(t0 + i) * (D + 2);
            sm[i] = __ldcg(pc + D);
            sl[i] = __ldcg(pc + D + 1);
        }
        float nv[MB];
        auto fetch = [&](int i0) {  // chunks t0 + i0 .. + MB - 1, those past the tile as its last
#pragma unroll
            for (int k = 0; k < MB; ++k) nv[k] = __ldcg(base + (i64)(t0 + imin(i0 + k, n - 1)) * (D + 2) + d);
        };
        fetch(0);
#if MERGE_SCAN
        // px[i]: the max of the tile's chunks 0..i, an inclusive scan in log2(n) steps (a thread's own
        // loop over 0..i took a serial chain of i shared loads)
        for (int i = d; i < n; i += D) px[i] = sm[i];
        __syncthreads();
        for (int off = 1; off < n; off <<= 1) {
            float v[(MT + D - 1) / D];
#pragma unroll
            for (int k = 0; k < (MT + D - 1) / D; ++k) {
                const int i = d + k * D;
                v[k] = i < n && i >= off ? fmaxf(px[i - off], px[i]) : 0.f;
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < (MT + D - 1) / D; ++k) {
                const int i = d + k * D;
                if (i < n && i >= off) px[i] = v[k];
            }
            __syncthreads();
        }
        for (int i = d; i < n; i += D) {
            const float mp = i == 0 ? m : fmaxf(m, px[i - 1]);
#else
        __syncthreads();
        for (int i = d; i < n; i += D) {
            float mp = m;
            for (int j = 0; j < i; ++j) mp = fmaxf(mp, sm[j]);
#endif
            float a, b, m_new;
            merge_coeffs(mp, sm[i], a, b, m_new);
            sa[i] = a;
            sb[i] = b;
        }
        __syncthreads();
        for (int i0 = 0; i0 < n; i0 += MB) {
            float cv[MB];
#pragma unroll
            for (int k = 0; k < MB; ++k) cv[k] = nv[k];
            if (i0 + MB < n) fetch(i0 + MB);
#pragma unroll
            for (int k = 0; k < MB; ++k) {
                const int i = i0 + k;
                if (i >= n) break;
                l = merge_add(l, sa[i], sl[i], sb[i]);
                acc = merge_add(acc, sa[i], cv[k], sb[i]);
                m = fmaxf(m, sm[i]);
            }
        }
        __syncthreads();  // the tile's coefficients read before the next tile's
    }
    store_attn<OUT16>(out, ((i64)r * n_heads + qh) * D + d, __fdiv_rn(acc, l));
}
