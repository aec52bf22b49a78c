// The recurrent half of hybrid models (Gated DeltaNet): causal conv1d, the chunked gated delta rule
// for prompt rows and the token-by-token rule for generated rows.
//
// Row invariance by construction: every block works on one sequence (and one head, and one slice of
// value columns) and walks that sequence's rows in a fixed order; no block reads another
// sequence's rows or state, and no loop bound depends on how many sequences share the launch.
// Prompt rows advance the state in chunks of CH positions counted from `origin` (0 in exact mode:
// the same chunks whatever piece of the prompt a step holds). Each value column of a head's state
// evolves by itself, so splitting the columns across blocks cannot change a column's arithmetic.
//
// A sequence's descriptor (DESC i64 values): first row, rows, position of the first row, chunk
// origin, address of its state, its snapshots [lo, hi) in snap_rel (offsets from the first row,
// ascending). Its state: per recurrent layer (layer_off floats apart) the conv window [K - 1, D]
// then the delta-rule state [heads, KD, VD].
#include "common.cuh"

#define DESC 8
#define MAXK 8          // widest causal conv supported
#define CONV_THREADS 128
#define CHUNK_THREADS 256

__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

// torch's softplus threshold: above 20, softplus(x) is x in float32
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The decay log-rate of a row of one head: -exp(a_log) * softplus(a + dt_bias)
__device__ __forceinline__ float decay_log(float a, float a_log, float dt_bias) {
    return __fmul_rn(-expf(a_log), softplus_f(__fadd_rn(a, dt_bias)));
}

__device__ __forceinline__ float* state_of(const i64* d, i64 off) { return reinterpret_cast<float*>(d[4]) + off; }

// x [T, D] (rows ldx floats apart) through each sequence's causal depthwise conv (w [D, K]) and
// silu into out [T, D]; the window moves on by the rows. A thread per (channel, sequence): the taps
// are added oldest first. At each snapshot offset o the window (the inputs before position
// start + o) goes to snap_conv [n_snap, K - 1, D].
extern "C" __global__ void __launch_bounds__(CONV_THREADS)
conv1d_silu(const float* __restrict__ x, i64 ldx, const float* __restrict__ w, float* __restrict__ out,
            const i64* __restrict__ desc, int D, int K, i64 layer_off, const int* __restrict__ snap_rel,
            float* __restrict__ snap_conv) {
    pdl_start();
    const int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= D) return;
    const i64* d = desc + (i64)blockIdx.y * DESC;
    const i64 row0 = d[0];
    const int n = (int)d[1];
    if (n == 0) return;  // a padding row of a replayed decode graph: no state behind it
    float* st = state_of(d, layer_off);
    float wt[MAXK], hist[MAXK];
#pragma unroll
    for (int j = 0; j < MAXK; ++j) {
        wt[j] = j < K ? w[(i64)c * K + j] : 0.f;
        hist[j] = j < K - 1 ? st[(i64)j * D + c] : 0.f;
    }
    int sk = (int)d[5];
    const int shi = (int)d[6];
    for (int r = 0; r < n; ++r) {
        const float xin = x[(row0 + r) * ldx + c];
#pragma unroll
        for (int j = 0; j < MAXK; ++j)  // the window then the new input: K values (static indices: registers)
            if (j == K - 1) hist[j] = xin;
        float acc = __fmul_rn(hist[0], wt[0]);
#pragma unroll
        for (int j = 1; j < MAXK; ++j)
            if (j < K) acc = __fadd_rn(acc, __fmul_rn(hist[j], wt[j]));
        out[(row0 + r) * D + c] = __fmul_rn(acc, sigmoid_f(acc));
#pragma unroll
        for (int j = 0; j + 1 < MAXK; ++j)
            if (j < K - 1) hist[j] = hist[j + 1];
        for (; sk < shi && snap_rel[sk] == r + 1; ++sk) {
#pragma unroll
            for (int j = 0; j + 1 < MAXK; ++j)
                if (j < K - 1) snap_conv[((i64)sk * (K - 1) + j) * D + c] = hist[j];
        }
    }
#pragma unroll
    for (int j = 0; j + 1 < MAXK; ++j)
        if (j < K - 1) st[(i64)j * D + c] = hist[j];
}

