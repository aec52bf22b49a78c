// Probe, not wired into the engine: an exact prefill matmul on wgmma that should give mm_wide's
// bits (bench/probes/wgmma_gemm.py compares them and times both against cuBLAS).
//
// mm_tc's arithmetic, per output element: K in chunks of 32; in each chunk one MMA takes the k set
// {0-3, 8-11, 16-19, 24-27}, the next {4-7, 12-15, 20-23, 28-31} (the order inside one instruction
// does not change the bits: bench/results/wgmma-bits-h200.json); chunks ascending inside each of S
// slices (s * C / S bounds), slices joined in order. Here: a block of 2 warpgroups computes 128
// weight rows x 128 tokens; each 32-k chunk of both operands is copied into shared memory in 8-byte
// pieces so that each set is 16 consecutive k of a K-major, unswizzled layout: element (row, kpos)
// at (kpos / 8) * 2048 + (row / 8) * 128 + (row % 8) * 16 + (kpos % 8) * 2 bytes. Each warpgroup
// issues wgmma m64n128k16 on its 64 rows for set A, then set B.
typedef unsigned short u16;
typedef long long i64;

#define TILE 128
#define STAGES 4
#define STAGE_BYTES (2 * TILE * 64)  // weights then tokens, 32 k of 16 bits each

__device__ __forceinline__ void cp_async8(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ unsigned long long desc(unsigned addr) {
    unsigned long long d = (unsigned long long)((addr >> 4) & 0x3fff);
    d |= (unsigned long long)((2048 >> 4) & 0x3fff) << 16;  // leading: the next 8 k
    d |= (unsigned long long)((128 >> 4) & 0x3fff) << 32;   // stride: the next 8 rows
    return d;
}

__device__ __forceinline__ void wgmma128(float (&d)[64], unsigned long long da, unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db));
}

extern "C" __global__ void __launch_bounds__(256, 1)
wg_gemm_f16(const u16* __restrict__ w, const u16* __restrict__ x16, float* __restrict__ out, int M, int N,
            int Kp, int Np, int S) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int n0 = blockIdx.x * TILE, m0 = blockIdx.y * TILE;
    const int C = Kp >> 5;
    const unsigned base = (unsigned)__cvta_generic_to_shared(smem);

    auto load = [&](int c, int stage) {
        const unsigned st = base + stage * STAGE_BYTES;
        for (int i = tid; i < 2 * TILE * 8; i += 256) {
            const int op = i >> 10, r = (i >> 3) & (TILE - 1), j = i & 7;
            const int kpos = (j & 1) * 16 + (j >> 1) * 4;
            const unsigned dst = st + op * TILE * 64 + (kpos >> 3) * 2048 + (r >> 3) * 128 + (r & 7) * 16 + (kpos & 7) * 2;
            const bool ok = op == 0 ? n0 + r < Np : m0 + r < M;
            const u16* src = op == 0 ? w + (i64)(ok ? n0 + r : 0) * Kp : x16 + (i64)(ok ? m0 + r : 0) * Kp;
            cp_async8(dst, src + c * 32 + 4 * j, ok ? 8 : 0);
        }
    };

    float part[64], total[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) part[i] = total[i] = 0.f;

#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < C) load(st, st);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    int s = 0, slice_end = (int)((i64)C / S);
    for (int c = 0; c < C; ++c) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // this thread's copies, to wgmma
        __syncthreads();
        if (c + STAGES - 1 < C) load(c + STAGES - 1, (c + STAGES - 1) % STAGES);
        asm volatile("cp.async.commit_group;\n" ::);
        const unsigned st = base + (c % STAGES) * STAGE_BYTES;
        const unsigned a = st + wg * 8 * 128, b = st + TILE * 64;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        wgmma128(part, desc(a), desc(b));                  // k set A: kpos 0-15
        wgmma128(part, desc(a + 2 * 2048), desc(b + 2 * 2048));  // k set B: kpos 16-31
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (c + 1 == slice_end) {
#pragma unroll
            for (int i = 0; i < 64; ++i) {
                total[i] = s == 0 ? part[i] : __fadd_rn(total[i], part[i]);
                part[i] = 0.f;
            }
            ++s;
            slice_end = (int)(((i64)(s + 1) * C) / S);
        }
        __syncthreads();  // the stage just read is the next one loaded
    }

    // d[4j + i]: row 16 warp + g (+8 for i >= 2), column 8j + 2t (+1 for odd i)
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int n = n0 + wg * 64 + warp * 16 + g + (i >= 2 ? 8 : 0);
            const int m = m0 + 8 * j + 2 * t + (i & 1);
            if (n < N && m < M) out[(i64)m * N + n] = total[4 * j + i];
        }
}
