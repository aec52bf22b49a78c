"""The HTTP side never waits for the compute thread: while a park is stuck in its device-to-host
copy, submit, cancel, stats and slots still return (from the inbox and the last snapshot)."""

import threading

import numpy as np

from engine.requests import DoneEvent, Request
from engine.runner import Runner, make_ops
from engine.sampler import SamplingParams
from engine.scheduler import Scheduler


def test_submit_stats_and_slots_answer_while_a_park_blocks(loaded_llama):
    runner = Runner(loaded_llama, make_ops("cpu", True), 8, "f16")
    sched = Scheduler(runner, loaded_llama.tokenizer, n_slots=2, n_ctx=2048, n_batch=512, n_ubatch=512, kv_unified=True,
                      preempt_ram_bytes=1 << 30, preempt_every=1)
    # Fake, named as such: a park that blocks until released stands in for a GPU's blocking
    # device-to-host copy of a long sequence's KV, which the CPU backend does too fast to observe.
    real_park, parking, release = runner.pool.park, threading.Event(), threading.Event()

    def blocking_park(pages):
        parking.set()
        assert release.wait(60)
        return real_park(pages)

    runner.pool.park = blocking_park
    done = threading.Event()
    sched.start()
    try:
        prompt = [int(t) for t in np.random.default_rng(0).integers(4, loaded_llama.config.vocab_size, 40)]
        sched.submit(Request(prompt, SamplingParams(temperature=0), 6),
                     lambda ev: isinstance(ev, DoneEvent) and done.set())
        assert parking.wait(60), "no park started"
        answers = {}

        def http_side():
            answers["stats"] = sched.stats()
            sched.want_slots()
            answers["slots"] = sched.slots()
            answers["rid"] = sched.submit(Request(prompt, SamplingParams(temperature=0), 2), lambda ev: None)
            sched.cancel(answers["rid"])

        t = threading.Thread(target=http_side)
        t.start()
        t.join(30)
        blocked = t.is_alive()
        release.set()
        t.join(30)
        assert not blocked, "the HTTP side waited for the park"
        assert answers["stats"]["parks"] == 0 and answers["stats"]["busy_slots"] == 1
        assert answers["slots"][0]["is_processing"] and answers["rid"] == 2
        assert done.wait(60)
        stats = sched.stats()
        assert stats["parks"] >= 5 and stats["queue_len"] == 0
    finally:
        release.set()
        sched.stop()
