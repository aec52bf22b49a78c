// Device functions shared by every kernel whose arithmetic must agree with another kernel's.
//
// NVRTC compiles these sources without the CUDA headers, so 16-bit floats are carried as raw
// `unsigned short` and converted with PTX; no <cuda_fp16.h>, no <cstdint>.
// Every kernel is compiled with -fmad=false as well; the exact paths still spell their roundings
// with __fmul_rn/__fadd_rn/__fmaf_rn so that no compiler choice can contract them differently.
#pragma once

#define PAGE 256     // KV cells per page; attention chunks are pages in logical order
#define NEG_INF __int_as_float(0xff800000)

typedef unsigned short u16;
typedef long long i64;

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// A register array's elements to 0 (unrolled: the array stays in registers).
template <int A, int B>
__device__ __forceinline__ void zero_regs(float (&x)[A][B]) {
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
        for (int b = 0; b < B; ++b) x[a][b] = 0.f;
}

// Unrolled loops over R x T x I register tiles with indices a, b, i, for the statement after it:
// constant indices after unrolling keep the tiles in registers. A macro rather than a function
// taking a lambda: with the lambda nvcc lays out the matmul kernels differently.
#define FOR_TILES(R, T, I, a, b, i)                      \
    _Pragma("unroll") for (int a = 0; a < (R); ++a)     \
        _Pragma("unroll") for (int b = 0; b < (T); ++b) \
            _Pragma("unroll") for (int i = 0; i < (I); ++i)

// ---- programmatic dependent launch (sm_90 and later)
// Captured decode steps launch each kernel so that it may start while the kernel before it still
// runs (lockstep_kernels/cuda/launch.py). Every kernel calls pdl_start() before it touches memory another
// kernel writes: it returns once the previous kernel has finished and its writes are visible, then
// lets the next kernel start. Before it a kernel may only read weights. Without such a launch (and
// before sm_90) both instructions are no-ops.
__device__ __forceinline__ void pdl_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- asynchronous copies to shared memory (sm_80 and later): src_bytes < 16 zero-fills the rest
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// ---- 16-bit float conversions (round to nearest even, as NumPy and torch do)

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __uint_as_float(((unsigned)b) << 16);
}

// The same integer rounding as lockstep_kernels.weights.f32_to_bf16, so GPU and CPU caches hold equal bits.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    unsigned bits = __float_as_uint(f);
    unsigned rounding = ((bits >> 16) & 1u) + 0x7fffu;
    return (u16)((bits + rounding) >> 16);
}

// Two floats to a packed pair for an MMA operand: `lo` lands in bits 0..15 (the lower k index).
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// act_to_16's `perm` order (mm_wgmma's token operand): the 16-bit pair at k = 32c + 8b + 2a (pair
// index i = 16c + 4b + a) is 32-bit word 16c + 4a + b of its row.
__device__ __forceinline__ int perm_word(int i) { return (i & ~15) | ((i & 3) << 2) | ((i >> 2) & 3); }

// ---- RoPE: one pair (a, b) rotated by the angle whose cosine and sine are c, s