// Sum of squares of a head's KD values in smem, in one fixed order for the block (thread i takes
// i, i + blockDim, ... ascending; warps meet in index order); `red`: a float per warp.
__device__ __forceinline__ float block_sumsq(const float* v, int KDn, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float acc = 0.f;
    for (int i = threadIdx.x; i < KDn; i += blockDim.x) acc = __fmaf_rn(v[i], v[i], acc);
    acc = warp_sum(acc);
    __syncthreads();
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    float s = red[0];
    for (int i = 1; i < nw; ++i) s = __fadd_rn(s, red[i]);
    return s;
}

__device__ __forceinline__ float l2_inv(float sumsq) { return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(sumsq, 1e-6f))); }

#ifdef KD
// ---- generated rows: the token-by-token rule. A block per (value head, sequence, slice of 32 value
// columns), VT threads: lane l of warp g holds rows [g * KR, (g + 1) * KR) of column l's state in
// registers (KR = KD / warps). A column's key and query products are summed by each warp over its
// rows, then across the warps in index order: the same order for any batch.
#ifdef VT
#define DW (VT / 32)
#define KR (KD / DW)
extern "C" __global__ void __launch_bounds__(VT)
delta_step(const float* __restrict__ mixed, const float* __restrict__ a, const float* __restrict__ b, i64 ldab,
           const float* __restrict__ a_log, const float* __restrict__ dt_bias, float* __restrict__ out,
           const i64* __restrict__ desc, int n_kh, int vh, int VD, float q_scale, i64 layer_off, i64 conv_len) {
    static_assert(KD % DW == 0, "the key rows split evenly across the warps");
    pdl_start();
    __shared__ float qs[KD], ks[KD], red[DW], part[DW][32], dsh[32];
    const int h = blockIdx.x, lane = threadIdx.x & 31, g = threadIdx.x >> 5;
    const int j = blockIdx.z * 32 + lane;
    const bool live = j < VD;
    const i64* d = desc + (i64)blockIdx.y * DESC;
    const i64 row0 = d[0];
    const int n = (int)d[1];
    if (n == 0) return;  // the whole block: a padding row of a replayed decode graph
    const int kh = h / (vh / n_kh);
    const i64 qkv = 2 * (i64)n_kh * KD + (i64)vh * VD;
    float* S = state_of(d, layer_off + conv_len + (i64)h * KD * VD) + (i64)g * KR * VD;
    float col[KR];
#pragma unroll
    for (int i = 0; i < KR; ++i) col[i] = live ? S[(i64)i * VD + j] : 0.f;
    const float al = a_log[h], dtb = dt_bias[h];
    for (int r = 0; r < n; ++r) {
        const i64 row = row0 + r;
        const float* m = mixed + row * qkv;
        __syncthreads();  // the previous row's readers are done with qs, ks, part
        for (int i = threadIdx.x; i < KD; i += VT) {
            qs[i] = m[(i64)kh * KD + i];
            ks[i] = m[(i64)(n_kh + kh) * KD + i];
        }
        // this row's scalars and value, loaded beside the keys (warp 0 forms the column's delta)
        const float v = g == 0 && live ? m[2 * (i64)n_kh * KD + (i64)h * VD + j] : 0.f;
        const float a_row = a[row * ldab + h], b_row = b[row * ldab + h];
        __syncthreads();
        const float qi = l2_inv(block_sumsq(qs, KD, red));
        const float ki = l2_inv(block_sumsq(ks, KD, red));
        __syncthreads();
        for (int i = threadIdx.x; i < KD; i += VT) {
            qs[i] = __fmul_rn(__fmul_rn(qs[i], qi), q_scale);
            ks[i] = __fmul_rn(ks[i], ki);
        }
        __syncthreads();
        const float* kg = ks + g * KR;
        const float* qg = qs + g * KR;
        const float decay = expf(decay_log(a_row, al, dtb));
        float kv = 0.f;
#pragma unroll
        for (int i = 0; i < KR; ++i) {
            col[i] = __fmul_rn(col[i], decay);
            kv = __fmaf_rn(kg[i], col[i], kv);
        }
        part[g][lane] = kv;
        __syncthreads();
        if (g == 0) {
            float s = part[0][lane];
#pragma unroll
            for (int w = 1; w < DW; ++w) s = __fadd_rn(s, part[w][lane]);
            dsh[lane] = __fmul_rn(__fsub_rn(v, s), sigmoid_f(b_row));
        }
        __syncthreads();
        const float delta = dsh[lane];
        float o = 0.f;
#pragma unroll
        for (int i = 0; i < KR; ++i) {
            col[i] = __fadd_rn(col[i], __fmul_rn(kg[i], delta));
            o = __fmaf_rn(qg[i], col[i], o);
        }
        part[g][lane] = o;  // warp 0 read the key sums before the last barrier
        __syncthreads();
        if (g == 0 && live) {
            float s = part[0][lane];
#pragma unroll
            for (int w = 1; w < DW; ++w) s = __fadd_rn(s, part[w][lane]);
            out[(row * vh + h) * VD + j] = s;
        }
    }
    if (live) {
#pragma unroll
        for (int i = 0; i < KR; ++i) S[(i64)i * VD + j] = col[i];
    }
}
#endif

