// K/V rows into their cache cells. Cell `slot` of the flat cache [pages * PAGE, n_kv, D] is page
// slot / PAGE, cell slot % PAGE; a negative slot (a padding row of a replayed graph) writes nothing.
// The roundings equal the CPU cache's (f16 round-to-nearest-even, bf16 as kernels.weights rounds).
#include "common.cuh"

template <typename S>
__device__ __forceinline__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                         typename S::T* __restrict__ kc, typename S::T* __restrict__ vc,
                                         const i64* __restrict__ slots, int T, int HD) {
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
