"""Probe: decode-step graph replays with the plan as it is and with one change, alternated on one
machine (machine instances differ by a few per cent, so an A/B must share one run).
  python3 bench/probes/step_ab.py --change one_row --out ab.json
  (--prefill 512: one prompt's forward pass, exact on and off, instead of decode steps)
Changes (the alternative to the plan):
  one_row        one row on tm1 instead of mm_*_one
  norm_gate_up   one row: the 8B gate|up matmul normalises its own input (no rms_norm launch)
  rope_apart     q|k|v stored as they are, rope_qkv_write after the matmul (not in its epilogue)
  warpsW         split_k aims at W warps an SM instead of plan.WARPS_PER_SM (other sums: timing only)
  late_values    attention of every head dim (not only <= 64) in LATE_VALUES_BUILD: keys loaded whole
                 before the scores, values after them (8B 16 rows 5.32 -> 5.43 ms: late-values-ab-h200.json)
  full_tiles     mm_wgmma's 128-row tiles even where they are few (with --prefill; 1B 7.03 -> 7.30 ms
                 with 64-row ones kept, 8B 24.9 ms against 26.2 when it took them too:
                 half-tiles-prefill-ab-h200.json)
Changes measured once and removed with their kernel code (docs/lab/results/mm-prefetch-ab-h200.json,
attn-prefetch-ab-h200.json): weights asked into L2 two batches ahead of their loads, attention's
key and value rows asked into L2 before its wait; a chunk's keys copied into shared memory
(attn-staged*-ab-h200.json, K_SMEM of b3bf2f3); attention's latency build loading its first batch
of values before the wait as well as its keys (v-early-ab-h200.json: 8B one row 4.138 -> 4.150 ms);
the matmul after attention asking the weights past its warps' first batch into L2 before its wait
(cp.async.bulk.prefetch.L2, prefetch-after-attention-ab-h200.json: 8B one row 4.088 -> 4.133 ms, 16
rows 5.98 -> 6.04, 1B equal); the rotation and cache stores in the epilogue of the wide kernels too
(mm_wgmma, mm_wide, mm_tile; rope-epilogue-prefill-ab-h200.json, where "plan" is that build): 8B
prompt of 512 tokens 28.3 -> 29.5 ms exact (scattered 4- and 2-byte stores from 128-row tiles);
attention's throughput build copying its second batch of values into shared memory by cp.async with
the first batch's loads (V_STAGE, 39 KB a block; vstage-ab-h200.json): 8B 8 rows 5.43 -> 5.49 ms,
16 rows 5.90 -> 5.98, 1B equal; attention's throughput build at four blocks an SM (64 registers, 4
or 8 value loads in flight; attn4-ab-h200.json): 8B 16 rows 5.36 -> 5.50 / 5.62 ms, 8 rows 5.02 ->
5.22 / 5.28.
Adopted: attention blocks past their row's last chunk leaving at once (skip-idle-ab-h200.json, table
width 56 pages: 8B one row 4.18 -> 4.08 ms); q|k|v rotated and stored by the matmul's epilogue
(rope-epilogue-ab-h200.json: 8B one row 4.19 -> 4.10 ms, 1B 0.863 -> 0.831).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import bench_decode_step  # noqa: E402
from bench.probes.prefill_pdl import measure, prompt_forward  # noqa: E402
from lockstep_kernels.cuda import plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402
from lockstep_kernels.weights import concat_rows  # noqa: E402

_launch = plan.matmul_launch


def _tm1_for_one_row(dtype, m, n, k, sm_count, split=None, prologue=None):
    mm = _launch(dtype, m, n, k, sm_count, split, prologue)
    return mm if prologue else replace(mm, kernel=mm.kernel.replace("_one", "_tm1"))


def _stacked_qkv(self, q, k, v, bias, head_dim):
    return self.upload(concat_rows([q, k, v])), None if bias is None else self.upload(bias)


CHANGES = {  # name: [(module or class, attribute, its value in the alternative)]
    "one_row": [(plan, "matmul_launch", _tm1_for_one_row)],
    "norm_gate_up": [(plan, "NORM_PROLOGUE_BYTES", 40 << 20)],
    # q|k|v rows as they are: rope_qkv_write after the matmul instead of in its epilogue
    "rope_apart": [(CudaOps, "upload_qkv", _stacked_qkv)],
    **{f"warps{w}": [(plan, "WARPS_PER_SM", w)] for w in (8, 32)},
    "late_values": [(plan, "THROUGHPUT_BUILD", plan.LATE_VALUES_BUILD)],
    "full_tiles": [(plan, "WGMMA_HALF_TILES_BELOW", 0)],
}


def _steps(shape: str, batches: list[int], pages: int | None):
    for r in bench_decode_step(True, shape, batches, 600, pages=pages):
        yield f"{shape} b{r['batch']}", r["step_ms"]


def _prefill(shape: str, tokens: int):
    for exact in (True, False):
        yield f"{shape} prompt {tokens} exact {'on' if exact else 'off'}", measure(
            prompt_forward(exact, shape, tokens), cp.cuda.Stream.null, 5)["wall_ms"]
        cp.get_default_memory_pool().free_all_blocks()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--change", choices=sorted(CHANGES), required=True)
    ap.add_argument("--shapes", default="8B,1B")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pages", type=int, help="pages per sequence (decode graph table width)")
    ap.add_argument("--prefill", type=int, help="time one prompt of this many tokens (exact on and off) instead")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    alt = CHANGES[a.change]
    current = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in alt]
    batches = [int(b) for b in a.batches.split(",")]
    res: dict = {"change": a.change, "pages": a.pages, "what": f"prompt of {a.prefill} tokens, forward pass ms" if a.prefill
                 else "decode step graph replay ms (exact on, context 600)"}
    try:
        for shape in a.shapes.split(","):
            for _ in range(a.repeats):
                for state, values in (("plan", current), ("alt", alt)):
                    for obj, attr, value in values:
                        setattr(obj, attr, value)
                    for key, ms in (_prefill(shape, a.prefill) if a.prefill else _steps(shape, batches, a.pages)):
                        key = f"{key} {state}"
                        res.setdefault(key, []).append(round(ms, 4))
                        print(key, res[key], flush=True)
    finally:
        for obj, attr, value in current:
            setattr(obj, attr, value)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
