"""Which tokens the next step runs: decode rows first, then prompt chunks, up to the token budget;
speculative drafts for decoding sequences; and the decode step that may be launched ahead."""

from __future__ import annotations

from collections.abc import Callable

from engine.kv_cache import pages_for
from engine.recurrent_state import snap_points
from engine.runner import Runner, StepEntry
from engine.sampler import needs_logits
from engine.scheduler.context import Context
from engine.scheduler.memory import StateManager
from engine.sequences import Seq
from engine.speculative import DraftState, lookup

Plan = list[tuple[Seq, StepEntry]]


class Planner:
    def __init__(self, runner: Runner, mem: StateManager, ctx: Context,
                 drafter: Callable[[Seq, int], list[int]] | None = None):
        """`drafter(seq, k)`: up to k draft tokens for the sequence (a draft model's); None = n-gram lookup."""
        self.runner, self.mem, self.ctx = runner, mem, ctx
        self.drafter = drafter

    def plan(self) -> Plan:
        """The next step; a sequence that cannot get its pages is parked instead."""
        budget = self.ctx.budget
        plan = []
        order = sorted(self.mem.running, key=lambda s: (s.pending > 1, s.admitted))  # decode rows first
        for seq in order:
            if budget <= 0:
                break
            if not self.mem.is_running(seq):  # parked to make room for an earlier sequence
                continue
            n = self._piece(seq, min(seq.pending, budget))
            seq.draft = self._draft(seq, budget) if n == seq.pending == 1 else []
            n += len(seq.draft)
            if not self.mem.grow(seq, seq.n_computed + n):
                seq.draft = []
                self.mem.park(seq)
                continue
            plan.append((seq, n))
            budget -= n
        return [(s, self._entry(s, n)) for s, n in plan if self.mem.is_running(s)]

    def plan_ahead(self, plan: Plan, after_ahead: bool) -> Plan | None:
        """In the steady decode state (every running sequence decoding greedily from the argmax,
        no drafts), the next step can be launched before this one's tokens reach the host, its
        tokens taken on the device from this step's argmax: the device then need not wait while
        the host reads this step's tokens and plans the next. A sequence that ends on this step's
        token (end of generation) wastes its row in that step: the row writes only the cell after
        its last token, in its own pages, and is dropped. Returns that step's plan (its entries'
        tokens are placeholders) with the pages it needs allocated, or None. `after_ahead`: this
        step was itself launched ahead."""
        # Admissions, restores and cancels between steps change the running set; the step after
        # then finds it differs from its plan and plans normally (one step later than without).
        if len(plan) != len(self.mem.running):
            return None
        if not all(self._steady(seq, e) and not self._ends_next(seq) and not self._parks_next(seq)
                   and not self._needs_host_token(seq, after_ahead) for seq, e in plan):
            return None
        entries = [StepEntry(seq.pages, [0], e.start + 1, "last", False, state=seq.state) for seq, e in plan]
        if not self.runner.can_launch_ahead(entries):
            return None
        need = [pages_for(e.start + 1) - len(seq.pages) for (seq, _), e in zip(plan, entries, strict=True)]
        if sum(n for n in need if n > 0) > self.mem.pool.n_free:
            return None
        for (seq, _), e, n in zip(plan, entries, need, strict=True):
            if n > 0:
                seq.pages = seq.pages + self.mem.pool.alloc(n)  # a new list: this step's entry keeps its own
            e.pages = seq.pages
            if seq.spec:
                seq.spec.wants_draft()  # that step is one of the sequence's steps without drafts
        return [(seq, e) for (seq, _), e in zip(plan, entries, strict=True)]

    # --- plan_ahead's conditions, per sequence of this step
    def _steady(self, seq: Seq, e: StepEntry) -> bool:
        """A running, greedy, argmax-only decode row past its first token, without drafts."""
        return (not seq.done and self.mem.is_running(seq) and not seq.draft and len(e.tokens) == 1
                and e.logits == "last" and not e.full_rows and seq.generated > 0)

    def _ends_next(self, seq: Seq) -> bool:
        """This step's token reaches max_tokens or the next one would fill the context."""
        after = seq.generated + 1  # tokens generated once this step's is read
        return 0 <= seq.req.max_tokens <= after or len(seq.tokens) + 1 >= self.ctx.n_ctx_seq

    def _parks_next(self, seq: Seq) -> bool:
        every = self.ctx.preempt_every
        return bool(every) and (seq.generated + 1) % every == 0

    def _needs_host_token(self, seq: Seq, after_ahead: bool) -> bool:
        """A draft needs this step's token on the host: with drafting on, a step without drafts is
        followed by one launched ahead while drafts back off, else only every other step (the one
        after is planned, drafts looked up again)."""
        return bool(self.ctx.spec_n_max) and not (seq.spec and (seq.spec.skip or not after_ahead))

    # --- entries and drafts
    def _piece(self, seq: Seq, n: int) -> int:
        """How many of the n tokens a sequence may take now. A recurrent state advances prompt
        tokens in chunks and generated tokens one at a time (also when they are recomputed), so a
        piece never mixes the two; in exact mode a prompt piece ends at a chunk end or the
        prompt's end (at least one chunk, even past the budget), so the chunks lie at the same
        places along the prompt for any budget and any neighbours."""
        if not self.runner.recurrent:
            return n
        if seq.n_computed >= seq.n_prompt:
            return 1
        end = min(seq.n_prompt, seq.n_computed + n)
        chunk = self.runner.ops.recurrent_chunk
        if self.runner.ops.exact and end < seq.n_prompt:
            aligned = end // chunk * chunk
            end = aligned if aligned > seq.n_computed else min(seq.n_prompt, seq.n_computed + chunk)
        return end - seq.n_computed

    def _entry(self, s: Seq, n: int) -> StepEntry:
        full = needs_logits(s.params, s.req.logprobs)
        if s.draft:
            return StepEntry(s.pages, [s.tokens[-1], *s.draft], s.n_computed, "all", full)
        prompt = s.n_computed < s.n_prompt
        snap = (snap_points(s.n_computed, s.n_computed + n, s.n_prompt, self.runner.ops.recurrent_chunk)
                if prompt and self.runner.recurrent else ())
        return StepEntry(s.pages, s.tokens[s.n_computed : s.n_computed + n], s.n_computed,
                         "last" if s.n_computed + n == len(s.tokens) else "none", full,
                         state=s.state, prompt=prompt, snap=snap, snapshots=s.snapshots)

    def _draft(self, seq: Seq, budget: int) -> list[int]:
        if not self.ctx.spec_n_max or seq.generated == 0:  # the first token comes from the prompt step
            return []
        if seq.spec is None:
            seq.spec = DraftState(self.ctx.spec_n_max)
        if not seq.spec.wants_draft():
            return []
        room = min(seq.spec.length, budget - 1, self.ctx.n_ctx_seq - len(seq.tokens) - 1)
        if seq.req.max_tokens >= 0:
            room = min(room, seq.req.max_tokens - seq.generated - 1)
        return self.drafter(seq, room) if self.drafter is not None else lookup(seq.tokens, room)
