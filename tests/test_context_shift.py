"""--context-shift (issue 27), llama-server's semantics: a sequence that fills its slot's context keeps its first
n_keep tokens (and a BOS), drops the n_discard after them (half the rest by default) and goes on; the tokens after
the cut are recomputed, so what follows a shift is what a fresh request for the shifted tokens generates."""

import json
import urllib.error
import urllib.request

import pytest

N_CTX_SEQ = 256  # -c 512 -np 2
PROMPT = [10 + (i * 37) % 290 for i in range(200)]  # token ids, no BOS (id 0) among them


@pytest.fixture(scope="module")
def eng(engine_factory, tiny_llama_noeos):
    return engine_factory(tiny_llama_noeos, "--context-shift", "-c", "512", "-np", "2", "--metrics")


def post(eng, body: dict, path: str = "/completion") -> dict:
    req = urllib.request.Request(eng.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def run(eng, prompt: list[int], n: int, **extra) -> tuple[list[int], list[float], dict]:
    out = post(eng, {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True, "n_probs": 1,
                     "cache_prompt": False, **extra})
    return out["tokens"], [p["logprob"] for p in out["completion_probabilities"]], out


def shifts(eng) -> float:
    return eng.metrics()["context_shifts_total"]


@pytest.mark.parametrize("n_keep,n_discard", [(0, 0), (10, 64), (-1, 0)])
def test_generation_goes_on_past_the_context_as_a_fresh_shifted_request(eng, n_keep, n_discard):
    before = shifts(eng)
    tokens, logprobs, out = run(eng, PROMPT, 80, n_keep=n_keep, n_discard=n_discard)
    assert len(tokens) == 80 and out["stop_type"] == "limit" and out["truncated"] is True
    assert out["timings"]["predicted_n"] == 80 and out["tokens_evaluated"] == len(PROMPT)
    assert shifts(eng) == before + 1
    # the shift came when prompt and generated tokens filled the context: 56 generated
    at = N_CTX_SEQ - len(PROMPT)
    full = PROMPT + tokens[:at]
    keep = len(PROMPT) if n_keep < 0 else n_keep  # -1: the whole prompt
    drop = n_discard or (N_CTX_SEQ - keep) // 2
    shifted = full[:keep] + full[keep + drop:]
    ref_tokens, ref_logprobs, _ = run(eng, shifted, 80 - at)
    assert tokens[at:] == ref_tokens
    # the kept head's KV is reused and the rest recomputed in other batch shapes (exact mode is off): 1e-4
    assert logprobs[at:] == pytest.approx(ref_logprobs, abs=1e-4)


def test_a_bos_is_kept_and_n_keep_is_checked(eng):
    tokens, _, out = run(eng, [0, *PROMPT[1:]], 80)  # id 0 is the tiny model's BOS
    assert len(tokens) == 80
    full = [0, *PROMPT[1:]] + tokens[:N_CTX_SEQ - len(PROMPT)]
    ref, _, _ = run(eng, full[:1] + full[1 + (N_CTX_SEQ - 1) // 2:], 80 - (N_CTX_SEQ - len(PROMPT)))
    assert tokens[N_CTX_SEQ - len(PROMPT):] == ref
    with pytest.raises(urllib.error.HTTPError) as e:
        post(eng, {"prompt": PROMPT, "n_predict": 4, "n_keep": -2})
    assert e.value.code == 400 and "'n_keep' must be >= -1" in e.value.read().decode()


def test_exact_mode_keeps_it_off(engine_factory, tiny_llama_noeos):
    exact = engine_factory(tiny_llama_noeos, "--context-shift", "-c", "512", "-np", "2", "--exact-concurrency", "on")
    tokens, _, out = run(exact, PROMPT, 80)
    assert len(tokens) == N_CTX_SEQ - len(PROMPT) and out["stop_type"] == "limit"  # ends where the context does
    assert "exact concurrency: --context-shift disabled (a shift drops tokens where the context ends" in exact.output()


def test_a_recurrent_model_keeps_it_off(engine_factory, tmp_path):
    from tests.tiny_hybrid import make_hybrid_model
    from tests.tiny_models import strip_eos

    hybrid = engine_factory(strip_eos(make_hybrid_model(tmp_path)), "--context-shift", "-c", "512", "-np", "2")
    assert "--context-shift disabled: qwen3_5 keeps a recurrent state" in hybrid.output()
    tokens, _, out = run(hybrid, PROMPT, 80)
    assert len(tokens) == N_CTX_SEQ - len(PROMPT) and out["truncated"] is True


def test_each_of_n_completions_shifts_on_its_own(eng):
    before = shifts(eng)
    out = post(eng, {"prompt": PROMPT, "n": 2, "max_tokens": 80, "temperature": 0}, "/v1/completions")
    texts = [c["text"] for c in sorted(out["choices"], key=lambda c: c["index"])]
    assert out["usage"]["completion_tokens"] == 160 and shifts(eng) == before + 2
    solo = post(eng, {"prompt": PROMPT, "max_tokens": 80, "temperature": 0}, "/v1/completions")
    assert texts == [solo["choices"][0]["text"]] * 2  # greedy: each copy goes on as one request alone does


def test_a_prompt_cache_left_by_a_shifted_sequence_holds_the_shifted_tokens(eng):
    tokens, _, _ = run(eng, PROMPT, 80, cache_prompt=True)
    at = N_CTX_SEQ - len(PROMPT)
    full = PROMPT + tokens[:at]
    shifted = full[N_CTX_SEQ // 2:]  # --keep 0 and no BOS: the first half went
    # the slot's cache is the shifted sequence (KV recomputed at the new positions): a prompt of those tokens
    # reuses it and continues as the shifted sequence did
    ref, _, out = run(eng, shifted + tokens[at:at + 8], 80 - at - 8, cache_prompt=True)
    assert out["tokens_cached"] > len(shifted) // 2
    assert ref == tokens[at + 8:]
