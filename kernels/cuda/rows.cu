// One row per block, 256 threads whatever the batch: a row's reduction order depends only on its
// length. Thread i takes elements i, i + 256, ...; then the warp butterfly, then warps in order.
#include "common.cuh"

#define ROW_THREADS 256

// y = (x * (1 / sqrt(mean(x^2) + eps))) * w, the reference's float32 steps.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int D, float eps) {
    __shared__ float scratch[ROW_THREADS / 32];
    const float* xr = x + (i64)blockIdx.x * D;
    float* yr = y + (i64)blockIdx.x * D;
    float acc = 0.f;
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) acc = __fmaf_rn(xr[i], xr[i], acc);
    const float total = block_sum(acc, scratch, ROW_THREADS / 32);
    const float ms = __fdiv_rn(total, (float)D);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
    for (int i = threadIdx.x; i < D; i += ROW_THREADS) yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
}

// Index of each row's largest value; ties go to the lowest index.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

extern "C" __global__ void __launch_bounds__(ROW_THREADS)
argmax_rows(const float* __restrict__ x, int* __restrict__ out, int V) {
    __shared__ float sv[ROW_THREADS / 32];
    __shared__ int si[ROW_THREADS / 32];
    const float* xr = x + (i64)blockIdx.x * V;
    float v = NEG_INF;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += ROW_THREADS) better(v, idx, xr[i], i);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        better(v, idx, __shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, idx, off));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ROW_THREADS / 32; ++w) better(v, idx, sv[w], si[w]);
        out[blockIdx.x] = idx;
    }
}
