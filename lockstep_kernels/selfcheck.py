"""Exactness checked where it runs: every kernel family or build the plan may pick for an op must
give a row the bits that row gets alone, on the device at hand.

Which kernel serves a batch depends on its row count (streaming for few rows, tiles for many; the
fused q|k|v projection's prologues; attention's latency and throughput builds); their agreement is
the exactness contract, measured once on one GPU model. At load the engine runs, for each of the
model's shapes, row 0 of a batch at the smallest row count that selects each choice (for attention
also its middle and last rows), and compares its bytes with that row computed alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lockstep_kernels.base import PAGE_SIZE, PagedRows

# Row counts tried to find each choice's smallest batch (the plan's thresholds lie between them).
ROW_COUNTS = (1, 2, 4, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 1024, 2048)
ATTENTION_CONTEXT = PAGE_SIZE + 44  # two chunks: the check runs the merge too


@dataclass(frozen=True)
class Mismatch:
    family: str
    rows: int
    where: str  # what was checked: "weight layers.0.wo, 4096x4096", "attention, ..."
    row: int = 0  # the row of the batch that differs

    def describe(self) -> str:
        return (f"kernel family {self.family} gives row {self.row} of {self.rows} rows other bits than the row alone "
                f"({self.where}) on this device")


@dataclass(frozen=True)
class AttentionShape:
    n_heads: int
    n_kv: int
    head_dim: int
    width: int  # pages a sequence's block table holds (the launch shape depends on it)
    kv_type: str

    def __str__(self) -> str:
        return (f"attention, {self.n_heads} heads, {self.n_kv} KV heads, head dim {self.head_dim}, "
                f"{self.kv_type} KV")


def first_rows(pick: Callable[[int], str], max_rows: int) -> dict[str, int]:
    """Each choice `pick(rows)` makes for up to `max_rows` rows, with the fewest rows that make it."""
    found: dict[str, int] = {}
    for m in sorted({r for r in ROW_COUNTS if r <= max_rows} | {max(1, max_rows)}):
        found.setdefault(pick(m), m)
    return found


def family_rows(ops: Any, w: Any, max_rows: int) -> dict[str, int]:
    return first_rows(lambda m: ops.matmul_family(m, w), max_rows)


def qkv_rows(ops: Any, w: Any, max_rows: int) -> dict[str, int]:
    return first_rows(lambda m: ops.qkv_family(m, w), max_rows)


def attention_rows(ops: Any, s: AttentionShape, max_rows: int) -> dict[str, int]:
    return first_rows(lambda m: ops.attention_build(m, s.n_heads, s.n_kv, s.head_dim, s.width, s.kv_type), max_rows)


def _first_difference(choices: dict[str, int], row0: Callable[[int], bytes]) -> tuple[str, int] | None:
    alone = row0(1)
    for choice, rows in choices.items():
        if row0(rows) != alone:
            return choice, rows
    return None


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
        checked[name] = families = family_rows(ops, w, max_rows)
        x = (rng.standard_normal((max(families.values()), shape[1])) * 0.5).astype(np.float32)
        bad = _first_difference(families,
                                lambda m, x=x, w=w: ops.to_host(ops.matmul(ops.tensor(x[:m]), w)[:1])[0].tobytes())
        if bad:
            return Mismatch(*bad, f"weight {name}, {'x'.join(map(str, shape))}"), _info(checked, t0)
    return None, _info(checked, t0)


def check_qkv(ops: Any, name: str, norm_weight: Any, eps: float, w: Any, bias: Any, rope: Any,
              s: AttentionShape, max_rows: int, seed: int = 0) -> tuple[Mismatch | None, dict]:
    """norm_qkv_rope_write (the fused q|k|v projection) under each kernel it may take: row 0's
    rotated q and the K and V it stores must not depend on the rows beside it."""
    t0 = time.perf_counter()
    families = qkv_rows(ops, w, max_rows)
    m_max = max(families.values())
    x = (np.random.default_rng(seed).standard_normal((m_max, _shape(w)[1])) * 0.5).astype(np.float32)
    layer = ops.kv_alloc(-(-m_max // PAGE_SIZE), s.n_kv, s.head_dim, s.kv_type)
    positions = np.arange(m_max, dtype=np.int32) % int(rope.cos.shape[0])

    def row0(m: int) -> bytes:
        rows = PagedRows(ops.tensor(positions[:m]), ops.tensor(np.zeros(m, np.int32)),
                         ops.tensor(np.zeros((1, layer_pages(layer)), np.int32)),
                         ops.tensor(np.arange(m, dtype=np.int64)))
        q = ops.norm_qkv_rope_write(ops.tensor(x[:m]), norm_weight, eps, w, bias, rows, rope, layer,
                                    s.n_heads, s.n_kv)
        cells = ops.kv_read_pages(layer, ops.tensor(np.zeros(1, np.int64)))  # row 0's slot: page 0, cell 0
        return ops.to_host(q)[0].tobytes() + b"".join(np.ascontiguousarray(c[0, 0]).tobytes() for c in cells)

    bad = _first_difference(families, row0)
    info = _info({name: families}, t0)
    return (Mismatch(*bad, f"q|k|v {name}, {'x'.join(map(str, _shape(w)))}") if bad else None), info


def check_attention(ops: Any, s: AttentionShape, max_rows: int, seed: int = 0) -> tuple[Mismatch | None, dict]:
    """Attention under each build the plan may compile: a row over a two-chunk context (the first,
    middle and last of the launch) must not depend on how many rows share the launch."""
    t0 = time.perf_counter()
    builds = attention_rows(ops, s, max_rows)
    rng = np.random.default_rng(seed)
    ctx = ATTENTION_CONTEXT
    layer = ops.kv_alloc(-(-ctx // PAGE_SIZE), s.n_kv, s.head_dim, s.kv_type)
    k, v = (rng.standard_normal((2, ctx, s.n_kv, s.head_dim)) * 0.5).astype(np.float32)
    ops.kv_write(layer, ops.tensor(k), ops.tensor(v), ops.tensor(np.arange(ctx, dtype=np.int64)))
    m_max = max(builds.values())
    q = rng.standard_normal((m_max, s.n_heads, s.head_dim)).astype(np.float32)
    table = np.zeros((1, max(s.width, layer_pages(layer))), np.int32)
    table[0, : layer_pages(layer)] = np.arange(layer_pages(layer))

    def attend(qs: np.ndarray) -> np.ndarray:
        m = len(qs)
        rows = PagedRows(ops.tensor(np.full(m, ctx - 1, np.int32)), ops.tensor(np.zeros(m, np.int32)),
                         ops.tensor(table), None)
        return ops.to_host(ops.attention(ops.tensor(qs), layer, rows, s.head_dim**-0.5))

    # The first, middle and last rows: a kernel that serves a block's rows in passes or through masks
    # could leave part of a tile wrong while its first row is right.
    alone: dict[int, bytes] = {}
    for build, m in builds.items():
        got = attend(q[:m])
        for i in sorted({0, m // 2, m - 1}):
            if i not in alone:
                alone[i] = attend(q[i:i + 1])[0].tobytes()
            if got[i].tobytes() != alone[i]:
                return Mismatch(build, m, str(s), i), _info({"attention": builds}, t0)
    return None, _info({"attention": builds}, t0)


def layer_pages(layer: Any) -> int:
    return int(layer.k.shape[0])


def _info(checked: dict, t0: float) -> dict:
    return {"families": checked, "seconds": time.perf_counter() - t0}


def _shape(w: Any) -> tuple[int, ...]:
    """[N, K] of an uploaded weight (a CPU gated pair keeps it on its stacked weight)."""
    shape = getattr(w, "shape", None) or w.stacked.shape
    return tuple(int(s) for s in shape)
