"""The reductions between ranks behind one small interface, and the exact-mode sum.

Exact mode never uses an all-reduce: NCCL picks its algorithm and protocol (ring/tree, LL/LL128/
Simple) by message size, i.e. by the rows in the step, which changes the summation order. It
all-gathers the partial sums instead and adds them on every rank in rank order, an elementwise
((p0 + p1) + p2) + ... whose arithmetic per element is the same for 1 row and 512.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np


class Collective(Protocol):
    """One call serves all ranks (one process drives every rank): xs[r] is rank r's array."""

    tp: int

    def all_gather(self, xs: list[Any]) -> list[list[Any]]:
        """Per rank, every rank's array in rank order."""

    def all_reduce(self, xs: list[Any]) -> list[Any]:
        """Per rank, the sum of all ranks' arrays, in whatever order the transport picks."""


def ordered_sum(parts: list[Any], add: Callable[[Any, Any], Any] = operator.add) -> Any:
    """The exact-mode combine: rank 0's part plus rank 1's, plus rank 2's... one add at a time."""
    acc = parts[0]
    for p in parts[1:]:
        acc = add(acc, p)
    return acc


def reduce_partials(coll: Collective, xs: list[Any], exact: bool,
                    adds: list[Callable[[Any, Any], Any]] | None = None) -> list[Any]:
    """Each rank's sum of the row-parallel partial products: gathered and added in rank order in
    exact mode (with adds[r], rank r's own add, so the sum runs on its device), the transport's
    all-reduce otherwise."""
    if coll.tp == 1:
        return list(xs)
    if not exact:
        return coll.all_reduce(xs)
    adds = adds or [operator.add] * coll.tp
    return [ordered_sum(parts, add) for parts, add in zip(coll.all_gather(xs), adds, strict=True)]


class InProcessCollective:
    """Ranks as a loop over shards in one process (the CPU backend): gathering is handing over the
    arrays; the all-reduce is NumPy's sum over the stacked parts (pairwise, an order of its own)."""

    def __init__(self, tp: int):
        self.tp = tp

    def all_gather(self, xs: list[np.ndarray]) -> list[list[np.ndarray]]:
        return [list(xs) for _ in range(self.tp)]

    def all_reduce(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        total = np.stack(xs).sum(axis=0, dtype=np.float32)
        return [total for _ in range(self.tp)]
