"""One forward step over a batch of sequences' token rows, on whichever backend is loaded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.kv_cache import PagePool, pages_for
from engine.loader import LoadedModel
from engine.models.llama import LlamaModel
from kernels.base import PAGE_SIZE, Ops, PagedRows


@dataclass
class StepEntry:
    """A sequence's part of a step: `tokens` at positions start.. written into its `pages`."""

    pages: list[int]
    tokens: list[int]
    start: int
    logits: str = "last"  # "last", "all" or "none"


class Runner:
    def __init__(self, loaded: LoadedModel, ops: Ops, n_pages: int, kv_type: str):
        c = loaded.config
        self.ops, self.config = ops, c
        self.max_positions = n_pages * PAGE_SIZE
        self.model = LlamaModel(c, loaded.weights, ops, self.max_positions)
        self.pool = PagePool(ops, c.n_layers, n_pages, c.n_kv_heads, c.head_dim, kv_type)

    def step(self, entries: list[StepEntry]) -> list[np.ndarray | None]:
        """Runs one batch; returns per entry its logits rows ([k, vocab] float32 on the host) or None."""
        tokens, positions, seq, slots, logit_rows = [], [], [], [], []
        width = max(len(e.pages) for e in entries)
        tables = np.zeros((len(entries), width), dtype=np.int32)
        spans = []
        for i, e in enumerate(entries):
            n = len(e.tokens)
            if pages_for(e.start + n) > len(e.pages):
                raise ValueError(f"entry {i}: {e.start + n} positions need more than {len(e.pages)} pages")
            tables[i, : len(e.pages)] = e.pages
            pos = np.arange(e.start, e.start + n, dtype=np.int64)
            base = len(tokens)
            tokens.extend(e.tokens)
            positions.append(pos)
            seq.append(np.full(n, i, dtype=np.int32))
            slots.append(np.asarray(e.pages, dtype=np.int64)[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE)
            first = len(logit_rows)
            if e.logits == "all":
                logit_rows.extend(range(base, base + n))
            elif e.logits == "last":
                logit_rows.append(base + n - 1)
            spans.append((first, len(logit_rows)))
        ops = self.ops
        rows = PagedRows(
            positions=ops.tensor(np.concatenate(positions).astype(np.int32)),
            seq=ops.tensor(np.concatenate(seq)),
            block_tables=ops.tensor(tables),
            slots=ops.tensor(np.concatenate(slots)),
        )
        ids = ops.tensor(np.asarray(tokens, dtype=np.int32))
        if not logit_rows:
            self.model.forward(ids, rows, self.pool.layers, ops.tensor(np.zeros(0, dtype=np.int64)))
            return [None] * len(entries)
        logits = ops.to_host(self.model.forward(ids, rows, self.pool.layers,
                                                ops.tensor(np.asarray(logit_rows, dtype=np.int64))))
        return [logits[a:b] if b > a else None for a, b in spans]


def make_ops(device: str, exact: bool) -> Ops:
    if device == "cpu":
        from kernels.cpu.ops import CpuOps

        return CpuOps(exact=exact)
    from kernels.cuda.ops import CudaOps  # noqa: PLC0415 - CuPy is optional

    return CudaOps(exact=exact)


def prompt_logits(loaded: LoadedModel, tokens: list[int], exact: bool = False, kv_type: str = "f32",
                  chunk: int | None = None) -> np.ndarray:
    """Float32 logits of every prompt position, computed on the CPU (the numerical reference)."""
    n_pages = max(1, pages_for(len(tokens)))
    runner = Runner(loaded, make_ops("cpu", exact), n_pages, kv_type)
    pages = runner.pool.alloc(n_pages)
    step = chunk or len(tokens)
    out = [runner.step([StepEntry(pages, tokens[i : i + step], i, "all")])[0] for i in range(0, len(tokens), step)]
    return np.concatenate(out)