__device__ __forceinline__ void rotate(float a, float b, float c, float s, float& ya, float& yb) {
    ya = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    yb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// ---- storage types: load one element as float, store a float with the cache's rounding

struct F32 {
    typedef float T;
    static __device__ __forceinline__ float load(const float* p, i64 i) { return p[i]; }
    static __device__ __forceinline__ void store(float* p, i64 i, float v) { p[i] = v; }
};
struct F16 {
    typedef u16 T;
    static __device__ __forceinline__ float load(const u16* p, i64 i) { return f16_to_f32(p[i]); }
    static __device__ __forceinline__ void store(u16* p, i64 i, float v) { p[i] = f32_to_f16(v); }
    static __device__ __forceinline__ void pair(unsigned w, float& lo, float& hi) {
        lo = f16_to_f32((u16)(w & 0xffffu));
        hi = f16_to_f32((u16)(w >> 16));
    }
};
struct BF16 {
    typedef u16 T;
    static __device__ __forceinline__ float load(const u16* p, i64 i) { return bf16_to_f32(p[i]); }
    static __device__ __forceinline__ void store(u16* p, i64 i, float v) { p[i] = f32_to_bf16(v); }
    static __device__ __forceinline__ void pair(unsigned w, float& lo, float& hi) {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
    }
};

// ---- a q|k|v matmul's outputs to attention's inputs (rope_qkv_write, and the matmul's EPI_ROPE
// epilogue): pair j of head hh of row r, a at dim e1 and b at e2 (neox: j and j + D/2, else 2j and
// 2j + 1). q heads are rotated into q [T, H, D]; k heads rotated and v heads as they are stored into
// the row's cache cell (none for a negative slot, a padding row).
struct QkvOut {
    float* q;
    void* kc;
    void* vc;
    const int* positions;
    const i64* slots;
    const float* cos_t;
    const float* sin_t;
    int H, Hkv, D;
};

template <typename S>
__device__ __forceinline__ void qkv_pair_store(const QkvOut& o, int r, int hh, int j, int e1, int e2, float a,
                                               float b) {
    const i64 at = (i64)o.positions[r] * (o.D >> 1) + j;
    if (hh < o.H) {
        float* dst = o.q + ((i64)r * o.H + hh) * o.D;
        rotate(a, b, o.cos_t[at], o.sin_t[at], dst[e1], dst[e2]);
        return;
    }
    const i64 slot = o.slots[r];
    if (slot < 0) return;
    const i64 cell = slot * o.Hkv * o.D;
    typename S::T* kc = static_cast<typename S::T*>(o.kc);
    typename S::T* vc = static_cast<typename S::T*>(o.vc);
    if (hh < o.H + o.Hkv) {
        float ya, yb;
        rotate(a, b, o.cos_t[at], o.sin_t[at], ya, yb);
        S::store(kc, cell + (i64)(hh - o.H) * o.D + e1, ya);
        S::store(kc, cell + (i64)(hh - o.H) * o.D + e2, yb);
    } else {
        S::store(vc, cell + (i64)(hh - o.H - o.Hkv) * o.D + e1, a);
        S::store(vc, cell + (i64)(hh - o.H - o.Hkv) * o.D + e2, b);
    }
}

// ---- fixed-order reductions: a warp's xor butterfly, then warps in index order.
// a + b == b + a bit for bit, so every lane of the butterfly ends with the same sum.

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// 1 / sqrt(mean(x^2) + eps) of one row, summed as a block of 256 threads would: virtual thread v
// takes elements v, v + 256, ... ascending (fmaf), each 32 of them meet in warp_sum, the 8 sums are
// added in order. A block of any 32 * S threads gets the same bits (warp w takes the virtual warps
// w, w + S, ...), so rms_norm and a matmul that normalises its own input row agree. `scratch`: 8
// floats of shared memory. Contains a barrier: every thread of the block must call it.
__device__ __forceinline__ float rms_inv(const float* __restrict__ xr, int D, float eps, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int vw = warp; vw < 8; vw += nwarps) {
        float acc = 0.f;
        for (int i = vw * 32 + lane; i < D; i += 256) acc = __fmaf_rn(xr[i], xr[i], acc);
        acc = warp_sum(acc);
        if (lane == 0) scratch[vw] = acc;
    }
    __syncthreads();
    float s = scratch[0];
    for (int w = 1; w < 8; ++w) s = __fadd_rn(s, scratch[w]);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(s, (float)D), eps)));
}

