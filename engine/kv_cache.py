"""The paged KV pool: fixed pages of PAGE_SIZE cells shared by all sequences, one table per sequence."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from lockstep_kernels.base import PAGE_SIZE, Ops


def pages_for(n_tokens: int) -> int:
    return -(-n_tokens // PAGE_SIZE)


def seq_context(n_ctx: int, n_slots: int, kv_unified: bool, pool_tokens: int) -> int:
    """Most positions one sequence may use: the whole context with a unified KV pool, else its share
    of it in whole pages (as llama-server splits n_ctx across slots); never more than the pool."""
    per_seq = n_ctx if kv_unified else max(PAGE_SIZE, (n_ctx // n_slots) // PAGE_SIZE * PAGE_SIZE)
    return min(per_seq, pool_tokens)


@dataclass
class ParkedKV:
    """A parked sequence's KV on the host: each layer's copy of its pages, and the host copies of any
    per-sequence state besides pages (one entry per state holder, in the holders' order)."""

    layers: list[tuple]
    n_pages: int
    nbytes: int
    states: list = field(default_factory=list)


class PagePool:
    def __init__(self, ops: Ops, n_layers: int, n_pages: int, n_kv_heads: int, head_dim: int, kv_type: str,
                 v_type: str | None = None):
        self.ops, self.n_pages, self.kv_type = ops, n_pages, kv_type
        self.layers = [ops.kv_alloc(n_pages, n_kv_heads, head_dim, kv_type, v_type) for _ in range(n_layers)]
        self._free = list(range(n_pages))  # a heap: lowest free page first, so placement is reproducible
        heapq.heapify(self._free)

    @property
    def n_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int, from_top: bool = False) -> list[int] | None:
        """Lowest free pages first; `from_top` takes the highest (restores land elsewhere, which
        exercises the rule that physical placement cannot matter)."""
        if n > len(self._free):
            return None
        if not from_top:
            return [heapq.heappop(self._free) for _ in range(n)]
        self._free.sort()
        taken = self._free[len(self._free) - n :]
        del self._free[len(self._free) - n :]
        return taken

    def release(self, pages: list[int]) -> None:
        for p in pages:
            heapq.heappush(self._free, p)

    def park(self, pages: list[int]) -> ParkedKV:
        """Copy pages to host memory; the caller frees them."""
        return ParkedKV([self.ops.kv_read_pages(layer, pages) for layer in self.layers], len(pages),
                        self.park_bytes(len(pages)))

    def restore(self, pages: list[int], parked: ParkedKV) -> None:
        for layer, data in zip(self.layers, parked.layers, strict=True):
            self.ops.kv_write_pages(layer, pages, data)

    def copy(self, src: list[int], dst: list[int]) -> None:
        for layer in self.layers:
            self.ops.kv_copy_pages(layer, src, dst)

    def park_bytes(self, n_pages: int) -> int:
        return n_pages * self.page_bytes

    @property
    def page_bytes(self) -> int:
        return sum(a.nbytes // a.shape[0] for layer in self.layers for a in vars(layer).values()
                   if hasattr(a, "nbytes"))
