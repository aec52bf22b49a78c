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
#include "attention_wgmma.cuh"

#ifndef WQ
#define WQ 2  // consumer warpgroups a block (plan.wgmma_attention_launch)
#endif
#ifndef NS
#define NS 3  // K/V stages in shared memory (plan.WGMMA_ATTN_STAGES)
#endif

#define MR (64 * WQ)           // MMA rows a block
#define RB (MR / GP)           // query rows a block
#define RQ (64 / GP)           // query rows a warpgroup
#define NW (4 * WQ)            // warps
#define THREADS (NW * 32)
#if RB > 32
#error "a block's rows are kept in 32-bit masks"
#endif
#if MR * LD * 2 > MR * D * 4
#error "q is staged where the folded O goes"
#endif

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
        load_kv(smem, NS, kc, vc, table, pmax, i, i % NS, h, cell, tid, THREADS);
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
