"""Probe: the Python around CpuOps.dense_layer (the one-call layer) per call, with the compiled layer
stubbed out, for this tree's lockstep_kernels/cpu/ops.py and an older copy of it, alternated in one process.

    git show main:lockstep_kernels/cpu/ops.py > /tmp/old_ops.py
    python bench/probes/cpu_layer_wrapper.py /tmp/old_ops.py
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from engine.threads import configure_threads  # noqa: E402

configure_threads(1)
from engine.launch import read_model  # noqa: E402
from engine.runner import Runner, StepEntry  # noqa: E402
from lockstep_kernels.cpu import layer  # noqa: E402
from lockstep_kernels.cpu import ops as new_ops  # noqa: E402

CALLS = 5000


def _load(path: str):
    spec = importlib.util.spec_from_file_location("old_ops", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_ops"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _layer_call(loaded, mod):
    """A runner on `mod`'s ops after a 128-token prompt, and the arguments of one decode step's first layer."""
    pages = list(range(16))
    r = Runner(loaded, mod.CpuOps(exact=True, threads=1), 64, "f32", max_pages_per_seq=16)
    r.step([StepEntry(pages, list(range(1, 129)), 0, "last", full_rows=False)])
    seen = []
    real = r.ops.dense_layer
    r.ops.dense_layer = lambda *a: seen.append(a) or real(*a)
    r.step([StepEntry(pages, [5], 128, "last", full_rows=False)])
    del r.ops.dense_layer
    return r.ops, seen[0]


def main() -> None:
    loaded = read_model("assets/models/lockstep-pycode-13m", None)
    sides = {"new": _layer_call(loaded, new_ops), "old": _layer_call(loaded, _load(sys.argv[1]))}
    real, layer.dense_layer_16 = layer.dense_layer_16, lambda *a: None
    try:
        for _ in range(3):
            for name, (ops, args) in sides.items():
                t0 = time.perf_counter()
                for _ in range(CALLS):
                    ops.dense_layer(*args)
                print(f"{name} {(time.perf_counter() - t0) / CALLS * 1e6:.1f} us a call")
    finally:
        layer.dense_layer_16 = real


if __name__ == "__main__":
    main()
