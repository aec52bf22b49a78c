"""preempt_mode end to end: the studio's load setting reaches the engine child
(LOCKSTEP_PREEMPT_MODE), which parks or recomputes accordingly; every mode gives the same bits."""


import openai
import pytest

from tests.engine_helpers import run_engine
from tests.studio_helpers import in_process_studio

# (mode, --preempt-ram MiB) -> which counter must move: park raises a zero budget to the host's
# free memory; recompute never parks; auto parks within the budget and recomputes past it
CASES = [("park", "0", "parks"), ("recompute", "4096", "recomputes"),
         ("auto", "4096", "parks"), ("auto", "0", "recomputes")]


@pytest.fixture(scope="module")
def outputs():
    return {}


@pytest.fixture
async def studio(tmp_path, tiny_llama):
    # the engine's test knob: park every sequence every 4 tokens
    client = await in_process_studio(tmp_path, tiny_llama, {"LOCKSTEP_PREEMPT_EVERY": "4"})
    yield client
    await client.close()


@pytest.mark.parametrize(("mode", "ram", "moved"), CASES, ids=[f"{m}-ram{r}" for m, r, _ in CASES])
async def test_mode_decides_park_or_recompute_and_keeps_the_bits(studio, outputs, mode, ram, moved):
    resp = await studio.post("/api/load", json={
        "model": studio.model, "ctx_size": 1024, "exact_concurrency": "on", "preempt_mode": mode,
        "extra_args": ["--device", "cpu", "--preempt-ram", ram]})
    body = await resp.json()
    assert resp.status == 200, body
    assert body["preempt_mode"] == mode
    api = openai.AsyncOpenAI(base_url=str(studio.make_url("/v1")), api_key="unused", max_retries=0)
    out = await api.completions.create(model=studio.model, prompt="The quick brown fox " * 8, max_tokens=24,
                                       temperature=0, logprobs=1)
    await api.close()
    m = await (await studio.get("/api/status")).json()
    other = "recomputes" if moved == "parks" else "parks"
    assert m[moved] >= 5 and m[other] == 0, m
    outputs[(mode, ram)] = (out.choices[0].text, out.choices[0].logprobs.token_logprobs)
    first = next(iter(outputs.values()))
    assert outputs[(mode, ram)] == first  # text and logprobs bit for bit, whatever the mode


def test_a_bad_mode_is_refused_with_one_line(tiny_llama):
    r = run_engine(["-m", str(tiny_llama), "--device", "cpu"], env={"LOCKSTEP_PREEMPT_MODE": "sometimes"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("error: LOCKSTEP_PREEMPT_MODE='sometimes' is not a preemption "
                                                 "mode (one of: auto, park, recompute)")
