"""Continuous batching over slots, page-granular admission, parking and restore.

One compute thread runs steps. Each step takes every running sequence's pending tokens (one for a
decoding sequence, a chunk of the prompt for a prefilling one) up to the token budget, runs them as
one batch and samples where a sequence reached its last token. Under row invariance none of these
choices changes any sequence's bits, which is what makes the output exact.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from engine.kv_cache import pages_for, seq_context
from engine.requests import DoneEvent, Event, QueueFullError, Request, Row, TokenEvent, call_each
from engine.runner import Pending, RowsOut, Runner, StepEntry
from engine.sampler import log_softmax, needs_logits, sample, top_logprobs
from engine.sequences import Seq, Slot, common_prefix
from engine.speculative import DraftState, lookup
from engine.tokenizer import TextTokenizer
from kernels.base import PAGE_SIZE

log = logging.getLogger("engine.scheduler")


class Scheduler:
    def __init__(self, runner: Runner, tokenizer: TextTokenizer, *, n_slots: int, n_ctx: int, n_batch: int,
                 n_ubatch: int, kv_unified: bool, preempt_ram_bytes: int, preempt_every: int = 0,
                 max_queue: int = 64, spec_n_max: int = 0,
                 dispatch: Callable[[list[tuple[Callable, Event]]], None] = call_each):
        """`dispatch` receives each step's events at once, on the compute thread: a server hands the
        whole batch to its event loop with one wake-up instead of one per token."""
        self.runner, self.tokenizer, self.pool = runner, tokenizer, runner.pool
        self.n_ctx_seq = seq_context(n_ctx, n_slots, kv_unified, self.pool.n_pages * PAGE_SIZE)
        self.budget = max(1, min(n_batch, n_ubatch))
        self.preempt_ram_bytes = preempt_ram_bytes
        self.preempt_every = preempt_every or int(os.environ.get("LOCKSTEP_PREEMPT_EVERY", "0") or 0)
        self.max_queue = max_queue
        self.spec_n_max = spec_n_max
        self.dispatch = dispatch
        self._outbox: list[tuple[Callable, Event]] = []
        self.slots_ = [Slot(i) for i in range(n_slots)]
        self._waiting: deque[tuple[int, Request, Callable]] = deque()
        self._cancel: set[tuple[int, int | None]] = set()
        self._running: list[Seq] = []
        self._parked: deque[Seq] = deque()
        self._parked_bytes = 0
        self._ids = itertools.count(1)
        self._admit_order = itertools.count()
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        # a decode step launched before the previous step's tokens reached the host (_plan_ahead)
        self._ahead: tuple[list[tuple[Seq, StepEntry]], Pending] | None = None
        self.counters = dict.fromkeys(("parks", "restores", "recomputes", "requests_total", "prompt_tokens_total",
                                       "tokens_predicted_total", "drafted_total",
                                       "draft_accepted_total", "steps_total", "decode_steps_total",
                                       "ahead_steps_total"), 0)
        self.counters |= {"step_seconds_total": 0.0, "decode_step_seconds_total": 0.0, "busy_seconds_total": 0.0}

    # ------------------------------------------------------------------ public API
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="engine-compute", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread:
            self._thread.join(timeout=10)

    def submit(self, req: Request, on_event: Callable[[Event], None]) -> int:
        if not req.prompt:
            raise ValueError("the prompt is empty")
        if len(req.prompt) >= self.n_ctx_seq:
            raise ValueError(f"the prompt has {len(req.prompt)} tokens; the context holds {self.n_ctx_seq} "
                             "per sequence (raise --ctx-size)")
        if req.n < 1 or req.n > len(self.slots_):
            raise ValueError(f"n={req.n} needs between 1 and {len(self.slots_)} slots")
        with self._cv:
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(f"the request queue is full ({self.max_queue} waiting)")
            rid = next(self._ids)
            self._waiting.append((rid, req, on_event))
            self._cv.notify_all()
        return rid

    def cancel(self, request_id: int, index: int | None = None) -> None:
        """Aborts a request, or only its completion `index` (n > 1: one choice hit a stop string)."""
        with self._cv:
            self._cancel.add((request_id, index))
            self._cv.notify_all()

    def stats(self) -> dict:
        with self._cv:
            busy = sum(1 for s in self.slots_ if s.seq is not None)
            return {**self.counters, "pages_total": self.pool.n_pages, "pages_free": self.pool.n_free,
                    "pages_cached": sum(len(s.cache_pages) for s in self.slots_),
                    "queue_len": len(self._waiting), "busy_slots": busy, "n_slots": len(self.slots_),
                    "parked_bytes": self._parked_bytes}

    def slots(self) -> list[dict]:
        with self._cv:
            out = []
            for s in self.slots_:
                q = s.seq
                out.append({
                    "id": s.id, "task": q.req_id if q else -1, "n_ctx": self.n_ctx_seq,
                    "is_processing": q is not None, "is_preempted": bool(q and q.is_parked),
                    "n_preempt": s.n_preempt, "n_restore": s.n_restore,
                    "params": vars(q.params).copy() if q else {},
                    "prompt_tokens": q.n_prompt if q else 0, "generated": q.generated if q else 0,
                    "cached_tokens": len(s.cache_tokens),
                    "n_drafted": q.spec.drafted if q and q.spec else 0,
                    "n_accepted": q.spec.accepted if q and q.spec else 0,
                })
            return out

    # ------------------------------------------------------------------ compute thread
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._has_work():
                    self._cv.wait(timeout=1.0)
                if self._stop:
                    return
                t_busy = time.perf_counter()
                self._apply_cancels()
                self._restore_parked()
                self._admit()
            try:
                self._step()
            except Exception as e:  # a failed step fails its requests, never the server
                log.exception("step failed")
                self._ahead = None
                with self._cv:
                    for seq in list(self._running) + list(self._parked):
                        self._finish(seq, "error", error=str(e))
            if not self._running:  # otherwise the next step's launch hands them over
                self._flush()
            self.counters["busy_seconds_total"] += time.perf_counter() - t_busy

    def _flush(self) -> None:
        """Hands the events so far to the server (its event loop then works on them)."""
        with self._cv:
            batch, self._outbox = self._outbox, []
        if batch:
            self.dispatch(batch)

    def _has_work(self) -> bool:
        return bool(self._running or self._parked or self._waiting or self._cancel or self._ahead)

    def _apply_cancels(self) -> None:
        if not self._cancel:
            return
        whole = {rid for rid, index in self._cancel if index is None}
        for seq in self._running + list(self._parked):
            if seq.req_id in whole or (seq.req_id, seq.index) in self._cancel:
                self._finish(seq, "abort")
        kept = deque()
        for item in self._waiting:
            if item[0] in whole:
                for j in range(item[1].n):
                    self._outbox.append((item[2], DoneEvent(j, "abort", len(item[1].prompt), 0, 0, 0, 0, {})))
            else:
                kept.append(item)
        self._waiting = kept
        self._cancel.clear()

    # --- pages
    def _alloc(self, n: int, exclude: Seq | None = None, from_top: bool = False) -> list[int] | None:
        """n pages, dropping idle slots' prompt caches and then parking the newest sequences if needed."""
        if n <= 0:
            return []
        while self.pool.n_free < n:
            if self._evict_cache():
                continue
            victims = [s for s in self._running if s is not exclude]
            if not victims:
                return None
            self._park(max(victims, key=lambda s: s.admitted))
        return self.pool.alloc(n, from_top=from_top)

    def _evict_cache(self) -> bool:
        idle = [s for s in self.slots_ if s.seq is None and s.cache_pages]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.last_used)
        self.pool.release(slot.cache_pages)
        slot.cache_pages, slot.cache_tokens = [], []
        return True

    def _park(self, seq: Seq) -> None:
        size = self.pool.park_bytes(len(seq.pages))
        if seq.pages and self._parked_bytes + size <= self.preempt_ram_bytes:
            seq.parked = self.pool.park(seq.pages)
            self._parked_bytes += size
            self.counters["parks"] += 1
        else:  # host memory for parking is exhausted: drop the KV and recompute it later
            seq.parked = None
            seq.n_computed = 0
            self.counters["recomputes"] += 1
        self.pool.release(seq.pages)
        seq.pages = []
        seq.is_parked = True
        seq.parks += 1
        self.slots_[seq.slot].n_preempt += 1
        self._running.remove(seq)
        self._parked.append(seq)

    def _restore_parked(self) -> None:
        while self._parked:
            seq = self._parked[0]
            if seq.parked is not None:
                need = max(len(seq.parked[0][0]), pages_for(seq.n_computed + 1))
            else:
                need = pages_for(len(seq.tokens))
            if self.pool.n_free < need + 1 and not self._can_free(need + 1):
                return
            pages = self._alloc(need, from_top=True)
            if pages is None:
                return
            self._parked.popleft()
            if seq.parked is not None:
                self.pool.restore(pages[: len(seq.parked[0][0])], seq.parked)
                self._parked_bytes -= self.pool.park_bytes(len(seq.parked[0][0]))
                seq.restores += 1
                self.slots_[seq.slot].n_restore += 1
                self.counters["restores"] += 1
            seq.parked, seq.pages, seq.is_parked = None, pages, False
            self._running.append(seq)

    def _can_free(self, n: int) -> bool:
        return self.pool.n_free + sum(len(s.cache_pages) for s in self.slots_ if s.seq is None) >= n

    # --- admission
    def _admit(self) -> None:
        while self._waiting:
            rid, req, on_event = self._waiting[0]
            idle = [s for s in self.slots_ if s.seq is None and not s.reserved]
            if len(idle) < req.n:
                return
            slot, reuse = self._pick_slot(idle, req)
            for other in [s for s in idle if s is not slot][: req.n - 1]:
                other.reserved = rid
            need = pages_for(len(req.prompt)) - pages_for(reuse)
            if not self._can_free(need + len(self._running)) and self._running:
                return  # keep a page of headroom per running sequence so admission does not force parks
            self._waiting.popleft()
            self.counters["requests_total"] += 1
            self.counters["prompt_tokens_total"] += len(req.prompt)
            seq = Seq(rid, 0, req, on_event, req.params, list(req.prompt), len(req.prompt),
                       next(self._admit_order), t_start=time.perf_counter())
            seq.slot = slot.id
            slot.seq = seq
            if reuse:
                keep = pages_for(reuse)
                seq.pages = slot.cache_pages[:keep]
                self.pool.release(slot.cache_pages[keep:])
                seq.n_computed = seq.cached_tokens = reuse
            else:
                self.pool.release(slot.cache_pages)
            slot.cache_pages, slot.cache_tokens = [], []
            self._running.append(seq)

    def _pick_slot(self, idle: list[Slot], req: Request) -> tuple[Slot, int]:
        if 0 <= req.id_slot < len(self.slots_) and self.slots_[req.id_slot].seq is None:
            slot = self.slots_[req.id_slot]
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
        return slot, reuse

    # --- one step
    def _step(self) -> None:
        t0 = time.perf_counter()
        ahead = self._ahead is not None
        if ahead:
            (plan, pending), self._ahead = self._ahead, None
        else:
            with self._cv:
                plan = self._plan()
            if not plan:
                self._flush()
                return
            pending = self.runner.launch([e for _, e in plan])
        with self._cv:
            nxt = self._plan_ahead(plan, ahead)
        if nxt:
            self._ahead = nxt, self.runner.launch_ahead(pending, [e for _, e in nxt])
            self.counters["ahead_steps_total"] += 1
        # The previous step's tokens go out while the device runs this one: the server's work on
        # them (sharing the GIL) then overlaps the step instead of delaying its launch.
        self._flush()
        results = pending.collect()
        took = time.perf_counter() - t0
        self.counters["step_seconds_total"] += took
        self.counters["steps_total"] += 1
        if all(len(e.tokens) == 1 for _, e in plan):
            self.counters["decode_step_seconds_total"] += took
            self.counters["decode_steps_total"] += 1
        with self._cv:
            for (seq, entry), logits in zip(plan, results, strict=True):
                if ahead and (seq.done or seq not in self._running):
                    continue  # ended, cancelled or parked after this step was launched: its row is dropped
                if seq.draft:
                    self._verify(seq, logits)
                    continue
                seq.n_computed += len(entry.tokens)
                if logits is not None and not seq.done:
                    self._on_logits(seq, logits.row(-1))

    def _plan(self) -> list[tuple[Seq, StepEntry]]:
        budget = self.budget
        plan = []
        order = sorted(self._running, key=lambda s: (s.pending > 1, s.admitted))  # decode rows first
        for seq in order:
            if budget <= 0:
                break
            if seq not in self._running:  # parked to make room for an earlier sequence
                continue
            n = min(seq.pending, budget)
            seq.draft = self._draft(seq, budget) if n == seq.pending == 1 else []
            n += len(seq.draft)
            need = pages_for(seq.n_computed + n) - len(seq.pages)
            if need > 0:
                pages = self._alloc(need, exclude=seq)
                if pages is None:
                    seq.draft = []
                    self._park(seq)
                    continue
                seq.pages += pages
            plan.append((seq, n))
            budget -= n
        plan = [(s, n) for s, n in plan if s in self._running]
        return [(s, self._entry(s, n)) for s, n in plan]

    def _plan_ahead(self, plan: list[tuple[Seq, StepEntry]], after_ahead: bool) -> list[tuple[Seq, StepEntry]] | None:
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
        if len(plan) != len(self._running):
            return None
        entries = []
        for seq, e in plan:
            after = seq.generated + 1  # tokens generated once this step's is read
            if (seq.done or seq not in self._running or seq.draft or len(e.tokens) != 1 or e.logits != "last"
                    or e.full_rows or seq.generated == 0 or 0 <= seq.req.max_tokens <= after
                    or len(seq.tokens) + 1 >= self.n_ctx_seq
                    or (self.preempt_every and after % self.preempt_every == 0)
                    # A draft needs this step's token on the host: with drafting on, a step without
                    # drafts is followed by one launched ahead while drafts back off, else only
                    # every other step (the one after is planned, drafts looked up again).
                    or (self.spec_n_max and not (seq.spec and (seq.spec.skip or not after_ahead)))):
                return None
            entries.append(StepEntry(seq.pages, [0], e.start + 1, "last", False))
        if not self.runner.can_launch_ahead(entries):
            return None
        need = [pages_for(e.start + 1) - len(seq.pages) for (seq, _), e in zip(plan, entries, strict=True)]
        if sum(n for n in need if n > 0) > self.pool.n_free:
            return None
        for (seq, _), e, n in zip(plan, entries, need, strict=True):
            if n > 0:
                seq.pages = seq.pages + self.pool.alloc(n)  # a new list: this step's entry keeps its own
            e.pages = seq.pages
            if seq.spec:
                seq.spec.wants_draft()  # that step is one of the sequence's steps without drafts
        return [(seq, e) for (seq, _), e in zip(plan, entries, strict=True)]

    def _entry(self, s: Seq, n: int) -> StepEntry:
        full = needs_logits(s.params, s.req.logprobs)
        if s.draft:
            return StepEntry(s.pages, [s.tokens[-1], *s.draft], s.n_computed, "all", full)
        return StepEntry(s.pages, s.tokens[s.n_computed : s.n_computed + n], s.n_computed,
                         "last" if s.n_computed + n == len(s.tokens) else "none", full)

    def _draft(self, seq: Seq, budget: int) -> list[int]:
        if not self.spec_n_max or seq.generated == 0:  # the first token comes from the prompt step
            return []
        if seq.spec is None:
            seq.spec = DraftState(self.spec_n_max)
        if not seq.spec.wants_draft():
            return []
        room = min(seq.spec.length, budget - 1, self.n_ctx_seq - len(seq.tokens) - 1)
        if seq.req.max_tokens >= 0:
            room = min(room, seq.req.max_tokens - seq.generated - 1)
        return lookup(seq.tokens, room)

    def _verify(self, seq: Seq, logits: RowsOut) -> None:
        """Row i predicts the token after draft[i - 1]; keep drafts while they equal the samples."""
        draft, seq.draft = seq.draft, []
        start = seq.n_computed
        accepted = 0
        for i in range(len(draft) + 1):
            seq.n_computed = start + i + 1  # KV is valid through the row that produced this sample
            tok = self._emit_token(seq, logits.row(i))
            if seq.done or seq not in self._running or i == len(draft) or tok != draft[i]:
                break
            accepted += 1
        seq.spec.record(len(draft), accepted)
        self.counters["drafted_total"] += len(draft)
        self.counters["draft_accepted_total"] += accepted

    def _on_logits(self, seq: Seq, row: Row) -> None:
        if seq.generated == 0 and seq.index == 0 and seq.req.n > 1:
            # the children sample their first token from the prompt's logits, like the parent
            for child in self._fork(seq):
                if not child.done:
                    self._emit_token(child, row)
        self._emit_token(seq, row)

    def _fork(self, seq: Seq) -> list[Seq]:
        """n > 1: each further completion gets a copy of the prompt's pages and its own slot."""
        reserved = [s for s in self.slots_ if s.reserved == seq.req_id]
        children = []
        for j, slot in enumerate(reserved, start=1):
            slot.reserved = 0
            self.pool.release(slot.cache_pages)
            slot.cache_pages, slot.cache_tokens = [], []
            params = replace(seq.params, seed=seq.params.seed + j)
            child = Seq(seq.req_id, j, seq.req, seq.on_event, params, list(seq.tokens), seq.n_prompt,
                         next(self._admit_order), t_start=seq.t_start)
            child.slot, slot.seq = slot.id, child
            children.append(child)
            pages = self._alloc(len(seq.pages), exclude=seq)
            if pages is None:
                child.is_parked, child.n_computed = True, 0  # recompute the prompt once pages free up
                self._parked.append(child)
                continue
            self.pool.copy(seq.pages, pages)
            child.pages, child.n_computed = pages, seq.n_computed
            self._running.append(child)
        return children

    def _emit_token(self, seq: Seq, row: Row) -> int:
        if seq.req.max_tokens == 0:  # the prompt is evaluated (and cached), nothing is generated
            self._finish(seq, "length")
            return -1
        if seq.generated == 0:
            seq.t_first = time.perf_counter()
        logits, best = row
        tok = best if logits is None else sample(logits, seq.params, seq.tokens, seq.generated)
        lp = top = None
        if seq.req.logprobs >= 0:
            lps = log_softmax(logits)
            lp = float(lps[tok])
            top = top_logprobs(lps, seq.req.logprobs) if seq.req.logprobs > 0 else None
        if self.tokenizer.is_eog(tok):
            self._finish(seq, "stop")
            return tok
        seq.tokens.append(tok)
        seq.generated += 1
        self.counters["tokens_predicted_total"] += 1
        self._outbox.append((seq.on_event, TokenEvent(seq.index, tok, lp, top)))
        if seq.generated >= seq.req.max_tokens >= 0 or len(seq.tokens) >= self.n_ctx_seq:
            self._finish(seq, "length")
        elif self.preempt_every and seq.generated % self.preempt_every == 0 and seq in self._running:
            self._park(seq)
        return tok

    def _finish(self, seq: Seq, reason: str, error: str | None = None) -> None:
        if seq in self._running:
            self._running.remove(seq)
        elif seq in self._parked:
            self._parked.remove(seq)
            if seq.parked is not None:
                self._parked_bytes -= self.pool.park_bytes(len(seq.parked[0][0]))
        seq.done = True
        unforked = [other for other in self.slots_ if other.reserved == seq.req_id]
        for j, other in enumerate(unforked, start=1):  # ended before its n > 1 fork
            other.reserved = 0
            self._outbox.append((seq.on_event, DoneEvent(j, reason, seq.n_prompt, 0, 0, 0, 0, {}, error)))
        slot = self.slots_[seq.slot]
        slot.seq = None
        slot.last_used = next(self._admit_order)
        if seq.req.cache_prompt and reason not in ("error", "abort") and seq.pages:
            # KV exists for tokens[:n_computed]; keep it for the next request's common prefix
            slot.cache_tokens, slot.cache_pages = seq.tokens[: seq.n_computed], seq.pages
        else:
            self.pool.release(seq.pages)
        seq.pages = []
        now = time.perf_counter()
        t_first = seq.t_first or now
        prompt_ms = (t_first - seq.t_start) * 1000
        pred_ms = (now - t_first) * 1000
        timings = {
            "prompt_n": seq.n_prompt - seq.cached_tokens, "prompt_ms": prompt_ms,
            "prompt_per_second": (seq.n_prompt - seq.cached_tokens) / (prompt_ms / 1000) if prompt_ms > 0 else 0.0,
            "predicted_n": seq.generated, "predicted_ms": pred_ms,
            "predicted_per_second": seq.generated / (pred_ms / 1000) if pred_ms > 0 else 0.0,
        }
        self._outbox.append((seq.on_event, DoneEvent(seq.index, reason, seq.n_prompt, seq.generated,
                                                     seq.cached_tokens, seq.parks, seq.restores, timings, error)))
