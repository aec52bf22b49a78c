"""What bounds CPU decode of a model on this machine: the 16-bit row kernel's rates on one thread over the
model's own product shapes, at 1 and 4 token rows, turned into tok/s bounds for the whole step.

    python bench/cpu_bound.py -m assets/models/lockstep-pycode-13m --threads 2

One row streams each weight once (bytes/s is its bound: cores x the one-thread rate); four rows share
each weight read (multiply-adds/s is theirs). Both assume every core runs the kernel all step long and
nothing else (attention, norms, the host): figures to put beside the measured tok/s, not to reach.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.loader import load_model  # noqa: E402
from lockstep_kernels.cpu import matvec  # noqa: E402


def _rate(n: int, k: int, rows: int, repeats: int = 200) -> float:
    """Seconds for one rows x [n, k] f16 product on this thread (best of 5)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, k)).astype(np.float16).view(np.uint16)
    w.flags.writeable = False
    x = rng.standard_normal((rows, k)).astype(np.float32)
    out = np.empty((rows, n), np.float32)
    matvec.blocked_rows_16(x, w, 1, out, 0, out, False, 0, n)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            matvec.blocked_rows_16(x, w, 1, out, 0, out, False, 0, n)
        best = min(best, (time.perf_counter() - t0) / repeats)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    c = load_model(args.model).config
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    shapes = [(q + 2 * kv, c.hidden), (c.hidden, q), (2 * c.ffn, c.hidden), (c.hidden, c.ffn)] * c.n_layers
    shapes.append((c.vocab_size, c.hidden))  # lm_head
    macs = sum(n * k for n, k in shapes)
    out = {"model": args.model, "threads": args.threads, "macs_per_row": macs, "weight_bytes": 2 * macs}
    for rows in (1, 4):
        t = sum(_rate(n, k, rows) * shapes.count((n, k)) for n, k in set(shapes))
        out[f"rows_{rows}"] = {"one_thread_step_ms": round(t * 1e3, 3),
                               "one_thread_gb_s": round(2 * macs / t / 1e9, 1),
                               "one_thread_gmac_s": round(rows * macs / t / 1e9, 1),
                               "bound_tok_s": round(rows * args.threads / t)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
