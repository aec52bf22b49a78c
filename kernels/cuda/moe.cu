// Mixture-of-experts steps around the grouped matmul (matmul.cu's mmg_*): routing, the schedule that
// groups (token, slot) pairs by expert, the gather of their rows and the weighted sum. Every step
// reads its counts from device memory, so a decode step with them is graph-capturable; none of them
// lets the batch change a row's arithmetic (routing and the sum are per row, the schedule only
// decides where a pair's row sits).
#include "common.cuh"

#define MOE_MAX_E 1024  // experts a router may have (kernels/cuda/moe.py checks)
#define SCHED_THREADS 1024
#define SCHED_STAGE 2048  // pair ids staged in shared memory at a time

// One warp per row: softmax over the E router logits in float32 (lane l takes e = l, l + 32, ...,
// then the fixed butterfly), the top k by repeated argmax with ties to the lowest expert index (the
// stable descending order of the reference), divided by their sum added in slot order when `renorm`.
extern "C" __global__ void __launch_bounds__(32) moe_route(const float* __restrict__ logits, int* __restrict__ ids,
                                                         float* __restrict__ weights, int E, int k, int renorm) {
    pdl_start();
    __shared__ float p[MOE_MAX_E];
    __shared__ float chosen[32];
    const int lane = threadIdx.x;
    const float* row = logits + (i64)blockIdx.x * E;
    float m = __int_as_float(0xff800000);  // -inf
    for (int e = lane; e < E; e += 32) m = fmaxf(m, row[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) {
        const float v = expf(__fsub_rn(row[e], m));
        p[e] = v;
        sum = __fadd_rn(sum, v);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
    for (int e = lane; e < E; e += 32) p[e] = __fdiv_rn(p[e], sum);
    __syncwarp();
    for (int j = 0; j < k; ++j) {
        float best = -1.f;  // probabilities are >= 0; a chosen expert is marked -2
        int at = E;
        for (int e = lane; e < E; e += 32)
            if (p[e] > best) best = p[e], at = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oa = __shfl_xor_sync(0xffffffffu, at, o);
            if (ob > best || (ob == best && oa < at)) best = ob, at = oa;
        }
        if (lane == 0) {
            chosen[j] = best;
            ids[(i64)blockIdx.x * k + j] = at;
            p[at] = -2.f;
        }
        __syncwarp();
    }
    if (lane == 0) {
        float total = chosen[0];
        for (int j = 1; j < k; ++j) total = __fadd_rn(total, chosen[j]);
        for (int j = 0; j < k; ++j)
            weights[(i64)blockIdx.x * k + j] = renorm ? __fdiv_rn(chosen[j], total) : chosen[j];
    }
}

// Pair ids p0 .. p0 + n - 1 into shared memory once every thread is done with the previous ones; n.
__device__ __forceinline__ int stage_ids(const int* __restrict__ ids, int p0, int P, int* stage) {
    const int n = imin(SCHED_STAGE, P - p0);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += SCHED_THREADS) stage[i] = ids[p0 + i];
    __syncthreads();
    return n;
}

// The P = T * k pairs grouped by expert, one block: thread e counts expert e's pairs, the experts'
// rows are laid out in expert order, and within an expert in pair order. pos[p]: where pair p's row
// sits; src[q]: the token row at place q; tiles: int4 (expert, first place, rows, 0) of at most R
// rows each, in expert order, then empty ones up to n_tiles (a bound fixed by T, k, E and R).
extern "C" __global__ void __launch_bounds__(SCHED_THREADS) moe_schedule(const int* __restrict__ ids, int P, int k,
                                                                       int E, int R, int n_tiles,
                                                                       int* __restrict__ pos, int* __restrict__ src,
                                                                       int4* __restrict__ tiles) {
    pdl_start();
    __shared__ int stage[SCHED_STAGE];
    __shared__ int first[MOE_MAX_E];
    __shared__ int tile0[MOE_MAX_E + 1];
    const int e = threadIdx.x;
    int count = 0;
    for (int p0 = 0; p0 < P; p0 += SCHED_STAGE) {
        const int n = stage_ids(ids, p0, P, stage);
        if (e < E)
            for (int i = 0; i < n; ++i) count += stage[i] == e;
    }
    if (e < E) first[e] = count;
    __syncthreads();
    if (threadIdx.x == 0) {
        int rows = 0, t = 0;
        for (int i = 0; i < E; ++i) {
            const int c = first[i];
            first[i] = rows;
            tile0[i] = t;
            rows += c;
            t += (c + R - 1) / R;
        }
        tile0[E] = t;
    }
    __syncthreads();
    if (e < E)
        for (int i = 0; i * R < count; ++i)
            tiles[tile0[e] + i] = make_int4(e, first[e] + i * R, imin(R, count - i * R), 0);
    for (int i = tile0[E] + threadIdx.x; i < n_tiles; i += SCHED_THREADS) tiles[i] = make_int4(0, 0, 0, 0);
    int q = e < E ? first[e] : 0;
    for (int p0 = 0; p0 < P; p0 += SCHED_STAGE) {
        const int n = stage_ids(ids, p0, P, stage);
        if (e < E)
            for (int i = 0; i < n; ++i)
                if (stage[i] == e) {
                    pos[p0 + i] = q;
                    src[q++] = (p0 + i) / k;
                }
    }
}

// xs[q] = x[src[q]]: each pair's token row at its place (rows of H floats).
extern "C" __global__ void moe_gather(const float* __restrict__ x, const int* __restrict__ src, float* __restrict__ xs,
                                      int P, int H) {
    pdl_start();
    const i64 n = (i64)P * H;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 q = i / H;
        xs[i] = x[(i64)src[q] * H + (i - q * H)];
    }
}

// out[t] = sum over slots j = 0 .. k-1, in that order, of weights[t, j] * y[pos[t * k + j]]; then
// + shared[t] * sigmoid(gate[t]) where `shared` is given, then res[t] + that where `res` is given:
// the reference's float32 steps, each rounded (no contraction).
extern "C" __global__ void moe_combine(const float* __restrict__ y, const int* __restrict__ pos,
                                       const float* __restrict__ weights, const float* __restrict__ shared,
                                       const float* __restrict__ gate, const float* __restrict__ res,
                                       float* __restrict__ out, int T, int H, int k, int has_shared, int has_res) {
    pdl_start();
    const i64 n = (i64)T * H;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 t = i / H, h = i - t * H;
        const int* pr = pos + t * k;
        const float* wr = weights + t * k;
        float acc = __fmul_rn(y[(i64)pr[0] * H + h], wr[0]);
        for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(y[(i64)pr[j] * H + h], wr[j]));
        if (has_shared) {
            const float s = __fdiv_rn(1.f, __fadd_rn(1.f, expf(-gate[t])));
            acc = __fadd_rn(acc, __fmul_rn(shared[i], s));
        }
        out[i] = has_res ? __fadd_rn(res[i], acc) : acc;
    }
}