// gate * sigmoid(gate) * up, as every kernel that gates a product computes it.
__device__ __forceinline__ float silu_times(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// ---- matmul epilogues (matmul.cu, wgmma.cu, kquant_mm.cu)
// Bias, then the residual stream: the same two roundings as add(x, matmul(h, w, bias)).
#define EPI_BIAS 1
#define EPI_RESIDUAL 2
// A gated product (weights as 16-row tiles of 8 gate rows, then the matching 8 up rows): the thread
// holding a gate output holds its up output 8 rows down and stores silu_times of the two, [M, N / 2].
#define EPI_SILU 8
// With EPI_SILU in the streaming kernel: the gated products stored as the MMA's 16-bit values
// (pack_act's rounding), the input of a PRO_X16 matmul.
#define EPI_OUT16 32
// q|k|v with each head's rows in rope-pair tiles (CudaOps.upload_qkv): the thread holding dim j of a
// head holds dim j + D/2 8 rows down, and stores what rope_qkv_write would (qkv_pair_store).
#define EPI_ROPE 16
__device__ __forceinline__ float epilogue(float v, const float* __restrict__ bias, const float* __restrict__ res,
                                          int m, int n, int N, int flags) {
    if (flags & EPI_BIAS) v = __fadd_rn(v, bias[n]);
    if (flags & EPI_RESIDUAL) v = __fadd_rn(res[(i64)m * N + n], v);
    return v;
}

// The streaming kernels' fixed combine of a block's S K slices (warp s holds slice s): warp 0 adds
// p1 .. p(S-1) to its own in slice order, sequentially, so a kernel that walks the slices one after
// another can reproduce it. Returns false on the other warps (which then stop). `red`: shared
// memory of (S - 1) * 32 * 4 * TM floats.
template <int TM>
__device__ __forceinline__ bool combine_slices(float (&acc)[TM][4], float* red) {
    const int S = blockDim.x >> 5, s = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (S > 1) {
        if (s > 0) {
            float* dst = red + ((s - 1) * 32 + lane) * (TM * 4);
#pragma unroll
            for (int tm = 0; tm < TM; ++tm)
#pragma unroll
                for (int i = 0; i < 4; ++i) dst[tm * 4 + i] = acc[tm][i];
        }
        __syncthreads();
        if (s != 0) return false;
#pragma unroll 4
        for (int p = 1; p < S; ++p) {
            const float* src = red + ((p - 1) * 32 + lane) * (TM * 4);
#pragma unroll
            for (int tm = 0; tm < TM; ++tm)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[tm][i] = __fadd_rn(acc[tm][i], src[tm * 4 + i]);
        }
    }
    return true;
}

// EPI_ROPE of the streaming kernels' accumulators (c0, c1: row n0 + g, tokens 2t, 2t + 1; c2, c3: row
// n0 + g + 8): head h0 + n0 / D, dims j and j + D/2 (q rotated into out, k and v into the cache);
// h0 > 0 for a run of a stack that starts past the first head.
template <int TM>
__device__ __forceinline__ void rope_stores(const float (&acc)[TM][4], int n0, int h0, int m_base,
                                            const float* __restrict__ bias, const float* __restrict__ res, int M,
                                            int N, int flags, const QkvOut& qkv, int kv) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int hh = h0 + n0 / qkv.D, j = 8 * ((n0 % qkv.D) >> 4) + g;
#pragma unroll
    for (int tm = 0; tm < TM; ++tm)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int m = m_base + tm * 8 + 2 * t + i;
            if (m >= M) continue;
            const float a = epilogue(acc[tm][i], bias, res, m, n0 + g, N, flags);
            const float b = epilogue(acc[tm][2 + i], bias, res, m, n0 + g + 8, N, flags);
            if (kv == 0)
                qkv_pair_store<F32>(qkv, m, hh, j, j, j + qkv.D / 2, a, b);
            else if (kv == 1)
                qkv_pair_store<F16>(qkv, m, hh, j, j, j + qkv.D / 2, a, b);
            else
                qkv_pair_store<BF16>(qkv, m, hh, j, j, j + qkv.D / 2, a, b);
        }
}

// One accumulator quad of the streaming kernels (c0, c1: row n0 + g, tokens m, m + 1; c2, c3: row
// n0 + g + 8) to `out` through the epilogue; rows of `out` are ldo apart.
__device__ __forceinline__ void store_quad(const float (&c)[4], int n0, int m, const float* __restrict__ bias,
                                           const float* __restrict__ res, float* __restrict__ out, int M, int N,
                                           int ldo, int flags) {
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int n = n0 + g + ((i & 2) ? 8 : 0);
        const int mm = m + (i & 1);
        if (n < N && mm < M) out[(i64)mm * ldo + n] = epilogue(c[i], bias, res, mm, n, N, flags);
    }
}

