"""A real engine child with --tp 2 on the CPU backend: the scheduler parks and restores its sequences
(all ranks' pages together) and exact mode gives every request the bits it gets alone."""

import json

import pytest
from openai import OpenAI

from tests.test_engine_concurrency import prompts, run_all


@pytest.fixture(scope="module")
def vocab(tiny_llama_noeos):
    return json.loads((tiny_llama_noeos / "config.json").read_text())["vocab_size"]


def test_tp2_engine_reports_its_split_and_serves_the_openai_client(engine_factory, tiny_llama_noeos):
    eng = engine_factory(tiny_llama_noeos, "--tp", "2", "-ts", "1,1", "--exact-concurrency", "on")
    props = eng.get_json("/props")
    assert props["tensor_parallel"] == {"tp": 2, "split_mode": "row", "split": [0.5, 0.5], "kv_heads": [1, 1],
                                        "devices": [0, 1]}
    assert props["exact_concurrency"]["granted"] is True
    client = OpenAI(base_url=eng.base + "/v1", api_key="none")
    out = client.completions.create(model="m", prompt="Hello world", max_tokens=8, temperature=0)
    assert out.usage.completion_tokens == 8


async def test_tp2_parked_and_concurrent_requests_match_their_solo_runs(engine_factory, tiny_llama_noeos, vocab):
    batch = prompts(vocab, 4, 20, 90, seed=11)
    solo_eng = engine_factory(tiny_llama_noeos, "--tp", "2", "--exact-concurrency", "on", "-np", "1")
    solo = [(await run_all(solo_eng, [p], 24))[0]["tokens"] for p in batch]
    eng = engine_factory(tiny_llama_noeos, "--tp", "2", "--exact-concurrency", "on", "-np", "4", "--kv-unified",
                         "--metrics", env={"LOCKSTEP_PREEMPT_EVERY": "5"})
    together = await run_all(eng, batch, 24)
    assert [r["tokens"] for r in together] == solo  # token ids and logprobs, compared exactly
    assert all(r["final"]["preempt"]["parks"] > 0 for r in together)
    assert eng.metrics()["restores_total"] > 0


def test_tp1_engine_reports_one_rank(engine_factory, tiny_llama_noeos):
    eng = engine_factory(tiny_llama_noeos)
    assert eng.get_json("/props")["tensor_parallel"] == {"tp": 1}


