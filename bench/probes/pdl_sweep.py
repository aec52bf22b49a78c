"""Probe: which kernels of a decode step gain or lose by programmatic dependent launch (PDL). The 8B step
at 16 rows x 4096 positions ran 7.30 ms captured without PDL and 8.31 ms with it; launching attn_merge
plainly made it 7.27 (bench/evidence/s24-decode-profile/pdl-attn-ab-h200.json, this probe's first form).
Each variant captures the step's graph anew: `all` as the engine does, `none` without PDL, `plain:<k>` with
kernel k launched plainly (it starts once the kernel before it has finished; the kernel after it may still
start early), `after:<k>` the kernel launched after k plainly; replays timed alternately on one machine
(median of 9 lone replays), each variant's output compared with the first's.
  python3 bench/probes/pdl_sweep.py --model 8b --cases 16x4096,16x600,1x600 --out pdl-8b.json
  python3 bench/probes/pdl_sweep.py --model 30b-a3b --cases 16x512,1x512 --out pdl-moe.json
  python3 bench/probes/pdl_sweep.py --model 4b-hybrid --out pdl-hybrid.json        (one row)
Without --variants: all, none, and plain:<k> for every kernel the step launches.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import cupy as cp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench.gpu_ops import lone_replay_ms, model_setup, step_inputs  # noqa: E402
from lockstep_kernels.cuda import deltanet, kquant_ops, modules, moe  # noqa: E402
from lockstep_kernels.cuda import launch as kernel_launch  # noqa: E402
from lockstep_kernels.cuda import ops as cuda_ops  # noqa: E402

_names: dict[int, str] = {}
_state: dict = {"plain": set(), "last": "", "seen": []}
_launch = kernel_launch.launch


def _named(make):
    def wrapped(name, function, *rest):
        fn = make(name, function, *rest)
        _names[id(fn)] = function
        return fn
    return wrapped


def _patched_launch(fn, grid, block, args, shared: int = 0, early: bool = True) -> None:
    name = _names.get(id(fn), "?")
    plain = {f"plain:{name}", f"after:{_state['last']}"} & _state["plain"]
    _state["last"] = name
    if cp.cuda.get_current_stream().is_capturing():  # a step's kernels (not a prompt's, which the hybrid runs)
        _state["seen"].append(name)
    _launch(fn, grid, block, args, shared, early and not plain)


for _m in (cuda_ops, moe, kquant_ops, deltanet):  # every module that builds and launches kernels
    for _attr in ("kernel", "big_smem_kernel"):
        if hasattr(_m, _attr):
            setattr(_m, _attr, _named(getattr(modules, _attr)))
    if hasattr(_m, "launch"):
        _m.launch = _patched_launch


def _graph_cases(model_name: str, cases: list[tuple[int, int]]):
    """(label, capture) per case: capture() builds the case's decode graph under the current variant and
    returns (replay ms, output bytes)."""
    by_ctx: dict[int, list[int]] = {}
    for b, ctx in cases:
        by_ctx.setdefault(ctx, []).append(b)
    for ctx, batches in by_ctx.items():
        if model_name == "8b":
            _, ops, model, pool, pages = model_setup(True, "8B", max(batches), ctx)
            tables = None
        else:
            from moe_decode import build
            from shapes import SHAPES

            from engine.kv_cache import PagePool
            from lockstep_kernels.cuda.ops import CudaOps

            ops = CudaOps(exact=True)
            pages = -(-(ctx + 2) // 256)
            cfg, model = build(ops, model_name, SHAPES[model_name]["layers"], 0, pages)
            pool = PagePool(ops, cfg.n_layers, pages * max(batches) + 1, cfg.n_kv_heads, cfg.head_dim, "f16")
            tables = np.arange(pages * max(batches), dtype=np.int32).reshape(max(batches), pages)

        def forward(ids, rows, lr, model=model, pool=pool):
            return model.forward(ids, rows, pool.layers, lr)

        for b in batches:
            if tables is None:
                inputs = step_inputs(b, pages, ctx)
            else:
                t = tables[:b]
                inputs = (np.arange(b, dtype=np.int32), np.full(b, ctx, np.int32), t,
                          (t[:, ctx // 256].astype(np.int64) * 256 + ctx % 256))

            def capture(ops=ops, forward=forward, pages=pages, b=b, inputs=inputs):
                graphs = ops.decode_graphs(forward, pages, (b,))
                out = cp.asnumpy(graphs(*inputs)).tobytes()  # the capture, then its replay's output
                ms = lone_replay_ms(graphs._graphs[b].graph)
                return ms, out

            yield f"b{b} ctx{ctx}", capture


def _hybrid_case():
    """The 4B hybrid's solo step: a 64-token prompt, then decode steps through the runner's graph."""
    from hybrid_decode import random_model
    from hybrid_profile import graph_replay_ms

    from engine.kv_cache import pages_for
    from engine.runner import Runner, StepEntry
    from lockstep_kernels.cuda.ops import CudaOps

    runner = Runner(random_model(), CudaOps(exact=True), 4 * pages_for(128), "f16", max_pages_per_seq=pages_for(128))

    def capture():
        runner.graphs._graphs.pop(1, None)
        pages, state = runner.pool.alloc(pages_for(128)), runner.new_state()
        try:
            tok = int(runner.step([StepEntry(pages, list(range(5, 69)), 0, "last", full_rows=False, state=state,
                                             prompt=True)])[0].argmax[-1])
            toks = [tok]
            for pos in range(64, 72):
                toks.append(int(runner.step([StepEntry(pages, [toks[-1]], pos, "last", full_rows=False,
                                                       state=state)])[0].argmax[-1]))
            return graph_replay_ms(runner, 1), np.array(toks).tobytes()
        finally:
            runner.pool.release(pages)

    yield "b1 solo", capture


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("8b", "30b-a3b", "4b-hybrid"), default="8b")
    ap.add_argument("--cases", default="16x4096,16x600,1x600", help="rows x context per case (not the hybrid)")
    ap.add_argument("--variants", default="", help="comma-separated; ';' between kernels of one plain: variant")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cases = [tuple(int(v) for v in c.split("x")) for c in a.cases.split(",")]
    res: dict = {"model": a.model, "what": "decode step graph replay ms (exact on), median of 9 lone replays",
                 "cells": {}}
    supported = kernel_launch.pdl_supported
    source = _hybrid_case() if a.model == "4b-hybrid" else _graph_cases(a.model, cases)
    for label, capture in source:
        _state["plain"], _state["seen"] = set(), []
        kernel_launch.pdl_supported = supported
        ref_ms, ref = capture()
        seen = list(dict.fromkeys(n for n in _state["seen"] if n != "?"))
        variants = [v for v in a.variants.split(",") if v] or ["all", "none"] + [f"plain:{n}" for n in seen]
        cell = res["cells"].setdefault(label, {"kernels": seen, "variants": {}})
        for _ in range(a.repeats):
            for v in variants:
                kernel_launch.pdl_supported = (lambda: False) if v == "none" else supported
                _state["plain"] = {f"{v.split(':')[0]}:{k}" for k in v.split(":", 1)[1].split(";")} if ":" in v else set()
                try:
                    ms, out = capture()
                except Exception as e:  # a variant that fails is a result too: the others still run
                    cell["variants"][v] = {"error": f"{type(e).__name__}: {e}"[:300]}
                    continue
                got = cell["variants"].setdefault(v, {"ms": [], "same_output": True})
                got["ms"].append(round(ms, 4))
                got["same_output"] &= out == ref
                print(label, v, got, flush=True)
                cp.get_default_memory_pool().free_all_blocks()
        kernel_launch.pdl_supported = supported
        timed = {v: statistics.median(c["ms"]) for v, c in cell["variants"].items() if c.get("ms")}
        if "all" in timed:
            cell["vs_all"] = {v: round(ms / timed["all"], 3) for v, ms in sorted(timed.items(), key=lambda x: x[1])}
        print(label, "vs all:", cell.get("vs_all"), flush=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