// The streaming kernels' epilogue of a warp's accumulators (c0, c1: row n0 + g, tokens 2t, 2t + 1 from
// m_base; c2, c3: row n0 + g + 8): EPI_ROPE's stores (heads from h0), the gated products (with EPI_OUT16
// and OUT16_ 1 or 2 as f16 or bf16 values; OUT16_ 0: never), or store_quad's, rows of `out` ldo apart.
// g, t (lane >> 2, lane & 3) come from the caller: computed here, they moved mm_tc's one-row K-quant
// SASS. The pointers carry the caller's __restrict__.
template <int TM, int OUT16_>
__device__ __forceinline__ void stream_stores(const float (&acc)[TM][4], int n0, int h0, int m_base, int g, int t,
                                              const float* bias, const float* res, float* out, int M, int N, int ldo,
                                              int flags, const QkvOut& qkv, int kv) {
    if (flags & EPI_ROPE) {
        rope_stores<TM>(acc, n0, h0, m_base, bias, res, M, N, flags, qkv, kv);
        return;
    }
#pragma unroll
    for (int tm = 0; tm < TM; ++tm) {
        const int m = m_base + tm * 8 + 2 * t;
        if (flags & EPI_SILU) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                if (m + j >= M) continue;
                const float v = silu_times(acc[tm][j], acc[tm][2 + j]);
                const i64 at = (i64)(m + j) * (N >> 1) + (n0 >> 1) + g;
                if (OUT16_ && (flags & EPI_OUT16))
                    reinterpret_cast<u16*>(out)[at] =
                        (u16)((OUT16_ == 2 ? pack_bf16x2(v, 0.f) : pack_f16x2(v, 0.f)) & 0xffffu);
                else
                    out[at] = v;
            }
            continue;
        }
        store_quad(acc[tm], n0, m, bias, res, out, M, N, ldo, flags);
    }
}

// A warp's RT x 4 accumulator tiles to `out` (rows n, tokens m), through the epilogue.
template <int RT>
__device__ __forceinline__ void store_tiles(const float (&total)[RT][4][4], int n_first, int m_first,
                                            const float* __restrict__ bias, const float* __restrict__ res,
                                            float* __restrict__ out, int M, int N, int flags) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (flags & EPI_SILU) {
        FOR_TILES(RT, 4, 2, rt, tt, j) {
            const int m = m_first + tt * 8 + 2 * t + j, f = ((n_first + rt * 16) >> 1) + g;
            if (m < M && 2 * f < N) out[(i64)m * (N >> 1) + f] = silu_times(total[rt][tt][j], total[rt][tt][2 + j]);
        }
        return;
    }
    FOR_TILES(RT, 4, 4, rt, tt, i) {
        const int n = n_first + rt * 16 + g + ((i & 2) ? 8 : 0);
        const int m = m_first + tt * 8 + 2 * t + (i & 1);
        if (n < N && m < M) out[(i64)m * N + n] = epilogue(total[rt][tt][i], bias, res, m, n, N, flags);
    }
}

// ---- the one merge of two softmax partials (running state and a later chunk), in ascending order.
// Attention kernels and the CPU reference merge chunks exactly this way.

__device__ __forceinline__ void merge_coeffs(float m, float m_c, float& a, float& b, float& m_new) {
    m_new = fmaxf(m, m_c);
    a = expf(__fsub_rn(m, m_new));
    b = expf(__fsub_rn(m_c, m_new));
}

__device__ __forceinline__ float merge_add(float x, float a, float y, float b) {
    return __fadd_rn(__fmul_rn(x, a), __fmul_rn(y, b));
}

