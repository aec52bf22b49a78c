// Paged prefill attention on wgmma, warp-specialised (sm_90a; plan.WgmmaAttentionLaunch.ws): the bits of
// attention_wgmma.cu (so attn_mma's, whose header fixes them) in FlashAttention-3's block structure.
//
// A block is three warpgroups: a producer that fills an NS-stage K/V ring by cp.async (the same
// swizzled tiles, keys past the pass's last position zero-filled), each stage guarded by a "full"
// mbarrier (cp.async.mbarrier.arrive: the producer's 128 copies landed) and an "empty" one (every
// consumer thread done with it), so no block-wide barrier runs in the key loop; and two consumers of 64
// MMA rows each. A consumer issues S of sub-tile i + 1 together with P V of sub-tile i (one commit
// group) and takes turns with the other one through two named barriers (ping-pong), so one's softmax
// runs while the other's MMAs keep the tensor cores busy. The producer gives up registers to the
// consumers (setmaxnreg). A row's arithmetic is unchanged: the softmax of sub-tile i + 1 runs after
// P V of sub-tile i has landed (and after its chunk was folded), in the order attention_wgmma.cu has.
// Shared memory: plan.wgmma_attention_smem(head_dim, 2, NS).
#include "common.cuh"
#include "attention_tc.cuh"
#include "attention_wgmma.cuh"

#ifndef NS
#define NS 4  // K/V stages (plan.WGMMA_WS_STAGES)
#endif
#ifndef PP
#define PP 1  // the consumers take turns issuing their MMAs (plan.WGMMA_WS_PINGPONG)
#endif
#ifndef OV
#define OV 1  // a consumer's softmax of sub-tile i + 1 overlaps its P V of i (plan.WGMMA_WS_OVERLAP)
#endif
#ifndef MK
#define MK 0  // the key-past-position compares skipped where a row sees the whole sub-tile (plan.WGMMA_WS_SKIP_MASK)
#endif
#ifndef LN
// fewer instructions a sub-tile, the same arithmetic (plan.WGMMA_WS_LEAN): S and a chunk's first P V
// overwrite their accumulators (scale-d 0) instead of adding to zeroed ones, so no zeroing and no
// rescale of a chunk's (zero) O; descriptors as one base plus constants; the row max as a tree
#define LN 0
#endif
#ifndef FZ
#define FZ 0  // softmax weights by ex2_ftz where P is f16 (plan.WGMMA_WS_FTZ; row_weights says why the bits stay)
#endif
#define FTZ_W (FZ && KV_T == 1)
#ifndef VF
#define VF 0  // the folded O in shared memory as float2s (plan.WGMMA_WS_VEC_FOLD; fold_vec)
#endif
#ifndef TK
// K/V sub-tiles by TMA, one thread's four boxes (plan.WGMMA_WS_TMA; with LN only): the same swizzled tiles;
// a pass's last sub-tile, whose keys past its last position must read zero, by load_kv_rows
#define TK 0
#endif
#if TK && !LN
#error "TK is a lean build's"
#endif
#if LN
typedef unsigned SUBTILE;  // stage and round of a count by shifts
#else
typedef int SUBTILE;
#endif

#define MR 128                 // MMA rows a block: two consumer warpgroups
#define RB (MR / GP)           // query rows a block
#define CONSUMERS 256
#define THREADS (CONSUMERS + 128)
#if RB > 32
#error "a block's rows are kept in 32-bit masks"
#endif

