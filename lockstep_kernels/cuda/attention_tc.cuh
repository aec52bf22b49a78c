// The arithmetic of a query row that attention_mma.cu (mma.sync) and attention_wgmma.cu (wgmma) share,
// on the accumulator layout both have: a thread's S and O values as [tile][4] (c0..c3 of an m16n8
// tile: rows g, g + 8 of its warp's 16 as index bit 1, neighbouring columns as bit 0). Pasted after
// common.cuh (lockstep_kernels/cuda/modules.py).

// The defines both kernels take, with their defaults: head dim, query heads per KV head a block serves
// (GP), the cache's 16-bit type and out's (KV_T, OUT16: 2 bf16), EX2 (0: expf for the softmax)
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef GP
#define GP 4
#endif
#ifndef KV_T
#define KV_T 1
#endif
#ifndef OUT16
#define OUT16 0
#endif
#ifndef EX2
#define EX2 1
#endif

#define LOG2E 1.4426950408889634f

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const u16* p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

__device__ __forceinline__ float ex2(float x) {  // 2^x by the SFU; -inf gives +0, 0 gives 1
    float y;
    asm("ex2.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ex2's value where it is normal, +0 where it would be subnormal (no operand or result fix-up): one
// SFU instruction where ex2 takes four
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// e^(s - mu) of a score, mul = mu log2 e (USE_EX2 0: expf; FTZ_: ex2_ftz)
template <int USE_EX2, bool FTZ_ = false>
__device__ __forceinline__ float softmax_weight(float s, float mu, float mul) {
    if (FTZ_ && USE_EX2) return ex2_ftz(__fmaf_rn(s, LOG2E, -mul));
    return USE_EX2 ? ex2(__fmaf_rn(s, LOG2E, -mul)) : expf(__fsub_rn(s, mu));
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// The max of row e's 2 NS_ scores of s, as a tree: max is exact in any order (only a zero's sign may
// differ, and no weight, sum or fold depends on it)
template <int NS_>
__device__ __forceinline__ float row_max_tree(const float (&s)[NS_][4], int e) {
    float m[NS_];
#pragma unroll
    for (int j = 0; j < NS_; ++j) m[j] = fmaxf(s[j][2 * e], s[j][2 * e + 1]);
#pragma unroll
    for (int w = 1; w < NS_; w *= 2)
#pragma unroll
        for (int j = 0; j + w < NS_; j += 2 * w) m[j] = fmaxf(m[j], m[j + w]);
    return m[0];
}

// Row e's part of one sub-tile's online softmax: scores s of keys past its position p (from key kbase +
// 8 j + x of tile j) -inf; its running max mc and sum lc updated; its weights left in s; the factor its
// O takes (alpha) returned. SKIP_: no key compared where the thread's last one is at or before p.
// LEAN_: the max as a tree and the weights by ex2_ftz (FTZ_): the same bits where P is rounded to f16
// (a weight under 2^-126 rounds to +0 there) and lc >= 1 takes the sum (the max's own weight is 1).
template <int USE_EX2, int NS_, bool SKIP_ = false, bool LEAN_ = false, bool FTZ_ = false>
__device__ __forceinline__ float row_weights(float (&s)[NS_][4], float& mc, float& lc, int p, int kbase, int e) {
    float mx = NEG_INF;
    if (!SKIP_ || kbase + (NS_ - 1) * 8 + 1 > p) {
        if (LEAN_) {
            const int last = p - kbase;  // keys j 8 + x past it -inf: compares with immediates
#pragma unroll
            for (int j = 0; j < NS_; ++j)
#pragma unroll
                for (int x = 0; x < 2; ++x)
                    if (j * 8 + x > last) s[j][2 * e + x] = NEG_INF;
            mx = row_max_tree(s, e);
        } else {
#pragma unroll
            for (int j = 0; j < NS_; ++j)
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    if (kbase + j * 8 + x > p) s[j][2 * e + x] = NEG_INF;
                    mx = fmaxf(mx, s[j][2 * e + x]);
                }
        }
    } else if (LEAN_) {
        mx = row_max_tree(s, e);
    } else {
#pragma unroll
        for (int j = 0; j < NS_; ++j)
#pragma unroll
            for (int x = 0; x < 2; ++x) mx = fmaxf(mx, s[j][2 * e + x]);
    }
    const float mn = fmaxf(mc, quad_max(mx));
    const float mu = mn == NEG_INF ? 0.f : mn, mul = __fmul_rn(mu, LOG2E);
    // a sub-tile past the row's position (all -inf) leaves the state as it is: alpha 1
    const float alpha = mc == mu ? 1.f : USE_EX2 ? ex2(__fmul_rn(__fsub_rn(mc, mu), LOG2E)) : expf(__fsub_rn(mc, mu));
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NS_; ++j)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const float pv = softmax_weight<USE_EX2, FTZ_>(s[j][2 * e + x], mu, mul);
            s[j][2 * e + x] = pv;
            sum = __fadd_rn(sum, pv);
        }
    lc = __fadd_rn(__fmul_rn(lc, alpha), quad_sum(sum));
    mc = mn;
    return alpha;
}

