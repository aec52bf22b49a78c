// One row per block, 256 threads whatever the batch: a row's reduction order depends only on its
// length. Thread i takes elements i, i + 256, ...; then the warp butterfly, then warps in order.
#include "common.cuh"

#define ROW_THREADS 256

// y = (x * (1 / sqrt(mean(x^2) + eps))) * w, the reference's float32 steps (rms_inv's order).
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int D, float eps) {
    pdl_start();
    __shared__ float scratch[8];
    const float* xr = x + (i64)blockIdx.x * D;
    float* yr = y + (i64)blockIdx.x * D;
    const float inv = rms_inv(xr, D, eps, scratch);
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
}

// rms_norm's values rounded to the MMA's 16-bit pairs (bf16 or f16, pack_act's rounding), rows of
// Dp >= D zero-padded: the input of the streaming matmul's PRO_X16 build (matmul.cu) or, with
// `perm` (Dp a multiple of 32), of mm_wgmma in act_to_16's `perm` order (perm_word).
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
rms_norm_16(const float* __restrict__ x, const float* __restrict__ w, u16* __restrict__ y, int D, int Dp, float eps,
            int bf16, int perm) {
    pdl_start();
    __shared__ float scratch[8];
    const float* xr = x + (i64)blockIdx.x * D;
    unsigned* yr = reinterpret_cast<unsigned*>(y + (i64)blockIdx.x * Dp);
    const float inv = rms_inv(xr, D, eps, scratch);
    for (int i = threadIdx.x; i < Dp / 2; i += ROW_THREADS) {
        const int k = 2 * i;
        const float lo = k < D ? __fmul_rn(__fmul_rn(xr[k], inv), w[k]) : 0.f;
        const float hi = k + 1 < D ? __fmul_rn(__fmul_rn(xr[k + 1], inv), w[k + 1]) : 0.f;
        yr[perm ? perm_word(i) : i] = bf16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
    }
}

// Index of each row's largest value; ties go to the lowest index.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

// (value, index) of the largest element in each block's span of its row: grid (rows, parts). The
// order of the reduction cannot matter: "larger, or equal with the lower index" is a total order.
__device__ __forceinline__ void block_best(float& v, int& idx) {
    __shared__ float sv[ROW_THREADS / 32];
    __shared__ int si[ROW_THREADS / 32];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        better(v, idx, __shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, idx, off));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < ROW_THREADS / 32; ++w) better(v, idx, sv[w], si[w]);
}

extern "C" __global__ void __launch_bounds__(ROW_THREADS)
argmax_part(const float* __restrict__ x, float* __restrict__ part_v, int* __restrict__ part_i, int V) {
    pdl_start();
    const int span = (V + gridDim.y - 1) / gridDim.y;
    const int lo = blockIdx.y * span, hi = imin(V, lo + span);
    const float* xr = x + (i64)blockIdx.x * V;
    float v = NEG_INF;
    int idx = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += ROW_THREADS) better(v, idx, xr[i], i);
    block_best(v, idx);
    if (threadIdx.x == 0) {
        part_v[blockIdx.x * gridDim.y + blockIdx.y] = v;
        part_i[blockIdx.x * gridDim.y + blockIdx.y] = idx;
    }
}

// One block per row folds its parts; a row whose values are all -inf (or NaN) answers 0.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
argmax_final(const float* __restrict__ part_v, const int* __restrict__ part_i, int* __restrict__ out, int parts) {
    pdl_start();
    float v = NEG_INF;
    int idx = 0x7fffffff;
    for (int p = threadIdx.x; p < parts; p += ROW_THREADS)
        better(v, idx, part_v[blockIdx.x * parts + p], part_i[blockIdx.x * parts + p]);
    block_best(v, idx);
    if (threadIdx.x == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
}
