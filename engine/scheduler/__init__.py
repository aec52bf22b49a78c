"""The engine's scheduler: continuous batching, pages and parks, planning and emitting (see `loop`)."""

from engine.scheduler.loop import Scheduler

__all__ = ["Scheduler"]