// Row e's O (oc) times alpha
template <int NO_>
__device__ __forceinline__ void rescale_row(float (&oc)[NO_][4], float alpha, int e) {
#pragma unroll
    for (int n = 0; n < NO_; ++n) {
        oc[n][2 * e] = __fmul_rn(oc[n][2 * e], alpha);
        oc[n][2 * e + 1] = __fmul_rn(oc[n][2 * e + 1], alpha);
    }
}

// One sub-tile's online softmax (row_weights) of both rows, O scaled by alpha
template <int USE_EX2, int NS_, int NO_>
__device__ __forceinline__ void online_softmax(float (&s)[NS_][4], float (&oc)[NO_][4], float (&mc)[2], float (&lc)[2],
                                               const int (&p)[2], int kbase) {
#pragma unroll
    for (int e = 0; e < 2; ++e) rescale_row(oc, row_weights<USE_EX2>(s, mc[e], lc[e], p[e], kbase, e), e);
}

// Row e's folded O values of dim tile n (c0 c1) as one float2 of Os (VEC_ layout: [NO_][2][threads]
// float2s): half the shared-memory instructions, each from a register pair of the accumulator
__device__ __forceinline__ float2& fold_vec(float* Os, int n, int e, int tid, int threads) {
    return reinterpret_cast<float2*>(Os)[(n * 2 + e) * threads + tid];
}

// A finished chunk's (oc, mc, lc) of row e folded into the row's state: the first copied, later ones
// merged in order (merge_coeffs / merge_add). The folded O lives in shared memory, [NO_ * 4][threads]
// (VEC_: as fold_vec's float2s, the same values).
template <int NO_, bool VEC_ = false>
__device__ __forceinline__ void fold_chunk(int e, const float (&oc)[NO_][4], float mc, float lc, bool& have, float& M,
                                           float& L, float* Os, int tid, int threads) {
    if (VEC_ && !have) {
        have = true;
        M = mc, L = lc;
#pragma unroll
        for (int n = 0; n < NO_; ++n) fold_vec(Os, n, e, tid, threads) = make_float2(oc[n][2 * e], oc[n][2 * e + 1]);
    } else if (VEC_ && __all_sync(__activemask(), M >= mc && M < __int_as_float(0x7f800000))) {
        // every row's folded max stays (merge_coeffs' m_new is M, its a expf(0) = 1 and x * 1 = x): the
        // same sums without the multiplications by a
        const float b = expf(__fsub_rn(mc, M));
        L = __fadd_rn(L, __fmul_rn(lc, b));
#pragma unroll
        for (int n = 0; n < NO_; ++n) {
            float2& o2 = fold_vec(Os, n, e, tid, threads);
            float2 o = o2;
            o.x = __fadd_rn(o.x, __fmul_rn(oc[n][2 * e], b));
            o.y = __fadd_rn(o.y, __fmul_rn(oc[n][2 * e + 1], b));
            o2 = o;
        }
    } else if (VEC_) {
        float a, b, m_new;
        merge_coeffs(M, mc, a, b, m_new);
        L = merge_add(L, a, lc, b);
#pragma unroll
        for (int n = 0; n < NO_; ++n) {
            float2& o2 = fold_vec(Os, n, e, tid, threads);
            float2 o = o2;
            o.x = merge_add(o.x, a, oc[n][2 * e], b);
            o.y = merge_add(o.y, a, oc[n][2 * e + 1], b);
            o2 = o;
        }
        M = m_new;
    } else if (!have) {
        have = true;
        M = mc, L = lc;
#pragma unroll
        for (int n = 0; n < NO_; ++n)
#pragma unroll
            for (int x = 0; x < 2; ++x) Os[(n * 4 + 2 * e + x) * threads + tid] = oc[n][2 * e + x];
    } else {
        float a, b, m_new;
        merge_coeffs(M, mc, a, b, m_new);
        L = merge_add(L, a, lc, b);
#pragma unroll
        for (int n = 0; n < NO_; ++n)
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                float& o = Os[(n * 4 + 2 * e + x) * threads + tid];
                o = merge_add(o, a, oc[n][2 * e + x], b);
            }
        M = m_new;
    }
}

