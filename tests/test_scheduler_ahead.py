"""Decode steps launched ahead (tokens fed from the previous step's argmax, before the host reads
them) never change an output: greedy runs without logprobs (which launch ahead) against the same
runs with logprobs (which never do), on the CPU backend."""

import threading

import numpy as np
import pytest

from engine.requests import DoneEvent, Request, TokenEvent
from engine.runner import Runner, make_ops
from engine.scheduler import Scheduler
from tests.test_runner_graph_rows import RowsStandIn
from tests.test_scheduler import GREEDY, run


@pytest.fixture(scope="module")
def prompts(loaded_llama):
    rng = np.random.default_rng(7)
    v = loaded_llama.config.vocab_size
    # 230..250 tokens: with 40 generated every sequence crosses a page boundary while decoding ahead
    return [[int(t) for t in rng.integers(4, v, int(rng.integers(230, 250)))] for _ in range(6)]


def tokens(outs):
    return {k: [t for t, _ in v] for k, v in outs.items()}


def test_steps_launched_ahead_give_the_same_tokens(loaded_llama, prompts):
    ref, ref_stats = run(loaded_llama, prompts, logprobs=0)
    got, stats = run(loaded_llama, prompts, logprobs=-1)
    assert ref_stats["ahead_steps_total"] == 0  # logprobs need the rows on the host
    assert stats["ahead_steps_total"] > 20
    assert tokens(got) == tokens(ref)


def test_ahead_while_requests_queue_for_slots(loaded_llama, prompts):
    ref, _ = run(loaded_llama, prompts, parallel=2, logprobs=0)
    got, stats = run(loaded_llama, prompts, parallel=2, logprobs=-1)
    assert stats["ahead_steps_total"] > 100
    assert tokens(got) == tokens(ref)


def test_ahead_while_speculative_drafts_back_off(loaded_llama, prompts):
    """Random prompts give drafts that fail, so drafting backs off; those steps may run ahead."""
    ref, _ = run(loaded_llama, prompts, logprobs=0)
    got, stats = run(loaded_llama, prompts, logprobs=-1, spec=3)
    assert stats["drafted_total"] > 0 and stats["ahead_steps_total"] > 0
    assert tokens(got) == tokens(ref)


def test_ahead_with_parks_and_a_tight_pool(loaded_llama, prompts):
    ref, _ = run(loaded_llama, prompts, n_pages=6, every=5, logprobs=0)
    got, stats = run(loaded_llama, prompts, n_pages=6, every=5, logprobs=-1)
    assert stats["parks"] > 0 and stats["ahead_steps_total"] > 0
    assert tokens(got) == tokens(ref)


def test_sequences_ending_on_a_token_drop_their_ahead_row(loaded_llama, prompts):
    """End of generation is only known once the token is read: the step launched ahead computed a
    row for the ended sequence, which must change nothing for it or anyone else."""
    solo, _ = run(loaded_llama, prompts[:4], logprobs=0)
    eos = {solo[(i, 0)][5 + 3 * i][0] for i in range(4)}  # tokens that come up early in each output
    saved = loaded_llama.tokenizer.eos_ids
    loaded_llama.tokenizer.eos_ids = eos
    try:
        ref, ref_stats = run(loaded_llama, prompts, logprobs=0, stop_ok=True)
        got, stats = run(loaded_llama, prompts, logprobs=-1, stop_ok=True)
    finally:
        loaded_llama.tokenizer.eos_ids = saved
    assert "stop" in stats["reasons"].values() and stats["ahead_steps_total"] > 0
    assert stats["reasons"] == ref_stats["reasons"]
    assert tokens(got) == tokens(ref)