__device__ __forceinline__ void mbar_init(u32 bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile("{\n.reg .pred p;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
#if TK
struct __align__(64) TensorMap {
    unsigned long long v[16];  // CUtensorMap of a cache as [pages x PAGE keys][heads x D], 64 x 64 boxes
};
// arrives on bar and adds `bytes` to the transfers its phase waits for
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// box (column c0, row c1) of map into shared memory at dst (128-byte swizzled), completing on bar
__device__ __forceinline__ void tma_box(u32 dst, const TensorMap* map, int c0, int c1, u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
#endif
// arrives on bar once this thread's cp.asyncs so far have landed (counted in the barrier's init count)
__device__ __forceinline__ void cp_async_arrive(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// v, the same in every lane, from lane 0: ptxas may then keep it (and what is computed from it) in uniform
// registers, as the wgmma descriptors must be
__device__ __forceinline__ u32 uniform(u32 v) { return __shfl_sync(0xffffffffu, v, 0); }
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
attn_ws(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
        const int* __restrict__ positions, const int* __restrict__ seq, const int* __restrict__ tables, int T,
        int n_heads, int n_kv, int W, float scale, float* __restrict__ out
#if TK
        , const __grid_constant__ TensorMap kmap, const __grid_constant__ TensorMap vmap
#endif
        ) {
    extern __shared__ unsigned char smem_raw[];
    __shared__ int s_pos[RB], s_seq[RB];
    __shared__ __align__(8) u64 s_bar[2 * NS];  // full[NS], then empty[NS]
    const u32 raw = (u32)__cvta_generic_to_shared(smem_raw);
    unsigned char* const smem = smem_raw + (((raw + 1023) & ~1023u) - raw);  // swizzle atoms 1024-aligned
    const u32 kbase = (raw + 1023) & ~1023u, vbase = kbase + NS * TILE;  // [NS][TILE] of K, then of V
    const u32 full = (u32)__cvta_generic_to_shared(s_bar), empty = full + 8 * NS;
    // the rings' descriptors' low words: a stage's and a step's offsets (16-byte units) add to the start
    // field, which holds every address of the block's shared memory without carrying into the next field
    const u32 klo = LN ? uniform((u32)desc128(kbase, 0)) : 0, vlo = LN ? uniform((u32)desc128(vbase, HALF)) : 0;
    constexpr u64 DHI = (u64)(1024 >> 4) << 32 | 1ull << 62;  // desc128's stride and swizzle, K's and V's
    float* Os = reinterpret_cast<float*>(smem + 2 * NS * TILE);  // folded O, [D / 2][CONSUMERS]
    u16* Qs = reinterpret_cast<u16*>(Os);                          // q staged there first, [MR][LD]

    int G, h, g0, ng;
    head_group<GP>(n_heads, n_kv, G, h, g0, ng);
    const int r0 = blockIdx.x * RB;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const i64 cell = (i64)n_kv * D;

    if (tid == 0)
        for (int st = 0; st < NS; ++st) {
            mbar_init(full + 8 * st, 128);
            mbar_init(empty + 8 * st, CONSUMERS);
        }
    stage_rows<RB>(s_pos, s_seq, positions, seq, r0, T, tid, THREADS);  // its barrier publishes the inits
    pdl_start();
    stage_q<D, GP, MR, MR, false, KV_T>(Qs, LD, q, scale, s_pos, r0, n_heads, h, G, g0, ng, tid, THREADS);

    if (warp >= CONSUMERS / 32) {  // the producer: every pass's sub-tiles in order, stage k % NS
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        const int pt = tid - CONSUMERS;
        unsigned todo = live_rows(s_pos, RB);
        int k = 0;
        while (todo) {
            int sq, pmax;
            todo &= ~pass_rows(todo, s_seq, s_pos, RB, sq, pmax);
            const int* table = tables + (i64)sq * W;
            for (int i = 0; i < pmax / KT + 1; ++i, ++k) {
                const int st = k % NS;
                if (k >= NS) mbar_wait(empty + 8 * st, (k / NS - 1) & 1);
#if TK
                if (pmax - i * KT >= KT - 1) {  // every key of the sub-tile at or before pmax: its boxes
                    if (pt == 0) {
                        // the stage's last fill may have been copies (generic proxy): ordered before the boxes
                        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                        mbar_expect_tx(full + 8 * st, 2 * TILE);
                        const int row = table[i / (PAGE / KT)] * PAGE + i * KT % PAGE;
#pragma unroll
                        for (int hf = 0; hf < D / 64; ++hf) {
                            tma_box(kbase + st * TILE + hf * HALF, &kmap, h * D + hf * 64, row, full + 8 * st);
                            tma_box(vbase + st * TILE + hf * HALF, &vmap, h * D + hf * 64, row, full + 8 * st);
                        }
                    } else {
                        mbar_arrive(full + 8 * st);
                    }
                    continue;
                }
#endif
                if (LN)
                    load_kv_rows(smem, NS, kc, vc, table, pmax, i, st, h, cell, pt);
                else
                    load_kv(smem, NS, kc, vc, table, pmax, i, st, h, cell, pt, 128);
                cp_async_arrive(full + 8 * st);
            }
        }
        for (int j = k < NS ? 0 : k - NS; j < k; ++j) mbar_wait(empty + 8 * (j % NS), (j / NS) & 1);  // all landed
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    const int wg = warp >> 2;
    u32 qa[D / 16][4];  // the warp's 16 rows of q as A fragments (attn_mma's)
    q_fragments<D>(qa, Qs, LD, warp * 16, lane);
    bar_sync(3, CONSUMERS);  // every fragment read before a fold writes Os over Qs

    int jr[2], qh[2];
    bool ok[2];
    row_slots<GP, RB, MR, false>(jr, qh, ok, warp * 16, g, h, G, g0, ng, s_pos);
    // turns: warpgroup w issues its MMAs after bar_sync(1 + w), then lets the other one go; 0 first
    const int mine = 1 + wg, other = 2 - wg;
    if (PP && wg == 1) bar_arrive(other, CONSUMERS);

    unsigned todo = live_rows(s_pos, RB);
    SUBTILE k = 0;  // sub-tiles consumed so far, all passes: stage k % NS, its round k / NS
    while (todo) {
        int sq, pmax;
        const unsigned act = pass_rows(todo, s_seq, s_pos, RB, sq, pmax);
        todo &= ~act;
        const int n = pmax / KT + 1;  // sub-tiles of the pass: chunk i / 4, sub-tile i % 4
        int p[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) p[e] = ok[e] && ((act >> jr[e]) & 1u) ? s_pos[jr[e]] : -1;

        float oc[D / 8][4], M[2], L[2], mc[2], lc[2], s[KT / 8][4];
        u32 pa[KT / 16][4];  // P as A fragments (attn_mma's), all packed before the first MMA reads any
        bool have[2] = {false, false};
        clear_chunk(oc, mc, lc);
#pragma unroll
        for (int e = 0; e < 2; ++e) M[e] = L[e] = 0.f;

        auto scores = [&](int st) {  // S of the sub-tile in stage st into s (issued, not waited for)
            if (LN) {
                const u32 kd = uniform(klo + (u32)st * (TILE >> 4));
                wgmma_rs<KT, 0, 0>(s, qa[0], DHI | kd);
#pragma unroll
                for (int ks = 1; ks < D / 16; ++ks)
                    wgmma_rs<KT, 0>(s, qa[ks], DHI | (kd + (((ks >> 2) * HALF + (ks & 3) * 32) >> 4)));
            } else {
#pragma unroll
                for (int ks = 0; ks < D / 16; ++ks)
                    wgmma_rs<KT, 0>(s, qa[ks], desc128(kbase + st * TILE + (ks >> 2) * HALF + (ks & 3) * 32, 0));
            }
        };
        // O += P V of sub-tile i of the pass in stage st (LN: O = P V at a chunk's first sub-tile)
        auto values = [&](int st, int i) {
            if (LN) {
                const u32 vd = uniform(vlo + (u32)st * (TILE >> 4));
                wgmma_rs<D, 1, -1>(oc, pa[0], DHI | vd, (unsigned)i % (PAGE / KT));
#pragma unroll
                for (int kk = 1; kk < KT / 16; ++kk) wgmma_rs<D, 1>(oc, pa[kk], DHI | (vd + (kk * 16 * 128 >> 4)));
            } else {
#pragma unroll
                for (int kk = 0; kk < KT / 16; ++kk)
                    wgmma_rs<D, 1>(oc, pa[kk], desc128(vbase + st * TILE + kk * 16 * 128, HALF));
            }
        };
        auto zero_s = [&]() {
            if (!LN)  // LN: S's first MMA overwrites
#pragma unroll
                for (int j = 0; j < KT / 8; ++j)
#pragma unroll
                    for (int x = 0; x < 4; ++x) s[j][x] = 0.f;
        };
        auto pack = [&]() {
#pragma unroll
            for (int kk = 0; kk < KT / 16; ++kk) {
                pa[kk][0] = pack16(s[2 * kk][0], s[2 * kk][1]);
                pa[kk][1] = pack16(s[2 * kk][2], s[2 * kk][3]);
                pa[kk][2] = pack16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[kk][3] = pack16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
        };
        auto arrived = [&](SUBTILE kk) {  // sub-tile kk's stage filled and visible to the MMAs
            mbar_wait(full + 8 * (kk % NS), (kk / NS) & 1);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async wrote it, wgmma reads it
        };
        auto chunk_end = [&](int i) { return (i + 1) % (PAGE / KT) == 0 || i + 1 == n; };
        auto fold = [&](int i, const float (&m)[2], const float (&l)[2]) {  // chunk of sub-tile i into the rows
            const int c = i / (PAGE / KT);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (p[e] < 0 || c > p[e] / PAGE) continue;
                fold_chunk<D / 8, VF>(e, oc, m[e], l[e], have[e], M[e], L[e], Os, tid, CONSUMERS);
            }
        };
        // the weights of the sub-tile in s, O scaled unless LN and the sub-tile opens a chunk (O overwritten)
        auto softmax = [&](const int (&pp)[2], int kb, bool opens) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float alpha = row_weights<EX2, KT / 8, MK, LN, FTZ_W>(s, mc[e], lc[e], pp[e], kb, e);
                if (!LN || !opens) rescale_row(oc, alpha, e);
            }
        };
        auto turn = [&]() {
            if (PP) bar_sync(mine, CONSUMERS);
        };
        auto hand_over = [&]() {
            if (PP) bar_arrive(other, CONSUMERS);
        };

        // every warpgroup, in the pass or not: wgmma in a divergent branch is serialised
        arrived(k);
        turn();
        zero_s();
        wg_fence();
        scores(k % NS);
        wg_commit();
        hand_over();
        wg_wait0();
        softmax(p, 2 * t, true);
        pack();
        if (n > 1) arrived(k + 1);
        for (int i = 0; i + 1 < n; ++i) {  // S of i + 1 with P V of i
            turn();
            zero_s();
            wg_fence();
            scores((k + i + 1) % NS);
            wg_commit();
            values((k + i) % NS, i);
            wg_commit();
            hand_over();
            const bool end = chunk_end(i);
            const int kb = (i + 1) * KT + 2 * t;
#if OV  // S of i + 1's weights while P V of i runs (it reads pa, adds into oc: neither touched)
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            float m[2] = {mc[0], mc[1]}, l[2] = {lc[0], lc[1]}, alpha[2];
            if (end)
#pragma unroll
                for (int e = 0; e < 2; ++e) mc[e] = NEG_INF, lc[e] = 0.f;  // the next chunk's state
#pragma unroll
            for (int e = 0; e < 2; ++e) alpha[e] = row_weights<EX2, KT / 8, MK, LN, FTZ_W>(s, mc[e], lc[e], p[e], kb, e);
            // the next sub-tile's wait here (a loop) keeps ptxas from hoisting the wait for P V above the softmax
            if (i + 2 < n) arrived(k + i + 2);
            wg_wait0();
            mbar_arrive(empty + 8 * ((k + i) % NS));
            if (end) {
                fold(i, m, l);
                if (!LN) clear_chunk(oc, m, l);  // LN: the chunk's first P V overwrites O
            }
            if (!LN || !end)
#pragma unroll
                for (int e = 0; e < 2; ++e) rescale_row(oc, alpha[e], e);
#else
            if (i + 2 < n) arrived(k + i + 2);
            wg_wait0();
            mbar_arrive(empty + 8 * ((k + i) % NS));
            if (end) {
                fold(i, mc, lc);
                if (LN) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) mc[e] = NEG_INF, lc[e] = 0.f;
                } else {
                    clear_chunk(oc, mc, lc);
                }
            }
            softmax(p, kb, end);
#endif
            pack();
        }
        turn();
        wg_fence();
        values((k + n - 1) % NS, n - 1);
        wg_commit();
        hand_over();
        wg_wait0();
        mbar_arrive(empty + 8 * ((k + n - 1) % NS));
        fold(n - 1, mc, lc);
        k += n;
        store_rows<OUT16, D, D / 8, VF>(out, p, jr, qh, r0, n_heads, t, 0, Os, tid, CONSUMERS, L);
    }
    if (PP && wg == 0) bar_sync(mine, CONSUMERS);  // the other's last turn handed over
}
