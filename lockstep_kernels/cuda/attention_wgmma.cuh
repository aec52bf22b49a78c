// The warpgroup MMAs attention_wgmma.cu and attention_ws.cu issue (sm_90a): S = q K^T and O += P V with
// A from registers in mma.sync's fragment layout, B from 128-byte-swizzled shared memory. Pasted after
// common.cuh and attention_tc.cuh (lockstep_kernels/cuda/modules.py).

typedef unsigned u32;
typedef unsigned long long u64;

#define D HEAD_DIM
#define KT 64                  // keys per sub-tile (part of the arithmetic)
#define HALF (KT * 128)        // bytes of one 64-dim half of a K or V sub-tile
#define TILE (HALF * (D / 64)) // bytes of a K or V sub-tile
#define LD (D + 8)             // q staging row stride in 16-bit values
#if D % 64
#error "the swizzled tiles are 64-dim halves: HEAD_DIM 64 or 128"
#endif

// Sub-tile i of a sequence (its page table) by cp.async into stage st of the K ring at smem and of the V
// ring ns stages on, as two 64-dim halves of 64 keys x 128 bytes, 16-byte unit u of key row r at unit
// u ^ (r & 7); units x0, x0 + step, ...; keys past pmax zero-filled (never read from the cache)
__device__ __forceinline__ void load_kv(unsigned char* smem, int ns, const u16* kc, const u16* vc, const int* table,
                                        int pmax, int i, int st, int h, i64 cell, int x0, int step) {
    const i64 page = table[i / (PAGE / KT)];
    const int key0 = i * KT;
    for (int x = x0; x < KT * (D / 8); x += step) {
        const int kr = x / (D / 8), u = x % (D / 8);
        const i64 off = (page * PAGE + key0 % PAGE + kr) * cell + (i64)h * D + u * 8;
        const int at = st * TILE + (u >> 3) * HALF + kr * 128 + (((u & 7) ^ (kr & 7)) << 4);
        const int bytes = key0 + kr <= pmax ? 16 : 0;
        cp_async16(smem + at, kc + off, bytes);
        cp_async16(smem + ns * TILE + at, vc + off, bytes);
    }
}

// load_kv's copies (the same bytes to the same places) by a thread x0 of 128 with its loop strength-reduced:
// it copies unit u = x0 % (D / 8) of key rows r0 = x0 / (D / 8) + ROWS it, whose swizzle row (r & 7) is r0's,
// so its addresses step by constants
__device__ __forceinline__ void load_kv_rows(unsigned char* smem, int ns, const u16* kc, const u16* vc, const int* table,
                                             int pmax, int i, int st, int h, i64 cell, int x0) {
    constexpr int UNITS = D / 8, ROWS = 128 / UNITS, ITERS = KT / ROWS;
    static_assert(ROWS % 8 == 0 && KT % ROWS == 0, "whole swizzle atoms a step");
    const int u = x0 % UNITS, r0 = x0 / UNITS;
    const i64 page = table[i / (PAGE / KT)];
    const int key0 = i * KT;
    const i64 off = (page * PAGE + key0 % PAGE + r0) * cell + (i64)h * D + u * 8, step = ROWS * cell;
    unsigned char* at = smem + st * TILE + (u >> 3) * HALF + r0 * 128 + (((u & 7) ^ (r0 & 7)) << 4);
    const int last = pmax - key0 - r0;  // row r0 + ROWS it is copied while ROWS it <= last, else zero-filled
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        const int bytes = ROWS * it <= last ? 16 : 0;
        cp_async16(at + it * ROWS * 128, kc + off + it * step, bytes);
        cp_async16(at + ns * TILE + it * ROWS * 128, vc + off + it * step, bytes);
    }
}

#define WG_RS_N64(T, TB, SD, ...) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SD ", 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, " TB ";\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc) __VA_ARGS__)

#define WG_RS_N128(T, TB, SD, ...) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SD ", 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, " TB ";\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc) __VA_ARGS__)

// wgmma with A (4 registers a thread, mma.sync's A fragment) and B from shared memory; TB 1: B N-major.
// SD_ 1: acc += A B; 0: acc = A B (acc's old values unread); -1: as sd (non-zero: accumulate)
template <int N, int TB, int SD_ = 1>
__device__ __forceinline__ void wgmma_rs(float (&acc)[N / 8][4], const u32 (&a)[4], u64 desc, int sd = 1) {
    static_assert(N == 64 || N == 128, "m64n64k16 or m64n128k16");
    float(&d)[N / 2] = reinterpret_cast<float(&)[N / 2]>(acc);  // d[4 j + i] is tile j's c[i]
#define WG_RS_ALL(SD64, SD128, ...) \
    if constexpr (N == 64 && TB == 0 && KV_T == 2) { \
        WG_RS_N64("bf16", "0", SD64, __VA_ARGS__); \
    } else if constexpr (N == 64 && TB == 0) { \
        WG_RS_N64("f16", "0", SD64, __VA_ARGS__); \
    } else if constexpr (N == 64 && KV_T == 2) { \
        WG_RS_N64("bf16", "1", SD64, __VA_ARGS__); \
    } else if constexpr (N == 64) { \
        WG_RS_N64("f16", "1", SD64, __VA_ARGS__); \
    } else if constexpr (KV_T == 2) { \
        WG_RS_N128("bf16", "1", SD128, __VA_ARGS__); \
    } else { \
        WG_RS_N128("f16", "1", SD128, __VA_ARGS__); \
    }
    if constexpr (SD_ == 1) {
        WG_RS_ALL("1", "1", );
    } else if constexpr (SD_ == 0) {
        WG_RS_ALL("0", "0", );
    } else {
        WG_RS_ALL("%37", "%69", , "r"(sd));
    }
#undef WG_RS_ALL
}

// 128-byte swizzle descriptors. K-major (K for S): 8-key groups 1024 bytes apart, the leading offset
// unused (a 16-dim step stays inside a 128-byte row). N-major (V for P V): 8-key groups 1024 bytes
// apart (stride), 64-dim halves HALF bytes apart (leading).
__device__ __forceinline__ u64 desc128(u32 addr, u32 lead) {
    return (u64)((addr >> 4) & 0x3fff) | ((u64)((lead >> 4) & 0x3fff) << 16) | ((u64)((1024 >> 4) & 0x3fff) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

__device__ __forceinline__ u32 pack16(float lo, float hi) { return pack16_kv<KV_T>(lo, hi); }