def graph_stand_ins(monkeypatch) -> list:
    """Every Runner made from now on plays its decode graphs with a CPU stand-in that has
    DecodeGraphs' call protocol; returns the stand-ins as they are made."""
    stand_ins = []
    real_init = Runner.__init__

    def with_stand_in(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.ops.asynchronous = True  # the runner then feeds replays from the device argmax
        self.graphs = RowsStandIn(self, width=self.pool.n_pages)
        stand_ins.append(self.graphs)

    monkeypatch.setattr(Runner, "__init__", with_stand_in)
    return stand_ins


def test_ahead_through_a_graph_takes_the_tokens_on_the_device(loaded_llama, prompts, monkeypatch):
    """The replayed-graph path: the runner passes the previous step's device argmax (`ids_from`)
    instead of host tokens."""
    ref, _ = run(loaded_llama, prompts, logprobs=0)
    stand_ins = graph_stand_ins(monkeypatch)
    got, stats = run(loaded_llama, prompts, logprobs=-1)
    assert stats["ahead_steps_total"] > 20 and stand_ins[0].fed == stats["ahead_steps_total"]
    assert tokens(got) == tokens(ref)


@pytest.mark.parametrize("parallel", [1, 4])
def test_accepted_drafts_beside_steps_launched_ahead_through_a_graph(loaded_llama, parallel, monkeypatch):
    """Repetitive prompts: drafts are accepted, and between them steps run ahead through the graph
    stand-in (tokens taken on the device). The tokens must be those of plain decoding."""
    rng = np.random.default_rng(3)
    v = loaded_llama.config.vocab_size
    prompts = [([int(t) for t in rng.integers(4, v, 12)] * 20)[:240] for _ in range(4)]
    ref, _ = run(loaded_llama, prompts, logprobs=0, parallel=parallel)
    graph_stand_ins(monkeypatch)
    got, stats = run(loaded_llama, prompts, logprobs=-1, spec=4, parallel=parallel)
    assert stats["draft_accepted_total"] > 20 and stats["ahead_steps_total"] > 0
    assert tokens(got) == tokens(ref)


@pytest.fixture(scope="module")
def loaded_hybrid(tmp_path_factory):
    """The tiny hybrid (qwen3_5) loaded in this process, without an end-of-generation token."""
    from engine.loader import load_model
    from tests.tiny_hybrid import make_hybrid_model

    loaded = load_model(make_hybrid_model(tmp_path_factory.mktemp("hybrid")))
    loaded.tokenizer.eos_ids = set()
    return loaded


def run_with_late_arrivals(loaded, early, late, *, n_pages, logprobs, after=6, spy=None):
    """`early` prompts submitted at once, `late` ones once the first completion has `after` tokens
    (arrivals while others decode); outputs {(prompt, 0): [tokens]} and the stats."""
    runner = Runner(loaded, make_ops("cpu", True), n_pages, "f16")
    sched = Scheduler(runner, loaded.tokenizer, n_slots=len(early) + len(late), n_ctx=n_pages * 256, n_batch=2048,
                      n_ubatch=512, kv_unified=True, preempt_ram_bytes=1 << 30)
    if spy:
        spy(sched)
    outs, done, left = {}, threading.Event(), [len(early) + len(late)]

    def listener(i):
        def on_event(ev):
            if isinstance(ev, TokenEvent):
                outs.setdefault(i, []).append(ev.token)
                if i == 0 and len(outs[0]) == after:
                    for j, p in enumerate(late):
                        sched.submit(Request(p, GREEDY, 40, logprobs=logprobs), listener(len(early) + j))
            elif isinstance(ev, DoneEvent):
                assert ev.finish_reason == "length", ev
                left[0] -= 1
                if not left[0]:
                    done.set()
        return on_event

    sched.start()
    try:
        for i, p in enumerate(early):
            sched.submit(Request(p, GREEDY, 40, logprobs=logprobs), listener(i))
        assert done.wait(120), "requests did not finish"
        stats = sched.stats()
    finally:
        sched.stop()
    return outs, stats


def test_hybrid_sequences_are_parked_only_between_steps_without_one_in_flight(loaded_hybrid):
    """A parked recurrent state must not hold the token of a row launched ahead and dropped: the
    scheduler admits and restores (which may park) only while no step is in flight, and launches
    none ahead while requests wait. Requests arrive while others decode, into a pool too small for
    all of them: their admissions park the newest running sequences."""
    rng = np.random.default_rng(3)
    v = loaded_hybrid.config.vocab_size
    # 230..250 tokens: every sequence needs a second page while it decodes
    early, late = ([[int(t) for t in rng.integers(4, v, int(rng.integers(230, 250)))] for _ in range(k)] for k in (3, 3))
    ref, _ = run_with_late_arrivals(loaded_hybrid, early, late, n_pages=5, logprobs=0)
    in_flight = []

    def spy(sched):
        park = sched.mem.park

        def recorded(seq):
            in_flight.append(sched.stepper.ahead is not None)
            return park(seq)
        sched.mem.park = recorded

    got, stats = run_with_late_arrivals(loaded_hybrid, early, late, n_pages=5, logprobs=-1, spy=spy)
    assert stats["ahead_steps_total"] > 0 and stats["parks"] > 0 and in_flight
    assert not any(in_flight)
    assert got == ref