// The rows of `todo` that belong to the sequence sq of its first row (a pass), and their last position
__device__ __forceinline__ unsigned pass_rows(unsigned todo, const int* s_seq, const int* s_pos, int rb, int& sq,
                                              int& pmax) {
    sq = s_seq[__ffs(todo) - 1];
    unsigned act = 0;
    pmax = -1;
    for (int j = 0; j < rb; ++j)
        if (((todo >> j) & 1u) && s_seq[j] == sq) {
            act |= 1u << j;
            pmax = max(pmax, s_pos[j]);
        }
    return act;
}

template <int KVT>
__device__ __forceinline__ unsigned pack16_kv(float lo, float hi) {
    return KVT == 2 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
}

// The 16 rows from MMA row row16 of staged q as A fragments, one per 16 head dims
template <int D_>
__device__ __forceinline__ void q_fragments(unsigned (&qa)[D_ / 16][4], const u16* Qs, int ld, int row16, int lane) {
#pragma unroll
    for (int ks = 0; ks < D_ / 16; ++ks)
        ldsm_x4(qa[ks], Qs + (row16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + ks * 16 + (lane >> 4) * 8);
}

// O / l of row e's folded dims (tiles n0.. of its head's D values from `at`) to out, a zero as +0
template <int OUT16_, int NO_, bool VEC_ = false>
__device__ __forceinline__ void store_row(float* out, i64 at, int n0, int e, const float* Os, int tid, int threads,
                                          float l) {
    if (VEC_) {
#pragma unroll
        for (int n = 0; n < NO_; ++n) {
            const float2 o = fold_vec(const_cast<float*>(Os), n, e, tid, threads);
            store_attn<OUT16_>(out, at + (n0 + n) * 8, __fdiv_rn(o.x, l));
            store_attn<OUT16_>(out, at + (n0 + n) * 8 + 1, __fdiv_rn(o.y, l));
        }
    } else {
#pragma unroll
        for (int n = 0; n < NO_; ++n)
#pragma unroll
            for (int x = 0; x < 2; ++x)
                store_attn<OUT16_>(out, at + (n0 + n) * 8 + x, __fdiv_rn(Os[(n * 4 + 2 * e + x) * threads + tid], l));
    }
}

// The KV head of block row blockIdx.y and its sub-group of query heads: G heads a KV head, the group's
// heads g0.. (ng of them, GP_ at most)
template <int GP_>
__device__ __forceinline__ void head_group(int n_heads, int n_kv, int& G, int& h, int& g0, int& ng) {
    G = n_heads / n_kv;
    const int sgs = (G + GP_ - 1) / GP_;
    h = blockIdx.y / sgs, g0 = (blockIdx.y % sgs) * GP_;
    ng = imin(GP_, G - g0);
}

// The block's launch rows r0.. into shared memory (position and sequence, -1 past T), then a barrier
template <int RB_>
__device__ __forceinline__ void stage_rows(int* s_pos, int* s_seq, const int* positions, const int* seq, int r0, int T,
                                           int tid, int threads) {
    for (int j = tid; j < RB_; j += threads) {
        const int r = r0 + j;
        s_pos[j] = r < T ? positions[r] : -1;
        s_seq[j] = r < T ? seq[r] : -1;
    }
    __syncthreads();
}

// q * scale rounded to the cache's type into Qs, [ROWS_][ld]: MMA row mrow is query row mrow / GP_ of the
// block, head g0 + mrow % GP_ of KV head h's group; a row past the group or of no launch row zero, and
// with CLAMP_ every row from MR_ on (the padding of a block of fewer than 16 MMA rows a warp)
template <int D_, int GP_, int ROWS_, int MR_, bool CLAMP_, int KVT>
__device__ __forceinline__ void stage_q(u16* Qs, int ld, const float* q, float scale, const int* s_pos, int r0,
                                        int n_heads, int h, int G, int g0, int ng, int tid, int threads) {
    for (int i = tid; i < ROWS_ * (D_ / 2); i += threads) {
        const int mrow = i / (D_ / 2), d = (i % (D_ / 2)) * 2, j = mrow / GP_, hh = mrow % GP_;
        float a = 0.f, b = 0.f;
        if ((!CLAMP_ || mrow < MR_) && s_pos[j] >= 0 && hh < ng) {
            const float* qp = q + ((i64)(r0 + j) * n_heads + h * G + g0 + hh) * D_ + d;
            a = __fmul_rn(qp[0], scale);
            b = __fmul_rn(qp[1], scale);
        }
        *reinterpret_cast<unsigned*>(Qs + mrow * ld + d) = pack16_kv<KVT>(a, b);
    }
    __syncthreads();
}

// This thread's two MMA rows (g and g + 8 of the 16 from row16): query row, query head, validity (with
// CLAMP_ the padding rows from MR_ on invalid, their query row clamped into the block's RB_)
template <int GP_, int RB_, int MR_, bool CLAMP_>
__device__ __forceinline__ void row_slots(int (&jr)[2], int (&qh)[2], bool (&ok)[2], int row16, int g, int h, int G, int g0,
                                          int ng, const int* s_pos) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int mrow = row16 + g + 8 * e;
        jr[e] = CLAMP_ ? imin(mrow / GP_, RB_ - 1) : mrow / GP_;
        qh[e] = h * G + g0 + mrow % GP_;
        ok[e] = (!CLAMP_ || mrow < MR_) && mrow % GP_ < ng && s_pos[jr[e]] >= 0;
    }
}

