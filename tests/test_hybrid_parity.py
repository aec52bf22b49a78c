"""Qwen3.5 hybrid models on the CPU engine against transformers in float32 (f32 KV)."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engine.errors import ModelLoadError  # noqa: E402
from engine.loader import load_model  # noqa: E402
from engine.runner import Runner, StepEntry, make_ops, prompt_logits  # noqa: E402
from engine.sampler import log_softmax  # noqa: E402
from tests.tiny_hybrid import as_multimodal, make_hybrid_model  # noqa: E402


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return make_hybrid_model(tmp_path_factory.mktemp("hybrid"))


def _reference(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _ids(loaded, n, seed=1):
    return [int(t) for t in np.random.default_rng(seed).integers(2, loaded.config.vocab_size, n)]


@pytest.fixture(scope="module")
def hybrid_moe(tmp_path_factory):
    return make_hybrid_model(tmp_path_factory.mktemp("hybrid_moe"), moe=True)


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
@pytest.mark.parametrize("which", ["hybrid", "hybrid_moe"])
def test_prompt_logits_match_transformers(request, which, exact):
    path = request.getfixturevalue(which)
    loaded = load_model(path)
    ids = _ids(loaded, 75)  # several chunks and a partial one
    with torch.no_grad():
        ref = _reference(path)(torch.tensor([ids])).logits[0].numpy()
    got = prompt_logits(loaded, ids, exact=exact)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def _greedy(loaded, ids, n):
    """The prompt in one step, then one decode step per token; returns tokens and their logprobs."""
    runner = Runner(loaded, make_ops("cpu", True), 2, "f32")
    pages, state = runner.pool.alloc(2), runner.new_state()
    row = runner.step([StepEntry(pages, ids, 0, state=state, prompt=True)])[0].logits[-1]
    toks, lps = [], []
    for i in range(n):
        lp = log_softmax(row)
        toks.append(int(np.argmax(lp)))
        lps.append(float(lp[toks[-1]]))
        row = runner.step([StepEntry(pages, [toks[-1]], len(ids) + i, state=state)])[0].logits[-1]
    return toks, lps


@pytest.mark.parametrize("kw", [{}, {"tie": True}, {"moe": True}], ids=["untied", "tied", "moe"])
def test_greedy_generation_matches_transformers(tmp_path, kw):
    path = make_hybrid_model(tmp_path, seed=3, **kw)
    loaded = load_model(path)
    assert loaded.config.arch == ("qwen3_5_moe" if kw.get("moe") else "qwen3_5")
    ids = _ids(loaded, 37, seed=4)
    with torch.no_grad():
        out = _reference(path).generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False,
                                        output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                                        pad_token_id=0)
    ref_toks = out.sequences[0, len(ids):].tolist()
    ref_lps = [float(torch.log_softmax(lg[0], -1)[t]) for lg, t in zip(out.logits, ref_toks, strict=True)]
    toks, lps = _greedy(loaded, ids, 20)
    assert toks == ref_toks
    assert max(abs(a - b) for a, b in zip(lps, ref_lps, strict=True)) <= 1e-4


def test_multimodal_checkpoint_loads_its_text_half(hybrid, tmp_path, caplog):
    mm = as_multimodal(hybrid, tmp_path / "mm")
    loaded = load_model(mm)
    assert loaded.config.arch == "qwen3_5"
    assert "vision tower" in caplog.text
    ids = _ids(loaded, 20)
    assert prompt_logits(loaded, ids).tobytes() == prompt_logits(load_model(hybrid), ids).tobytes()


def test_bad_layer_types_fail_the_load_by_name(hybrid, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(hybrid, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["layer_types"] = cfg["layer_types"][:-1] + ["sliding_attention"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="layer_types"):
        load_model(bad)


@pytest.mark.parametrize("which", ["hybrid", "hybrid_moe"])
def test_gguf_in_llama_cpps_layout_gives_the_hf_logits(request, which, tmp_path):
    """qwen35 / qwen35moe GGUF (tiled value heads, ssm_a = -exp(A_log), 1 + w norms, stacked experts):
    the loader undoes each change; the float32 round trips of the norms and A_log move the last bits."""
    from tests.tiny_hybrid import write_hybrid_gguf

    path = request.getfixturevalue(which)
    hf, gg = load_model(path), load_model(write_hybrid_gguf(path, tmp_path / "m.gguf"))
    assert (gg.format, gg.config.arch, gg.config.extra, gg.config.moe) == ("gguf", hf.config.arch, hf.config.extra,
                                                                          hf.config.moe)
    ids = _ids(hf, 40)
    a, b = prompt_logits(hf, ids, exact=True), prompt_logits(gg, ids, exact=True)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    assert gg.tokenizer.encode("def fibonacci(n):") == hf.tokenizer.encode("def fibonacci(n):")


def test_memory_planning_counts_the_recurrent_state_and_only_attention_kv(hybrid):
    from engine.launch import memory_need

    loaded = load_model(hybrid)
    spec = loaded.config.extra["hybrid"]
    one, four = memory_need(loaded, "cpu", 4, "f32", n_seqs=1), memory_need(loaded, "cpu", 4, "f32", n_seqs=4)
    runner = Runner(loaded, make_ops("cpu", True), 4, "f32")
    assert one["state"] == runner.state_bytes == sum(a.nbytes for a in runner.ops.state_read(runner.new_state()))
    assert four["state"] == 4 * one["state"]
    assert one["kv"] == runner.pool.page_bytes * 4 and len(runner.pool.layers) == spec.n_full == 2


def test_the_exactness_self_check_probes_the_hybrid_layers_matmuls(hybrid):
    from engine.selfcheck import model_matmuls

    runner = Runner(load_model(hybrid), make_ops("cpu", True), 2, "f32")
    names = {n.split(".", 2)[2] for n, _ in model_matmuls(runner.model)}
    assert names == {"mixer.w_in", "mixer.w_out", "mixer.w_qkv", "mixer.wo", "ffn.gate_up", "ffn.down"}


def test_cuda_memory_planning_sizes_every_hybrid_tensor(hybrid):
    """The conv weight is [D, 1, K]: sized as the float32 it is stored as (no CuPy needed to plan)."""
    from engine.launch import memory_need

    loaded = load_model(hybrid)
    need = memory_need(loaded, "cuda", 4, "f16", n_seqs=2)
    conv = sum(w.size * 4 for n, w in loaded.weights.items() if n.endswith("conv1d.weight"))
    assert need["weights"] > conv > 0 and need["state"] == 2 * Runner(loaded, make_ops("cpu", True), 2, "f32").state_bytes