// Output element d of query head qh of row r from its chunks 0..last: `part` holds (o[HD], m, l) per
// (row, head, chunk), folded ascending, then o / l. Read through L2 (ld.cg): other blocks wrote them.
// The loads of B chunks go out together, those of the next B before the fold of these: ld.cg loads
// are not moved past each other, so a fold that loads as it goes waits a round trip per chunk.
template <int HD, int B>
__device__ __forceinline__ float merge_chunks(const float* __restrict__ part, int r, int qh, int d, int last,
                                              int n_heads, int W) {
    const float* base = part + ((i64)r * n_heads + qh) * W * (HD + 2);
    float m = __ldcg(base + HD), l = __ldcg(base + HD + 1), acc = __ldcg(base + d);
    float nm[B], nl[B], no[B];
    auto fetch = [&](int c0) {  // chunks c0 .. c0 + B - 1, those past `last` as `last` (loaded, never used)
#pragma unroll
        for (int i = 0; i < B; ++i) {
            const float* pc = base + (i64)imin(c0 + i, last) * (HD + 2);
            nm[i] = __ldcg(pc + HD);
            nl[i] = __ldcg(pc + HD + 1);
            no[i] = __ldcg(pc + d);
        }
    };
    if (last >= 1) fetch(1);
    for (int c0 = 1; c0 <= last; c0 += B) {
        float cm[B], cl[B], co[B];
#pragma unroll
        for (int i = 0; i < B; ++i) cm[i] = nm[i], cl[i] = nl[i], co[i] = no[i];
        if (c0 + B <= last) fetch(c0 + B);
#pragma unroll
        for (int i = 0; i < B; ++i) {
            if (c0 + i > last) break;
            float a, b, m_new;
            merge_coeffs(m, cm[i], a, b, m_new);
            l = merge_add(l, a, cl[i], b);
            acc = merge_add(acc, a, co[i], b);
            m = m_new;
        }
    }
    return __fdiv_rn(acc, l);
}

// One attention output value, its zero made +0 (a zero's sign may depend on what shared the tile): a
// float (OUT16 0), or rounded as the o projection's MMA rounds its input (1 f16, 2 bf16).
template <int OUT16_>
__device__ __forceinline__ void store_attn(float* out, i64 at, float v) {
    v = __fadd_rn(v, 0.f);
    if (OUT16_ == 0)
        out[at] = v;
    else
        reinterpret_cast<u16*>(out)[at] = (u16)((OUT16_ == 2 ? pack_bf16x2(v, 0.f) : pack_f16x2(v, 0.f)) & 0xffffu);
}

// ---- K-quant planes (lockstep_kernels/cuda/kquant.py): a Q4_K or Q6_K weight of `tiles` 16-row tiles and
// C 32-value chunks, repacked so that a warp reads each plane whole. `w` is the low-nibble plane;
// `aux` holds (Q6_K) the top-bit plane, the sub-block scales, the super-block scales.
template <bool B>
struct Bool {  // a compile-time flag for generic lambdas (no <type_traits> under NVRTC)
    static constexpr bool value = B;
};

struct KqPlanes {
    const unsigned char* nib;
    const unsigned char* top;
    const unsigned char* sc;
    const unsigned char* d;
};

__device__ __forceinline__ KqPlanes kq_planes(const void* w, const void* aux, bool q6, int tiles, int C) {
    const unsigned char* a = reinterpret_cast<const unsigned char*>(aux);
    KqPlanes p;
    p.nib = reinterpret_cast<const unsigned char*>(w);
    p.top = a;
    p.sc = a + (q6 ? (i64)tiles * C * 128 : 0);
    p.d = p.sc + (i64)tiles * C * 32;
    return p;
}

// (a & MASK) | c in one LOP3: written plainly, with two constants, ptxas issues two (one immediate an
// instruction); c's register is set once outside the loops.
template <unsigned MASK>
__device__ __forceinline__ unsigned and_or(unsigned a, unsigned c) {
    unsigned r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "n"(MASK), "r"(c));
    return r;
}

// Pair j (k 8t + 2j, 8t + 2j + 1) of a lane's word as an exact f16 pair: q (Q4_K), or q - 32 with the
// top bits at `hs` in `top` (Q6_K): 1024 + q is an f16 whose low mantissa bits are q. KQ_PAIR_FMA (1:
// both types, 2: Q6_K only): odd pairs taken where they lie, 1024 + 16 q, and scaled by 1/16 in the
// subtraction's FMA (exact too: the same f16), so a word's four pairs need one shift.
#ifndef KQ_PAIR_FMA
#define KQ_PAIR_FMA 0
#endif
__device__ __forceinline__ unsigned kq_pair(unsigned nib, unsigned top, int j, int hs, bool q6) {
    const bool fma = KQ_PAIR_FMA == 1 || (KQ_PAIR_FMA == 2 && q6);
    unsigned r;
    if (fma && (j & 1)) {
        unsigned v = and_or<0x00F000F0u>(nib >> (4 * (j & 2)), 0x64006400u);
        if (q6) v |= ((top >> (2 * j + hs)) << 8) & 0x03000300u;
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x2C002C00u), "r"(q6 ? 0xD600D600u : 0xD400D400u));
        return r;
    }
    unsigned v = and_or<0x000F000Fu>(nib >> (4 * (fma ? j & 2 : j)), 0x64006400u);
    if (q6) v |= ((top >> (2 * j + hs)) << 4) & 0x00300030u;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(q6 ? 0x64206420u : 0x64006400u));
    return r;
}

