"""Decode attention with other query-head groupings and register builds than the plan's (same bits:
each head's arithmetic is its own; the probe checks that bit for bit):
  python3 bench/probes/attention_groups.py [--out FILE]
Builds measured and removed: a chunk's keys copied into shared memory by cp.async (K_SMEM of
b3bf2f3; attn-staged*-h200.json: 26.9 against 26.9-29.3 us at 16 rows, 8B step 5.88 -> 6.05 ms);
value batches reloaded only after the whole batch was read (before session 13's rolling reload:
16 rows, head dim 128, 25.2 against 24.7 us; attention-late-values-h200.json, build "noroll")."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import attention_inputs, timed  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402

BUILDS = {"latency": plan.LATENCY_BUILD, "throughput": plan.THROUGHPUT_BUILD,
          "mid": (("MIN_BLOCKS", 2), ("K_EARLY_OK", 0), ("VBATCH", 16)),
          "late_values": plan.LATE_VALUES_BUILD}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out")
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--gm", default="4,2,1", help="query heads a block")
    ap.add_argument("--builds", default=",".join(BUILDS))
    a = ap.parse_args()
    ops = CudaOps(exact=True)
    group_max, spread, builds = plan.group_max, plan.ATTN_SPREAD, (plan.LATENCY_BUILD, plan.THROUGHPUT_BUILD)
    rows_out = []
    for hd in (128, 64):
        for rows in (int(r) for r in a.rows.split(",")):
            cp.random.seed(0)
            q, layer, pr = attention_inputs(ops, rows, 640, 32, 8, hd, False)
            call = functools.partial(ops.attention, q, layer, pr, hd**-0.5)
            ref = call().get().tobytes()
            for gm in (int(g) for g in a.gm.split(",")):
                for name, build in ((b, BUILDS[b]) for b in a.builds.split(",")):
                    plan.group_max, plan.ATTN_SPREAD = (lambda group, gm=gm: gm), 0  # exactly gm heads a block
                    plan.LATENCY_BUILD = plan.THROUGHPUT_BUILD = build
                    try:
                        t = timed(call)
                        same = call().get().tobytes() == ref
                    finally:
                        plan.group_max, plan.ATTN_SPREAD = group_max, spread
                        plan.LATENCY_BUILD, plan.THROUGHPUT_BUILD = builds
                    rows_out.append({"head_dim": hd, "rows": rows, "gm": gm, "build": name, "us": t * 1e6,
                                     "same_bits": same})
                    print(f"d {hd:3d} rows {rows:2d} gm {gm} {name:10s} {t * 1e6:6.1f} us same bits {same}",
                          flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"ctx": 640, "heads": 32, "kv_heads": 8, "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