// The rows with a position, a bit each: what the passes serve
__device__ __forceinline__ unsigned live_rows(const int* s_pos, int rb) {
    unsigned todo = 0;
    for (int j = 0; j < rb; ++j)
        if (s_pos[j] >= 0) todo |= 1u << j;
    return todo;
}

// A chunk's state before its first sub-tile: O zero, running max -inf, sum zero
template <int NO_>
__device__ __forceinline__ void clear_chunk(float (&oc)[NO_][4], float (&mc)[2], float (&lc)[2]) {
#pragma unroll
    for (int n = 0; n < NO_; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) oc[n][i] = 0.f;
#pragma unroll
    for (int e = 0; e < 2; ++e) mc[e] = NEG_INF, lc[e] = 0.f;
}

// The pass's folded rows, O / l, to out (row e's dims from tile n0: NO_ tiles of 8)
template <int OUT16_, int D_, int NO_, bool VEC_ = false>
__device__ __forceinline__ void store_rows(float* out, const int (&p)[2], const int (&jr)[2], const int (&qh)[2], int r0,
                                           int n_heads, int t, int n0, const float* Os, int tid, int threads,
                                           const float (&L)[2]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        if (p[e] < 0) continue;
        const i64 at = ((i64)(r0 + jr[e]) * n_heads + qh[e]) * D_ + 2 * t;
        store_row<OUT16_, NO_, VEC_>(out, at, n0, e, Os, tid, threads, L[e]);
    }
}
