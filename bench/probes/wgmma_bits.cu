// Does wgmma round like mma.sync? One warpgroup per trial computes D = A B + C (A 64x16, B 16x8
// f16, C 64x8 f32) five ways: mma.sync m16n8k16 per warp; the same with the k order reversed and
// with k xor 8 (is the order inside one instruction visible?); wgmma m64n8k16 with A from
// registers (RS) and from shared memory (SS). Shared operands are K-major without swizzle:
// element (row, k) at (k / 8) * kstride + (row / 8) * rstride + (row % 8) * 16 + (k % 8) * 2
// bytes; `lbo_is_k` says which descriptor field gets which stride (bench/probes/wgmma_bits.py
// tries both and keeps the one that computes the product).
typedef unsigned short u16;

__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned long long desc(const void* smem, int kstride, int rstride, int lbo_is_k) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    const int lbo = lbo_is_k ? kstride : rstride, sbo = lbo_is_k ? rstride : kstride;
    unsigned long long d = (unsigned long long)((addr >> 4) & 0x3fff);
    d |= (unsigned long long)((lbo >> 4) & 0x3fff) << 16;
    d |= (unsigned long long)((sbo >> 4) & 0x3fff) << 32;
    return d;  // base offset 0, layout type 0: no swizzle
}

__device__ __forceinline__ int perm(int k, int mode) { return mode == 1 ? 15 - k : (mode == 2 ? k ^ 8 : k); }

__device__ __forceinline__ int smem_index(int row, int k, int kstride, int rstride) {
    return ((k >> 3) * kstride + (row >> 3) * rstride + (row & 7) * 16) / 2 + (k & 7);
}

extern "C" __global__ void __launch_bounds__(128) probe(const u16* A, const u16* B, const float* C, float* out,
                                                        int lbo_is_k, int variant) {
    __shared__ __align__(128) u16 as[64 * 16];
    __shared__ __align__(128) u16 bs[8 * 16];
    const int trial = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const u16* a = A + trial * 64 * 16;  // [row][k]
    const u16* b = B + trial * 16 * 8;   // [k][n]
    const float* c = C + trial * 64 * 8;
    float* o = out + (long long)trial * 64 * 8;
    const int AK = 1024, AR = 128, BK = 128, BR = 256;  // A: k groups 1024 B apart, 8-row groups 128 B
    for (int i = tid; i < 64 * 16; i += 128) as[smem_index(i / 16, i % 16, AK, AR)] = a[i];
    for (int i = tid; i < 16 * 8; i += 128) bs[smem_index(i % 8, i / 8, BK, BR)] = b[i];
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    const int r0 = warp * 16 + g, r1 = r0 + 8;
    auto apair = [&](int row, int kl, int mode) {
        return (unsigned)a[row * 16 + perm(kl, mode)] | ((unsigned)a[row * 16 + perm(kl + 1, mode)] << 16);
    };
    auto bpair = [&](int kl, int mode) {
        return (unsigned)b[perm(kl, mode) * 8 + g] | ((unsigned)b[perm(kl + 1, mode) * 8 + g] << 16);
    };
    auto store = [&](int v, const float (&d)[4]) {
        float* ov = o;
        ov[r0 * 8 + 2 * t] = d[0];
        ov[r0 * 8 + 2 * t + 1] = d[1];
        ov[r1 * 8 + 2 * t] = d[2];
        ov[r1 * 8 + 2 * t + 1] = d[3];
    };
    if (variant < 3) {
        const int mode = variant;
        float d[4] = {c[r0 * 8 + 2 * t], c[r0 * 8 + 2 * t + 1], c[r1 * 8 + 2 * t], c[r1 * 8 + 2 * t + 1]};
        mma16816(d, apair(r0, 2 * t, mode), apair(r1, 2 * t, mode), apair(r0, 2 * t + 8, mode),
                 apair(r1, 2 * t + 8, mode), bpair(2 * t, mode), bpair(2 * t + 8, mode));
        store(mode, d);
        return;
    }
    const unsigned long long db = desc(bs, BK, BR, lbo_is_k), da = desc(as, AK, AR, lbo_is_k);
    if (variant == 3) {
        float d[4] = {c[r0 * 8 + 2 * t], c[r0 * 8 + 2 * t + 1], c[r1 * 8 + 2 * t], c[r1 * 8 + 2 * t + 1]};
        const unsigned a0 = apair(r0, 2 * t, 0), a1 = apair(r1, 2 * t, 0), a2 = apair(r0, 2 * t + 8, 0),
                       a3 = apair(r1, 2 * t + 8, 0);
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                     "wgmma.fence.sync.aligned;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n"
                     "wgmma.commit_group.sync.aligned;\n"
                     "wgmma.wait_group.sync.aligned 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1)
                     : "memory");
        store(3, d);
    }
    if (variant == 4) {
        float d[4] = {c[r0 * 8 + 2 * t], c[r0 * 8 + 2 * t + 1], c[r1 * 8 + 2 * t], c[r1 * 8 + 2 * t + 1]};
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                     "wgmma.fence.sync.aligned;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n"
                     "wgmma.commit_group.sync.aligned;\n"
                     "wgmma.wait_group.sync.aligned 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "l"(da), "l"(db), "r"(1)
                     : "memory");
        store(4, d);
    }
}
