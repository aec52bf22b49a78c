"""Probe: how fast can the exact prefill matmul's consumer loop issue wgmma, with nothing to wait for?

Every block loops over four shared-memory stages that never change (no TMA, no barriers) and
issues mm_wgmma_tma's MMAs (m64n128k16, two per 32-k chunk, tokens K-major with the 128-byte
swizzle). One block per SM, 132 blocks. Builds vary one thing at a time:
  a      the weights' fragments: `const` (registers loaded once), `lds` (two LDS.128 a chunk, as the
         product), `ss` (wgmma's shared-memory A operand, no fragments)
  wg     consumer warpgroups a block (64 weight rows each)
  group  chunks per commit group; `depth` the wait_group after each commit
  slice  chunks per slice: wait_group 0 and the slice join into `total` (0: no slices)
Prints and writes TFLOP/s per build (dense f16 peak ~989).
  python3 bench/probes/wgmma_issue.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import timed  # noqa: E402
from lockstep_kernels.cuda import modules  # noqa: E402

_D = ", ".join(f"%{i}" for i in range(64))
_OUTS = ", ".join(f'"+f"(d[{i}])' for i in range(64))
SOURCE = r'''
typedef unsigned u32;
#define STAGES 4
#define X_STAGE (2 * 128 * 64)
#define W_CHUNK (NWG * 64 * 64)
#define W_STAGE (2 * W_CHUNK)

__device__ __forceinline__ unsigned long long desc128(unsigned addr) {
    return (unsigned long long)((addr >> 4) & 0x3fff) | ((unsigned long long)((1024 >> 4) & 0x3fff) << 32) | (1ull << 62);
}
__device__ __forceinline__ unsigned long long desc64(unsigned addr) {
    return (unsigned long long)((addr >> 4) & 0x3fff) | ((unsigned long long)((512 >> 4) & 0x3fff) << 32) | (2ull << 62);
}
__device__ __forceinline__ void mma_rs(float (&d)[64], u32 a0, u32 a1, u32 a2, u32 a3, unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {D}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : OUTS : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
__device__ __forceinline__ void mma_ss(float (&d)[64], unsigned long long da, unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {D}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : OUTS : "l"(da), "l"(db));
}

extern "C" __global__ void __launch_bounds__(NWG * 128, 1) probe(float* out, int C) {
    extern __shared__ unsigned char smem_raw[];
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const unsigned raw = (unsigned)__cvta_generic_to_shared(smem_raw);
    const unsigned base = (raw + 1023) & ~1023u;
    unsigned char* const sm = smem_raw + (base - raw);
    for (int i = tid * 4; i < STAGES * (X_STAGE + W_STAGE); i += blockDim.x * 4)
        *reinterpret_cast<u32*>(sm + i) = 0x2c002c00u ^ (unsigned)(i & 0x00ff00ff);
    __syncthreads();
    const unsigned wbase = base + STAGES * X_STAGE;
    const unsigned char* const wsm = sm + STAGES * X_STAGE;
    const int frag = (wg * 64 + warp * 16 + g) * 64 + t * 16;
    float part[64];
#if SLICE
    float total[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) total[i] = 0.f;
#endif
#pragma unroll
    for (int i = 0; i < 64; ++i) part[i] = 0.f;
    uint4 a[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        a[j][0] = *reinterpret_cast<const uint4*>(wsm + j * W_CHUNK + frag);
        a[j][1] = *reinterpret_cast<const uint4*>(wsm + j * W_CHUNK + frag + 512);
    }
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    const int L = SLICE ? SLICE : C;  // slices are loops of their own, as in wgmma.cu's `slices`
    for (int c0 = 0; c0 < C; c0 += L) {
    for (int c = c0; c < c0 + L; c += 2) {
        const int s = (c >> 1) % STAGES;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const unsigned xs = base + s * X_STAGE + j * 64;
#if ASRC == 1
            a[j][0] = *reinterpret_cast<const uint4*>(wsm + s * W_STAGE + j * W_CHUNK + frag);
            a[j][1] = *reinterpret_cast<const uint4*>(wsm + s * W_STAGE + j * W_CHUNK + frag + 512);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
#if ASRC == 2
            const unsigned wa = wbase + s * W_STAGE + j * W_CHUNK + wg * 64 * 64;
            mma_ss(part, desc64(wa), desc128(xs));
            mma_ss(part, desc64(wa + 32), desc128(xs + 32));
#else
            mma_rs(part, a[j][0].x, a[j][1].x, a[j][0].y, a[j][1].y, desc128(xs));
            mma_rs(part, a[j][0].z, a[j][1].z, a[j][0].w, a[j][1].w, desc128(xs + 32));
#endif
            if (GROUP == 1 || j == 1) {
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(DEPTH) : "memory");
            }
        }
    }
#if SLICE
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        total[i] = __fadd_rn(total[i], part[i]);
        part[i] = 0.f;
    }
#endif
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
#if SLICE
        sum += total[i];
#endif
        sum += part[i];
    }
    out[blockIdx.x * blockDim.x + tid] = sum;
}
'''.replace("{D}", "{" + _D + "}").replace("OUTS", _OUTS)

ASRC = {"const": 0, "lds": 1, "ss": 2}
BUILDS = [  # (a, wg, group, depth, slice)
    ("lds", 2, 1, 1, 0), ("const", 2, 1, 1, 0), ("ss", 2, 1, 1, 0),
    ("lds", 2, 2, 1, 0), ("const", 2, 2, 1, 0), ("ss", 2, 2, 1, 0),
    ("lds", 2, 1, 0, 0), ("lds", 2, 1, 1, 8), ("lds", 2, 1, 1, 16), ("const", 2, 1, 1, 8),
    ("lds", 1, 1, 1, 0), ("lds", 3, 1, 1, 0), ("lds", 4, 1, 1, 0),
    ("const", 1, 1, 1, 0), ("const", 3, 1, 1, 0), ("const", 4, 1, 1, 0),
    ("ss", 3, 1, 1, 0), ("ss", 4, 1, 1, 0), ("lds", 3, 2, 1, 0), ("lds", 3, 1, 1, 8),
]


def run(a: str, wg: int, group: int, depth: int, slice_: int, chunks: int, sms: int) -> dict:
    opts = modules.OPTIONS + ("-arch=sm_90a",) + tuple(
        f"-D{k}={v}" for k, v in (("NWG", wg), ("ASRC", ASRC[a]), ("GROUP", group), ("DEPTH", depth), ("SLICE", slice_)))
    fn = cp.RawModule(code=SOURCE, options=opts).get_function("probe")
    shared = max(4 * (2 * 128 * 64 + 2 * wg * 64 * 64) + 1024, 120 * 1024)  # one block an SM
    fn.max_dynamic_shared_size_bytes = shared
    out = cp.zeros(sms * wg * 128, cp.float32)
    sec = timed(lambda: fn((sms,), (wg * 128,), (out, cp.int32(chunks)), shared_mem=shared))
    flop = 2.0 * sms * wg * 64 * 128 * 32 * chunks
    return {"a": a, "wg": wg, "group": group, "depth": depth, "slice": slice_, "us": sec * 1e6,
            "tflops": flop / sec / 1e12, "regs": fn.num_regs, "local_bytes": fn.local_size_bytes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=2048)
    ap.add_argument("--out")
    args = ap.parse_args()
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    res = []
    for b in BUILDS:
        try:
            r = run(*b, args.chunks, sms)
        except Exception as e:  # noqa: BLE001 - a build that fails to compile or launch is a result too
            r = dict(zip(("a", "wg", "group", "depth", "slice"), b, strict=True)) | {"error": str(e)[:300]}
        res.append(r)
        print(json.dumps(r), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