// One row's sub-block scales of a chunk as float32, as gguf scales them, from its scale bytes `s`
// (low 16 bits) and its super-block scales `d` (Q4_K: d, dmin; Q6_K: d in the low 16 bits): Q4_K
// (d * scale, dmin * min) of its 32 values; Q6_K (d * scale) of its two 16-value halves.
// kq_scale_pair with the super-block scales already float32 (d; dmin, Q4_K only).
__device__ __forceinline__ float2 kq_scale_pair_f(unsigned s, float d, float dmin, bool q6) {
    if (q6) return make_float2(__fmul_rn(d, (float)(signed char)(s & 0xffu)), __fmul_rn(d, (float)(signed char)((s >> 8) & 0xffu)));
    return make_float2(__fmul_rn(d, (float)(s & 0xffu)), __fmul_rn(dmin, (float)((s >> 8) & 0xffu)));
}

__device__ __forceinline__ float2 kq_scale_pair(unsigned s, unsigned d, bool q6) {
    return kq_scale_pair_f(s, f16_to_f32((u16)(d & 0xffffu)), q6 ? 0.f : f16_to_f32((u16)(d >> 16)), q6);
}

// The scale words of rows g and g + 8 of a tile's chunk c: `s` (row g's bytes, then row g + 8's)
// and the super-block scales (Q4_K: d.x row g, d.y row g + 8; Q6_K: d.x, row g's then row g + 8's).
__device__ __forceinline__ void kq_scale_words(const KqPlanes& p, bool q6, i64 tile, int C, int c, int g,
                                               unsigned& s, uint2& d) {
    s = *reinterpret_cast<const unsigned*>(p.sc + ((tile * C + c) * 8 + g) * 4);
    const i64 sb = tile * (C >> 3) + (c >> 3);
    d = q6 ? make_uint2(*reinterpret_cast<const unsigned*>(p.d + (sb * 8 + g) * 4), 0u)
           : *reinterpret_cast<const uint2*>(p.d + (sb * 8 + g) * 8);
}

// Row r (0..15) of the tile's scales at chunk c (kq_scale_pair).
__device__ __forceinline__ float2 kq_scales(const KqPlanes& p, bool q6, i64 tile, int C, int c, int r) {
    unsigned s;
    uint2 d;
    kq_scale_words(p, q6, tile, C, c, r & 7, s, d);
    const int half = r >> 3;
    return kq_scale_pair(s >> (16 * half), q6 ? d.x >> (16 * half) : (half ? d.y : d.x), q6);
}

// One value, as gguf dequantises it: Q4_K d*sc * q - dmin*m, Q6_K d*sc * (q - 32) (float32); `top`:
// the planes hold the top bits (Q6_K, and Q5_K: Q4_K's scales with a fifth bit).
__device__ __forceinline__ float kq_value(const KqPlanes& p, bool q6, int C, i64 n, int k, bool top = false) {
    const i64 tile = n >> 4;
    const int r = (int)(n & 15), g = r & 7, half = r >> 3;
    const int c = k >> 5, t = (k >> 3) & 3, i = k & 7;
    const i64 lane = (tile * C + c) * 32 + 4 * g + t;
    const unsigned nib = *reinterpret_cast<const unsigned*>(p.nib + lane * 8 + 4 * half);
    int q = (nib >> (16 * (i & 1) + 4 * (i >> 1))) & 0xF;
    const float2 s = kq_scales(p, q6, tile, C, c, r);
    if (q6 || top) {
        const unsigned tw = *reinterpret_cast<const unsigned*>(p.top + lane * 4);
        q |= ((tw >> (8 * half + 16 * (i & 1) + 2 * (i >> 1))) & 3u) << 4;
    }
    if (!q6) return __fsub_rn(__fmul_rn(s.x, (float)q), s.y);
    return __fmul_rn((t < 2) ? s.x : s.y, (float)(q - 32));
}

