// Mixture-of-experts steps around the grouped matmul (matmul.cu's mmg_*): routing, the schedule that
// groups (token, slot) pairs by expert, and the weighted sum where the down projection does not do it
// itself. Every step reads its counts from device memory, so a decode step with them is
// graph-capturable; none of them lets the batch change a row's arithmetic (routing and the sum are
// per row, the schedule only decides where a pair's row sits).
#include "common.cuh"

#define SCHED_THREADS 1024
#define SCHED_STAGE 2048  // pair ids staged in shared memory at a time
#define ROUTE_SMEM 24576  // bytes of the fused kernel's routing scratch (moe.py's ROUTE_SMEM)

// One warp per row (any number of rows: a block each).
extern "C" __global__ void __launch_bounds__(32) moe_route(const float* __restrict__ logits, int* __restrict__ ids,
                                                         float* __restrict__ weights, int E, int k, int renorm) {
    pdl_start();
    __shared__ float p[MOE_MAX_E];
    __shared__ float chosen[32];
    const i64 r = blockIdx.x;
    route_row(logits + r * E, ids + r * k, weights + r * k, E, k, renorm, p, chosen);
}

// Pair ids p0 .. p0 + n - 1 into shared memory once every thread is done with the previous ones; n.
__device__ __forceinline__ int stage_ids(const int* ids, int p0, int P, int* stage) {
    const int n = imin(SCHED_STAGE, P - p0);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += SCHED_THREADS) stage[i] = __ldcg(ids + p0 + i);  // L2: see moe_route_schedule
    __syncthreads();
    return n;
}

// Exclusive prefix sums of a and b over the block's threads in thread order (integers: exact); the
// totals in *ta, *tb. Contains barriers.
__device__ __forceinline__ void block_scan2(int& a, int& b, int* ta, int* tb, int* wa, int* wb) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int xa = __shfl_up_sync(0xffffffffu, ia, o), xb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) ia += xa, ib += xb;
    }
    if (lane == 31) wa[warp] = ia, wb[warp] = ib;
    __syncthreads();
    if (warp == 0) {
        int sa = lane < SCHED_THREADS / 32 ? wa[lane] : 0, sb = lane < SCHED_THREADS / 32 ? wb[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int xa = __shfl_up_sync(0xffffffffu, sa, o), xb = __shfl_up_sync(0xffffffffu, sb, o);
            if (lane >= o) sa += xa, sb += xb;
        }
        wa[lane] = sa, wb[lane] = sb;  // inclusive over warps
    }
    __syncthreads();
    const int oa = warp ? wa[warp - 1] : 0, ob = warp ? wb[warp - 1] : 0;
    a = oa + ia - a, b = ob + ib - b;
    *ta = wa[31], *tb = wb[31];
}

// The P = T * k pairs grouped by expert, one block of SCHED_THREADS: thread e counts expert e's
// pairs, the experts' rows are laid out in expert order, and within an expert in pair order. pos[p]:
// where pair p's row sits; src[q]: the token row at place q; tiles: int4 (expert, first place, rows,
// 0) of at most R rows each, in expert order, then empty ones up to n_tiles (a bound fixed by T, k,
// E and R).
__device__ __forceinline__ void schedule(const int* ids, int P, int k, int E, int R, int n_tiles,
                                         int* __restrict__ pos, int* __restrict__ src, int4* __restrict__ tiles) {
    __shared__ int stage[SCHED_STAGE];
    __shared__ int wa[32], wb[32];
    const int e = threadIdx.x;
    int count = 0;
    for (int p0 = 0; p0 < P; p0 += SCHED_STAGE) {
        const int n = stage_ids(ids, p0, P, stage);
        if (e < E)
            for (int i = 0; i < n; ++i) count += stage[i] == e;
    }
    int first = count, tile0 = (count + R - 1) / R, rows_all, tiles_all;
    block_scan2(first, tile0, &rows_all, &tiles_all, wa, wb);
    for (int i = 0; i * R < count; ++i) tiles[tile0 + i] = make_int4(e, first + i * R, imin(R, count - i * R), 0);
    for (int i = tiles_all + threadIdx.x; i < n_tiles; i += SCHED_THREADS) tiles[i] = make_int4(0, 0, 0, 0);
    int q = first;
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

extern "C" __global__ void __launch_bounds__(SCHED_THREADS) moe_schedule(const int* __restrict__ ids, int P, int k,
                                                                       int E, int R, int n_tiles,
                                                                       int* __restrict__ pos, int* __restrict__ src,
                                                                       int4* __restrict__ tiles) {
    pdl_start();
    schedule(ids, P, k, E, R, n_tiles, pos, src, tiles);
}

// moe_route then moe_schedule in one block (a decode step's few rows): warps w < W route rows w,
// w + W, ... with route_row in ROUTE_SMEM bytes of scratch, then the block schedules their pairs.
extern "C" __global__ void __launch_bounds__(SCHED_THREADS) moe_route_schedule(
    const float* __restrict__ logits, int T, int E, int k, int renorm, int R, int n_tiles, int* __restrict__ ids,
    float* __restrict__ weights, int* __restrict__ pos, int* __restrict__ src, int4* __restrict__ tiles) {
    pdl_start();
    __shared__ float scratch[ROUTE_SMEM / 4];
    const int per = E + 32, W = imin(SCHED_THREADS / 32, (ROUTE_SMEM / 4) / per), warp = threadIdx.x >> 5;
    if (warp < W)
        for (int r = warp; r < T; r += W)
            route_row(logits + (i64)r * E, ids + (i64)r * k, weights + (i64)r * k, E, k, renorm,
                      scratch + warp * per, scratch + warp * per + E);
    __syncthreads();  // the ids in global memory are the block's own writes: visible after the barrier
    schedule(ids, T * k, k, E, R, n_tiles, pos, src, tiles);
}

// out[t] = moe_weighted_sum (common.cuh) of every token (rows of H floats), where the down projection's
// grouped launch did not sum them itself.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const int* __restrict__ pos,
                                       const float* __restrict__ weights, const float* __restrict__ shared,
                                       const float* __restrict__ gate, const float* __restrict__ res,
                                       float* __restrict__ out, int T, int H, int k, int has_shared, int has_res) {
    pdl_start();
    const i64 n = (i64)T * H;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 t = i / H;
        out[i] = moe_weighted_sum(y, pos, weights, shared, gate, res, t, (int)(i - t * H), H, k, has_shared, has_res);
    }
}
