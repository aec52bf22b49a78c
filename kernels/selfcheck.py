"""Exactness checked where it runs: every matmul kernel family the plan may pick for a weight
must give a row the bits that row gets alone, on the device at hand.

Which family serves a batch depends on its row count (streaming for few rows, tiles for many);
their agreement is the exactness contract's matmul rule, measured once on one GPU model. At load
the engine runs, for each of the model's weight shapes, row 0 of a batch at the smallest row count
that selects each family, and compares its bytes with row 0 computed alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

# Row counts tried to find each family's smallest batch (the plan's thresholds lie between them).
ROW_COUNTS = (1, 2, 4, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 1024, 2048)


@dataclass(frozen=True)
class Mismatch:
    family: str
    rows: int
    weight: str
    shape: tuple[int, ...]

    def describe(self) -> str:
        return (f"kernel family {self.family} gives row 0 of {self.rows} rows other bits than the row alone "
                f"(weight {self.weight}, {'x'.join(map(str, self.shape))}) on this device")


def family_rows(ops: Any, w: Any, max_rows: int) -> dict[str, int]:
    """Each family `ops.matmul` may run w on for up to `max_rows` rows, with the fewest rows that pick it."""
    found: dict[str, int] = {}
    for m in sorted({r for r in ROW_COUNTS if r <= max_rows} | {max(1, max_rows)}):
        found.setdefault(ops.matmul_family(m, w), m)
    return found


def check_matmuls(ops: Any, weights: Iterable[tuple[str, Any]], max_rows: int, seed: int = 0
                  ) -> tuple[Mismatch | None, dict]:
    """The first family whose row 0 differs from the row alone, or None; and what was checked
    (families per weight, seconds)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    checked: dict[str, dict[str, int]] = {}
    seen: set = set()
    for name, w in weights:
        shape = _shape(w)
        key = (shape, getattr(w, "dtype", None), getattr(w, "gate_up", None), type(w).__name__)
        if key in seen:
            continue
        seen.add(key)
        families = family_rows(ops, w, max_rows)
        checked[name] = families
        x = (rng.standard_normal((max(families.values()), shape[1])) * 0.5).astype(np.float32)
        alone = ops.to_host(ops.matmul(ops.tensor(x[:1]), w))[0].tobytes()
        for family, rows in families.items():
            got = ops.to_host(ops.matmul(ops.tensor(x[:rows]), w))[0].tobytes()
            if got != alone:
                return Mismatch(family, rows, name, shape), \
                    {"families": checked, "seconds": time.perf_counter() - t0}
    return None, {"families": checked, "seconds": time.perf_counter() - t0}


def _shape(w: Any) -> tuple[int, ...]:
    """[N, K] of an uploaded weight (a CPU gated pair keeps it on its stacked weight)."""
    shape = getattr(w, "shape", None) or w.stacked.shape
    return tuple(int(s) for s in shape)
