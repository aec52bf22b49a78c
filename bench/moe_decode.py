"""Decode and prefill speed of a MoE shape on CUDA, built in memory (no GGUF on disk: the 30B-A3B file
is 60 GB at F16): random F16 weights from a seed, one stacked expert set shared by every layer on the
host (each layer gets its own device copy), the engine's model class and decode graphs, exact on and
off (at decode buckets both run the same kernels; prefill past 64 rows takes cuBLAS off).

    python bench/moe_decode.py --shape 30b-a3b --buckets 1,16 --out /tmp/moe-decode.json

Decode tok/s = rows / wall time of a replayed step (inputs copied in, logits left on the device, argmax
computed in the graph), at --ctx tokens of context per sequence. Prefill: one --prompt-token prompt.
--profile: each exact-on bucket's kernels under the PyTorch profiler (bench/gpu_profile.py's summary,
with PDL as the engine runs, so neighbouring kernels overlap). --tile-rule mean: then exact on again
with tiles sized by the mean rows of a used expert only (the rule before 16-token steps got tiles that
hold all of an expert's rows). --kernel-variants: then exact on again with each of KERNEL_VARIANTS's
settings of the ops (the same bits, other kernels), at the buckets whose kernels it changes.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from shapes import SHAPES, weight_bytes  # noqa: E402

from engine.config import ModelConfig, MoeConfig  # noqa: E402
from engine.models.llama import LlamaModel  # noqa: E402
from engine.models.moe import expert_views  # noqa: E402
from lockstep_kernels.base import PAGE_SIZE, PagedRows  # noqa: E402
from lockstep_kernels.weights import Weight, quantize_q8_0  # noqa: E402

# split factors (gate|up, down) of the --split-variants runs, against the uploads' splits
# --kernel-variants: ops attributes (lockstep_kernels/cuda/moe.py's, against these defaults) and the rows (lo, hi]
# of the buckets whose kernels they change
KERNEL_DEFAULTS = {"one_token_route": "router"}
KERNEL_VARIANTS = {"route-gate_up": ({"one_token_route": "gate_up"}, 0, 1),
                   "defaults-again": ({}, 0, 1 << 30)}  # the run-to-run noise of the comparison
SPLIT_VARIANTS = {"gate-up-half": (0.5, 1), "gate-up-double": (2, 1), "down-half": (1, 0.5), "down-double": (1, 2)}


def build(ops, shape: str, layers: int, seed: int, max_pages: int, expert_dtype: str = "f16"):
    s = SHAPES[shape]
    h, f, v, n_e = s["hidden"], s["ffn"], s["vocab"], s["experts"]
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    rng = np.random.default_rng(seed)

    def mat(n: int, k: int) -> Weight:  # 1024 random rows repeated, as bench/shapes.py writes them
        block = (rng.standard_normal((min(n, 1024), k), dtype=np.float32) * np.float32(0.02)).astype(np.float16)
        return Weight(np.resize(block, (n, k)), "f16")

    cfg = ModelConfig(arch="qwen3_moe", vocab_size=v, hidden=h, n_layers=layers, n_heads=s["heads"],
                      n_kv_heads=s["kv_heads"], head_dim=s["head_dim"], ffn=f, qk_norm=True, rope_theta=500000.0,
                      moe=MoeConfig(n_experts=n_e, top_k=s["top_k"], expert_ffn=f))
    ones, norm = Weight(np.ones(h, np.float32), "f32"), Weight(np.ones(s["head_dim"], np.float32), "f32")
    def experts(a: int, b: int) -> Weight:  # [E, a, b]; q8_0: the 1024 rows quantised, then repeated
        m = mat(n_e * a, b)
        if expert_dtype == "f16":
            return Weight(m.data.reshape(n_e, a, b), "f16")
        q = quantize_q8_0(m.data[:1024].astype(np.float32))
        return replace(q, **{k: np.resize(getattr(q, k), (n_e * a, getattr(q, k).shape[1])).reshape(n_e, a, -1)
                             for k in ("data", "scales")})

    stacked = {p: experts(a, b) for p, (a, b) in {"gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)}.items()}
    w = {"model.embed_tokens.weight": mat(v, h), "lm_head.weight": mat(v, h), "model.norm.weight": ones}
    for i in range(layers):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": ones, p + "post_attention_layernorm.weight": ones,
              p + "self_attn.q_proj.weight": mat(q, h), p + "self_attn.k_proj.weight": mat(kv, h),
              p + "self_attn.v_proj.weight": mat(kv, h), p + "self_attn.o_proj.weight": mat(h, q),
              p + "self_attn.q_norm.weight": norm, p + "self_attn.k_norm.weight": norm,
              p + "mlp.gate.weight": Weight(rng.standard_normal((n_e, h), dtype=np.float32).astype(np.float16), "f16")}
        for proj, st in stacked.items():
            w |= expert_views(p + "mlp.", proj, st)
    return cfg, LlamaModel(cfg, w, ops, max_pages * PAGE_SIZE)


def exposed(runs) -> dict:
    """What each kernel adds to the step where neighbours overlap (PDL): its end minus the previous
    kernel's end (median over the runs), summed by name, and the expert matmuls' share."""
    from collections import defaultdict

    names = [k[0] for k in runs[0]]
    ends = np.array([[k[1] + k[2] for k in r] for r in runs])
    add = np.median(np.diff(ends, axis=1, prepend=np.array([[r[0][1]] for r in runs])), axis=0)
    by: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for n, a in zip(names, add, strict=True):
        by[n][0] += float(a)
        by[n][1] += 1
    return {"exposed_by_name": sorted(([n, round(t, 2), c] for n, (t, c) in by.items()), key=lambda r: -r[1])}


def pdl_off_profile(ops, forward, max_pages: int, rows: int, inputs, layers: int) -> dict:
    import cupy as cp
    from gpu_profile import kernel_times, summarize

    from lockstep_kernels.cuda import launch as kernel_launch

    supported = kernel_launch.pdl_supported
    kernel_launch.pdl_supported = lambda: False
    try:
        g = ops.decode_graphs(forward, max_pages=max_pages, buckets=(rows,))
        g(*inputs)  # captured here, without PDL
        cp.cuda.Device().synchronize()
        return summarize(kernel_times(functools.partial(g, *inputs), 5), {"rows": rows, "pdl": False}, layers)
    finally:
        kernel_launch.pdl_supported = supported


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="30b-a3b", choices=[k for k, s in SHAPES.items() if "experts" in s])
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the shape's (0: all)")
    ap.add_argument("--buckets", default="1,16")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--modes", default="on,off")
    ap.add_argument("--dense-split", action="store_true",
                    help="then exact on again with the experts split as one dense weight each (the split before "
                         "upload_experts took the active count)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-pdl-off", action="store_true", help="with --profile: also the step captured without PDL")
    ap.add_argument("--tile-rule", choices=("all", "mean"), default="all")
    ap.add_argument("--split-variants", action="store_true",
                    help="then exact on again with each expert projection's split halved, then doubled (other sums: "
                         "speed only)")
    ap.add_argument("--kernel-variants", action="store_true",
                    help="then exact on again with each KERNEL_VARIANTS setting (where a lone token is routed)")
    ap.add_argument("--expert-dtype", choices=("f16", "q8_0"), default="f16", help="the routed experts' type")
    ap.add_argument("--out", default="moe-decode.json")
    args = ap.parse_args(argv)
    import cupy as cp

    from engine.kv_cache import PagePool
    from lockstep_kernels.cuda.ops import CudaOps

    buckets = [int(b) for b in args.buckets.split(",")]
    ops = CudaOps(exact=True)
    layers = args.layers or SHAPES[args.shape]["layers"]
    max_pages = -(-(args.ctx + args.steps + 1) // PAGE_SIZE)
    t0 = time.perf_counter()
    cfg, model = build(ops, args.shape, layers, 0, max_pages, args.expert_dtype)
    n_seq = max(buckets)
    pool = PagePool(ops, layers, max_pages * n_seq + 1, cfg.n_kv_heads, cfg.head_dim, "f16")
    pages = np.arange(max_pages * n_seq, dtype=np.int32).reshape(n_seq, max_pages)
    cp.cuda.Device().synchronize()
    report = {"shape": args.shape, "layers": layers, "ctx": args.ctx, "load_s": round(time.perf_counter() - t0, 1),
              "expert_dtype": args.expert_dtype, "active_weight_gb_per_token": round(weight_bytes(args.shape) * layers / SHAPES[args.shape]["layers"]
                                                  / 1e9, 2), "decode": [], "prefill": []}

    def save() -> None:  # after every measurement: a run cut short keeps what it measured
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")

    save()

    def forward(ids, rows, logit_rows):
        return model.forward(ids, rows, pool.layers, logit_rows)

    def dense_split() -> None:
        from lockstep_kernels.cuda import plan

        for layer in model.layers:
            ex = layer.moe.experts
            for sw in (ex.gate_up, ex.down):
                sw.split = plan.split_k(*sw.shape, ops.sm_count, sw.dtype)
            ex.token_tiles_cap = min(plan.max_token_tiles(ex.gate_up.split), plan.max_token_tiles(ex.down.split))

    base_splits = [(ex.gate_up.split, ex.down.split) for ex in (layer.moe.experts for layer in model.layers)]

    def rescale_split(gu: float, down: float) -> None:  # from the uploads' splits, per projection
        from lockstep_kernels.cuda import plan

        for layer, (s_gu, s_down) in zip(model.layers, base_splits, strict=True):
            ex = layer.moe.experts
            for sw, s0, f in ((ex.gate_up, s_gu, gu), (ex.down, s_down, down)):
                sw.split = max(1, min(plan.MAX_SPLIT, int(s0 * f)))
            ex.token_tiles_cap = min(plan.max_token_tiles(ex.gate_up.split), plan.max_token_tiles(ex.down.split))

    from lockstep_kernels.cuda import plan

    all_rows = plan.ALL_ROWS_TOKENS
    rng = np.random.default_rng(1)
    runs = [(m == "on", "active") for m in args.modes.split(",")] + ([(True, "dense")] if args.dense_split else [])
    runs += [(True, "mean-tiles")] if args.tile_rule == "mean" else []
    runs += [(True, v) for v in SPLIT_VARIANTS] if args.split_variants else []
    runs += [(True, v) for v in KERNEL_VARIANTS] if args.kernel_variants else []
    for exact, split in runs:
        if split == "dense":
            dense_split()
        from lockstep_kernels.cuda import plan

        plan.ALL_ROWS_TOKENS = 0 if split == "mean-tiles" else all_rows
        if split in SPLIT_VARIANTS:
            rescale_split(*SPLIT_VARIANTS[split])
        ops.exact = exact
        for attr, value in (KERNEL_DEFAULTS | KERNEL_VARIANTS.get(split, ({}, 0, 0))[0]).items():
            setattr(ops, attr, value)
        n = args.prompt  # one prompt of --prompt tokens into sequence 0's pages
        pos = np.arange(n, dtype=np.int32)
        slots = pages[0][pos // PAGE_SIZE].astype(np.int64) * PAGE_SIZE + pos % PAGE_SIZE
        rows = PagedRows(cp.asarray(pos), cp.zeros(n, cp.int32), cp.asarray(pages[:1]), cp.asarray(slots))
        ids = cp.asarray(rng.integers(0, cfg.vocab_size, n).astype(np.int32))
        last = cp.asarray(np.array([n - 1], np.int64))
        for rep in range(3):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            forward(ids, rows, last)
            cp.cuda.Device().synchronize()
            if rep:
                report["prefill"].append({"exact": exact, "split": split, "tokens": n,
                                          "tok_s": round(n / (time.perf_counter() - t))})
        save()
        graphs = ops.decode_graphs(forward, max_pages=max_pages, buckets=tuple(buckets))
        for b in buckets:
            if split in KERNEL_VARIANTS and not KERNEL_VARIANTS[split][1] < b <= KERNEL_VARIANTS[split][2]:
                continue  # the variant changes no kernel of this bucket
            seqs = range(b)
            p = np.full(b, args.ctx, np.int32)
            tables = pages[list(seqs)]
            sl = np.array([pages[s][args.ctx // PAGE_SIZE] * PAGE_SIZE + args.ctx % PAGE_SIZE for s in seqs], np.int64)
            toks = rng.integers(0, cfg.vocab_size, b).astype(np.int32)
            graphs(toks, p, tables, sl)  # captured here
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            for _ in range(args.steps):
                graphs(toks, p, tables, sl)
            cp.cuda.Device().synchronize()
            step = (time.perf_counter() - t) / args.steps
            report["decode"].append({"exact": exact, "split": split, "rows": b, "step_ms": round(step * 1e3, 3),
                                     "tok_s": round(b / step, 1)})
            print(f"exact {'on' if exact else 'off'}, {split} split: {b} rows {step * 1e3:.2f} ms/step, {b / step:.1f} tok/s",
                  flush=True)
            save()
            if args.profile and exact and split == "active":
                from gpu_profile import kernel_times, summarize

                runs_k = kernel_times(functools.partial(graphs, toks, p, tables, sl), 5)
                prof = summarize(runs_k, {"rows": b, "pdl": True}, layers) | exposed(runs_k)
                report.setdefault("profile", []).append(prof)
                if args.profile_pdl_off:  # the same step captured without PDL: each kernel's own duration
                    prof_off = pdl_off_profile(ops, forward, max_pages, b, (toks, p, tables, sl), layers)
                    report["profile"].append(prof_off)
                    print("  profile without PDL: span {:.0f} us; ".format(prof_off.get("span_us", 0))
                          + " | ".join(f"{n} {t:.0f}us x{c}" for n, t, c in prof_off.get("by_name", [])[:8]), flush=True)
                print(f"  profile: {prof.get('kernels')} kernels, span {prof.get('span_us', 0):.0f} us; "
                      + " | ".join(f"{n} {t:.0f}us x{c}" for n, t, c in prof.get("by_name", [])[:8]), flush=True)
                save()
    for b in buckets:
        got = {d["exact"]: d["tok_s"] for d in report["decode"] if d["rows"] == b and d["split"] == "active"}
        if len(got) == 2:
            report.setdefault("on_off", {})[str(b)] = round(got[True] / got[False], 3)
    save()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
