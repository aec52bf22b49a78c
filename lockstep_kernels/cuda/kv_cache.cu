// K/V rows into their cache cells. Cell `slot` of the flat cache [pages * PAGE, n_kv, D] is page
// slot / PAGE, cell slot % PAGE; a negative slot (a padding row of a replayed graph) writes nothing.
// The roundings equal the CPU cache's (f16 round-to-nearest-even, bf16 as lockstep_kernels.weights rounds).
#include "common.cuh"

template <typename S>
__device__ __forceinline__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                         typename S::T* __restrict__ kc, typename S::T* __restrict__ vc,
                                         const i64* __restrict__ slots, int T, int HD) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * HD) return;
    const int r = (int)(i / HD), e = (int)(i % HD);
    const i64 slot = slots[r];
    if (slot < 0) return;
    S::store(kc, slot * HD + e, k[i]);
    S::store(vc, slot * HD + e, v[i]);
}

extern "C" __global__ void kv_write_f32(const float* k, const float* v, float* kc, float* vc, const i64* slots,
                                        int T, int HD) {
    kv_write<F32>(k, v, kc, vc, slots, T, HD);
}
extern "C" __global__ void kv_write_f16(const float* k, const float* v, u16* kc, u16* vc, const i64* slots,
                                        int T, int HD) {
    kv_write<F16>(k, v, kc, vc, slots, T, HD);
}
extern "C" __global__ void kv_write_bf16(const float* k, const float* v, u16* kc, u16* vc, const i64* slots,
                                         int T, int HD) {
    kv_write<BF16>(k, v, kc, vc, slots, T, HD);
}

// The fused step after the q|k|v matmul: qkv [T, (H + 2 * Hkv) * D] -> q rotated [T, H, D]; k
// rotated and v stored into their cache cells. One thread per pair of a head (rotate() does the
// arithmetic of the `rope` kernel, the stores the roundings of kv_write). `tiles` (neox only): each
// head's products come as 16-row tiles of dims 8i .. 8i+7 then D/2 + 8i .. D/2 + 8i+7 (CudaOps.upload_qkv).
template <typename S>
__device__ __forceinline__ void rope_qkv_write(const float* __restrict__ qkv, const QkvOut& o, int T, int neox,
                                               int tiles) {
    pdl_start();
    const int half = o.D >> 1, heads = o.H + 2 * o.Hkv;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * heads * half) return;
    const int j = (int)(i % half);
    const int hh = (int)((i / half) % heads);
    const int r = (int)(i / ((i64)half * heads));
    const int e1 = neox ? j : 2 * j, e2 = neox ? j + half : 2 * j + 1;
    const int s1 = tiles ? 16 * (j >> 3) + (j & 7) : e1, s2 = tiles ? s1 + 8 : e2;
    const float* row = qkv + (i64)r * heads * o.D + (i64)hh * o.D;
    qkv_pair_store<S>(o, r, hh, j, e1, e2, row[s1], row[s2]);
}

#define ROPE_QKV(NAME, S)                                                                                  \
    extern "C" __global__ void NAME(const float* qkv, float* q, S::T* kc, S::T* vc, const int* positions,    \
                                    const i64* slots, const float* cos_t, const float* sin_t, int T, int H,    \
                                    int Hkv, int D, int neox, int tiles) {                                 \
        rope_qkv_write<S>(qkv, QkvOut{q, kc, vc, positions, slots, cos_t, sin_t, H, Hkv, D}, T, neox, tiles); \
    }
ROPE_QKV(rope_qkv_write_f32, F32)
ROPE_QKV(rope_qkv_write_f16, F16)
ROPE_QKV(rope_qkv_write_bf16, BF16)

// Qwen3's step after the q|k|v matmul: each q and k head normalised over its D values (rms_norm's
// arithmetic: rms_inv, then (x * inv) * w with w the q or k norm weight), then as rope_qkv_write.
// One block per (row, head) of at least D / 2 threads, thread j taking pair j: the bits of rms_norm
// on the head's rows, rope and kv_write (qkv_pair_store's rotate and stores), in one launch.
template <typename S>
__device__ __forceinline__ void qk_norm_rope_qkv_write(const float* __restrict__ qkv, const float* __restrict__ qw,
                                                       const float* __restrict__ kw, float eps, const QkvOut& o,
                                                       int neox) {
    pdl_start();
    __shared__ float scratch[8];
    const int half = o.D >> 1, heads = o.H + 2 * o.Hkv, j = threadIdx.x;
    const int r = blockIdx.x / heads, hh = blockIdx.x % heads;
    const float* row = qkv + (i64)r * heads * o.D + (i64)hh * o.D;
    const float* w = hh < o.H ? qw : hh < o.H + o.Hkv ? kw : nullptr;
    const float inv = w != nullptr ? rms_inv(row, o.D, eps, scratch) : 0.f;  // block-uniform branch
    if (j >= half) return;
    const int e1 = neox ? j : 2 * j, e2 = neox ? j + half : 2 * j + 1;
    float a = row[e1], b = row[e2];
    if (w != nullptr) {
        a = __fmul_rn(__fmul_rn(a, inv), w[e1]);
        b = __fmul_rn(__fmul_rn(b, inv), w[e2]);
    }
    qkv_pair_store<S>(o, r, hh, j, e1, e2, a, b);
}

#define QK_NORM_ROPE_QKV(NAME, S)                                                                          \
    extern "C" __global__ void NAME(const float* qkv, const float* qw, const float* kw, float eps, float* q,   \
                                    S::T* kc, S::T* vc, const int* positions, const i64* slots,               \
                                    const float* cos_t, const float* sin_t, int H, int Hkv, int D, int neox) {  \
        qk_norm_rope_qkv_write<S>(qkv, qw, kw, eps, QkvOut{q, kc, vc, positions, slots, cos_t, sin_t, H, Hkv, D}, \
                                  neox);                                                                   \
    }
QK_NORM_ROPE_QKV(qk_norm_rope_qkv_write_f32, F32)
QK_NORM_ROPE_QKV(qk_norm_rope_qkv_write_f16, F16)
QK_NORM_ROPE_QKV(qk_norm_rope_qkv_write_bf16, BF16)
