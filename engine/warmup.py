"""Every kernel a model can need, built before the engine reports ready.

Kernels are compiled (or read back from CuPy's disk cache) the first time a shape asks for them, so
without this the first requests pay for it and run slower than the ones after. At load the decode
graphs of every batch bucket are captured (each capture runs its step once, which builds that step's
kernels) and throwaway prompts run at the row counts where the kernel plan may change its choice, up
to -ub rows, on pages that go back to the pool after.
"""

from __future__ import annotations

import logging
import time

from engine.kv_cache import pages_for
from engine.runner import Runner, StepEntry
from lockstep_kernels.selfcheck import ROW_COUNTS

log = logging.getLogger("engine.warmup")


def prompt_rows(ubatch: int) -> list[int]:
    """The prompt sizes warmed: each threshold row count of the plan up to -ub, and -ub itself."""
    return sorted({r for r in ROW_COUNTS if r <= ubatch} | {max(1, ubatch)})


def warm_up(runner: Runner, ubatch: int, prompts: bool = True) -> dict:
    """Builds the decode graphs and runs one throwaway prompt of each prompt_rows size (`prompts`; else
    one row: the CPU backend's kernels do not depend on the row count); returns what it did (buckets
    captured, prompt sizes, seconds)."""
    t0 = time.perf_counter()
    buckets = runner.graphs.capture_all() if runner.graphs is not None else []
    sizes = [] if runner.recurrent else prompt_rows(ubatch) if prompts else [1]
    pages = runner.pool.alloc(pages_for(max(sizes, default=0))) if sizes else None
    if sizes and pages is None:
        log.warning("warm-up: the pool has fewer than %d free pages, prompts not warmed", pages_for(max(sizes)))
        sizes = []
    try:
        for n in sizes:
            runner.step([StepEntry(pages=pages[: pages_for(n)], tokens=[0] * n, start=0, full_rows=False)])
    finally:
        if pages:
            runner.pool.release(pages)
    done = {"buckets": list(buckets), "prompt_rows": sizes, "seconds": time.perf_counter() - t0}
    log.info("warm-up: decode graphs %s, prompts of %s rows, %.2f s", done["buckets"] or "none",
             ", ".join(map(str, sizes)) or "no", done["seconds"])
    return done