// ---- One (tile, chunk) of the planes as a record in shared memory: the nibbles (256 bytes), Q6_K's
// top bits (128), the sub-block scale words (32), the super-block's scale record (Q4_K 64, Q6_K 32),
// so that the staged kernels (mm_tile, mm_wide) read what mm_tc reads from global.
__device__ __forceinline__ constexpr int kq_rec_bytes(bool q6) { return q6 ? 448 : 352; }

// Where 16-byte segment `seg` (0 .. kq_rec_bytes / 16 - 1) of a record comes from: its plane, that
// plane's bytes per (tile, chunk) (0: the super-block scales, per 8 chunks) and its offset there.
struct KqSeg {
    const unsigned char* plane;
    int stride;
    int off;
};

__device__ __forceinline__ KqSeg kq_seg(const KqPlanes& p, bool q6, int seg) {
    const int top = q6 ? 8 : 0;
    if (seg < 16) return KqSeg{p.nib, 256, seg * 16};
    if (seg < 16 + top) return KqSeg{p.top, 128, (seg - 16) * 16};
    if (seg < 18 + top) return KqSeg{p.sc, 32, (seg - 16 - top) * 16};
    return KqSeg{p.d, 0, (seg - 18 - top) * 16};
}

// Copy segment `sg` of tile `tile`'s chunk c into its place `dst` in the record; `ok` false zero-fills
// it (tiles past the weight).
__device__ __forceinline__ void kq_issue_seg(unsigned char* dst, const KqSeg& sg, bool q6, i64 tile, int C, int c,
                                             bool ok) {
    const i64 at = sg.stride ? (tile * C + c) * sg.stride : (tile * (C >> 3) + (c >> 3)) * (q6 ? 32 : 64);
    cp_async16(dst, ok ? sg.plane + at + sg.off : sg.plane, ok ? 16 : 0);
}

// A lane's words of a staged record, as mm_tc's load_weights packs them: wa = (row g's nibbles,
// Q6_K top bits, scale word), wb = (row g + 8's nibbles, super-block scale words).
__device__ __forceinline__ void kq_read_rec(const unsigned char* rec, bool q6, int lane, uint4& wa, uint4& wb) {
    const int g = lane >> 2, top = q6 ? 128 : 0;
    const uint2 q = *reinterpret_cast<const uint2*>(rec + lane * 8);
    const unsigned tb = q6 ? *reinterpret_cast<const unsigned*>(rec + 256 + lane * 4) : 0u;
    const unsigned s = *reinterpret_cast<const unsigned*>(rec + 256 + top + g * 4);
    const uint2 d = q6 ? make_uint2(*reinterpret_cast<const unsigned*>(rec + 288 + top + g * 4), 0u)
                       : *reinterpret_cast<const uint2*>(rec + 288 + g * 8);
    wa = make_uint4(q.x, tb, s, 0u);
    wb = make_uint4(q.y, d.x, d.y, 0u);
}

// A chunk's scales of rows g, g + 8 from those words (kq_scale_pair): sa, sb multiply the integers'
// sums; xa, xb (Q4_K: dmin*m; Q6_K: the second half's scales) the second sums.
// The super-block scales of rows g, g + 8 (load_weights' wb.y, wb.z) as float32: (d, dmin) of row g,
// then of row g + 8 (Q6_K: d of each, dmin 0).
__device__ __forceinline__ float4 kq_super_floats(unsigned y, unsigned z, bool q6) {
    if (q6) return make_float4(f16_to_f32((u16)(y & 0xffffu)), 0.f, f16_to_f32((u16)(y >> 16)), 0.f);
    return make_float4(f16_to_f32((u16)(y & 0xffffu)), f16_to_f32((u16)(y >> 16)), f16_to_f32((u16)(z & 0xffffu)),
                       f16_to_f32((u16)(z >> 16)));
}

