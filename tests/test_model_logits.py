"""The CPU engine against transformers in float32: logits and greedy generation."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engine.errors import ModelLoadError, UnsupportedError  # noqa: E402
from engine.loader import load_model  # noqa: E402
from engine.runner import prompt_logits  # noqa: E402
from tests.tiny_models import make_hf_model  # noqa: E402

CASES = [
    ("llama", {"kv_ratio": 2}),
    ("llama", {"kv_ratio": 1}),
    ("llama3", {"kv_ratio": 2}),
    ("llama", {"tie": True}),
    ("mistral", {}),
    ("qwen2", {}),
    ("qwen3", {"kv_ratio": 1}),
    ("qwen3", {"tie": True}),
]


def _reference(path, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return model, model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize(("arch", "kw"), CASES, ids=[f"{a}-{'-'.join(f'{k}{v}' for k, v in kw.items())}" for a, kw in CASES])
@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
def test_logits_match_transformers(tmp_path, arch, kw, exact):
    path = make_hf_model(tmp_path, arch, **kw)
    loaded = load_model(path)
    ids = list(np.random.default_rng(1).integers(0, loaded.config.vocab_size, 64))
    _, ref = _reference(path, ids)
    got = prompt_logits(loaded, ids, exact=exact)
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= 1e-4 * scale


def test_long_prompt_crosses_pages_and_chunks_do_not_change_bits(tmp_path):
    path = make_hf_model(tmp_path, "llama3")
    loaded = load_model(path)
    ids = list(np.random.default_rng(2).integers(0, loaded.config.vocab_size, 600))
    _, ref = _reference(path, ids)
    whole = prompt_logits(loaded, ids, exact=True)
    assert np.abs(whole - ref).max() <= 1e-4 * np.abs(ref).max()
    assert prompt_logits(loaded, ids, exact=True, chunk=37).tobytes() == whole.tobytes()


@pytest.mark.parametrize("arch", ["llama3", "qwen2"])
def test_greedy_generation_matches_transformers(tmp_path, arch):
    path = make_hf_model(tmp_path, arch)
    loaded = load_model(path)
    prompt = loaded.tokenizer.encode("def fibonacci(n):")
    model, _ = _reference(path, prompt)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=32)
    want = out[0, len(prompt):].tolist()
    ids = list(prompt)
    for _ in range(32):
        ids.append(int(np.argmax(prompt_logits(loaded, ids)[-1])))
    assert ids[len(prompt):] == want


def test_truncated_safetensors_is_named(tmp_path):
    path = make_hf_model(tmp_path, "llama")
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(path)


def test_not_a_safetensors_file_is_named(tmp_path):
    path = make_hf_model(tmp_path, "llama")
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(path)


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size"])
def test_missing_config_key_is_named(tmp_path, key):
    path = make_hf_model(tmp_path, "llama")
    cfg = json.loads((path / "config.json").read_text())
    del cfg[key]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=key):
        load_model(path)


def test_unknown_architecture_is_named(tmp_path):
    path = make_hf_model(tmp_path, "llama")
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "gemma2", ["Gemma2ForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError, match="gemma2"):
        load_model(path)


def test_missing_tensor_and_shape_mismatch_are_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    path = make_hf_model(tmp_path, "llama")
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.1.mlp.up_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, str(path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=name):
        load_model(path)
    tensors[name] = tensors[name][:, :-1].copy()
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="shape"):
        load_model(path)


def test_sharded_safetensors_with_index(tmp_path):
    from safetensors.numpy import load_file, save_file

    path = make_hf_model(tmp_path, "qwen2")
    tensors = load_file(str(path / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    ids = list(range(40))
    before = prompt_logits(load_model(path), ids)
    (path / "model.safetensors").unlink()
    for fname, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(path / fname))
    index = {"weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert prompt_logits(load_model(path), ids).tobytes() == before.tobytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16bit_safetensors_kept_as_stored_and_match_upcast_reference(tmp_path, dtype):
    path = make_hf_model(tmp_path, "llama", dtype=dtype)
    loaded = load_model(path)
    assert loaded.tensor_types == [{"bfloat16": "bf16", "float16": "f16"}[dtype]]
    ids = list(range(3, 67))
    _, ref = _reference(path, ids)  # transformers upcasts the stored 16-bit weights to float32
    assert np.abs(prompt_logits(loaded, ids) - ref).max() <= 1e-4 * np.abs(ref).max()
