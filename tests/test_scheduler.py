"""The scheduler in-process on the CPU backend: exactness under batching, parks, forks and drafts."""

import threading

import numpy as np
import pytest

from engine.requests import DoneEvent, QueueFullError, Request, TokenEvent
from engine.runner import Runner, make_ops
from engine.sampler import SamplingParams
from engine.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0)
SEEDED = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=1234)


@pytest.fixture(scope="module")
def prompts(loaded_llama):
    rng = np.random.default_rng(1)
    v = loaded_llama.config.vocab_size
    return [[int(t) for t in rng.integers(4, v, int(rng.integers(20, 400)))] for _ in range(8)]


def run(loaded_llama, prompts, *, n_pages=8, parallel=4, every=0, ub=512, params=GREEDY, n=1, ram=1 << 30, spec=0,
        max_tokens=40, logprobs=0, stop_ok=False, states=None):
    """Outputs {(prompt, completion): [(token, logprob)]} and the scheduler's stats (with the
    completions' finish reasons under "reasons"); every completion must run to its length unless
    `stop_ok`."""
    runner = Runner(loaded_llama, make_ops("cpu", True), n_pages, "f16")
    sched = Scheduler(runner, loaded_llama.tokenizer, n_slots=parallel, n_ctx=n_pages * 256, n_batch=2048, n_ubatch=ub,
                      kv_unified=True, preempt_ram_bytes=ram, preempt_every=every, spec_n_max=spec,
                      states=states)
    sched.start()
    outs: dict = {}
    finished = threading.Event()
    left = [len(prompts) * n]
    lock = threading.Lock()
    reasons = {}

    def listener(i):
        def on_event(ev):
            if isinstance(ev, TokenEvent):
                outs.setdefault((i, ev.index), []).append((ev.token, ev.logprob))
            elif isinstance(ev, DoneEvent):
                assert ev.finish_reason == "length" or stop_ok and ev.finish_reason == "stop", ev
                reasons[(i, ev.index)] = ev.finish_reason
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        finished.set()
        return on_event

    try:
        for i, p in enumerate(prompts):
            sched.submit(Request(p, params, max_tokens, n=n, logprobs=logprobs), listener(i))
        assert finished.wait(120), "requests did not finish"
        stats = sched.stats()
    finally:
        sched.stop()
    assert stats["pages_free"] + stats["pages_cached"] == stats["pages_total"], "pages leaked"
    return outs, {**stats, "reasons": reasons}


@pytest.fixture(scope="module")
def solo(loaded_llama, prompts):
    return {name: run(loaded_llama, [prompts[0]], params=p)[0][(0, 0)] for name, p in (("greedy", GREEDY), ("seeded", SEEDED))}


def test_beside_seven_neighbours_in_a_tight_pool_parks_and_stays_exact(loaded_llama, prompts, solo):
    outs, stats = run(loaded_llama, prompts, n_pages=4)
    assert stats["parks"] > 0 and stats["restores"] == stats["parks"]
    assert outs[(0, 0)] == solo['greedy']
    assert all(len(outs[(i, 0)]) == 40 for i in range(8))