// kq_chunk_scales from the chunk's scale word `s` and kq_super_floats' `d`.
__device__ __forceinline__ void kq_chunk_scales_f(unsigned s, float4 d, bool q6, float& sa, float& sb, float& xa,
                                                  float& xb) {
    const float2 pa = kq_scale_pair_f(s, d.x, d.y, q6);
    const float2 pb = kq_scale_pair_f(s >> 16, d.z, d.w, q6);
    sa = pa.x; xa = pa.y; sb = pb.x; xb = pb.y;
}

__device__ __forceinline__ void kq_chunk_scales(uint4 wa, uint4 wb, bool q6, float& sa, float& sb, float& xa,
                                                float& xb) {
    kq_chunk_scales_f(wa.z, kq_super_floats(wb.y, wb.z, q6), q6, sa, sb, xa, xb);
}

// ---- mixture of experts (moe.cu, matmul.cu's grouped kernels)
#define MOE_MAX_E 1024  // experts a router may have (lockstep_kernels/cuda/moe.py checks)

// One row routed by one warp: softmax over the E router logits in float32 (lane l takes e = l,
// l + 32, ..., then the fixed butterfly), the top k by repeated argmax with ties to the lowest expert
// index (the stable descending order of the reference), divided by their sum added in slot order
// when `renorm`. p: E floats, chosen: k floats of the warp's shared memory. Every kernel that routes
// calls this, so a row's ids and weights never depend on which kernel or batch routed it.
__device__ __forceinline__ void route_row(const float* __restrict__ row, int* __restrict__ ids,
                                          float* __restrict__ weights, int E, int k, int renorm, float* p,
                                          float* chosen) {
    const int lane = threadIdx.x & 31;
    float m = NEG_INF;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, row[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) {
        const float v = expf(__fsub_rn(row[e], m));
        p[e] = v;
        sum = __fadd_rn(sum, v);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
    for (int e = lane; e < E; e += 32) p[e] = __fdiv_rn(p[e], sum);
    __syncwarp();
    for (int j = 0; j < k; ++j) {
        float best = -1.f;  // probabilities are >= 0; a chosen expert is marked -2
        int at = E;
        for (int e = lane; e < E; e += 32)
            if (p[e] > best) best = p[e], at = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oa = __shfl_xor_sync(0xffffffffu, at, o);
            if (ob > best || (ob == best && oa < at)) best = ob, at = oa;
        }
        if (lane == 0) {
            chosen[j] = best;
            ids[j] = at;
            p[at] = -2.f;
        }
        __syncwarp();
    }
    if (lane == 0) {
        float total = chosen[0];
        for (int j = 1; j < k; ++j) total = __fadd_rn(total, chosen[j]);
        for (int j = 0; j < k; ++j) weights[j] = renorm ? __fdiv_rn(chosen[j], total) : chosen[j];
    }
    __syncwarp();
}

// Token t's output feature h: the sum over slots j = 0 .. k-1, in that order, of weights[t, j] times
// its pair's expert output y[pos[t * k + j]] (rows of H), then + shared[t] * sigmoid(gate[t]) where
// `has_shared`, then res[t] + that where `has_res`: the reference's float32 steps, each rounded.
// y is read through L2 (__ldcg): other blocks of the same kernel may have written it.
__device__ __forceinline__ float moe_weighted_sum(const float* __restrict__ y, const int* __restrict__ pos,
                                                  const float* __restrict__ weights, const float* __restrict__ shared,
                                                  const float* __restrict__ gate, const float* __restrict__ res,
                                                  i64 t, int h, int H, int k, int has_shared, int has_res) {
    const int* pr = pos + t * k;
    const float* wr = weights + t * k;
    float acc = __fmul_rn(__ldcg(y + (i64)pr[0] * H + h), wr[0]);
    for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(__ldcg(y + (i64)pr[j] * H + h), wr[j]));
    if (has_shared) {
        const float s = __fdiv_rn(1.f, __fadd_rn(1.f, expf(-gate[t])));
        acc = __fadd_rn(acc, __fmul_rn(shared[t * H + h], s));
    }
    return has_res ? __fadd_rn(res[t * H + h], acc) : acc;
}
