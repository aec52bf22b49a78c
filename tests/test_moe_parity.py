"""qwen3_moe on the CPU against transformers float32 (f32 KV): logits, greedy tokens and their
logprobs, from the HF directory and from GGUF; the qwen3_5_moe block (shared expert) against
transformers' own block; load failures named."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engine.errors import ModelLoadError  # noqa: E402
from engine.loader import LoadedModel, load_model  # noqa: E402
from engine.loader.moe import hf_expert_views, hf_moe_config  # noqa: E402
from engine.models.moe import MoeBlock  # noqa: E402
from engine.runner import prompt_logits  # noqa: E402
from lockstep_kernels.cpu.ops import CpuOps  # noqa: E402
from lockstep_kernels.weights import Weight  # noqa: E402
from tests.tiny_moe import make_moe_hf_model, write_moe_gguf  # noqa: E402

SHAPES = {
    "mixed": {},  # layer 1 dense (mlp_only_layers), norm_topk on
    "step2-no-norm": {"dense_layers": (), "sparse_step": 2, "norm_topk": False, "top_k": 3},
}


@pytest.fixture(scope="module", params=list(SHAPES))
def moe_dir(request, tmp_path_factory):
    return make_moe_hf_model(tmp_path_factory.mktemp(request.param), **SHAPES[request.param])


def _reference(path, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return model, model(torch.tensor([ids])).logits[0].numpy()


def _logprobs(logits):
    x = logits.astype(np.float64)
    return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
def test_logits_match_transformers(moe_dir, exact):
    loaded = load_model(moe_dir)
    assert loaded.config.arch == "qwen3_moe" and loaded.config.moe is not None
    ids = list(np.random.default_rng(1).integers(0, loaded.config.vocab_size, 64))
    _, ref = _reference(moe_dir, ids)
    got = prompt_logits(loaded, ids, exact=exact)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_greedy_tokens_and_top1_logprobs_match_transformers(moe_dir):
    loaded = load_model(moe_dir)
    prompt = loaded.tokenizer.encode("def fibonacci(n):")
    model, _ = _reference(moe_dir, prompt)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=24, output_logits=True, return_dict_in_generate=True)
    want = out.sequences[0, len(prompt):].tolist()
    want_lp = [float(_logprobs(step[0].numpy()[None])[0, t]) for step, t in zip(out.logits, want, strict=True)]
    ids, got_lp = list(prompt), []
    for _ in range(24):
        last = prompt_logits(loaded, ids, exact=True)[-1]
        ids.append(int(np.argmax(last)))
        got_lp.append(float(_logprobs(last[None])[0, ids[-1]]))
    assert ids[len(prompt):] == want
    assert np.abs(np.array(got_lp) - np.array(want_lp)).max() <= 1e-4


def test_gguf_f32_gives_the_hf_bits(moe_dir, tmp_path):
    ids = list(range(3, 43))
    hf = prompt_logits(load_model(moe_dir), ids, exact=True)
    g = load_model(write_moe_gguf(moe_dir, tmp_path / "m.gguf", "f32"))
    want = load_model(moe_dir).config.moe
    assert [g.config.moe.is_sparse(i) for i in range(3)] == [want.is_sparse(i) for i in range(3)]
    assert (g.config.moe.n_experts, g.config.moe.top_k, g.config.moe.norm_topk) == \
        (want.n_experts, want.top_k, want.norm_topk)
    assert prompt_logits(g, ids, exact=True).tobytes() == hf.tobytes()


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0"])
def test_gguf_types_kept_as_stored_and_match_their_values(moe_dir, tmp_path, dtype):
    """Experts stay in the file's type (views of the stacked tensor) and compute as their float32 values."""
    g = load_model(write_moe_gguf(moe_dir, tmp_path / f"m-{dtype}.gguf", dtype))
    expert = g.weights["model.layers.0.mlp.experts.5.down_proj.weight"] if g.config.moe.is_sparse(0) else \
        g.weights["model.layers.1.mlp.experts.5.down_proj.weight"]
    assert expert.dtype == dtype and expert.data.base is not None
    ids = list(range(3, 43))
    as_f32 = LoadedModel(g.path, g.format, g.config, {k: Weight(w.to_f32(), "f32") for k, w in g.weights.items()},
                         g.tokenizer)
    want = prompt_logits(as_f32, ids)
    assert np.abs(prompt_logits(g, ids) - want).max() <= 1e-5 * np.abs(want).max()


def test_gguf_q4_k_m_experts_give_their_dequantised_twin_s_bits(tmp_path):
    """K-quant experts stay raw blocks ([E, N, bytes] split per expert) and compute as gguf-py's values."""
    from tests.tiny_models import write_dequantized_gguf

    hf = make_moe_hf_model(tmp_path, hidden=256, head_dim=64, expert_ffn=256)  # whole 256-value super-blocks
    quantized = load_model(q := write_moe_gguf(hf, tmp_path / "m-q4_k_m.gguf", "q4_k_m"))
    twin = load_model(write_dequantized_gguf(q, tmp_path / "m-q4_k_m-f32.gguf"))
    assert quantized.weights["model.layers.0.mlp.experts.3.gate_proj.weight"].dtype == "q4_k"
    ids = list(range(3, 40))
    for exact in (False, True):
        assert prompt_logits(quantized, ids, exact=exact).tobytes() == prompt_logits(twin, ids, exact=exact).tobytes()


