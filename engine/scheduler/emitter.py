"""From a step's logits rows to events: sampling and logprobs, speculative verification, n > 1
forks, and a sequence's end (its slot's prompt cache, its timings)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from engine import constraints
from engine.kv_cache import pages_for
from engine.requests import DoneEvent, Event, ProgressEvent, Row, TokenEvent
from engine.runner import RowsOut
from engine.sampler import log_softmax, post_sampling_logprobs, sample, top_logprobs
from engine.scheduler.context import Context
from engine.scheduler.memory import StateManager
from engine.scheduler.slots import SlotTable, Waiting
from engine.sequences import Seq
from engine.timings import timings as make_timings
from engine.tokenizer import TextTokenizer


class Emitter:
    def __init__(self, tokenizer: TextTokenizer, mem: StateManager, slots: SlotTable, ctx: Context):
        self.tokenizer, self.mem, self.slots, self.ctx = tokenizer, mem, slots, ctx
        self.outbox: list[tuple[Callable, Event]] = []

    def on_logits(self, seq: Seq, row: Row) -> None:
        """The row after a sequence's last token."""
        if seq.generated == 0 and seq.index == 0 and seq.req.n > 1:
            # the children sample their first token from the prompt's logits, like the parent
            for child in self._fork(seq):
                if not child.done:
                    self._emit(child, row)
        self._emit(seq, row)

    def verify(self, seq: Seq, logits: RowsOut) -> None:
        """Row i predicts the token after draft[i - 1]; keep drafts while they equal the samples."""
        draft, seq.draft = seq.draft, []
        start = seq.n_computed
        accepted = 0
        for i in range(len(draft) + 1):
            seq.n_computed = start + i + 1  # KV is valid through the row that produced this sample
            tok = self._emit(seq, logits.row(i))
            if seq.done or not self.mem.is_running(seq) or i == len(draft) or tok != draft[i] or seq.pending > 1:
                break
            accepted += 1
        seq.spec.record(len(draft), accepted)
        self.ctx.counters["drafts_total"] += 1
        self.ctx.counters["drafted_total"] += len(draft)
        self.ctx.counters["draft_accepted_total"] += accepted

    def progress(self, seq: Seq) -> None:
        """return_progress: how much of the prompt has KV, while the prompt is processed."""
        if seq.req.return_progress and seq.generated == 0 and seq.index == 0:
            self.outbox.append((seq.on_event, ProgressEvent(0, seq.n_prompt, seq.cached_tokens,
                                                            min(seq.n_computed, seq.n_prompt))))

    def finish(self, seq: Seq, reason: str, error: str | None = None) -> None:
        self.mem.drop(seq)
        seq.done = True
        for j in range(1, self.slots.unreserve(seq.req_id) + 1):  # ended before its n > 1 fork
            self.outbox.append((seq.on_event, DoneEvent(j, reason, seq.n_prompt, 0, 0, 0, 0, {}, error)))
        self.slots.vacate(seq, keep_cache=seq.req.cache_prompt and reason not in ("error", "abort"))
        self.outbox.append((seq.on_event, DoneEvent(seq.index, reason, seq.n_prompt, seq.generated,
                                                     seq.cached_tokens, seq.parks, seq.restores, _timings(seq),
                                                     error)))

    def abort(self, cancels: set[tuple[int, int | None]], waiting: Waiting) -> Waiting:
        """Ends the cancelled requests (or single completions) that run or are parked, answers the
        cancelled waiting ones; returns the waiting requests left."""
        whole = {rid for rid, index in cancels if index is None}
        for seq in self.mem.running + list(self.mem.parked):
            if seq.req_id in whole or (seq.req_id, seq.index) in cancels:
                self.finish(seq, "abort")
        kept: Waiting = deque()
        for rid, req, on_event in waiting:
            if rid in whole:
                for j in range(req.n):
                    self.outbox.append((on_event, DoneEvent(j, "abort", len(req.prompt), 0, 0, 0, 0, {})))
            else:
                kept.append((rid, req, on_event))
        return kept

    def _shift(self, seq: Seq) -> bool:
        """llama-server's context shift: the first n_keep tokens (and a BOS) stay, the n_discard after them
        go (half the rest by default), and the sequence goes on. The KV of the kept head is still valid
        (causal: it never saw what followed); the tokens after the cut are recomputed at their new
        positions, which gives the KV a fresh prompt of the shifted tokens would have, where re-rotating
        the old keys would keep values computed with the dropped tokens in view and round each key twice.
        False when nothing can be dropped."""
        n_keep = seq.n_prompt if seq.req.n_keep < 0 else seq.req.n_keep
        if self.tokenizer.bos_id is not None and seq.tokens[0] == self.tokenizer.bos_id:
            n_keep += 1
        n_keep = max(0, min(self.ctx.n_ctx_seq - 4, n_keep))
        n_left = len(seq.tokens) - n_keep
        n_discard = min(max(seq.req.n_discard or n_left // 2, 0), max(0, n_left - 1))
        if n_discard <= 0:
            return False
        del seq.tokens[n_keep : n_keep + n_discard]
        seq.n_computed = min(seq.n_computed, n_keep)
        keep_pages = pages_for(len(seq.tokens))
        self.mem.pool.release(seq.pages[keep_pages:])
        seq.pages = seq.pages[:keep_pages]
        self.ctx.counters["context_shifts"] += 1
        return True

    def _fork(self, seq: Seq) -> list[Seq]:
        """n > 1: each further completion gets a copy of the prompt's pages and its own slot."""
        children = []
        for j, slot in enumerate(self.slots.reserved(seq.req_id), start=1):
            params = replace(seq.params, seed=seq.params.seed + j)
            child = Seq(seq.req_id, j, seq.req, seq.on_event, params, list(seq.tokens), seq.n_prompt,
                        self.ctx.tick(), t_start=seq.t_start)
            self.slots.seat_fork(child, slot)
            children.append(child)
            self.mem.fork(seq, child)
        return children

    def _emit(self, seq: Seq, row: Row) -> int:
        """Samples the row's token and sends it; ends or parks the sequence where that is due."""
        if seq.req.max_tokens == 0:  # the prompt is evaluated (and cached), nothing is generated
            self.finish(seq, "length")
            return -1
        if seq.generated == 0:
            seq.t_first = time.perf_counter()
        logits, best = row
        if seq.params.grammar:
            logits = constraints.mask(seq, self.tokenizer, logits)
            if logits is None:  # the grammar allows nothing more: the answer is complete
                self.finish(seq, "stop")
                return -1
        tok = best if logits is None else sample(logits, seq.params, seq.tokens, seq.generated)
        lp = top = None
        if seq.req.logprobs >= 0 and seq.params.post_sampling_probs:
            lp, top = post_sampling_logprobs(logits, seq.params, seq.tokens, tok, seq.req.logprobs)
        elif seq.req.logprobs >= 0:
            lps = log_softmax(logits)
            lp = float(lps[tok])
            top = top_logprobs(lps, seq.req.logprobs) if seq.req.logprobs > 0 else None
        if self.tokenizer.is_eog(tok):
            self.finish(seq, "stop")
            return tok
        seq.tokens.append(tok)
        if seq.params.grammar:
            constraints.advance(seq, self.tokenizer, tok)
        seq.generated += 1
        self.ctx.counters["tokens_predicted_total"] += 1
        self.outbox.append((seq.on_event, TokenEvent(seq.index, tok, lp, top)))
        every = self.ctx.preempt_every
        if seq.generated >= seq.req.max_tokens >= 0:
            self.finish(seq, "length")
        elif len(seq.tokens) >= self.ctx.n_ctx_seq and not (self.ctx.context_shift and self._shift(seq)):
            self.finish(seq, "length")
        elif every and seq.generated % every == 0 and self.mem.is_running(seq):
            self.mem.park(seq)
        return tok


def _timings(seq: Seq) -> dict:
    now = time.perf_counter()
    t_first = seq.t_first or now
    return make_timings(seq.n_prompt - seq.cached_tokens, (t_first - seq.t_start) * 1000, seq.generated,
                        (now - t_first) * 1000)
