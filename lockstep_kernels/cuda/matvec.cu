// One-row matmuls on 16-bit weights (decode): out[N] = x[K] @ w[N, K]^T with the sums of matmul.cu's
// streaming kernel (mm_tc, PRO_ONE / PRO_NORM), so a row's bits do not change with the batch width:
// S = plan.split_k warps split a 16-row tile's 32-k chunks into mm_tc's contiguous ranges, each
// accumulated in ascending chunk order by the same two m16n8k16 MMAs on the same operands, the S
// partials added in slice order p0 + p1 + ... .
//
// What differs is only how the loads are issued: a ring of MV_ST batches of MV_U chunks a warp is in
// flight (mm_tc issues one batch, then waits for it), blocks walk several row tiles (grid-stride, so
// a block's prologue is paid once for them), and the row's activations are packed once a block into
// shared memory as the MMA's 16-bit pairs (optionally normalised first: rms_inv over a staged copy,
// rms_norm's bits), so no chunk waits on an activation load.
#include "common.cuh"

#ifndef MV_U
#define MV_U 4  // chunks a batch
#endif
#ifndef MV_ST
#define MV_ST 2  // batches in flight a warp
#endif
#ifndef MV_MAX_WARPS
#define MV_MAX_WARPS 16  // plan.MV_MAX_SPLIT: registers for the ring at this block size
#endif
#ifndef MV_HINT
#define MV_HINT 1  // weights read once: no L1 allocation, 256-byte L2 prefetch
#endif

#define MV_NORM 1   // rms_norm of the row (rows.cu's bits)
#define MV_GATED 2  // gated_rms_norm of each `seg` values of the row against `gate` (deltanet.cu's bits)
#define MV_MAX_SEGS 128

__device__ __forceinline__ float mv_sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

// rms_inv of D values by one warp: its virtual warps one after another, their sums added in order
// (rms_inv's arithmetic, which spreads the virtual warps over a block).
__device__ __forceinline__ float warp_rms_inv(const float* xr, int D, float eps) {
    const int lane = threadIdx.x & 31;
    float s = 0.f;
    for (int vw = 0; vw < 8; ++vw) {
        float acc = 0.f;
        for (int i = vw * 32 + lane; i < D; i += 256) acc = __fmaf_rn(xr[i], xr[i], acc);
        acc = warp_sum(acc);
        s = vw == 0 ? acc : __fadd_rn(s, acc);
    }
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(s, (float)D), eps)));
}

__device__ __forceinline__ uint4 mv_load(const u16* p) {
#if MV_HINT
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
#else
    return __ldg(reinterpret_cast<const uint4*>(p));
#endif
}

#define MV_MMA(T)                                                    \
    "mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 "         \
    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"

