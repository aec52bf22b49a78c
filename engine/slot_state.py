"""An idle slot's prompt cache (its tokens and their KV pages) to host arrays and back, run on the
scheduler's compute thread (Scheduler.call), which owns the slots and the pool.

Restoring writes the same KV bytes into whatever pages are free: placement cannot change a result under
row invariance, so a restored cache serves a request exactly as the saved one did.
"""

from __future__ import annotations

from engine.kv_cache import ParkedKV


class SlotBusy(Exception):
    pass


def _idle(scheduler, slot_id: int):
    slot = scheduler.slots_[slot_id]
    if slot.seq is not None or slot.reserved:
        raise SlotBusy(f"slot {slot_id} is processing a request")
    return slot


def read_slot(scheduler, slot_id: int) -> tuple[list[int], list[tuple]]:
    """(tokens with KV, per layer the page arrays) of the slot's prompt cache."""
    slot = _idle(scheduler, slot_id)
    tokens = list(slot.cache_tokens)
    return tokens, scheduler.pool.park(slot.cache_pages).layers if tokens else []


def write_slot(scheduler, slot_id: int, tokens: list[int], layers: list[tuple]) -> None:
    n_pages = len(layers[0][0]) if layers else 0
    slot = _idle(scheduler, slot_id)
    scheduler.pool.release(slot.cache_pages)
    slot.cache_pages, slot.cache_tokens = [], []
    pages = scheduler.mem.alloc(n_pages) if n_pages else []
    if pages is None:
        raise MemoryError(f"no {n_pages} free KV pages to restore into")
    scheduler.pool.restore(pages, ParkedKV(layers, n_pages, scheduler.pool.park_bytes(n_pages)))
    slot.cache_pages, slot.cache_tokens = pages, list(tokens)


def erase_slot(scheduler, slot_id: int) -> int:
    slot = _idle(scheduler, slot_id)
    n = len(slot.cache_tokens)
    scheduler.pool.release(slot.cache_pages)
    slot.cache_pages, slot.cache_tokens = [], []
    return n