// ---- prompt rows: chunks of CH positions by the WY form (transformers' chunk_gated_delta_rule).
// A block per (value head, sequence, slice of VS value columns); the chunk's keys, queries and its
// triangular system are computed by every slice's block alike. The state slice stays in shared
// memory across the sequence's chunks.
#if defined(VS) && defined(CH)
#define LK (KD + 1)  // padded rows: threads reading different rows hit different banks
#define LC (CH + 1)
#define OA ((CH * VS + CHUNK_THREADS - 1) / CHUNK_THREADS)

extern "C" __global__ void __launch_bounds__(CHUNK_THREADS)
delta_chunks(const float* __restrict__ mixed, const float* __restrict__ a, const float* __restrict__ b, i64 ldab,
             const float* __restrict__ a_log, const float* __restrict__ dt_bias, float* __restrict__ out,
             const i64* __restrict__ desc, int n_kh, int vh, int VD, float q_scale, i64 layer_off, i64 conv_len,
             const int* __restrict__ snap_rel, float* __restrict__ snap_ssm) {
    pdl_start();
    extern __shared__ float smem[];
    float* Qs = smem;                // [CH][LK] queries (normalised, scaled)
    float* Ks = Qs + CH * LK;        // [CH][LK] keys (normalised)
    float* Wb = Ks + CH * LK;        // [CH][LK] T @ (k * beta * exp(cum))
    float* Vs = Wb + CH * LK;        // [CH][VS] values of the slice
    float* Ub = Vs + CH * VS;        // [CH][VS] T @ (v * beta), then the corrected values
    float* A0 = Ub + CH * VS;        // [CH][LC] strictly lower: -(beta_r k_r . k_c) exp(cum_r - cum_c)
    float* Tm = A0 + CH * LC;        // [CH][LC] (I - A0)^-1 by forward substitution, lower
    float* QK = Tm + CH * LC;        // [CH][LC] lower incl. diagonal: (q_r . k_c) exp(cum_r - cum_c)
    float* Ss = QK + CH * LC;        // [KD][VS] the state slice
    float* cum = Ss + KD * VS;       // [CH] cumulative decay log
    float* beta = cum + CH;          // [CH]
    float* ecum = beta + CH;         // [CH] exp(cum)
    float* dend = ecum + CH;         // [CH] exp(cum_last - cum)

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.x, j0 = blockIdx.z * VS;
    const i64* d = desc + (i64)blockIdx.y * DESC;
    const i64 row0 = d[0], start = d[2], origin = d[3];
    const int n = (int)d[1];
    if (n == 0) return;
    const int kh = h / (vh / n_kh);
    const i64 qkv = 2 * (i64)n_kh * KD + (i64)vh * VD;
    float* S = state_of(d, layer_off + conv_len + (i64)h * KD * VD);
    for (int p = tid; p < KD * VS; p += CHUNK_THREADS) Ss[p] = S[(i64)(p / VS) * VD + j0 + p % VS];
    const float al = a_log[h], dtb = dt_bias[h];
    int sk = (int)d[5];
    const int shi = (int)d[6];
    int at = 0;
    while (at < n) {
        const int len = imin(n - at, CH - (int)((start + at - origin) % CH));
        const i64 base = row0 + at;
        __syncthreads();  // the previous chunk's readers are done
        for (int p = tid; p < len * KD; p += CHUNK_THREADS) {
            const int r = p / KD, i = p % KD;
            const float* m = mixed + (base + r) * qkv;
            Qs[r * LK + i] = m[(i64)kh * KD + i];
            Ks[r * LK + i] = m[(i64)(n_kh + kh) * KD + i];
        }
        for (int p = tid; p < len * VS; p += CHUNK_THREADS) {
            const int r = p / VS, jj = p % VS;
            Vs[p] = mixed[(base + r) * qkv + 2 * (i64)n_kh * KD + (i64)h * VD + j0 + jj];
        }
        if (tid < len) {
            beta[tid] = sigmoid_f(b[(base + tid) * ldab + h]);
            cum[tid] = decay_log(a[(base + tid) * ldab + h], al, dtb);
        }
        __syncthreads();
        for (int r = warp; r < len; r += CHUNK_THREADS / 32) {  // a warp per row: l2 norms
            float sq = 0.f, sk2 = 0.f;
            for (int i = lane; i < KD; i += 32) {
                sq = __fmaf_rn(Qs[r * LK + i], Qs[r * LK + i], sq);
                sk2 = __fmaf_rn(Ks[r * LK + i], Ks[r * LK + i], sk2);
            }
            const float qi = l2_inv(warp_sum(sq)), ki = l2_inv(warp_sum(sk2));
            for (int i = lane; i < KD; i += 32) {
                Qs[r * LK + i] = __fmul_rn(__fmul_rn(Qs[r * LK + i], qi), q_scale);
                Ks[r * LK + i] = __fmul_rn(Ks[r * LK + i], ki);
            }
        }
        if (tid == 0)
            for (int r = 1; r < len; ++r) cum[r] = __fadd_rn(cum[r - 1], cum[r]);
        __syncthreads();
        if (tid < len) {
            ecum[tid] = expf(cum[tid]);
            dend[tid] = expf(__fsub_rn(cum[len - 1], cum[tid]));
        }
        for (int p = tid; p < CH * CH; p += CHUNK_THREADS) {
            const int r = p / CH, c = p % CH;
            if (r >= len || c > r) continue;
            const float e = expf(__fsub_rn(cum[r], cum[c]));
            float dq = 0.f, dk = 0.f;
            for (int i = 0; i < KD; ++i) {
                dq = __fmaf_rn(Qs[r * LK + i], Ks[c * LK + i], dq);
                dk = __fmaf_rn(Ks[r * LK + i], Ks[c * LK + i], dk);
            }
            QK[r * LC + c] = __fmul_rn(dq, e);
            if (c < r) A0[r * LC + c] = -__fmul_rn(__fmul_rn(dk, beta[r]), e);
        }
        __syncthreads();
        if (tid < len) {  // column c of the inverse, down the rows (columns are independent)
            const int c = tid;
            Tm[c * LC + c] = 1.0f;
            for (int r = c + 1; r < len; ++r) {
                float acc = A0[r * LC + c];
                for (int m = c + 1; m < r; ++m) acc = __fmaf_rn(A0[r * LC + m], Tm[m * LC + c], acc);
                Tm[r * LC + c] = acc;
            }
        }
        __syncthreads();
        for (int p = tid; p < len * KD; p += CHUNK_THREADS) {
            const int r = p / KD, i = p % KD;
            float acc = 0.f;
            for (int m = 0; m <= r; ++m)
                acc = __fmaf_rn(Tm[r * LC + m], __fmul_rn(__fmul_rn(Ks[m * LK + i], beta[m]), ecum[m]), acc);
            Wb[r * LK + i] = acc;
        }
        for (int p = tid; p < len * VS; p += CHUNK_THREADS) {
            const int r = p / VS, jj = p % VS;
            float acc = 0.f;
            for (int m = 0; m <= r; ++m) acc = __fmaf_rn(Tm[r * LC + m], __fmul_rn(Vs[m * VS + jj], beta[m]), acc);
            Ub[p] = acc;
        }
        __syncthreads();
        float oa[OA];
#pragma unroll
        for (int k = 0; k < OA; ++k) {  // corrected values, and what the state before the chunk gives
            const int p = tid + k * CHUNK_THREADS;
            oa[k] = 0.f;
            if (p >= len * VS) continue;
            const int r = p / VS, jj = p % VS;
            float ws = 0.f, qs = 0.f;
            for (int i = 0; i < KD; ++i) {
                const float s = Ss[i * VS + jj];
                ws = __fmaf_rn(Wb[r * LK + i], s, ws);
                qs = __fmaf_rn(Qs[r * LK + i], s, qs);
            }
            Ub[p] = __fsub_rn(Ub[p], ws);
            oa[k] = __fmul_rn(qs, ecum[r]);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < OA; ++k) {  // outputs: + the chunk's own keys' contributions
            const int p = tid + k * CHUNK_THREADS;
            if (p >= len * VS) continue;
            const int r = p / VS, jj = p % VS;
            float o = oa[k];
            for (int c = 0; c <= r; ++c) o = __fmaf_rn(QK[r * LC + c], Ub[c * VS + jj], o);
            out[((base + r) * vh + h) * VD + j0 + jj] = o;
        }
        const float elast = ecum[len - 1];
        for (int p = tid; p < KD * VS; p += CHUNK_THREADS) {  // the state after the chunk
            const int i = p / VS, jj = p % VS;
            float acc = __fmul_rn(Ss[p], elast);
            for (int r = 0; r < len; ++r)
                acc = __fmaf_rn(__fmul_rn(Ks[r * LK + i], dend[r]), Ub[r * VS + jj], acc);
            Ss[p] = acc;
        }
        at += len;
        __syncthreads();
        while (sk < shi && snap_rel[sk] < at) ++sk;  // offsets inside the chunk: no state there
        for (; sk < shi && snap_rel[sk] == at; ++sk)
            for (int p = tid; p < KD * VS; p += CHUNK_THREADS)
                snap_ssm[(((i64)sk * vh + h) * KD + p / VS) * VD + j0 + p % VS] = Ss[p];
    }
    __syncthreads();
    for (int p = tid; p < KD * VS; p += CHUNK_THREADS) S[(i64)(p / VS) * VD + j0 + p % VS] = Ss[p];
}
#endif
#endif

