// Paged attention on tensor cores (mma.sync m16n8k16, 16-bit inputs, f32 accumulation), one arithmetic
// for prefill and decode rows of a 16-bit cache.
//
// An MMA row is (query row, query head of its KV head's group): a warp's 16 rows hold 16 / GP query
// rows of GP heads each (GP: the group rounded up to a power of two, at most 16). A query row's
// arithmetic depends on its position alone:
//   q        q * scale (f32), rounded to the cache's 16-bit type;
//   chunks   keys cut at page boundaries (chunk c = logical page c, found through the block table);
//   sub-tiles a chunk's keys in KT = 64-key sub-tiles, ascending: S = q K^T (mma over the head dims
//            in 16-dim steps, ascending); keys past the row's position -inf; an online softmax in
//            registers (running max m, alpha = 2^((m_old - m_new) log2 e), exactly 1 where the max
//            did not move, P = 2^(S log2 e - m_new log2 e) as one fused multiply-add, both by the SFU's
//            ex2.approx (a few instructions where expf takes a dozen: EX2 0 builds expf); the sum
//            of P in a fixed order: a thread's 16 values ascending, then its quad's xor butterfly),
//            O = O * alpha + P V (P rounded to 16 bits, mma over the sub-tile's keys in 16-key steps);
//   merge    the chunks' (O, m, l) folded in ascending order with merge_coeffs/merge_add from
//            common.cuh, then O / l (+0: a zero's sign never depends on what shares the tile).
// An MMA row's products do not depend on the other rows of the tile, nor on where in the tile it
// sits (verified bit for bit on the device: tests/test_cuda_attention.py), and a sub-tile past a row's
// position adds exact zeros with alpha = 1, so a decode row alone gets the bits of the same row inside
// a prefill tile or beside padding.
//
// A block takes RB consecutive launch rows and one KV head (a sub-group of its query heads); rows of
// different sequences among them are served in passes, one per sequence. DW warps share each 16 MMA
// rows (a decode row: more warps to issue the K/V loads): each computes the same S and softmax and
// keeps DT / DW of O's dim tiles, whose MMAs are those of one warp keeping all. With gridDim.z > 1
// (flash-decoding) block z takes chunks z, z + Z, ..., stores each chunk's partial as it is and
// attention.cu's attn_merge folds them (merge_chunks, D threads a row and head: the fold's chain is
// long at long contexts); with one block the partials are folded in registers in the same order.
// Either way the same bits. K/V sub-tiles go to shared memory through cp.async (two stages); keys
// past the pass's last position are zero-filled. Shared memory: mma_attention_smem in
// lockstep_kernels/cuda/plan.py.
#include "common.cuh"
#include "attention_tc.cuh"

#ifndef RB
#define RB 16
#endif
#ifndef DW
#define DW 1  // warps that share 16 MMA rows, each keeping DT / DW of O's dim tiles (S computed by each)
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1  // blocks an SM the registers must allow (plan.mma_attention_launch)
#endif
#ifndef SHARE_S
#define SHARE_S 0  // with DW > 1: each warp computes its share of S's key tiles, all read S from shared memory
#endif

#define D HEAD_DIM
#define KT 64                 // keys per sub-tile (part of the arithmetic)
#define MR (RB * GP)          // MMA rows a block uses
#define RW ((MR + 15) / 16)   // warps of distinct rows
#define NW (RW * DW)          // warps
#define THREADS (NW * 32)
#define LD (D + 8)            // shared row stride in 16-bit values: rows 16 bytes apart in banks
#define NT (KT / 8)           // key tiles of S
#define DT (D / 8)            // dim tiles of O
#define DTW (DT / DW)         // dim tiles of O a warp keeps
#define STAGE (KT * LD)
#define SHS (SHARE_S && DW > 1)
#define JPW (NT / 2 / DW)     // pairs of S's key tiles a warp computes when they are shared (SHS)
#define SLD (KT + 8)          // shared S row stride in floats: rows g of a quad's stores 8 banks apart
#if RW * 16 > KT
#error "q is staged in one K/V stage: at most KT MMA rows a block"
#endif
#if (DT / 2) % DW
#error "a warp's share of O must be whole pairs of dim tiles"
#endif
#if SHS && (NT / 2) % DW
#error "a warp's share of S must be whole pairs of key tiles"
#endif

__device__ __forceinline__ void mma16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if KV_T == 2
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ unsigned pack16(float lo, float hi) { return pack16_kv<KV_T>(lo, hi); }

