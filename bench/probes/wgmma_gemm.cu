// Probe, not wired into the engine: an exact prefill matmul on wgmma that should give mm_wide's
// bits (bench/probes/wgmma_gemm.py compares them and times both against cuBLAS).
//
// mm_tc's arithmetic, per output element: K in chunks of 32; in each chunk one MMA takes the k set
// {0-3, 8-11, 16-19, 24-27}, the next {4-7, 12-15, 20-23, 28-31}; chunks ascending inside each of
// S slices (s * C / S bounds), slices joined in order (total = p0, then total + p1, ...).
//
// A block of 2 warpgroups computes 128 weight rows x 128 tokens. Weights are wgmma's A operand, from
// registers: lane (g, t) of a warp reads k 8t..8t+7 of its rows g and g+8 (16 bytes each) from
// shared memory, which is mm_tc's own fragment: words 0-1 feed the first MMA, 2-3 the second, and
// the k slot each word fills fixes which k of the tokens must meet it. So the tokens (B, from shared
// memory, K-major) arrive permuted within each chunk (PERM in wgmma_gemm.py; the activation
// conversion would write them so): four 16-byte units per token and chunk, units 0-1 the first MMA's
// k slots 0-15, units 2-3 the second's. A pipeline stage holds KC chunks; the tokens' rows of
// KC * 64 bytes are stored with the hardware's 64-byte (KC 1) or 128-byte (KC 2) swizzle, without
// which the MMA's shared-memory reads conflict eightfold (the unswizzled version ran at mm_wide's
// speed). Weights sit unswizzled, [chunk][row][64 bytes]: a quarter-warp's 16-byte reads are 128
// consecutive bytes.
typedef unsigned short u16;
typedef unsigned u32;
typedef long long i64;

#define ROWS 128  // weight rows per block (2 warpgroups x 64)
#define TOK 128   // tokens per block (the MMA's N)
#ifndef KC
#define KC 2  // 32-k chunks per pipeline stage
#endif
#ifndef TSTAGES
#define TSTAGES 6  // stages in shared memory: TSTAGES - 3 loading ahead
#endif
#define AHEAD (TSTAGES - 3)
#define W_STAGE (KC * ROWS * 64)
#define X_STAGE (KC * TOK * 64)
#define ROW_BYTES (KC * 64)  // one token's row of a stage

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

// K-major, swizzled: 8-token groups ROW_BYTES * 8 apart; the leading offset is unused.
__device__ __forceinline__ unsigned long long desc(unsigned addr) {
    unsigned long long d = (unsigned long long)((addr >> 4) & 0x3fff);
    d |= (unsigned long long)(((ROW_BYTES * 8) >> 4) & 0x3fff) << 32;
    d |= (unsigned long long)(KC == 2 ? 1 : 2) << 62;  // 128-byte : 64-byte swizzle
    return d;
}

// Byte offset of 16-byte unit u of token tok within a stage's tokens (Swizzle<3|2, 4, 3>).
__device__ __forceinline__ int tok_offset(int tok, int u) {
    return tok * ROW_BYTES + ((u ^ ((tok * ROW_BYTES >> 7) & (KC == 2 ? 7 : 3))) << 4);
}

__device__ __forceinline__ void wgmma_ra(float (&d)[64], u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}

