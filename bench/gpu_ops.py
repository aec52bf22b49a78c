"""CUDA op micro-benchmarks on the device: matmul bandwidth at decode widths, prefill throughput,
attention, and a whole decode step of the 1B and 8B shapes replayed from CUDA graphs.

Every timing is the median of CUDA-event-timed graph replays (launch overhead excluded), over
weight copies rotated so the L2 cache cannot serve them. Writes JSON (--out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import cupy as cp
import numpy as np

from lockstep_kernels.cuda import kquant, plan
from lockstep_kernels.cuda import launch as kernel_launch
from lockstep_kernels.cuda.ops import CudaOps, mm_tc_args, streaming_kernel
from lockstep_kernels.cuda.weights import CudaStack, CudaWeight
from lockstep_kernels.quants import BLOCK_TYPES

SHAPES_1B = {"qo": (2048, 2048), "kv": (512, 2048), "gate_up": (8192, 2048), "down": (2048, 8192),
             "lm_head": (128256, 2048)}
SHAPES_8B = {"qo": (4096, 4096), "kv": (1024, 4096), "gate_up": (14336, 4096), "down": (4096, 14336),
             "lm_head": (128256, 4096)}
ROTATE_BYTES = 1 << 30  # weight copies per timed graph: well past the 60 MB L2


def timed(fn, reps: int = 7, graph: bool = True) -> float:
    """Median seconds of one call of `fn` (which launches work on the current stream): replays of
    a graph captured from it, or (graph=False: cuBLAS refuses capture) plain calls between events."""
    stream = cp.cuda.Stream(non_blocking=False)
    with stream:
        fn()
        stream.synchronize()
        if graph:
            stream.begin_capture()
            fn()
            g = stream.end_capture()
            g.launch(stream)
            stream.synchronize()
        times = []
        for _ in range(reps):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            if graph:
                g.launch(stream)
            else:
                fn()
            b.record(stream)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return float(np.median(times))


# Spins `cycles` clocks: launched before a run, it holds the GPU while Python queues the run's calls
_HOLD = cp.RawKernel(r"""extern "C" __global__ void hold(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}""", "hold")


def back_to_back_ms(fn, calls: int, hold_cycles: int = 0) -> float:
    """Milliseconds per call of `fn` issued `calls` times back to back on the current stream (after one
    warm-up call): each call's launches overlap the previous one's tail, as a serving loop's do.
    hold_cycles > 0 queues the calls behind a spinning kernel, so calls whose host side outlasts their
    GPU work are timed by the GPU's work."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    if hold_cycles:
        _HOLD((1,), (1,), (np.int64(hold_cycles),))
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / calls


def write_json(path: str | None, obj) -> None:
    """`obj` as JSON to `path` when one was given. Probes call it after each measurement, so a probe
    stopped by its time limit keeps what it measured."""
    if path:
        Path(path).write_text(json.dumps(obj, indent=1))


def guarded(results: list, fn, **label) -> None:
    """Runs one benchmark; a failure is recorded with its label instead of ending the run."""
    try:
        out = fn()
    except Exception as e:  # report every failure, keep measuring the rest
        results.append({**label, "error": f"{type(e).__name__}: {e}"[:500]})
        print("FAILED", label, e, flush=True)
        return
    for r in out if isinstance(out, list) else [out]:
        results.append({**label, **r})


