"""What `/metrics` and `/slots` read: figures the compute thread publishes between steps, so a
reader never waits for a step, a park or a restore."""

from __future__ import annotations

from engine.scheduler.context import Context
from engine.scheduler.memory import StateManager
from engine.scheduler.slots import SlotTable


class Snapshot:
    def __init__(self, slots: SlotTable, mem: StateManager, ctx: Context):
        self.slots, self.mem, self.ctx = slots, mem, ctx
        self.stats: dict = {}
        self.rows: list[dict] = []
        self.version = 0  # of the rows
        self.wanted = False
        self._changes = -1

    def publish(self, rows: bool = False) -> None:
        """Stats every time; slot rows (a dict per slot) when asked for, when slots changed hands,
        or when nothing runs."""
        if rows or self.wanted or self._changes != self.slots.changes or not self.mem.running:
            self.wanted = False
            self._changes = self.slots.changes
            self.rows = self.slots.rows(self.ctx.n_ctx_seq)
            self.version += 1
        pool = self.mem.pool
        self.stats = {**self.ctx.counters, "pages_total": pool.n_pages, "pages_free": pool.n_free,
                      "pages_cached": self.slots.cached_pages(),
                      "busy_slots": sum(1 for s in self.slots if s.seq is not None), "n_slots": len(self.slots),
                      "parked_bytes": self.mem.parked_bytes,
                      "recurrent_states": sum(getattr(st, "n_live", 0) for st in self.mem.states)}
