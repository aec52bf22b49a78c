"""Probe: which programmatic dependent launches (PDL) a decode step with long contexts gains or loses
by. The 8B step at 16 rows x 4096 positions ran 7.30 ms captured without PDL and 8.31 ms with it
(bench/evidence/s24-decode-profile); here the step's graph is captured with PDL everywhere, nowhere,
and with chosen kernels launched plainly (each waits for the whole kernel before it; the kernel after a
plain one may still start early), replays timed alternately on one machine, their outputs compared.
  python3 bench/probes/pdl_attn_ab.py --out pdl-attn-ab.json
Variants: all, none, and plain:<names>, names among attn_mma, attn_merge, after_merge (the kernel
launched after attn_merge: the o projection).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import lone_replay_ms, model_setup, step_inputs  # noqa: E402
from lockstep_kernels.cuda import launch as kernel_launch  # noqa: E402
from lockstep_kernels.cuda import modules  # noqa: E402
from lockstep_kernels.cuda import ops as cuda_ops  # noqa: E402

VARIANTS = ("all", "none", "plain:attn_mma", "plain:attn_merge", "plain:attn_mma,attn_merge", "plain:after_merge",
            "plain:attn_mma,attn_merge,after_merge")
CASES = ((4096, (16,)), (600, (16, 1)), (30000, (1,)))

_names: dict[int, str] = {}
_state = {"plain": set(), "last": ""}


def _named(make):
    def wrapped(name, function, *rest):
        fn = make(name, function, *rest)
        _names[id(fn)] = function
        return fn
    return wrapped


cuda_ops.kernel = _named(modules.kernel)
cuda_ops.big_smem_kernel = _named(modules.big_smem_kernel)
_driver_launch = kernel_launch._driver_launch


def _launch(fn, grid, block, args, shared, stream, pdl):
    name = _names.get(id(fn), "?")
    label = "after_merge" if _state["last"] == "attn_merge" else name
    _state["last"] = name
    _driver_launch(fn, grid, block, args, shared, stream, pdl and label not in _state["plain"])


kernel_launch._driver_launch = _launch


def _forward(model, pool):
    return lambda ids, rows, lr: model.forward(ids, rows, pool.layers, lr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res: dict = {"what": "8B decode step graph replay ms (exact on), median of 9 lone replays", "cells": {}}
    supported = kernel_launch.pdl_supported
    for ctx, batches in CASES:
        _, ops, model, pool, pages = model_setup(True, "8B", max(batches), ctx)
        forward = _forward(model, pool)
        ref: dict[int, bytes] = {}
        for _ in range(a.repeats):
            for v in VARIANTS:
                kernel_launch.pdl_supported = (lambda: False) if v == "none" else supported
                _state["plain"] = set(v.split(":")[1].split(",")) if v.startswith("plain:") else set()
                graphs = ops.decode_graphs(forward, pages, tuple(batches))
                for b in batches:
                    inputs = step_inputs(b, pages, ctx)
                    out = cp.asnumpy(graphs(*inputs)).tobytes()  # the capture, then its replay's output
                    ms = lone_replay_ms(graphs._graphs[b].graph)
                    cell = res["cells"].setdefault(f"b{b} ctx{ctx}", {}).setdefault(v, {"ms": [], "same_output": True})
                    cell["ms"].append(round(ms, 4))
                    cell["same_output"] &= ref.setdefault(b, out) == out
                    print(f"b{b} ctx{ctx} {v}", cell, flush=True)
                del graphs
                cp.get_default_memory_pool().free_all_blocks()
        kernel_launch.pdl_supported = supported
        del forward, model, pool, ops
        cp.get_default_memory_pool().free_all_blocks()
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
