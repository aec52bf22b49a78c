"""Probe: one 512-token prompt through the 8B shape (random weights), launched as the engine does
(CuPy's launches on the default stream) against every kernel launched with programmatic dependent
launch outside graph capture too (cuLaunchKernelEx, on a stream of its own). Wall time of the
forward pass (median), host time to enqueue it, and whether the logits keep their bits.
  python3 bench/probes/prefill_pdl.py [--shape 8B] [--tokens 512] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gpu_ops import model_setup  # noqa: E402
from lockstep_kernels.base import PagedRows  # noqa: E402
from lockstep_kernels.cuda import launch as kernel_launch  # noqa: E402
from lockstep_kernels.cuda import ops as cuda_ops  # noqa: E402

ORIGINAL = kernel_launch.launch


def driver_launch(pdl: bool):
    def launch(fn, grid, block, args, shared: int = 0) -> None:
        kernel_launch._driver_launch(fn, grid, block, args, shared, cp.cuda.get_current_stream(), pdl)
    return launch


def measure(forward, stream, reps: int) -> dict:
    with stream:
        out = forward()
        stream.synchronize()
        walls, hosts = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            out = forward()
            t1 = time.perf_counter()
            stream.synchronize()
            walls.append(time.perf_counter() - t0)
            hosts.append(t1 - t0)
    return {"wall_ms": statistics.median(walls) * 1e3, "host_ms": statistics.median(hosts) * 1e3,
            "logits": out.get().tobytes()}


def prompt_forward(exact: bool, shape: str, tokens: int):
    """The model's forward pass over one prompt of `tokens` tokens (random weights), as a function."""
    cfg, ops, model, pool, pages = model_setup(exact, shape, 1, tokens)
    pos = np.arange(tokens)
    table = np.arange(pages, dtype=np.int32)
    rows = PagedRows(ops.tensor(pos.astype(np.int32)), ops.tensor(np.zeros(tokens, np.int32)),
                     ops.tensor(table[None]), ops.tensor(table[pos // 256].astype(np.int64) * 256 + pos % 256))
    ids = ops.tensor((pos % cfg.vocab_size).astype(np.int32))
    last = ops.tensor(np.array([tokens - 1], np.int64))

    def forward():
        return model.forward(ids, rows, pool.layers, last)

    return forward


def run_mode(exact: bool, a) -> list[dict]:
    forward = prompt_forward(exact, a.shape, a.tokens)
    out, ref = [], None
    own = cp.cuda.Stream(non_blocking=False)
    for label, launcher, stream in (("cupy, default stream", ORIGINAL, cp.cuda.Stream.null),
                                    ("cupy, own stream", ORIGINAL, own),
                                    ("driver, own stream, no PDL", driver_launch(False), own),
                                    ("driver, own stream, PDL", driver_launch(True), own)):
        cuda_ops.launch = launcher
        try:
            r = measure(forward, stream, a.reps)
        except Exception as e:  # keep measuring the others
            out.append({"exact": exact, "launch": label, "error": str(e)[:300]})
            print(exact, label, "FAILED", e, flush=True)
            continue
        finally:
            cuda_ops.launch = ORIGINAL
        logits = r.pop("logits")
        ref = ref or logits
        r.update(exact=exact, launch=label, same_bits=logits == ref, tok_s=a.tokens / r["wall_ms"] * 1e3)
        out.append(r)
        print(f"{a.shape} exact={exact!s:5s} {label:28s} {r['wall_ms']:7.2f} ms  host {r['host_ms']:6.2f} ms  "
              f"{r['tok_s']:8.0f} tok/s  same bits {r['same_bits']}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8B")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = run_mode(True, a)
    cp.get_default_memory_pool().free_all_blocks()
    rows += run_mode(False, a)
    if a.out:
        Path(a.out).write_text(json.dumps({"shape": a.shape, "tokens": a.tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
