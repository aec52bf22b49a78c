"""The paged KV pool: fixed pages of PAGE_SIZE cells shared by all sequences, one table per sequence."""

from __future__ import annotations

import heapq

from kernels.base import PAGE_SIZE, Ops


def pages_for(n_tokens: int) -> int:
    return -(-n_tokens // PAGE_SIZE)


class PagePool:
    def __init__(self, ops: Ops, n_layers: int, n_pages: int, n_kv_heads: int, head_dim: int, kv_type: str):
        self.ops, self.n_pages, self.kv_type = ops, n_pages, kv_type
        self.layers = [ops.kv_alloc(n_pages, n_kv_heads, head_dim, kv_type) for _ in range(n_layers)]
        self._free = list(range(n_pages))  # a heap: lowest free page first, so placement is reproducible
        heapq.heapify(self._free)

    @property
    def n_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        return [heapq.heappop(self._free) for _ in range(n)]

    def release(self, pages: list[int]) -> None:
        for p in pages:
            heapq.heappush(self._free, p)

    def park(self, pages: list[int]) -> list[tuple]:
        """Copy pages to host memory; the caller frees them."""
        return [self.ops.kv_read_pages(layer, pages) for layer in self.layers]

    def restore(self, pages: list[int], parked: list[tuple]) -> None:
        for layer, data in zip(self.layers, parked, strict=True):
            self.ops.kv_write_pages(layer, pages, data)

    def copy(self, src: list[int], dst: list[int]) -> None:
        for layer in self.layers:
            self.ops.kv_copy_pages(layer, src, dst)

    @staticmethod
    def parked_bytes(parked: list[tuple]) -> int:
        return sum(a.nbytes for layer in parked for a in layer)