extern "C" __global__ void __launch_bounds__(256, 1)
wg_gemm_f16(const u16* __restrict__ w, const u16* __restrict__ xp, float* __restrict__ out, int M, int N,
            int Kp, int Np, int S) {
    extern __shared__ unsigned char smem_raw[];
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * ROWS, m0 = blockIdx.y * TOK;
    const int C = Kp >> 5, stages = (C + KC - 1) / KC;
    const unsigned raw = (unsigned)__cvta_generic_to_shared(smem_raw);
    const unsigned base = (raw + 1023) & ~1023u;  // swizzle atoms aligned
    unsigned char* const sbase = smem_raw + (base - raw);
    const unsigned wbase = base + TSTAGES * X_STAGE;

    auto load_stage = [&](int st) {
        const unsigned xs = base + (st % TSTAGES) * X_STAGE, ws = wbase + (st % TSTAGES) * W_STAGE;
#pragma unroll
        for (int h = 0; h < 2 * KC; ++h) {  // tokens: pairs of threads read one 32-byte sector
            const int i = tid + 256 * h, u = 2 * (i >> 8) + (i & 1), tok = (i >> 1) & (TOK - 1);
            const int c = st * KC + (u >> 2);
            const bool ok = m0 + tok < M && c < C;
            cp_async16(xs + tok_offset(tok, u), xp + (i64)(ok ? m0 + tok : 0) * Kp + (ok ? c * 32 : 0) + (u & 3) * 8,
                       ok ? 16 : 0);
        }
#pragma unroll
        for (int h = 0; h < 2 * KC; ++h) {  // weights: [chunk][row][64 bytes]
            const int i = tid + 256 * h, kc = i >> 9, row = (i >> 2) & (ROWS - 1), u = i & 3;
            const int c = st * KC + kc;
            const bool ok = n0 + row < Np && c < C;
            cp_async16(ws + kc * ROWS * 64 + row * 64 + u * 16,
                       w + (i64)(ok ? n0 + row : 0) * Kp + (ok ? c * 32 : 0) + u * 8, ok ? 16 : 0);
        }
    };

#pragma unroll
    for (int st = 0; st <= AHEAD; ++st) {
        if (st < stages) load_stage(st);
        asm volatile("cp.async.commit_group;\n" ::);
    }

    float part[64], total[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) part[i] = total[i] = 0.f;
    int s = 0, slice_end = (int)((i64)C / S);
    const int wrow = (wg * 64 + warp * 16 + g) * 64 + t * 16;  // this lane's fragment within a chunk

    auto chunk = [&](int c, uint4& a0, uint4& a1) {
        const int st = c / KC, kc = c % KC;
        if (kc == 0) {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(AHEAD));
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // this thread's copies, to wgmma
            __syncthreads();  // every copy of stage st landed; every MMA of stage st - 2 is done
            if (st + AHEAD + 1 < stages) load_stage(st + AHEAD + 1);  // into the buffer of stage st - 2
            asm volatile("cp.async.commit_group;\n" ::);
        }
        const unsigned char* ws = sbase + TSTAGES * X_STAGE + (st % TSTAGES) * W_STAGE + kc * ROWS * 64;
        a0 = *reinterpret_cast<const uint4*>(ws + wrow);
        a1 = *reinterpret_cast<const uint4*>(ws + wrow + 8 * 64);
        const unsigned xs = base + (st % TSTAGES) * X_STAGE + kc * 64;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        wgmma_ra(part, a0.x, a1.x, a0.y, a1.y, desc(xs));
        wgmma_ra(part, a0.z, a1.z, a0.w, a1.w, desc(xs + 32));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        if (c + 1 == slice_end) {
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
            for (int i = 0; i < 64; ++i) {
                total[i] = s == 0 ? part[i] : __fadd_rn(total[i], part[i]);
                part[i] = 0.f;
            }
            ++s;
            slice_end = (int)(((i64)(s + 1) * C) / S);
        } else {
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        }
    };
    uint4 a0, a1, b0, b1;  // two fragments in turn: the one an MMA in flight reads is not overwritten
    for (int c = 0; c < C; c += 2) {
        chunk(c, a0, a1);
        if (c + 1 < C) chunk(c + 1, b0, b1);
    }

    // total[4j + i]: weight row 16 warp + g (+8 for i >= 2), token 8j + 2t (+1 for odd i)
    const int r0 = n0 + wg * 64 + warp * 16 + g;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int n = r0 + (i >= 2 ? 8 : 0);
            const int m = m0 + 8 * j + 2 * t + (i & 1);
            if (n < N && m < M) out[(i64)m * N + n] = total[4 * j + i];
        }
}