def _qwen3_5_block(stacked: bool):
    import transformers as tf
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

    cfg = tf.Qwen3_5MoeTextConfig(hidden_size=64, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                                  shared_expert_intermediate_size=48)
    torch.manual_seed(3)
    block = Qwen3_5MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.normal_(0.0, 0.5 if name == "gate.weight" else 0.15)
    state = {f"model.layers.0.mlp.{k}": v.detach().numpy() for k, v in block.state_dict().items()}
    if not stacked:  # the per-expert layout of converted checkpoints
        gu, down = state.pop("model.layers.0.mlp.experts.gate_up_proj"), state.pop("model.layers.0.mlp.experts.down_proj")
        for e in range(8):
            state[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"] = gu[e, :32]
            state[f"model.layers.0.mlp.experts.{e}.up_proj.weight"] = gu[e, 32:]
            state[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] = down[e]
    return cfg, block, hf_expert_views({k: Weight(np.ascontiguousarray(v), "f32") for k, v in state.items()})


@pytest.mark.parametrize("layout", ["stacked", "per-expert"])
@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
def test_qwen3_5_moe_block_matches_transformers(layout, exact):
    cfg, block, weights = _qwen3_5_block(layout == "stacked")
    moe = hf_moe_config(cfg.to_dict(), always_renormalize=True)
    assert moe.shared_ffn == 48 and moe.norm_topk
    ours = MoeBlock(moe, weights, "model.layers.0.mlp.", CpuOps(exact=exact))
    x = np.random.default_rng(4).standard_normal((37, 64)).astype(np.float32)
    with torch.no_grad():
        want = block(torch.from_numpy(x)[None])[0].numpy()
    got = ours(x, residual=x) - x
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_qwen3_5_moe_block_from_gguf_names_matches_transformers():
    """The block's tensors as llama.cpp's qwen35moe stores them (stacked ffn_*_exps, *_shexp, a 1-D
    ffn_gate_inp_shexp), through the GGUF mapping the hybrid model's loader uses."""
    from engine.loader.moe import gguf_moe_config, gguf_moe_tensor

    cfg, block, _ = _qwen3_5_block(True)
    sd = {k: v.detach().numpy() for k, v in block.state_dict().items()}
    gu = sd["experts.gate_up_proj"]
    gguf = {"ffn_gate_inp.weight": sd["gate.weight"], "ffn_gate_exps.weight": gu[:, :32], "ffn_up_exps.weight": gu[:, 32:],
            "ffn_down_exps.weight": sd["experts.down_proj"], "ffn_gate_shexp.weight": sd["shared_expert.gate_proj.weight"],
            "ffn_up_shexp.weight": sd["shared_expert.up_proj.weight"],
            "ffn_down_shexp.weight": sd["shared_expert.down_proj.weight"],
            "ffn_gate_inp_shexp.weight": sd["shared_expert_gate.weight"].reshape(-1)}
    weights = {}
    for name, a in gguf.items():
        weights |= gguf_moe_tensor("0", name, Weight(np.ascontiguousarray(a), "f32"))
    meta = {"expert_count": 8, "expert_used_count": 3, "expert_feed_forward_length": 32,
            "expert_shared_feed_forward_length": 48}
    moe = gguf_moe_config(lambda k, d=None: meta.get(k, d), {"blk.0.ffn_gate_inp.weight": None}, 1)
    assert (moe.shared_ffn, moe.norm_topk, moe.is_sparse(0)) == (48, True, True)
    x = np.random.default_rng(5).standard_normal((9, 64)).astype(np.float32)
    with torch.no_grad():
        want = block(torch.from_numpy(x)[None])[0].numpy()
    got = MoeBlock(moe, weights, "model.layers.0.mlp.", CpuOps(exact=True))(x)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_missing_expert_is_named(moe_dir, tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(moe_dir, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    name = next(k for k in tensors if ".experts.3.up_proj" in k)
    save_file({k: v for k, v in tensors.items() if k != name}, str(bad / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=name.replace(".", r"\.")):
        load_model(bad)


def test_gguf_missing_stacked_experts_are_named(moe_dir, tmp_path):
    layer = next(i for i in range(3) if load_model(moe_dir).config.moe.is_sparse(i))
    path = write_moe_gguf(moe_dir, tmp_path / "m.gguf", drop_tensors=(f"blk.{layer}.ffn_up_exps.weight",))
    with pytest.raises(ModelLoadError, match=rf"blk\.{layer}\.ffn_up_exps\.weight \(expert 0\)"):
        load_model(path)
