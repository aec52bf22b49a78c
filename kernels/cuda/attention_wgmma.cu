// Paged prefill attention on Hopper's warpgroup MMA (wgmma, sm_90a): attention_mma.cu's arithmetic,
// element for element, for blocks of 64 MMA rows per warpgroup (plan.wgmma_attention selects it).
//
// Every choice that fixes a row's bits is attn_mma's (read its header): q * scale rounded to 16 bits;
// chunks = logical pages; KT = 64-key sub-tiles ascending; S = q K^T summed over the head dims in
// 16-dim MMA steps ascending; keys past the row's position -inf; the same online softmax (ex2.approx,
// a thread's 16 values ascending then its quad's butterfly: a wgmma accumulator holds each thread's
// values exactly where an m16n8 tile of mma.sync does, d[4j + i] = tile j's c[i]); O = O * alpha + P V
// over the sub-tile's keys in 16-key steps ascending (P rounded to 16 bits, wgmma's A from registers
// in mma.sync's A fragment layout); chunks folded ascending with merge_coeffs/merge_add; O / l, +0.
// What changes is only the instruction: one wgmma m64n64k16 per 16 dims for S and one m64nDk16 per
// 16 keys for P V, whose products and f32 sums round as mma.sync's do (checked on the device for the
// matmul, wgmma.cu; for this kernel by tests/test_cuda_attention_wgmma.py).
//
// A block has WQ consumer warpgroups (64 MMA rows each: 64 / GP query rows of GP heads), RB = 64 WQ
// / GP consecutive launch rows and one KV head (sub-group); rows of different sequences are served in
// passes as in attn_mma. All threads copy K/V sub-tiles with cp.async (keys past the pass's last
// position zero-filled) into an NS-stage ring, each tile stored as two 64-dim halves of 64 rows x
// 128 bytes with the hardware's 128-byte swizzle (16-byte unit u of row r at unit u ^ (r & 7)): K is
// S's B operand K-major, V is P V's B operand N-major (transposed), from the same layout. No split
// over blocks (grid.z 1): the chunks are folded in registers, the folded O kept in shared memory.
// Shared memory: plan.wgmma_attention_smem.
#include "common.cuh"
#include "attention_tc.cuh"

typedef unsigned u32;
typedef unsigned long long u64;

#ifndef WQ
#define WQ 2  // consumer warpgroups a block (plan.wgmma_attention_launch)
#endif
#ifndef NS
#define NS 3  // K/V stages in shared memory (plan.WGMMA_ATTN_STAGES)
#endif

#define D HEAD_DIM
#define KT 64                  // keys per sub-tile (part of the arithmetic)
#define MR (64 * WQ)           // MMA rows a block
#define RB (MR / GP)           // query rows a block
#define RQ (64 / GP)           // query rows a warpgroup
#define NW (4 * WQ)            // warps
#define THREADS (NW * 32)
#define HALF (KT * 128)        // bytes of one 64-dim half of a K or V sub-tile
#define TILE (HALF * (D / 64)) // bytes of a K or V sub-tile
#define LD (D + 8)             // q staging row stride in 16-bit values
#if D % 64
#error "the swizzled tiles are 64-dim halves: HEAD_DIM 64 or 128"
#endif
#if RB > 32
#error "a block's rows are kept in 32-bit masks"
#endif
#if MR * LD * 2 > MR * D * 4
#error "q is staged where the folded O goes"
#endif

#define WG_RS_N64(T, TB) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, " TB ";\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))

#define WG_RS_N128(T, TB) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, " TB ";\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))