__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const u16* p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
attn_mma(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
         const int* __restrict__ positions, const int* __restrict__ seq, const int* __restrict__ tables,
         float* __restrict__ part, int T, int n_heads, int n_kv, int W, float scale, float* __restrict__ out) {
    extern __shared__ __align__(16) unsigned char smem[];
    u16* Ks = reinterpret_cast<u16*>(smem);  // [2][KT][LD]
    u16* Vs = Ks + 2 * STAGE;
    u16* Qs = Vs + STAGE;  // [RW * 16 <= KT][LD]: q staged in V's second stage, before any pass loads it
    // the folded chunks' O of each thread's rows and dims, [DTW * 4][THREADS]: touched once a chunk, so out
    // of registers (only without a split: then the partials go to `part`, and the launch leaves this out)
#if SHS
    float* Ss = reinterpret_cast<float*>(Vs + 2 * STAGE);  // [RW * 16][SLD]: the sub-tile's S, of every warp's tiles
    float* Os = Ss + RW * 16 * SLD;
#else
    float* Os = reinterpret_cast<float*>(Vs + 2 * STAGE);
#endif
    __shared__ int s_pos[RB], s_seq[RB];

    int G, h, g0, ng;
    head_group<GP>(n_heads, n_kv, G, h, g0, ng);
    const int r0 = blockIdx.x * RB;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wr = warp / DW, n0 = (warp % DW) * DTW;  // the warp's 16 rows, its first dim tile of O
    const i64 cell = (i64)n_kv * D;
    const bool split = gridDim.z > 1;

    // step inputs (positions, seq, tables) are copied in before a captured step's first kernel
    stage_rows<RB>(s_pos, s_seq, positions, seq, r0, T, tid, THREADS);
    int maxlast = -1;
    for (int j = 0; j < RB; ++j) maxlast = max(maxlast, s_pos[j] < 0 ? -1 : s_pos[j] / PAGE);
    // blocks sized for a longer context than these rows reach leave at once
    if ((int)blockIdx.z > maxlast) return;
    // K and V sub-tile `sub` of chunk c of a sequence (table) into stage st; keys past pmax zero-filled
    auto load = [&](const int* table, int pmax, int c, int sub, int st) {
        const i64 page = table[c];
        for (int i = tid; i < KT * (D / 8); i += THREADS) {
            const int kr = i / (D / 8), u = i % (D / 8);
            const i64 off = (page * PAGE + sub * KT + kr) * cell + (i64)h * D + u * 8;
            const int bytes = c * PAGE + sub * KT + kr <= pmax ? 16 : 0;
            cp_async16(Ks + st * STAGE + kr * LD + u * 8, kc + off, bytes);
            cp_async16(Vs + st * STAGE + kr * LD + u * 8, vc + off, bytes);
        }
        cp_async_commit();
    };
    // A one-row block's first sub-tile goes out before the wait (while the kernel before still runs)
    // where its keys lie T or more positions before the row's: the cells this step writes are those
    // of its rows, and a sequence's rows in a launch are consecutive positions (later launches of a
    // step run after the write has finished). Stage 0 only: q is staged in V's stage 1.
    const bool early = RB == 1 && (int)blockIdx.z * PAGE + KT + T <= s_pos[0];
    if (early) load(tables + (i64)s_seq[0] * W, s_pos[0], blockIdx.z, 0, 0);
    pdl_start();

    stage_q<D, GP, RW * 16, MR, true, KV_T>(Qs, LD, q, scale, s_pos, r0, n_heads, h, G, g0, ng, tid, THREADS);
    unsigned qa[D / 16][4];  // the warp's q as MMA A fragments, for every sub-tile of every pass
    q_fragments<D>(qa, Qs, LD, wr * 16, lane);

    // this thread's two MMA rows (g and g + 8 of its warp's 16): query row, head, validity
    int jr[2], qh[2];
    bool ok[2];
    row_slots<GP, RB, MR, true>(jr, qh, ok, wr * 16, g, h, G, g0, ng, s_pos);

    unsigned todo = live_rows(s_pos, RB);
    while (todo) {
        int sq, pmax;
        const unsigned act = pass_rows(todo, s_seq, s_pos, RB, sq, pmax);
        todo &= ~act;
        const int lastc = pmax / PAGE;
        if ((int)blockIdx.z > lastc) continue;
        const int* table = tables + (i64)sq * W;
        int p[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) p[e] = ok[e] && ((act >> jr[e]) & 1u) ? s_pos[jr[e]] : -1;
        const bool busy = __any_sync(0xffffffffu, p[0] >= 0 || p[1] >= 0);
        auto subs = [&](int c) { return c < lastc ? PAGE / KT : (pmax % PAGE) / KT + 1; };

        float oc[DTW][4], M[2], L[2], mc[2], lc[2];
        bool have[2] = {false, false};
        clear_chunk(oc, mc, lc);
#pragma unroll
        for (int e = 0; e < 2; ++e) M[e] = L[e] = 0.f;

        int c = blockIdx.z, sub = 0, st = 0;
        __syncthreads();  // q read (first pass), the stages free
        if (!early) load(table, pmax, c, 0, 0);
        while (true) {
            int nc = c, ns = sub + 1;
            if (ns >= subs(c)) nc = c + gridDim.z, ns = 0;
            const bool more = nc <= lastc;
            if (more) {
                load(table, pmax, nc, ns, st ^ 1);
                asm volatile("cp.async.wait_group 1;\n" ::);
            } else {
                asm volatile("cp.async.wait_group 0;\n" ::);
            }
            __syncthreads();
#if SHS
            // S's key tiles split over the DW warps of these rows (an S value is the same MMA whichever warp
            // issues it), exchanged through shared memory: each warp then has the whole sub-tile's S
            if (busy) {
                const u16* Kt = Ks + st * STAGE;
                const int jw = (warp % DW) * JPW;
                float sw[2 * JPW][4];
#pragma unroll
                for (int j = 0; j < 2 * JPW; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) sw[j][i] = 0.f;
#pragma unroll
                for (int ks = 0; ks < D / 16; ++ks) {
                    const unsigned(&a)[4] = qa[ks];
#pragma unroll
                    for (int jj = 0; jj < JPW; ++jj) {
                        unsigned b[4];
                        ldsm_x4(b, Kt + ((jw + jj) * 16 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 16 +
                                       ((lane >> 3) & 1) * 8);
                        mma16(sw[2 * jj], a, b[0], b[1]);
                        mma16(sw[2 * jj + 1], a, b[2], b[3]);
                    }
                }
                float* sr = Ss + (wr * 16 + g) * SLD + 2 * jw * 8 + 2 * t;
#pragma unroll
                for (int j = 0; j < 2 * JPW; ++j) {
                    *reinterpret_cast<float2*>(sr + j * 8) = make_float2(sw[j][0], sw[j][1]);
                    *reinterpret_cast<float2*>(sr + 8 * SLD + j * 8) = make_float2(sw[j][2], sw[j][3]);
                }
            }
            __syncthreads();
            if (busy) {
                const u16* Vt = Vs + st * STAGE;
                float s[NT][4];
                const float* sr = Ss + (wr * 16 + g) * SLD + 2 * t;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const float2 lo = *reinterpret_cast<const float2*>(sr + j * 8);
                    const float2 hi = *reinterpret_cast<const float2*>(sr + 8 * SLD + j * 8);
                    s[j][0] = lo.x, s[j][1] = lo.y, s[j][2] = hi.x, s[j][3] = hi.y;
                }
#else
            if (busy) {
                const u16* Kt = Ks + st * STAGE;
                const u16* Vt = Vs + st * STAGE;
                float s[NT][4];
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) s[j][i] = 0.f;
#pragma unroll
                for (int ks = 0; ks < D / 16; ++ks) {
                    const unsigned(&a)[4] = qa[ks];
#pragma unroll
                    for (int jt = 0; jt < NT / 2; ++jt) {
                        unsigned b[4];
                        ldsm_x4(b, Kt + (jt * 16 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 16 + ((lane >> 3) & 1) * 8);
                        mma16(s[2 * jt], a, b[0], b[1]);
                        mma16(s[2 * jt + 1], a, b[2], b[3]);
                    }
                }
#endif
                online_softmax<EX2>(s, oc, mc, lc, p, c * PAGE + sub * KT + 2 * t);
#pragma unroll
                for (int kk = 0; kk < KT / 16; ++kk) {
                    const unsigned a[4] = {pack16(s[2 * kk][0], s[2 * kk][1]), pack16(s[2 * kk][2], s[2 * kk][3]),
                                           pack16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                           pack16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                    for (int dp = 0; dp < DTW / 2; ++dp) {
                        unsigned b[4];
                        ldsm_x4_t(b, Vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (n0 / 2 + dp) * 16 +
                                         (lane >> 4) * 8);
                        mma16(oc[2 * dp], a, b[0], b[1]);
                        mma16(oc[2 * dp + 1], a, b[2], b[3]);
                    }
                }
            }
            __syncthreads();  // the stage is free for the load after next
            if (ns == 0 || !more) {  // chunk c done: its partial stored, or folded into the row's state
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (p[e] < 0 || c > p[e] / PAGE) continue;
                    if (split) {
                        float* dst = part + (((i64)(r0 + jr[e]) * n_heads + qh[e]) * W + c) * (D + 2);
#pragma unroll
                        for (int n = 0; n < DTW; ++n) {
                            dst[(n0 + n) * 8 + 2 * t] = oc[n][2 * e];
                            dst[(n0 + n) * 8 + 2 * t + 1] = oc[n][2 * e + 1];
                        }
                        if (t == 0 && n0 == 0) dst[D] = mc[e], dst[D + 1] = lc[e];
                    } else {
                        fold_chunk(e, oc, mc[e], lc[e], have[e], M[e], L[e], Os, tid, THREADS);
                    }
                }
                clear_chunk(oc, mc, lc);
            }
            if (!more) break;
            c = nc, sub = ns, st ^= 1;
        }
        if (!split) store_rows<OUT16, D, DTW>(out, p, jr, qh, r0, n_heads, t, n0, Os, tid, THREADS, L);
    }
}