def copy_bandwidth() -> float:
    """Device-to-device memcpy of 4 GiB, bytes read plus bytes written."""
    src = cp.ones(1 << 30, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timed(lambda: dst.data.copy_from_device_async(src.data, src.nbytes))
    return 2 * src.nbytes / t


def random_weight(n: int, k: int, dtype: str) -> CudaWeight:
    np_, kp = plan.padded_shape(n, k)
    x = cp.random.standard_normal((np_, kp), dtype=cp.float32) * np.float32(k**-0.5)
    if dtype == "f16":
        return CudaWeight("f16", (n, k), x.astype(cp.float16).view(cp.uint16))
    if dtype == "bf16":
        return CudaWeight("bf16", (n, k), (x.view(cp.uint32) >> 16).astype(cp.uint16))
    if dtype == "f32":
        return CudaWeight("f32", (n, k), x)
    if dtype in kquant.KQUANT_TYPES:  # random blocks with small finite f16 block scales
        size = BLOCK_TYPES[dtype].type_size
        raw = cp.random.randint(0, 256, (n, k // 256, size), dtype=cp.uint8)
        d = raw[..., size - 2 :] if dtype == "q6_k" else raw[..., :4]
        d[..., 1::2] = 0x20  # high bytes: magnitudes near 2^-7
        nib, aux = kquant.pack(raw.reshape(n, -1), dtype, cp)
        return CudaWeight(dtype, (n, k), nib, aux)
    scales = (cp.abs(x).reshape(np_, kp // 32, 32).max(axis=2) / 127).astype(cp.float16)
    q = cp.rint(x / scales.astype(cp.float32).repeat(32, axis=1)).astype(cp.int8)
    return CudaWeight("q8_0", (n, k), q, scales.view(cp.uint16))


def bench_matmul(ops: CudaOps, n: int, k: int, m: int, dtype: str, split: int | None = None,
                 defines: tuple = (), prologue: str | None = None) -> dict:
    """One matmul's time (rotating weight copies past the L2); with `split`, the streaming kernel
    launched directly (its build by `defines`; prologue "x16": f16 activations, the 9-16-row kernel)."""
    w0 = random_weight(n, k, dtype)
    copies = max(1, min(16, ROTATE_BYTES // w0.nbytes))
    ws = [w0] + [random_weight(n, k, dtype) for _ in range(copies - 1)]
    x = probe_activations(m, w0, prologue)
    if split is None:
        def run():
            for w in ws:
                ops.matmul(x, w)
    else:
        mm = plan.matmul_launch(dtype, m, n, k, ops.sm_count, split, prologue)
        fn = streaming_kernel(mm, defines)
        out = cp.empty((m, n), cp.float32)
        def run():
            for w in ws:
                kernel_launch.launch(fn, mm.grid, mm.block, mm_tc_args(w, x, out, out), mm.shared)
    t = timed(run, graph=ops.exact or m < 65) / len(ws)
    return {"n": n, "k": k, "m": m, "dtype": dtype, "exact": ops.exact, "split": split or plan.split_k(n, k, ops.sm_count),
            "us": t * 1e6, "weight_GBps": w0.nbytes / t / 1e9, "TFLOPs": 2 * m * n * k / t / 1e12}


def probe_activations(m: int, w: CudaWeight, prologue: str | None = None):
    """Random activations for m rows of w: float32 [m, k], or (prologue "x16") f16 bits [m, kp]."""
    if prologue == "x16":
        return cp.random.standard_normal((m, w.kp), dtype=cp.float32).astype(cp.float16).view(cp.uint16)
    return cp.random.standard_normal((m, w.shape[1]), dtype=cp.float32)


def attention_inputs(ops: CudaOps, rows: int, ctx: int, n_heads: int, n_kv: int, hd: int, prefill: bool):
    """Random queries and a filled f16 cache: `rows` decode rows of their own sequences at ctx - 1, or
    the last `rows` rows of one prompt of ctx. Returns (q, layer, rows)."""
    pages_per_seq = -(-ctx // 256)
    n_seq = 1 if prefill else rows
    layer = ops.kv_alloc(n_seq * pages_per_seq, n_kv, hd, "f16")
    layer.k[...] = cp.random.standard_normal(layer.k.shape, dtype=cp.float32).astype(cp.float16)
    layer.v[...] = cp.random.standard_normal(layer.v.shape, dtype=cp.float32).astype(cp.float16)
    tables = cp.arange(n_seq * pages_per_seq, dtype=cp.int32).reshape(n_seq, pages_per_seq)
    if prefill:
        positions, seq = cp.arange(ctx - rows, ctx, dtype=cp.int32), cp.zeros(rows, cp.int32)
    else:
        positions, seq = cp.full(rows, ctx - 1, cp.int32), cp.arange(rows, dtype=cp.int32)
    from lockstep_kernels.base import PagedRows

    pr = PagedRows(positions, seq, tables, cp.zeros(rows, cp.int64))
    q = cp.random.standard_normal((rows, n_heads, hd), dtype=cp.float32)
    return q, layer, pr


def bench_attention(ops: CudaOps, rows: int, ctx: int, n_heads: int, n_kv: int, hd: int, prefill: bool) -> dict:
    q, layer, pr = attention_inputs(ops, rows, ctx, n_heads, n_kv, hd, prefill)
    t = timed(lambda: ops.attention(q, layer, pr, hd**-0.5))
    kv_bytes = (1 if prefill else rows) * ctx * n_kv * hd * 2 * 2
    return {"rows": rows, "ctx": ctx, "heads": n_heads, "kv_heads": n_kv, "head_dim": hd, "prefill": prefill,
            "us": t * 1e6, "kv_GBps": kv_bytes / t / 1e9}


def bench_accuracy() -> list[dict]:
    """Relative L2 error of each op against the NumPy reference on fresh random inputs."""
    from lockstep_kernels.base import PagedRows, RopeTable
    from lockstep_kernels.cpu.ops import CpuKVLayer, CpuOps
    from lockstep_kernels.weights import Weight

    rng = np.random.default_rng()
    cpu, gpu = CpuOps(exact=False), CudaOps(exact=True)

    def rel(got, ref):
        got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
        return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))

    out = []
    for dtype in ("f32", "f16", "bf16", "q8_0"):
        w = Weight.from_f32((rng.standard_normal((2048, 2048)) / 45).astype(np.float32), dtype)
        for m in (1, 512):
            x = rng.standard_normal((m, 2048)).astype(np.float32)
            got = cp.asnumpy(gpu.matmul(cp.asarray(x), gpu.upload(w)))
            out.append({"op": f"matmul {dtype} 2048x2048 M={m}", "rel_err": rel(got, cpu.matmul(x, w))})
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    nw = rng.standard_normal(4096).astype(np.float32)
    out.append({"op": "rms_norm 4096", "rel_err": rel(cp.asnumpy(gpu.rms_norm(cp.asarray(x), cp.asarray(nw), 1e-5)),
                                                     cpu.rms_norm(x, nw, 1e-5))})
    out.append({"op": "silu_mul", "rel_err": rel(cp.asnumpy(gpu.silu_mul(cp.asarray(x), cp.asarray(x[::-1]))),
                                                 cpu.silu_mul(x, x[::-1]))})
    cos, sin = np.cos(x[:, :64]), np.sin(x[:, :64])
    q = rng.standard_normal((64, 8, 128)).astype(np.float32)
    pos = np.arange(64, dtype=np.int32)
    got = gpu.rope(cp.asarray(q), cp.asarray(pos), RopeTable(cp.asarray(cos), cp.asarray(sin)))
    out.append({"op": "rope neox", "rel_err": rel(cp.asnumpy(got), cpu.rope(q, pos, RopeTable(cos, sin)))})
    for kv_type in ("f16", "bf16", "f32"):
        layer = gpu.kv_alloc(8, 8, 128, kv_type)
        kv = rng.standard_normal((2, 2000, 8, 128)).astype(np.float32)
        gpu.kv_write(layer, cp.asarray(kv[0]), cp.asarray(kv[1]), cp.arange(2000, dtype=cp.int64))
        tables = np.arange(8, dtype=np.int32)[None]
        positions = rng.integers(0, 2000, 48).astype(np.int32)
        q = rng.standard_normal((48, 32, 128)).astype(np.float32)
        got = cp.asnumpy(gpu.attention(cp.asarray(q), layer, PagedRows(cp.asarray(positions), cp.zeros(48, cp.int32),
                                                                      cp.asarray(tables), None), 128**-0.5))
        k, v = gpu.kv_read_pages(layer, list(range(8)))
        ref = cpu.attention(q, CpuKVLayer(kv_type, kv_type, k, v), PagedRows(positions, np.zeros(48, np.int32), tables, None),
                            128**-0.5)
        out.append({"op": f"attention {kv_type} KV, d=128, GQA 4", "rel_err": rel(got, ref)})
    return out


class _BenchOps(CudaOps):
    """Random f16 weights made on the device (no host copies of gigabytes)."""

    def upload(self, w):
        if w.data.ndim == 1:
            return cp.ones(w.shape, cp.float32)
        return random_weight(int(w.shape[0]), int(w.shape[1]), "f16")


def _fake_weights(cfg) -> dict:
    from engine.models.llama import expected_shapes
    from lockstep_kernels.weights import Weight

    stub = np.zeros(1, np.float16)
    return {name: Weight(np.lib.stride_tricks.as_strided(stub, shape, (0,) * len(shape)), "f16")
            for name, shape in expected_shapes(cfg).items()}


def model_setup(exact: bool, shape: str, n_seqs: int, ctx: int, pages: int | None = None, gguf: str | None = None):
    """The 1B or 8B shape with random f16 weights, or the model of the file `gguf` as the engine loads
    it (a K-quant mix: its blocks), and a page pool for n_seqs sequences of ctx + 1 cells, or of `pages`
    pages each (the engine's decode graphs take the pages a sequence may reach: 56 for the throughput
    benchmark's 14336-token unified context): (cfg, ops, model, pool, pages per sequence)."""
    from engine.config import ModelConfig
    from engine.kv_cache import PagePool
    from engine.models.llama import LlamaModel

    pages_per_seq = max(pages or 0, -(-(ctx + 1) // 256))
    if gguf:
        from engine.loader import load_model
        from engine.models.build import model_class

        loaded = load_model(gguf)
        cfg, ops = loaded.config, CudaOps(exact=exact)
        model = model_class(cfg)(cfg, loaded.weights, ops, pages_per_seq * 256)
    else:
        big = shape == "8B"
        cfg = ModelConfig(arch="llama", vocab_size=128256, hidden=4096 if big else 2048, n_layers=32 if big else 16,
                          n_heads=32, n_kv_heads=8, head_dim=128 if big else 64, ffn=14336 if big else 8192)
        ops = _BenchOps(exact=exact)
        model = LlamaModel(cfg, _fake_weights(cfg), ops, pages_per_seq * 256)
    pool = PagePool(ops, cfg.n_layers, n_seqs * pages_per_seq, cfg.n_kv_heads, cfg.head_dim, "f16")
    return cfg, ops, model, pool, pages_per_seq


def decode_setup(exact: bool, shape: str, batches: list[int], ctx: int, pages: int | None = None,
                 gguf: str | None = None):
    """model_setup for `batches` sequences and its decode graphs: (cfg, graphs, pages per sequence,
    weight bytes)."""
    cfg, ops, model, pool, pages_per_seq = model_setup(exact, shape, max(batches), ctx, pages, gguf)
    weight_bytes = sum(w.nbytes for layer in model.layers for w in vars(layer).values()
                       if isinstance(w, CudaWeight | CudaStack))
    weight_bytes += model.lm_head.nbytes
    graphs = ops.decode_graphs(lambda ids, rows, lr: model.forward(ids, rows, pool.layers, lr), pages_per_seq,
                               tuple(batches))
    return cfg, graphs, pages_per_seq, weight_bytes


def step_inputs(b: int, pages_per_seq: int, ctx: int):
    """tokens, positions, block tables and slots of b sequences decoding at position ctx."""
    tables = np.arange(b * pages_per_seq, dtype=np.int32).reshape(b, pages_per_seq)
    positions = np.full(b, ctx, np.int32)
    slots = tables[:, ctx // 256].astype(np.int64) * 256 + ctx % 256
    return np.arange(b, dtype=np.int32), positions, tables, slots


def lone_replay_ms(graph, reps: int = 9) -> float:
    """Median milliseconds of one replay of `graph` between two events, the device idle before."""
    times = []
    for _ in range(reps):
        a, e = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        graph.launch()
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, e))
    return float(np.median(times))


def bench_decode_step(exact: bool, shape: str, batches: list[int], ctx: int, pdl: bool = True,
                      pages: int | None = None) -> list[dict]:
    supported = kernel_launch.pdl_supported
    if not pdl:
        kernel_launch.pdl_supported = lambda: False  # every graph of this call captured with plain launches
    try:
        cfg, graphs, pages_per_seq, weight_bytes = decode_setup(exact, shape, batches, ctx, pages)
        out = []
        for b in batches:
            tokens, positions, tables, slots = step_inputs(b, pages_per_seq, ctx)
            graphs(tokens, positions, tables, slots)  # capture
            cp.cuda.get_current_stream().synchronize()
            t_graph = lone_replay_ms(graphs._graphs[b].graph) / 1e3
            host = []
            for _ in range(5):  # what a runner sees: inputs up, replay, logits down to the host
                t0 = time.perf_counter()
                cp.asnumpy(graphs(tokens, positions, tables, slots))
                host.append(time.perf_counter() - t0)
            kv_read = b * (ctx + 1) * cfg.n_kv_heads * cfg.head_dim * 2 * 2 * cfg.n_layers
            out.append({"shape": shape, "exact": exact, "pdl": pdl, "batch": b, "ctx": ctx, "step_ms": t_graph * 1e3,
                        "tok_s": b / t_graph, "step_with_host_logits_ms": float(np.median(host)) * 1e3,
                        "weight_bytes": weight_bytes, "bandwidth_TBps": (weight_bytes + kv_read) / t_graph / 1e12})
    finally:
        kernel_launch.pdl_supported = supported
    return out


def ops_benchmarks(res: dict, ex: CudaOps, off: CudaOps) -> None:
    guarded(res["accuracy"], bench_accuracy)
    for name, (n, k) in [("1B qo", SHAPES_1B["qo"]), ("1B gate_up", SHAPES_1B["gate_up"]),
                         ("1B down", SHAPES_1B["down"]), ("8B kv", SHAPES_8B["kv"]),
                         ("8B gate_up", SHAPES_8B["gate_up"]), ("8B down", SHAPES_8B["down"])]:
        for s in (1, 2, 4, 8, 16, 32):
            if s <= plan.ceil_div(k, 32):
                guarded(res["split_sweep"], lambda n=n, k=k, s=s: bench_matmul(ex, n, k, 1, "f16", split=s), name=name)

    for label, shapes in (("1B", SHAPES_1B), ("8B", SHAPES_8B)):
        for name, (n, k) in shapes.items():
            for m in (1, 16, 64):
                guarded(res["matmul"], lambda n=n, k=k, m=m: bench_matmul(ex, n, k, m, "f16"), name=f"{label} {name}")
    for dtype in ("bf16", "q8_0", "f32"):
        for name in ("qo", "gate_up"):
            n, k = SHAPES_8B[name]
            guarded(res["matmul"], lambda n=n, k=k, dtype=dtype: bench_matmul(ex, n, k, 1, dtype), name=f"8B {name}")
    prefill_matmuls(res, ex, off)


def prefill_matmuls(res: dict, ex: CudaOps, off: CudaOps) -> None:
    mm_wide = CudaOps(exact=True)
    mm_wide.tiled = "wide"  # the exact prefill kernel of devices without wgmma, for comparison
    kernels = [(ex, "wgmma" if ex.wgmma else "mm_wide")] + ([(mm_wide, "mm_wide")] if ex.wgmma else [])
    for label, shapes in (("1B", SHAPES_1B), ("8B", SHAPES_8B)):
        for name in ("qo", "gate_up", "down"):
            n, k = shapes[name]
            for ops, kernel_name in kernels + [(off, "cuBLAS")]:
                guarded(res["prefill_matmul"], lambda n=n, k=k, ops=ops: bench_matmul(ops, n, k, 512, "f16"),
                        name=f"{label} {name}", kernel=kernel_name)

    for n_heads, n_kv, hd in ((32, 8, 64), (32, 8, 128)):
        for rows, ctx in ((1, 640), (16, 640), (1, 4096), (16, 4096)):
            guarded(res["attention"], lambda a=(rows, ctx, n_heads, n_kv, hd): bench_attention(ex, *a, prefill=False))
        guarded(res["attention"], lambda a=(512, 512, n_heads, n_kv, hd): bench_attention(ex, *a, prefill=True))


def attention_builds(res: dict, ex: CudaOps) -> None:
    """Decode attention with each register budget forced (plan.attention_launch picks by batch)."""
    saved = plan.ATTN_LATENCY_PAIRS
    try:
        for build, pairs in (("latency", 1e9), ("throughput", 0)):
            plan.ATTN_LATENCY_PAIRS = pairs
            for hd in (64, 128):
                for rows in (1, 4, 16):
                    guarded(res["attention"], lambda rows=rows, hd=hd: bench_attention(ex, rows, 640, 32, 8, hd, False),
                            build=build)
    finally:
        plan.ATTN_LATENCY_PAIRS = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu-ops.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps-only", action="store_true", help="only the decode steps")
    ap.add_argument("--prefill-only", action="store_true", help="only the prefill matmuls")
    ap.add_argument("--pages", type=int, help="decode steps: pages per sequence (the engine's graphs in "
                    "bench/throughput.py: 56); default: just enough for the context")
    args = ap.parse_args()
    props = cp.cuda.runtime.getDeviceProperties(0)
    res: dict = {"device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
                 "sm_count": props["multiProcessorCount"]}
    t0 = time.time()
    res["copy_TBps"] = copy_bandwidth() / 1e12
    bw = res["copy_TBps"] * 1e12
    ex, off = CudaOps(exact=True), CudaOps(exact=False)

    for key in ("accuracy", "split_sweep", "matmul", "prefill_matmul", "attention"):
        res[key] = []
    if args.prefill_only:
        prefill_matmuls(res, ex, off)
    elif not args.steps_only:
        ops_benchmarks(res, ex, off)
    if not args.prefill_only:
        attention_builds(res, ex)

    res["decode_step"] = []
    for shape in () if args.prefill_only else ("1B", "8B"):
        for exact, pdl in ((True, True), (False, True), (True, False)):
            guarded(res["decode_step"], lambda shape=shape, exact=exact, pdl=pdl:
                    bench_decode_step(exact, shape, [1, 4, 8, 16], 600, pdl, args.pages))
            cp.get_default_memory_pool().free_all_blocks()  # the model of the last call is gone
    res["seconds"] = time.time() - t0

    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print_table(res, bw)


def print_table(res: dict, bw: float) -> None:
    for key in ("accuracy", "split_sweep", "matmul", "prefill_matmul", "attention", "decode_step"):
        for r in res[key]:
            if "error" in r:
                print(f"ERROR {key}: {r}")
        res = {**res, key: [r for r in res[key] if "error" not in r]}
    print(f"\n== {res['device']}, {res['sm_count']} SMs, copy bandwidth {res['copy_TBps']:.2f} TB/s")
    print("\naccuracy against the NumPy reference (relative L2 error)")
    for r in res["accuracy"]:
        print(f"  {r['op']:<34} {r['rel_err']:.2e}")
    print("\nsplit sweep, f16, M=1 (us, fraction of copy bandwidth)")
    for r in res["split_sweep"]:
        print(f"  {r['name']:<12} S={r['split']:<3} {r['us']:8.1f} us  {r['weight_GBps'] * 1e9 / bw:6.1%}")
    print("\nmatmul, exact (f16 unless named)")
    for r in res["matmul"]:
        print(f"  {r['name']:<12} {r['dtype']:<5} M={r['m']:<3} S={r['split']:<3} {r['us']:8.1f} us"
              f"  {r['weight_GBps']:7.0f} GB/s  {r['weight_GBps'] * 1e9 / bw:6.1%}")
    print("\nprefill matmul M=512, f16")
    for r in res["prefill_matmul"]:
        print(f"  {r['name']:<12} {r['kernel']:<14} {r['us']:8.1f} us  {r['TFLOPs']:6.1f} TFLOP/s")
    print("\nattention, f16 KV")
    for r in res["attention"]:
        kind = ("prefill" if r["prefill"] else "decode") + (f" {r['build']}" if "build" in r else "")
        print(f"  {kind:<18} rows={r['rows']:<4} ctx={r['ctx']:<5} d={r['head_dim']:<4} {r['us']:8.1f} us"
              f"  {r['kv_GBps']:7.0f} GB/s")
    print("\ndecode step (graph replay; forward only, then with logits copied to the host)")
    for r in res["decode_step"]:
        print(f"  {r['shape']} exact={r['exact']!s:<5} pdl={r['pdl']!s:<5} batch={r['batch']:<3} {r['step_ms']:7.3f} ms"
              f"  {r['tok_s']:8.0f} tok/s  host {r['step_with_host_logits_ms']:7.3f} ms"
              f"  {r['bandwidth_TBps'] * 1e12 / bw:6.1%} of copy bw")


if __name__ == "__main__":
    main()
