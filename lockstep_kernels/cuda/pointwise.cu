// Elementwise ops: each output element depends on its own inputs only, so row invariance is free;
// the roundings are spelled out so the results equal the NumPy reference's float32 steps.
#include "common.cuh"

// x, y: [T, H, Dh]; cos/sin: [positions, Dh / 2]. neox rotates pairs (i, i + Dh/2), else (2i, 2i+1).
extern "C" __global__ void rope(const float* __restrict__ x, float* __restrict__ y, const int* __restrict__ positions,
                                const float* __restrict__ cos_t, const float* __restrict__ sin_t, int T, int H,
                                int Dh, int neox) {
    pdl_start();
    const int half = Dh >> 1;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * H * half) return;
    const int j = (int)(i % half);
    const i64 rh = i / half;  // row * H + head
    const int r = (int)(rh / H);
    const i64 at = (i64)positions[r] * half + j;
    const float c = cos_t[at], s = sin_t[at];
    const i64 base = rh * Dh;
    const i64 i1 = base + (neox ? j : 2 * j), i2 = base + (neox ? j + half : 2 * j + 1);
    rotate(x[i1], x[i2], c, s, y[i1], y[i2]);
}

// gate / (1 + exp(-gate)) * up, y [T, F]; gate and up rows are `ld` floats apart (the two halves
// of a fused gate|up matmul's output rows, read in place).
extern "C" __global__ void silu_mul(const float* __restrict__ gate, const float* __restrict__ up,
                                    float* __restrict__ y, int T, int F, i64 ld) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * F) return;
    const i64 at = (i / F) * ld + i % F;
    y[i] = silu_times(gate[at], up[at]);
}

// silu_mul of a gated product stored as 16-column tiles of 8 gate then the matching 8 up columns
// (Ops.upload_gate_up's "tiles"): y2 [T, 2F] -> y [T, F].
extern "C" __global__ void silu_tiles(const float* __restrict__ y2, float* __restrict__ y, int T, int F) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * F) return;
    const int f = (int)(i % F);
    const i64 at = (i / F) * 2 * F + (f >> 3) * 16 + (f & 7);
    y[i] = silu_times(y2[at], y2[at + 8]);
}

extern "C" __global__ void add(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                               i64 n) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(a[i], b[i]);
}

// Rows of a stored table to float32: table [V, Kp], out [T, K].
template <typename S>
__device__ __forceinline__ void embed_rows(const typename S::T* __restrict__ table, const int* __restrict__ ids,
                                           float* __restrict__ out, int T, int K, int Kp) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * K) return;
    const int r = (int)(i / K), k = (int)(i % K);
    out[i] = S::load(table, (i64)ids[r] * Kp + k);
}

extern "C" __global__ void embed_f32(const float* t, const int* ids, float* out, int T, int K, int Kp) {
    embed_rows<F32>(t, ids, out, T, K, Kp);
}
extern "C" __global__ void embed_f16(const u16* t, const int* ids, float* out, int T, int K, int Kp) {
    embed_rows<F16>(t, ids, out, T, K, Kp);
}
extern "C" __global__ void embed_bf16(const u16* t, const int* ids, float* out, int T, int K, int Kp) {
    embed_rows<BF16>(t, ids, out, T, K, Kp);
}
// q8_0: value = q * d, d the block's f16 scale (the ggml rule, as lockstep_kernels.weights dequantizes)
extern "C" __global__ void embed_q8(const signed char* __restrict__ t, const u16* __restrict__ scales,
                                    const int* __restrict__ ids, float* __restrict__ out, int T, int K, int Kp) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)T * K) return;
    const int r = (int)(i / K), k = (int)(i % K);
    const i64 row = ids[r];
    out[i] = __fmul_rn((float)t[row * Kp + k], f16_to_f32(scales[row * (Kp >> 5) + (k >> 5)]));
}
// Q4_K / Q5_K / Q6_K in kquant.py's planes (`nib`, `aux`; TOP: with the top-bit plane): each value as
// gguf dequantises it (kq_value)
#define EMBED_KQ(NAME, Q6, TOP)                                                                           \
    extern "C" __global__ void NAME(const unsigned char* __restrict__ nib, const unsigned char* __restrict__ aux, \
                                    const int* __restrict__ ids, float* __restrict__ out, int T, int K, int N) { \
        pdl_start();                                                                                      \
        const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;                                         \
        if (i >= (i64)T * K) return;                                                                      \
        const int r = (int)(i / K), k = (int)(i % K);                                                     \
        out[i] = kq_value(kq_planes(nib, aux, TOP, (N + 15) >> 4, K >> 5), Q6, K >> 5, ids[r], k, TOP);   \
    }
EMBED_KQ(embed_q4k, false, false)
EMBED_KQ(embed_q5k, false, true)
EMBED_KQ(embed_q6k, true, true)
