"""A real engine child on the CPU serving tiny qwen3_moe models (HF directory and Q8_0 GGUF) over HTTP:
the openai client, greedy tokens equal to the in-process reference, and exact mode beside neighbours."""

import shutil

import numpy as np
import openai
import pytest

from engine.loader import load_model
from engine.runner import prompt_logits
from tests.test_engine_concurrency import prompts, run_all
from tests.tiny_models import strip_eos
from tests.tiny_moe import make_moe_hf_model, write_moe_gguf


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    """Without an end-of-generation token, so every completion runs to its length."""
    return strip_eos(make_moe_hf_model(tmp_path_factory.mktemp("moe")))


@pytest.fixture(scope="module", params=["hf", "gguf-q8_0"])
def model_path(request, moe_dir, tmp_path_factory):
    if request.param == "hf":
        return moe_dir
    where = tmp_path_factory.mktemp("moe-gguf")
    shutil.copy(moe_dir / "tokenizer_config.json", where / "tokenizer_config.json")
    return write_moe_gguf(moe_dir, where / "moe-q8_0.gguf", "q8_0")


@pytest.fixture(scope="module")
def eng(engine_factory, model_path):
    return engine_factory(model_path, "-np", "4", "--kv-unified", "--exact-concurrency", "on", "--metrics")


def test_openai_chat_and_props(eng):
    client = openai.OpenAI(base_url=eng.base + "/v1", api_key="none", max_retries=0, timeout=60)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hello."}],
                                       max_tokens=12, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    props = eng.get_json("/props")
    assert props["exact_concurrency"]["granted"] is True and props["exact_concurrency"]["backend"] == "cpu"


async def test_greedy_tokens_equal_the_in_process_reference(eng, model_path):
    loaded = load_model(model_path)
    prompt = prompts(loaded.config.vocab_size, 1, 30, 31, seed=7)[0]
    got = (await run_all(eng, [prompt], 16))[0]["tokens"]
    ids = list(prompt)
    for _ in range(16):
        ids.append(int(np.argmax(prompt_logits(loaded, ids, exact=True)[-1])))
    assert [t for t, _ in got] == ids[len(prompt):]


async def test_exact_beside_neighbours_that_route_elsewhere(eng, model_path):
    """P0 alone, then P0 beside seven others on four slots: the same tokens and logprob values."""
    vocab = load_model(model_path).config.vocab_size
    batch = prompts(vocab, 8, 20, 120, seed=11)
    solo = await run_all(eng, batch[:1], 24)
    together = await run_all(eng, batch, 24)
    assert all(r["final"] is not None and r["tokens"] for r in together)  # GGUF files may end on <|im_end|>
    assert together[0]["tokens"] == solo[0]["tokens"]
    assert len({tuple(r["tokens"]) for r in together}) > 1  # the neighbours did generate other text
