"""`/health` and `/slots` answer promptly while the compute thread parks and restores a sequence
on every token (LOCKSTEP_PREEMPT_EVERY=1) during a long generation."""

import asyncio
import json
import statistics
import time

import aiohttp

from tests.test_engine_concurrency import prompts, stream_completion


async def timed_get(session, url) -> tuple[float, object]:
    t0 = time.perf_counter()
    async with session.get(url) as r:
        assert r.status == 200
        body = await r.json()
    return time.perf_counter() - t0, body


async def test_health_and_slots_answer_while_parks_run(engine_factory, tiny_llama_noeos):
    eng = engine_factory(tiny_llama_noeos, "-np", "2", env={"LOCKSTEP_PREEMPT_EVERY": "1"})
    vocab = json.loads((tiny_llama_noeos / "config.json").read_text())["vocab_size"]
    async with aiohttp.ClientSession() as s:
        gen = asyncio.create_task(stream_completion(s, eng, prompts(vocab, 1, 300, 301)[0], 300))
        times, preempted = {"/health": [], "/slots": []}, 0
        while not gen.done() and len(times["/slots"]) < 40:
            for path in times:
                took, body = await timed_get(s, eng.base + path)
                times[path].append(took)
                if path == "/slots":
                    preempted = max(preempted, body[0]["n_preempt"])
        out = await gen
    assert len(out["tokens"]) == 300 and out["final"]["timings"]["predicted_n"] == 300
    assert preempted > 0, "no park ran while the endpoints were polled"
    for path, took in times.items():
        assert len(took) >= 10, (path, len(took))
        # the median, so that one scheduling hiccup of a shared CI machine does not decide
        assert statistics.median(took) < 0.05, (path, sorted(took))
        assert max(took) < 1.0, (path, sorted(took))
