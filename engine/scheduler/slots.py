"""The slot table: which sequence holds each slot, the prompt cache an idle slot keeps, admission
into slots (prefix reuse, `id_slot`), and the slots an n > 1 request reserves for its forks."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from engine.kv_cache import PagePool, pages_for
from engine.requests import Request
from engine.scheduler.context import Context
from engine.sequences import Seq, Slot, common_prefix

if TYPE_CHECKING:
    from engine.scheduler.memory import StateManager

Waiting = deque[tuple[int, Request, Callable]]


class SlotTable:
    def __init__(self, n_slots: int, pool: PagePool, ctx: Context, snapshots_only: bool = False):
        """`snapshots_only`: a cached prefix is reused only up to a recurrent-state snapshot (hybrid models)."""
        self.pool, self.ctx, self.snapshots_only = pool, ctx, snapshots_only
        self.all = [Slot(i) for i in range(n_slots)]
        self.changes = 0  # counts sequences seated and vacated: a snapshot of the rows is stale when it moved

    def __getitem__(self, i: int) -> Slot:
        return self.all[i]

    def __len__(self) -> int:
        return len(self.all)

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.all)

    # --- prompt caches
    def evict_cache(self) -> bool:
        """Drops the least recently used idle slot's prompt cache; False when there is none."""
        idle = [s for s in self.all if s.seq is None and s.cache_pages]
        if not idle:
            return False
        self._drop_cache(min(idle, key=lambda s: s.last_used))
        return True

    def idle_cache_pages(self) -> int:
        return sum(len(s.cache_pages) for s in self.all if s.seq is None)

    def cached_pages(self) -> int:
        return sum(len(s.cache_pages) for s in self.all)

    def _drop_cache(self, slot: Slot) -> None:
        self.pool.release(slot.cache_pages)
        slot.cache_pages, slot.cache_tokens, slot.cache_states = [], [], {}

    # --- admission
    def admit(self, waiting: Waiting, mem: StateManager) -> None:
        """Starts waiting requests in order while slots and pages allow."""
        while waiting:
            rid, req, on_event = waiting[0]
            idle = [s for s in self.all if s.seq is None and not s.reserved]
            if len(idle) < req.n:
                return
            slot, reuse = self._pick(idle, req)
            for other in [s for s in idle if s is not slot][: req.n - 1]:
                other.reserved = rid
            need = pages_for(len(req.prompt)) - pages_for(reuse)
            if not mem.can_free(need + len(mem.running)) and mem.running:
                return  # keep a page of headroom per running sequence so admission does not force parks
            waiting.popleft()
            self.ctx.counters["requests_total"] += 1
            self.ctx.counters["prompt_tokens_total"] += len(req.prompt)
            seq = Seq(rid, 0, req, on_event, req.params, list(req.prompt), len(req.prompt), self.ctx.tick(),
                      t_start=time.perf_counter())
            self._seat(seq, slot)
            if reuse:
                keep = pages_for(reuse)
                seq.pages = slot.cache_pages[:keep]
                self.pool.release(slot.cache_pages[keep:])
                seq.n_computed = seq.cached_tokens = reuse
                seq.resume = slot.cache_states.get(reuse)
                seq.snapshots = {p: d for p, d in slot.cache_states.items() if p <= reuse}
                slot.cache_pages, slot.cache_tokens, slot.cache_states = [], [], {}
            else:
                self._drop_cache(slot)
            mem.start(seq)

    def _pick(self, idle: list[Slot], req: Request) -> tuple[Slot, int]:
        if 0 <= req.id_slot < len(self.all) and self.all[req.id_slot].seq is None:
            slot = self.all[req.id_slot]
        else:
            # an empty slot, else the least recently used cache: other prompts' caches stay alive
            slot = min(idle, key=lambda s: (len(s.cache_pages), s.last_used))
            if req.cache_prompt:
                best = max(idle, key=lambda s: (common_prefix(s.cache_tokens, req.prompt), -s.id))
                if common_prefix(best.cache_tokens, req.prompt):
                    slot = best
        reuse = 0
        if req.cache_prompt:
            # the last prompt token is always computed again: its logits start the generation
            reuse = min(common_prefix(slot.cache_tokens, req.prompt), len(req.prompt) - 1)
            if self.snapshots_only:
                reuse = max((p for p in slot.cache_states if p <= reuse), default=0)
        return slot, reuse

    def _seat(self, seq: Seq, slot: Slot) -> None:
        seq.slot, slot.seq = slot.id, seq
        self.changes += 1

    # --- n > 1
    def reserved(self, req_id: int) -> list[Slot]:
        """The slots a request's further completions will take, in slot order."""
        return [s for s in self.all if s.reserved == req_id]

    def seat_fork(self, child: Seq, slot: Slot) -> None:
        slot.reserved = 0
        self._drop_cache(slot)
        self._seat(child, slot)

    def unreserve(self, req_id: int) -> int:
        """Frees a request's reserved slots (it ended before its fork); returns how many."""
        reserved = self.reserved(req_id)
        for slot in reserved:
            slot.reserved = 0
        return len(reserved)

    # --- finish
    def vacate(self, seq: Seq, keep_cache: bool) -> None:
        """The sequence's slot goes idle; its pages become the slot's prompt cache or are freed."""
        slot = self.all[seq.slot]
        slot.seq = None
        self.changes += 1
        slot.last_used = self.ctx.tick()
        if keep_cache and seq.pages:
            # KV exists for tokens[:n_computed]; keep it for the next request's common prefix
            slot.cache_tokens, slot.cache_pages = seq.tokens[: seq.n_computed], seq.pages
            slot.cache_states = seq.snapshots
        else:
            self.pool.release(seq.pages)
        seq.pages = []

    def rows(self, n_ctx_seq: int) -> list[dict]:
        """`/slots`: one row per slot."""
        out = []
        for s in self.all:
            q = s.seq
            out.append({
                "id": s.id, "task": q.req_id if q else -1, "n_ctx": n_ctx_seq,
                "is_processing": q is not None, "is_preempted": bool(q and q.is_parked),
                "n_preempt": s.n_preempt, "n_restore": s.n_restore,
                "params": vars(q.params).copy() if q else {},
                "prompt_tokens": q.n_prompt if q else 0, "generated": q.generated if q else 0,
                "cached_tokens": len(s.cache_tokens),
                "n_drafted": q.spec.drafted if q and q.spec else 0,
                "n_accepted": q.spec.accepted if q and q.spec else 0,
            })
        return out