def test_forced_parks_and_small_chunks(loaded_llama, prompts, solo):
    outs, stats = run(loaded_llama, prompts[:4], every=7, ub=16)
    assert stats["parks"] >= 4 * (40 // 7)
    assert outs[(0, 0)] == solo['greedy']


def test_recompute_when_host_memory_for_parking_is_exhausted(loaded_llama, prompts, solo):
    outs, stats = run(loaded_llama, prompts[:3], every=5, ram=0, params=SEEDED)
    assert stats["recomputes"] > 0 and stats["parks"] == 0
    assert outs[(0, 0)] == solo['seeded']


def test_seeded_sampling_beside_neighbours(loaded_llama, prompts, solo):
    outs, _ = run(loaded_llama, prompts, params=SEEDED)
    assert outs[(0, 0)] == solo['seeded']
    assert outs[(1, 0)] != outs[(0, 0)]


def test_n2_copies_the_prompt_pages(loaded_llama, prompts, solo):
    outs, _ = run(loaded_llama, [prompts[0]], n=2)
    assert outs[(0, 0)] == outs[(0, 1)] == solo['greedy']
    seeded, _ = run(loaded_llama, [prompts[0]], n=2, params=SEEDED)
    assert seeded[(0, 0)] == solo['seeded'] and seeded[(0, 1)] != seeded[(0, 0)]


def test_prompt_cache_hit_gives_the_same_bits(loaded_llama, prompts, solo):
    runner = Runner(loaded_llama, make_ops("cpu", True), 8, "f16")
    sched = Scheduler(runner, loaded_llama.tokenizer, n_slots=2, n_ctx=2048, n_batch=512, n_ubatch=512, kv_unified=True,
                      preempt_ram_bytes=1 << 30)
    sched.start()
    try:
        results = []
        for _ in range(2):
            got, done = [], threading.Event()
            dones = []

            def on_event(ev, got=got, done=done, dones=dones):
                if isinstance(ev, TokenEvent):
                    got.append((ev.token, ev.logprob))
                else:
                    dones.append(ev)
                    done.set()
            sched.submit(Request(prompts[0], GREEDY, 40, logprobs=0), on_event)
            assert done.wait(60)
            results.append((got, dones[0]))
    finally:
        sched.stop()
    assert results[0][1].cached_tokens == 0
    assert results[1][1].cached_tokens == len(prompts[0]) - 1
    assert results[0][0] == results[1][0] == solo['greedy']


def test_a_new_prompt_takes_an_empty_slot_not_another_prompts_cache(loaded_llama, prompts):
    """Prompts evaluated one after another each keep their cache while slots are free, so each one
    asked again reuses its own (a new prompt once took the lowest slot id, evicting a cache)."""
    runner = Runner(loaded_llama, make_ops("cpu", True), 8, "f16")
    sched = Scheduler(runner, loaded_llama.tokenizer, n_slots=3, n_ctx=2048, n_batch=512, n_ubatch=512, kv_unified=True,
                      preempt_ram_bytes=1 << 30)
    sched.start()

    def cached(prompt) -> int:
        done, dones = threading.Event(), []

        def on_event(ev):
            if isinstance(ev, DoneEvent):
                dones.append(ev)
                done.set()
        sched.submit(Request(prompt, GREEDY, 0), on_event)
        assert done.wait(60)
        return dones[0].cached_tokens

    try:
        first = [cached(p) for p in prompts[:3]]
        again = [cached(p) for p in prompts[:3]]
    finally:
        sched.stop()
    assert first == [0, 0, 0]
    assert again == [len(p) - 1 for p in prompts[:3]]


@pytest.fixture(scope="module")
def repetitive(loaded_llama):
    rng = np.random.default_rng(5)
    return [[int(t) for t in rng.integers(4, loaded_llama.config.vocab_size, 12)] * 6 for _ in range(4)]


@pytest.mark.parametrize("draft_max", [1, 2, 3, 4])
@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.7, top_k=2, seed=99)], ids=["greedy", "seeded"])
def test_speculation_never_changes_the_output(loaded_llama, repetitive, draft_max, params):
    plain, _ = run(loaded_llama, repetitive, params=params, max_tokens=60)
    drafted, stats = run(loaded_llama, repetitive, params=params, spec=draft_max, max_tokens=60)
    parked, pstats = run(loaded_llama, repetitive[:1], params=params, spec=draft_max, every=7, max_tokens=60)
    assert drafted == plain
    assert parked[(0, 0)] == plain[(0, 0)]
    assert stats["drafted_total"] > 0 and stats["draft_accepted_total"] > 0 and pstats["parks"] > 0


def test_queue_bound_and_bad_requests(loaded_llama):
    runner = Runner(loaded_llama, make_ops("cpu", True), 2, "f16")
    sched = Scheduler(runner, loaded_llama.tokenizer, n_slots=1, n_ctx=512, n_batch=512, n_ubatch=512, kv_unified=True,
                      preempt_ram_bytes=0, max_queue=2)
    with pytest.raises(ValueError, match="empty"):
        sched.submit(Request([], GREEDY, 4), lambda ev: None)
    with pytest.raises(ValueError, match="context"):
        sched.submit(Request([5] * 600, GREEDY, 4), lambda ev: None)
    with pytest.raises(ValueError, match="n=2"):
        sched.submit(Request([5], GREEDY, 4, n=2), lambda ev: None)
    sched.submit(Request([5], GREEDY, 4), lambda ev: None)
    sched.submit(Request([5], GREEDY, 4), lambda ev: None)
    with pytest.raises(QueueFullError):
        sched.submit(Request([5], GREEDY, 4), lambda ev: None)
