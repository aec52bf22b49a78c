"""Pages and per-sequence state: who runs, who is parked, and the host memory parked KV takes.

A sequence is running (its KV on the device) or parked (its KV on the host as a `ParkedKV`, or
dropped to be recomputed from its tokens when host memory for parking is exhausted). Pages are
taken lowest first, from idle slots' prompt caches next, and by parking the newest running
sequence last.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from engine.kv_cache import PagePool, pages_for
from engine.scheduler.context import Context
from engine.scheduler.slots import SlotTable
from engine.sequences import Seq


class SeqState(Protocol):
    """Per-sequence state besides KV pages (a hybrid model's recurrent state). The manager calls a
    holder wherever it changes a sequence's pages, so the state lives exactly as long as they do:
    `alloc` when a sequence starts running with fresh or restored pages, `copy` when an n > 1 fork
    copies them, `park` (returns the host copy, which `restore` gets back; `host_bytes` counts it
    against the parking budget) and `free` when they are released. A recomputed sequence is
    `free`d, then `alloc`ed again and recomputed from its first token."""

    def alloc(self, seq: Seq) -> None: ...
    def free(self, seq: Seq) -> None: ...
    def copy(self, src: Seq, dst: Seq) -> None: ...
    def host_bytes(self, seq: Seq) -> int: ...
    def park(self, seq: Seq) -> object: ...
    def restore(self, seq: Seq, host: object) -> None: ...


class StateManager:
    def __init__(self, pool: PagePool, slots: SlotTable, ctx: Context, states: list[SeqState] | None = None):
        self.pool, self.slots, self.ctx = pool, slots, ctx
        self.states: list[SeqState] = list(states or [])
        self.running: list[Seq] = []
        self.parked: deque[Seq] = deque()
        self.parked_bytes = 0

    def is_running(self, seq: Seq) -> bool:
        return seq in self.running

    def start(self, seq: Seq) -> None:
        """A sequence enters the running set with the pages it holds."""
        for st in self.states:
            st.alloc(seq)
        self.running.append(seq)

    def alloc(self, n: int, exclude: Seq | None = None, from_top: bool = False) -> list[int] | None:
        """n pages, dropping idle slots' prompt caches and then parking the newest sequences if needed."""
        if n <= 0:
            return []
        while self.pool.n_free < n:
            if self.slots.evict_cache():
                continue
            victims = [s for s in self.running if s is not exclude]
            if not victims:
                return None
            self.park(max(victims, key=lambda s: s.admitted))
        return self.pool.alloc(n, from_top=from_top)

    def grow(self, seq: Seq, n_tokens: int) -> bool:
        """Pages for `n_tokens` positions; False when none can be had without parking `seq` itself."""
        need = pages_for(n_tokens) - len(seq.pages)
        if need > 0:
            pages = self.alloc(need, exclude=seq)
            if pages is None:
                return False
            seq.pages += pages
        return True

    def can_free(self, n: int) -> bool:
        return self.pool.n_free + self.slots.idle_cache_pages() >= n

    def park(self, seq: Seq) -> None:
        size = self.pool.park_bytes(len(seq.pages)) + sum(st.host_bytes(seq) for st in self.states)
        fits = self.ctx.preempt_mode != "recompute" and self.parked_bytes + size <= self.ctx.preempt_ram_bytes
        if seq.pages and fits:
            seq.parked = self.pool.park(seq.pages)
            seq.parked.states = [st.park(seq) for st in self.states]
            seq.parked.nbytes = size
            self.parked_bytes += size
            self.ctx.counters["parks"] += 1
        else:  # host memory for parking is exhausted: drop the KV and recompute it later
            seq.parked = None
            seq.n_computed = 0
            self.ctx.counters["recomputes"] += 1
        self._release(seq)
        seq.is_parked = True
        seq.parks += 1
        self.slots[seq.slot].n_preempt += 1
        self.running.remove(seq)
        self.parked.append(seq)

    def park_unstarted(self, seq: Seq) -> None:
        """A sequence that never got pages (an n > 1 fork in a full pool) waits to be computed."""
        seq.is_parked, seq.n_computed = True, 0
        self.parked.append(seq)

    def restore_parked(self) -> None:
        """Oldest parked first, into whatever pages are free, while a page of headroom remains."""
        while self.parked:
            seq = self.parked[0]
            if seq.parked is not None:
                need = max(seq.parked.n_pages, pages_for(seq.n_computed + 1))
            else:
                need = pages_for(len(seq.tokens))
            if self.pool.n_free < need + 1 and not self.can_free(need + 1):
                return
            pages = self.alloc(need, from_top=True)
            if pages is None:
                return
            self.parked.popleft()
            seq.pages, seq.is_parked = pages, False
            host, seq.parked = seq.parked, None
            if host is None:
                self.start(seq)
                continue
            self.pool.restore(pages[: host.n_pages], host)
            for st, data in zip(self.states, host.states, strict=True):
                st.alloc(seq)
                st.restore(seq, data)
            self.parked_bytes -= host.nbytes
            seq.restores += 1
            self.slots[seq.slot].n_restore += 1
            self.ctx.counters["restores"] += 1
            self.running.append(seq)

    def fork(self, parent: Seq, child: Seq) -> None:
        """n > 1: the child gets a copy of the parent's pages (and state), or waits parked for them."""
        pages = self.alloc(len(parent.pages), exclude=parent)
        if pages is None:
            self.park_unstarted(child)  # recompute the prompt once pages free up
            return
        self.pool.copy(parent.pages, pages)
        child.pages, child.n_computed = pages, parent.n_computed
        self.start(child)
        for st in self.states:
            st.copy(parent, child)

    def drop(self, seq: Seq) -> None:
        """A finished sequence leaves the running or parked set; its pages stay with the caller."""
        if seq in self.running:
            self.running.remove(seq)
            for st in self.states:
                st.free(seq)
        elif seq in self.parked:
            self.parked.remove(seq)
            if seq.parked is not None:
                self.parked_bytes -= seq.parked.nbytes

    def _release(self, seq: Seq) -> None:
        self.pool.release(seq.pages)
        seq.pages = []
        for st in self.states:
            st.free(seq)
