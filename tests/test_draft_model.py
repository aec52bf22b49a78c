"""-md / --model-draft (issue 27): a draft model's greedy continuation is the speculative draft. A draft token is
kept only where it equals the token the model samples, so answers are bit for bit those without a draft model,
whatever the draft model (the model itself, or another one with the same vocabulary), exact mode on."""

import json
import shutil
import urllib.request

import pytest

from contract import progress
from tests.engine_helpers import last_line, run_engine

EXACT = ("--exact-concurrency", "on", "--metrics")
PROMPTS = ["def fibonacci(n):", "    return fibonacci(n - 1) +", "if n < 2:\n"]


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    from tests.tiny_models import make_hf_model

    return make_hf_model(tmp_path_factory.mktemp("draft"), "llama", seed=1)


def post(eng, body: dict) -> dict:
    req = urllib.request.Request(eng.base + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def answers(eng) -> list:
    out = []
    for prompt in PROMPTS:
        for sampling in ({"temperature": 0}, {"temperature": 0.9, "seed": 5}):
            r = post(eng, {"prompt": prompt, "n_predict": 24, "n_probs": 2, "return_tokens": True,
                           "cache_prompt": False, **sampling})
            out.append((r["tokens"], r["completion_probabilities"]))
    return out


@pytest.fixture(scope="module")
def plain(engine_factory, tiny_llama_noeos) -> list:
    return answers(engine_factory(tiny_llama_noeos, *EXACT))


def test_draft_models_change_no_bit(engine_factory, tiny_llama_noeos, other_draft, plain):
    itself = engine_factory(tiny_llama_noeos, *EXACT, "-md", str(tiny_llama_noeos), "--spec-draft-n-max", "4")
    assert answers(itself) == plain
    m = itself.metrics()
    assert m["drafted_total"] > 0 and m["draft_accepted_total"] > 0  # the model drafting for itself is right often
    assert "speculative drafts from the draft model" in itself.output()
    # the studio follows the model's load: the draft's adds no phase after warmup and no memory line of its own
    lines = itself.output().splitlines()
    assert [s.phase for s in map(progress.parse, lines) if s and s.phase != "weights"] == ["read", "kernels", "warmup"]
    assert sum("memory: needs" in line for line in lines) == 1
    other = engine_factory(tiny_llama_noeos, *EXACT, "--model-draft", str(other_draft), "-ngld", "99",
                           "--spec-type", "draft-simple")
    assert answers(other) == plain
    assert other.metrics()["drafted_total"] > 0


def test_drafts_across_parks_and_an_aborted_neighbour_change_no_bit(engine_factory, tiny_llama_noeos, plain):
    eng = engine_factory(tiny_llama_noeos, *EXACT, "-md", str(tiny_llama_noeos), "--spec-draft-n-max", "4",
                         "-np", "2", env={"LOCKSTEP_PREEMPT_EVERY": "3"})
    body = json.dumps({"prompt": PROMPTS[0], "n_predict": 200, "stream": True, "cache_prompt": False}).encode()
    stream = urllib.request.urlopen(urllib.request.Request(eng.base + "/completion", data=body, headers={
        "Content-Type": "application/json"}), timeout=120)
    with stream:  # a few tokens in, the client leaves: its slot's draft KV is left behind, half used
        events = 0
        while events < 4:
            line = stream.readline()
            assert line, "the stream ended before its fourth token"
            events += line.startswith(b"data: ")
    assert answers(eng) == plain
    m = eng.metrics()
    assert m["parks_total"] > 0 and m["restores_total"] > 0 and m["draft_accepted_total"] > 0


def test_a_draft_model_with_another_vocabulary_is_refused(tiny_llama_noeos, tmp_path):
    from tokenizers import Tokenizer

    draft = shutil.copytree(tiny_llama_noeos, tmp_path / "other-vocab")
    tok = Tokenizer.from_file(str(draft / "tokenizer.json"))
    vocab = tok.get_vocab()
    first = min(vocab, key=vocab.get)  # the same size, one entry spelled differently
    text = (draft / "tokenizer.json").read_text().replace(json.dumps(first), json.dumps(first + "\u00e9"), 1)
    (draft / "tokenizer.json").write_text(text)
    r = run_engine(["-m", str(tiny_llama_noeos), "--port", "0", "--device", "cpu", "-md", str(draft)])
    assert r.returncode == 2, r.stderr
    assert "the draft model's vocabulary differs from the model's" in last_line(r.stderr)


def test_a_missing_draft_model_fails_before_the_model_loads(tiny_llama_noeos, tmp_path):
    r = run_engine(["-m", str(tiny_llama_noeos), "--port", "0", "--device", "cpu", "-md", str(tmp_path / "nope")])
    assert r.returncode == 4
    assert last_line(r.stderr) == f"error: model load failed: -md {tmp_path / 'nope'}: no such file or directory"
    assert progress.PREFIX not in r.stderr  # refused before the model's load began


def test_a_recurrent_draft_model_is_refused(tiny_llama_noeos, tmp_path):
    from tests.tiny_hybrid import make_hybrid_model

    r = run_engine(["-m", str(tiny_llama_noeos), "--port", "0", "--device", "cpu", "-md",
                    str(make_hybrid_model(tmp_path))])
    assert r.returncode == 2 and "a draft model with a recurrent state is not supported" in last_line(r.stderr)


@pytest.mark.parametrize("args,line", [
    (["--spec-type", "draft-simple"], "error: --spec-type draft-simple needs a draft model: -md PATH"),
    (["--spec-type", "ngram", "-md", "x"], "error: --spec-type ngram with -md: one kind of draft at a time"),
])
def test_draft_flags_that_contradict_are_named(tiny_llama_noeos, args, line):
    r = run_engine(["-m", str(tiny_llama_noeos), "--port", "0", "--device", "cpu", *args])
    assert r.returncode == 2 and last_line(r.stderr).startswith(line)
