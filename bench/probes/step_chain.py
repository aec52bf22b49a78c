"""Probe: where an engine decode step's time goes beyond its graph replay. Times, per step, for
one batch width: a lone replay between events (what bench/gpu_ops.py reports), replays back to
back, and back-to-back steps as the engine issues them (input staging copies, tokens taken on the
device from the previous step's argmax, the argmax copied to the host).
  python3 bench/probes/step_chain.py --shape 8B --batch 1 --out chain.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import back_to_back_ms, decode_setup, lone_replay_ms, step_inputs  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8B")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=600)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--pages", type=int, help="pages per sequence (decode graph table width; the engine's: 56)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    _, graphs, pages, _ = decode_setup(True, a.shape, [a.batch], a.ctx, a.pages)
    tokens, positions, tables, slots = step_inputs(a.batch, pages, a.ctx)
    graphs(tokens, positions, tables, slots)
    cp.cuda.get_current_stream().synchronize()
    g = graphs._graphs[a.batch]
    ops = CudaOps(exact=True)

    def engine_like():
        graphs(tokens, positions, tables, slots, ids_from=graphs.last_argmax)
        ops.to_host_async(graphs.last_argmax)

    res = {"shape": a.shape, "batch": a.batch, "ctx": a.ctx, "pages": pages, "steps": a.steps,
           "lone_replay_ms": lone_replay_ms(g.graph),
           "replays_back_to_back_ms": back_to_back_ms(lambda: g.graph.launch(), a.steps),
           "engine_like_steps_ms": back_to_back_ms(engine_like, a.steps),
           "replays_back_to_back_again_ms": back_to_back_ms(lambda: g.graph.launch(), a.steps)}
    print(json.dumps(res, indent=1), flush=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
