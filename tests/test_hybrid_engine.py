"""A hybrid (Gated DeltaNet) model in a real engine child on the CPU: its recurrent state follows the
pages (n > 1, parks, aborts, prompt-cache hits) and the output stays exact across -ub and neighbours."""

import asyncio
import json

import aiohttp
import numpy as np
import pytest

from lockstep_kernels.cpu.deltanet import CHUNK
from tests.test_engine_concurrency import wait_for

EXACT = ("--exact-concurrency", "on", "--kv-unified", "--metrics")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """The tiny hybrid without an end-of-generation token (every completion runs to its length)."""
    from tests.tiny_hybrid import make_hybrid_model
    from tests.tiny_models import strip_eos

    return strip_eos(make_hybrid_model(tmp_path_factory.mktemp("hybrid")))


@pytest.fixture(scope="module")
def prompts(hybrid):
    vocab = json.loads((hybrid / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(7)
    return [[int(t) for t in rng.integers(4, vocab, n)] for n in (100, 37, 83, 150)]


async def _complete(session, eng, prompt, n_predict=16, **extra) -> list[dict]:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "n_probs": 1, **extra}
    async with session.post(eng.base + "/completion", json=body) as r:
        data = await r.json()
        assert r.status == 200, data
    return data if isinstance(data, list) else [data]


def _sample(result: dict) -> list[tuple[int, float]]:
    return [(p["id"], p["logprob"]) for p in result["completion_probabilities"]]


async def _solo_and_beside(eng, prompts):
    async with aiohttp.ClientSession() as s:
        solo = _sample((await _complete(s, eng, prompts[0]))[0])
        beside = await asyncio.gather(*(_complete(s, eng, p) for p in prompts))
    return solo, _sample(beside[0][0])


@pytest.fixture(scope="module")
def reference(engine_factory, hybrid, prompts):
    """P0 alone on a plain exact server (-ub 512: its whole prompt in one step)."""
    eng = engine_factory(hybrid, "-np", "4", *EXACT)
    solo, beside = asyncio.run(_solo_and_beside(eng, prompts))
    return eng, solo, beside


def test_neighbours_whose_prompts_share_the_steps_change_nothing(reference):
    _, solo, beside = reference
    assert len(solo) == 16 and beside == solo


def test_ubatch_16_and_parks_every_5_tokens_change_nothing(engine_factory, hybrid, prompts, reference):
    eng = engine_factory(hybrid, "-np", "4", "-ub", "16", *EXACT, env={"LOCKSTEP_PREEMPT_EVERY": "5"})
    solo, beside = asyncio.run(_solo_and_beside(eng, prompts))
    m = eng.metrics()
    assert m["parks_total"] > 0 and m["restores_total"] == m["parks_total"]
    assert solo == reference[1] and beside == reference[1]
    assert m["recurrent_states"] == 0 and m["parked_bytes"] == 0


def test_recompute_after_parking_without_host_memory_changes_nothing(engine_factory, hybrid, prompts, reference):
    eng = engine_factory(hybrid, "-np", "4", "--preempt-ram", "0", *EXACT, env={"LOCKSTEP_PREEMPT_EVERY": "4"})
    solo, beside = asyncio.run(_solo_and_beside(eng, prompts))
    assert eng.metrics()["recomputes_total"] > 0
    assert solo == reference[1] and beside == reference[1]


def test_n2_copies_the_state_of_the_prompt(reference, prompts):
    eng, solo, _ = reference

    async def go():
        async with aiohttp.ClientSession() as s:
            return await _complete(s, eng, prompts[0], n=2)

    pair = asyncio.run(go())
    assert [_sample(r) for r in pair] == [solo, solo]
    assert eng.metrics()["recurrent_states"] == 0


def test_prompt_cache_hit_resumes_mid_prompt_from_a_snapshot(reference, prompts):
    eng, solo, _ = reference
    p0 = prompts[0]
    other = p0[:70] + prompts[1][:20]  # shares 70 tokens: the last snapshot inside them is at 64

    async def go():
        async with aiohttp.ClientSession() as s:
            fresh = (await _complete(s, eng, other, cache_prompt=False))[0]
            await _complete(s, eng, p0, cache_prompt=True)
            again = (await _complete(s, eng, p0, cache_prompt=True))[0]
            await _complete(s, eng, p0, cache_prompt=True)
            hit = (await _complete(s, eng, other, cache_prompt=True, id_slot=-1))[0]
            return fresh, again, hit

    fresh, again, hit = asyncio.run(go())
    last = (len(p0) - 1) // CHUNK * CHUNK
    assert again["timings"]["prompt_n"] == len(p0) - last and _sample(again) == solo
    assert hit["timings"]["prompt_n"] == len(other) - 64
    assert _sample(hit) == _sample(fresh)


async def test_abort_frees_the_state_and_the_pages(engine_factory, hybrid):
    eng = engine_factory(hybrid, "-np", "2", "--metrics")
    start = eng.metrics()["pages_free"]
    body = {"prompt": "The quick brown fox " * 20, "max_tokens": 100000, "temperature": 0, "stream": True,
            "cache_prompt": False}
    async with aiohttp.ClientSession() as s:
        resp = await s.post(eng.base + "/v1/completions", json=body)
        seen = 0
        async for raw in resp.content:
            seen += raw.startswith(b"data: ")
            if seen >= 3:
                break
        assert eng.metrics()["recurrent_states"] == 1
        resp.close()
        assert await wait_for(lambda: eng.metrics()["recurrent_states"] == 0, 2.0), "state not freed"
        assert await wait_for(lambda: eng.metrics()["pages_free"] == start, 2.0), "pages not freed"


def test_speculative_drafting_is_turned_off_by_name(engine_factory, hybrid, prompts, reference):
    eng = engine_factory(hybrid, "-np", "2", "--spec-type", "ngram", *EXACT)

    async def go():
        async with aiohttp.ClientSession() as s:
            return _sample((await _complete(s, eng, prompts[0]))[0])

    assert asyncio.run(go()) == reference[1]
    assert "speculative drafting is off for qwen3_5" in eng.output()


def test_gguf_hybrid_serves_exactly_beside_neighbours_at_ub_24(engine_factory, hybrid, prompts, tmp_path):
    from tests.tiny_hybrid import write_hybrid_gguf

    eng = engine_factory(write_hybrid_gguf(hybrid, tmp_path / "hybrid.gguf"), "-np", "4", "-ub", "24", *EXACT)
    solo, beside = asyncio.run(_solo_and_beside(eng, prompts))
    assert len(solo) == 16 and beside == solo
    assert eng.get_json("/props")["exact_concurrency"]["granted"] is True