// rms_norm(x) * w * silu(gate), one row of D per block (rms_inv's fixed order, as rows.cu's rms_norm).
extern "C" __global__ void __launch_bounds__(256)
gated_rms_norm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ gate,
               float* __restrict__ y, int D, float eps) {
    pdl_start();
    __shared__ float scratch[8];
    const i64 at = (i64)blockIdx.x * D;
    const float inv = rms_inv(x + at, D, eps, scratch);
    for (int i = threadIdx.x; i < D; i += 256) {
        const float g = gate[at + i];
        y[at + i] = __fmul_rn(__fmul_rn(__fmul_rn(x[at + i], inv), w[i]), __fmul_rn(g, sigmoid_f(g)));
    }
}

// x * sigmoid(gate), elementwise (the output gate of gated attention)
extern "C" __global__ void sigmoid_mul(const float* __restrict__ x, const float* __restrict__ gate,
                                       float* __restrict__ y, i64 n) {
    pdl_start();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fmul_rn(x[i], sigmoid_f(gate[i]));
}

// Gated attention's heads (Qwen3.5) from the q|gate, k, v projection rows y (ld floats apart; per
// query head its d queries then its d gate values): each q and k head through rms_norm (rms_inv's
// order) and rope on its first `rot` dims, the same steps as rms_norm then rope, into q [T, nh, d]
// and k [T, nkv, d]; the gate values copied out to gate [T, nh * d]. A block per (row, head), the
// query heads then the key heads.
extern "C" __global__ void __launch_bounds__(256)
gated_qk_norm_rope(const float* __restrict__ y, i64 ld, const float* __restrict__ qw, const float* __restrict__ kw,
                   float* __restrict__ q, float* __restrict__ k, float* __restrict__ gate,
                   const int* __restrict__ positions, const float* __restrict__ cos_t,
                   const float* __restrict__ sin_t, int nh, int nkv, int d, int rot, int neox, float eps) {
    pdl_start();
    __shared__ float scratch[8];
    const int r = blockIdx.x, hd = blockIdx.y;
    const bool is_q = hd < nh;
    const float* x = y + (i64)r * ld + (is_q ? (i64)hd * 2 * d : 2 * (i64)nh * d + (i64)(hd - nh) * d);
    float* o = is_q ? q + ((i64)r * nh + hd) * d : k + ((i64)r * nkv + hd - nh) * d;
    const float* w = is_q ? qw : kw;
    const float inv = rms_inv(x, d, eps, scratch);
    const int half = rot >> 1;
    const i64 at = (i64)positions[r] * half;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        if (i >= rot) {
            o[i] = __fmul_rn(__fmul_rn(x[i], inv), w[i]);
            continue;
        }
        if (neox ? i >= half : (i & 1)) continue;  // the thread of a pair's first element rotates both
        const int p = neox ? i : i >> 1, i2 = neox ? i + half : i + 1;
        rotate(__fmul_rn(__fmul_rn(x[i], inv), w[i]), __fmul_rn(__fmul_rn(x[i2], inv), w[i2]), cos_t[at + p],
               sin_t[at + p], o[i], o[i2]);
    }
    if (is_q)
        for (int i = threadIdx.x; i < d; i += blockDim.x) gate[((i64)r * nh + hd) * d + i] = x[d + i];
}