// wgmma with A (4 registers a thread, mma.sync's A fragment) and B from shared memory; TB 1: B N-major
template <int N, int TB>
__device__ __forceinline__ void wgmma_rs(float (&acc)[N / 8][4], const u32 (&a)[4], u64 desc) {
    static_assert(N == 64 || N == 128, "m64n64k16 or m64n128k16");
    float(&d)[N / 2] = reinterpret_cast<float(&)[N / 2]>(acc);  // d[4 j + i] is tile j's c[i]
    if constexpr (N == 64 && TB == 0 && KV_T == 2) {
        WG_RS_N64("bf16", "0");
    } else if constexpr (N == 64 && TB == 0) {
        WG_RS_N64("f16", "0");
    } else if constexpr (N == 64 && KV_T == 2) {
        WG_RS_N64("bf16", "1");
    } else if constexpr (N == 64) {
        WG_RS_N64("f16", "1");
    } else if constexpr (KV_T == 2) {
        WG_RS_N128("bf16", "1");
    } else {
        WG_RS_N128("f16", "1");
    }
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

extern "C" __global__ void __launch_bounds__(THREADS, 1)
attn_wgmma(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
           const int* __restrict__ positions, const int* __restrict__ seq, const int* __restrict__ tables, int T,
           int n_heads, int n_kv, int W, float scale, float* __restrict__ out) {
    extern __shared__ unsigned char smem_raw[];
    __shared__ int s_pos[RB], s_seq[RB];
    const u32 raw = (u32)__cvta_generic_to_shared(smem_raw);
    unsigned char* const smem = smem_raw + (((raw + 1023) & ~1023u) - raw);  // swizzle atoms 1024-aligned
    const u32 kbase = (raw + 1023) & ~1023u, vbase = kbase + NS * TILE;  // [NS][TILE] of K, then of V
    float* Os = reinterpret_cast<float*>(smem + 2 * NS * TILE);  // folded O, [D / 2][THREADS]
    u16* Qs = reinterpret_cast<u16*>(Os);                          // q staged there first, [MR][LD]

    int G, h, g0, ng;
    head_group<GP>(n_heads, n_kv, G, h, g0, ng);
    const int r0 = blockIdx.x * RB;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const i64 cell = (i64)n_kv * D;

    stage_rows<RB>(s_pos, s_seq, positions, seq, r0, T, tid, THREADS);
    // sub-tile i of a sequence (table) into stage i % NS; keys past pmax zero-filled
    auto load = [&](const int* table, int pmax, int i) {
        const i64 page = table[i / (PAGE / KT)];
        const int key0 = i * KT, st = i % NS;
        for (int x = tid; x < KT * (D / 8); x += THREADS) {
            const int kr = x / (D / 8), u = x % (D / 8);
            const i64 off = (page * PAGE + key0 % PAGE + kr) * cell + (i64)h * D + u * 8;
            const int at = st * TILE + (u >> 3) * HALF + kr * 128 + (((u & 7) ^ (kr & 7)) << 4);
            const int bytes = key0 + kr <= pmax ? 16 : 0;
            cp_async16(smem + at, kc + off, bytes);
            cp_async16(smem + NS * TILE + at, vc + off, bytes);
        }
    };
    pdl_start();

    stage_q<D, GP, MR, MR, false, KV_T>(Qs, LD, q, scale, s_pos, r0, n_heads, h, G, g0, ng, tid, THREADS);
    u32 qa[D / 16][4];  // the warp's 16 rows of q as A fragments (attn_mma's)
    q_fragments<D>(qa, Qs, LD, warp * 16, lane);

    int jr[2], qh[2];
    bool ok[2];
    row_slots<GP, RB, MR, false>(jr, qh, ok, warp * 16, g, h, G, g0, ng, s_pos);

    unsigned todo = live_rows(s_pos, RB);
    bool first = true;
    while (todo) {
        int sq, pmax;
        const unsigned act = pass_rows(todo, s_seq, s_pos, RB, sq, pmax);
        todo &= ~act;
        const int* table = tables + (i64)sq * W;
        const int n = pmax / KT + 1;  // sub-tiles of the pass: chunk i / 4, sub-tile i % 4
        int p[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) p[e] = ok[e] && ((act >> jr[e]) & 1u) ? s_pos[jr[e]] : -1;

        float oc[D / 8][4], M[2], L[2], mc[2], lc[2];
        bool have[2] = {false, false};
        clear_chunk(oc, mc, lc);
#pragma unroll
        for (int e = 0; e < 2; ++e) M[e] = L[e] = 0.f;

        if (!first) __syncthreads();  // the last pass's stages read by every warpgroup
        first = false;
#pragma unroll
        for (int i = 0; i < NS - 1; ++i) {
            if (i < n) load(table, pmax, i);
            cp_async_commit();
        }
        for (int i = 0; i < n; ++i) {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(NS - 2));
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async wrote it, wgmma reads it
            __syncthreads();  // tile i is in; every warpgroup is done with tile i - 1, whose stage is refilled
            if (i + NS - 1 < n) load(table, pmax, i + NS - 1);
            cp_async_commit();
            const int c = i / (PAGE / KT), st = i % NS;
            {  // every warpgroup, in the pass or not: wgmma in a divergent branch is serialised
                float s[KT / 8][4];
#pragma unroll
                for (int j = 0; j < KT / 8; ++j)
#pragma unroll
                    for (int x = 0; x < 4; ++x) s[j][x] = 0.f;
                wg_fence();
#pragma unroll
                for (int ks = 0; ks < D / 16; ++ks)
                    wgmma_rs<KT, 0>(s, qa[ks], desc128(kbase + st * TILE + (ks >> 2) * HALF + (ks & 3) * 32, 0));
                wg_commit();
                wg_wait0();
                online_softmax<EX2>(s, oc, mc, lc, p, i * KT + 2 * t);
                u32 pa[KT / 16][4];  // P as A fragments (attn_mma's), all packed before the first MMA reads any
#pragma unroll
                for (int kk = 0; kk < KT / 16; ++kk) {
                    pa[kk][0] = pack16(s[2 * kk][0], s[2 * kk][1]);
                    pa[kk][1] = pack16(s[2 * kk][2], s[2 * kk][3]);
                    pa[kk][2] = pack16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    pa[kk][3] = pack16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                }
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < KT / 16; ++kk)
                    wgmma_rs<D, 1>(oc, pa[kk], desc128(vbase + st * TILE + kk * 16 * 128, HALF));
                wg_commit();
                wg_wait0();
            }
            if ((i + 1) % (PAGE / KT) == 0 || i + 1 == n) {  // chunk c done: folded into the row's state
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (p[e] < 0 || c > p[e] / PAGE) continue;
                    fold_chunk(e, oc, mc[e], lc[e], have[e], M[e], L[e], Os, tid, THREADS);
                }
                clear_chunk(oc, mc, lc);
            }
        }
        store_rows<OUT16, D, D / 8>(out, p, jr, qh, r0, n_heads, t, 0, Os, tid, THREADS, L);
    }
}