template <bool BF>
__device__ __forceinline__ void mv_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                       unsigned b1) {
    if (BF)
        asm volatile(MV_MMA("bf16") : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile(MV_MMA("f16") : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 32-k chunk into the accumulator: lane (g, t) holds rows g, g + 8 at k 8t .. 8t + 7 (wa, wb) and
// token 0's pairs of the same k (bx; zero on the lanes of tokens 1-7), mm_tc's a_frags and row_pairs.
template <bool BF>
__device__ __forceinline__ void mv_chunk(float (&d)[4], uint4 wa, uint4 wb, uint4 bx) {
    mv_mma<BF>(d, wa.x, wb.x, wa.y, wb.y, bx.x, bx.y);
    mv_mma<BF>(d, wa.z, wb.z, wa.w, wb.w, bx.z, bx.w);
}

// The row as 16-bit pairs in shared memory, words [0, Kp / 2), zero past K (mm_tc's pack_act of
// load_x8's values); with MV_NORM normalised as rms_norm does (rms_inv's order over a staged copy,
// then (x * inv) * w), with MV_GATED as gated_rms_norm does each segment. `xf`: Kp floats of shared
// memory (MV_NORM, MV_GATED).
template <bool BF, int PRO>
__device__ __forceinline__ void mv_pack_row(const float* __restrict__ x, int K, int Kp, const float* __restrict__ nw,
                                            float eps, const float* __restrict__ gate, int seg, unsigned* xs, float* xf,
                                            float* scratch) {
    const int tid = threadIdx.x, nt = blockDim.x;
    const bool vec = (K & 3) == 0 && (reinterpret_cast<unsigned long long>(x) & 15) == 0;
    if (PRO & (MV_NORM | MV_GATED)) {
        if (vec) {
            for (int i = tid; i < K / 4; i += nt) reinterpret_cast<float4*>(xf)[i] = reinterpret_cast<const float4*>(x)[i];
        } else {
            for (int i = tid; i < K; i += nt) xf[i] = x[i];
        }
        __syncthreads();
    }
    if (PRO & MV_GATED) {  // y = ((x * inv) * w) * silu(gate), inv per segment of `seg` values
        __shared__ float seg_inv[MV_MAX_SEGS];
        for (int h = tid >> 5; h < K / seg; h += nt >> 5) {
            const float v = warp_rms_inv(xf + h * seg, seg, eps);
            if ((tid & 31) == 0) seg_inv[h] = v;
        }
        __syncthreads();
        for (int i = tid; i < Kp / 2; i += nt) {
            float y[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int k = 2 * i + e;
                const float g = k < K ? gate[k] : 0.f;
                y[e] = k < K ? __fmul_rn(__fmul_rn(__fmul_rn(xf[k], seg_inv[k / seg]), nw[k % seg]), __fmul_rn(g, mv_sigmoid(g)))
                             : 0.f;
            }
            xs[i] = BF ? pack_bf16x2(y[0], y[1]) : pack_f16x2(y[0], y[1]);
        }
    } else if (PRO & MV_NORM) {
        const float inv = rms_inv(xf, K, eps, scratch);
        for (int i = tid; i < Kp / 2; i += nt) {
            const int k = 2 * i;
            const float lo = k < K ? __fmul_rn(__fmul_rn(xf[k], inv), nw[k]) : 0.f;
            const float hi = k + 1 < K ? __fmul_rn(__fmul_rn(xf[k + 1], inv), nw[k + 1]) : 0.f;
            xs[i] = BF ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
        }
    } else if (vec) {
        for (int i = tid; i < Kp / 4; i += nt) {
            const int k = 4 * i;
            const float4 f = k < K ? reinterpret_cast<const float4*>(x)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
            xs[2 * i] = BF ? pack_bf16x2(f.x, f.y) : pack_f16x2(f.x, f.y);
            xs[2 * i + 1] = BF ? pack_bf16x2(f.z, f.w) : pack_f16x2(f.z, f.w);
        }
    } else {
        for (int i = tid; i < Kp / 2; i += nt) {
            const int k = 2 * i;
            const float lo = k < K ? x[k] : 0.f, hi = k + 1 < K ? x[k + 1] : 0.f;
            xs[i] = BF ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
        }
    }
    __syncthreads();
}

// Dynamic shared memory (plan.matvec_smem): the packed row (Kp / 2 words), the staged row (MV_NORM,
// MV_GATED: Kp floats), and two buffers of warps 1 .. S-1's partials (one barrier a tile: a buffer is written
// again only after warp 0 passed the next tile's barrier, so after it read the buffer).
template <bool BF, int PRO>
__device__ __forceinline__ void mv_tc(const u16* __restrict__ w, const float* __restrict__ x,
                                      const float* __restrict__ bias, const float* __restrict__ res,
                                      float* __restrict__ out, int N, int K, int Kp, int flags,
                                      const float* __restrict__ nw, float eps, const float* __restrict__ gate, int seg) {
    extern __shared__ __align__(16) unsigned mv_smem[];
    __shared__ float scratch[8];
    const int S = blockDim.x >> 5, s = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int C = Kp >> 5;
    const int c_begin = (int)(((i64)s * C) / S), c_end = (int)(((i64)(s + 1) * C) / S);
    const int nbt = ((C + S - 1) / S + MV_U - 1) / MV_U;  // batches a tile, the same for every warp
    const int tiles = (N + 15) >> 4;
    const int mine = tiles > (int)blockIdx.x ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int total = mine * nbt;
    unsigned* xs = mv_smem;
    float* xf = reinterpret_cast<float*>(mv_smem + Kp / 2);
    float* red = reinterpret_cast<float*>(mv_smem + Kp / 2 + ((PRO & (MV_NORM | MV_GATED)) ? Kp : 0));

    uint4 wa[MV_ST][MV_U], wb[MV_ST][MV_U];
    auto issue = [&](int st, int b) {
        if (b >= total) return;
        const int tile = (int)blockIdx.x + (b / nbt) * (int)gridDim.x, c0 = c_begin + (b % nbt) * MV_U;
        const u16* ra = w + (i64)(tile * 16 + g) * Kp + 8 * t;
        const u16* rb = ra + (i64)8 * Kp;
#pragma unroll
        for (int u = 0; u < MV_U; ++u)
            if (c0 + u < c_end) {
                wa[st][u] = mv_load(ra + (c0 + u) * 32);
                wb[st][u] = mv_load(rb + (c0 + u) * 32);
            }
    };
    // The first batches are in flight while the previous kernel finishes (weights are never written).
#pragma unroll
    for (int st = 0; st < MV_ST; ++st) issue(st, st);
    pdl_start();
    mv_pack_row<BF, PRO>(x, K, Kp, nw, eps, gate, seg, xs, xf, scratch);
    const uint4* xs4 = reinterpret_cast<const uint4*>(xs);

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int b0 = 0; b0 < total; b0 += MV_ST) {
#pragma unroll
        for (int st = 0; st < MV_ST; ++st) {
            const int b = b0 + st;
            if (b >= total) break;
            const int j = b / nbt, q = b - j * nbt, c0 = c_begin + q * MV_U;
#pragma unroll
            for (int u = 0; u < MV_U; ++u)
                if (c0 + u < c_end) {
                    const uint4 bx = lane < 4 ? xs4[(c0 + u) * 4 + t] : make_uint4(0u, 0u, 0u, 0u);
                    mv_chunk<BF>(acc, wa[st][u], wb[st][u], bx);
                }
            issue(st, b + MV_ST);
            if (q != nbt - 1) continue;
            // The tile's sums: warp 0 adds the partials in slice order (mm_tc's combine), then stores.
            const int n0 = ((int)blockIdx.x + j * (int)gridDim.x) * 16;
            float a0 = acc[0], a2 = acc[2];
            acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
            if (S > 1) {
                float* buf = red + (j & 1) * (S - 1) * 16;
                if (s > 0 && t == 0) {
                    buf[((s - 1) * 8 + g) * 2] = a0;
                    buf[((s - 1) * 8 + g) * 2 + 1] = a2;
                }
                __syncthreads();
                if (s != 0) continue;
                for (int p = 1; p < S; ++p) {
                    a0 = __fadd_rn(a0, buf[((p - 1) * 8 + g) * 2]);
                    a2 = __fadd_rn(a2, buf[((p - 1) * 8 + g) * 2 + 1]);
                }
            }
            if (t != 0) continue;
            if (flags & EPI_SILU) {
                const float v = silu_times(a0, a2);
                const i64 at = (n0 >> 1) + g;
                if (flags & EPI_OUT16)
                    reinterpret_cast<u16*>(out)[at] = (u16)((BF ? pack_bf16x2(v, 0.f) : pack_f16x2(v, 0.f)) & 0xffffu);
                else
                    out[at] = v;
            } else {
                if (n0 + g < N) out[n0 + g] = epilogue(a0, bias, res, 0, n0 + g, N, flags);
                if (n0 + g + 8 < N) out[n0 + g + 8] = epilogue(a2, bias, res, 0, n0 + g + 8, N, flags);
            }
        }
    }
}

#define MV_KERNEL(NAME, BF, PRO)                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * MV_MAX_WARPS) NAME(                                \
        const u16* w, const float* x, const float* bias, const float* res, float* out, int N, int K, int Kp, \
        int flags, const float* nw, float eps, const float* gate, int seg) {                             \
        mv_tc<BF, PRO>(w, x, bias, res, out, N, K, Kp, flags, nw, eps, gate, seg);                       \
    }

MV_KERNEL(mv_f16_one, false, 0)
MV_KERNEL(mv_f16_norm, false, MV_NORM)
MV_KERNEL(mv_f16_gated, false, MV_GATED)
MV_KERNEL(mv_bf16_one, true, 0)
MV_KERNEL(mv_bf16_norm, true, MV_NORM)
MV_KERNEL(mv_bf16_gated, true, MV_GATED)
