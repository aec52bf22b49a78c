"""Where a hybrid decode step's time goes (bench/hybrid_decode.py --profile FILE): the solo decode
graph recaptured without PDL (so kernel durations add up to the step) replayed under the
PyTorch profiler, each kernel's median duration summed by name, and the kernels of the first four
layers (three DeltaNet layers and a full-attention one in Qwen3.5) in launch order.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from bench.gpu_profile import kernel_times, summarize
from engine.kv_cache import pages_for
from engine.runner import Runner, StepEntry
from lockstep_kernels.cuda import launch as kernel_launch


def graph_replay_ms(runner: Runner, bucket: int, reps: int = 50) -> float:
    """GPU time of one replay of the bucket's decode graph (host work of a step left out)."""
    g = runner.graphs._graphs[bucket].graph
    stream = cp.cuda.get_current_stream()
    g.launch(stream)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(reps):
        g.launch(stream)
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / reps


def profile_solo(runner: Runner, reps: int = 10) -> dict:
    """Recaptures the runner's solo decode graph without PDL, profiles it, and drops it again."""
    supported = kernel_launch.pdl_supported
    kernel_launch.pdl_supported = lambda: False
    per_seq = pages_for(128)
    pages, state = runner.pool.alloc(per_seq), runner.new_state()
    try:
        runner.graphs._graphs.pop(1, None)
        tok = int(runner.step([StepEntry(pages, list(range(5, 69)), 0, "last", full_rows=False, state=state,
                                         prompt=True)])[0].argmax[-1])
        for pos in range(64, 68):
            tok = int(runner.step([StepEntry(pages, [tok], pos, "last", full_rows=False, state=state)])[0].argmax[-1])
        replay_ms = graph_replay_ms(runner, 1)
        g = runner.graphs._graphs[1].graph
        runs = kernel_times(lambda: g.launch(cp.cuda.get_current_stream()), reps)
    finally:
        kernel_launch.pdl_supported = supported
        runner.graphs._graphs.pop(1, None)
        runner.pool.release(pages)
    out = summarize(runs, {"pdl": False, "replay_ms_no_pdl": round(replay_ms, 4)}, runner.config.n_layers)
    if runs:
        first = 4 * len(runs[0]) // runner.config.n_layers + 3  # about four layers and the embedding before them
        dur = np.median(np.array([[k[2] for k in r] for r in runs]), axis=0)
        out["first_layers"] = [[k[0], round(float(t), 2)] for k, t in zip(runs[0][:first], dur, strict=False)]
        out["step"] = [round(float(t), 2) for t in dur]  # every kernel's median duration, in launch order
    return out


def print_profile(p: dict) -> None:
    if "error" in p:
        print(p)
        return
    print(f"solo decode graph without PDL: replay {p['replay_ms_no_pdl']:.3f} ms, {p['kernels']} kernels, "
          f"span {p['span_us']:.0f} us, busy {p['busy_us']:.0f} us")
    for name, t, c in p["by_name"][:16]:
        print(f"  {name[:40]:<40} {t:8.1f} us  x{c}")
    print("  first layers:", " | ".join(f"{n[:24]} {d}" for n, d in p["first_layers"]))
