"""Hybrid models' per-sequence recurrent state, kept beside the sequence's KV pages.

A `RecurrentStates` holder follows the pages through the scheduler's state manager (see
`engine.scheduler.memory.SeqState`): a sequence gets a zeroed state when it starts running (or the
prompt-cache snapshot it resumes from), a copy when an n > 1 fork copies its pages, a host copy when
it is parked (counted against --preempt-ram) and nothing once its pages are released.

Snapshots: a prompt's state at some of its chunk ends (`snap_points`) is copied to the host while
the prompt runs; a finished sequence's snapshots stay with its slot's prompt cache, and a later
prompt that shares the prefix resumes from the last one inside the shared part (never from a state
built any other way: without one it is recomputed from position 0).
"""

from __future__ import annotations

from engine.runner import Runner
from engine.sequences import Seq
from lockstep_kernels.base import PAGE_SIZE

TAIL_SNAPSHOTS = 4  # chunk ends kept before a prompt's end (a re-sent or extended prompt resumes there)


def snap_points(start: int, end: int, n_prompt: int, chunk: int) -> tuple[int, ...]:
    """Chunk ends in (start, end] to snapshot: page boundaries (shared prefixes such as a system
    prompt) and the last TAIL_SNAPSHOTS chunk ends before the prompt's last token (which is
    always computed again, so a snapshot at the prompt's end would never be used)."""
    first = (start // chunk + 1) * chunk
    tail = n_prompt - 1 - TAIL_SNAPSHOTS * chunk
    return tuple(p for p in range(first, min(end, n_prompt - 1) + 1, chunk) if p % PAGE_SIZE == 0 or p > tail)


class RecurrentStates:
    def __init__(self, runner: Runner):
        self.runner = runner
        self.n_live = 0  # sequences holding a state now (/metrics: recurrent_states)

    def alloc(self, seq: Seq) -> None:
        if seq.state is None:
            self.n_live += 1
        seq.state = self.runner.new_state()
        if seq.n_computed and seq.resume is not None:
            self.runner.ops.state_write(seq.state, seq.resume)
        seq.resume = None

    def free(self, seq: Seq) -> None:
        if seq.state is not None:
            self.n_live -= 1
        seq.state = None

    def copy(self, src: Seq, dst: Seq) -> None:
        self.runner.ops.state_write(dst.state, self.runner.ops.state_read(src.state))
        dst.snapshots = dict(src.snapshots)

    def host_bytes(self, seq: Seq) -> int:
        return self.runner.state_bytes

    def park(self, seq: Seq) -> object:
        return self.runner.ops.state_read(seq.state)

    def restore(self, seq: Seq, host: object) -> None:
        self.runner.ops.state_write(seq.state, host)
