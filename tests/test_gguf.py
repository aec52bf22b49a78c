"""GGUF models: the same weights as the safetensors load, bit for bit in F32, close in F16/BF16/Q8_0."""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from gguf import GGMLQuantizationType  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from engine.errors import ModelLoadError, UnsupportedError  # noqa: E402
from engine.loader import load_model  # noqa: E402
from engine.loader.gguf import GGUFFile  # noqa: E402
from engine.runner import prompt_logits  # noqa: E402
from tests.tiny_models import make_hf_model, write_gguf, write_gguf_file  # noqa: E402

# (lead's tiny model arch, options): llama3 rope scaling, GQA 1 and 2, a Mistral file (GGUF arch
# "llama", q/k permuted), qkv bias, q/k norm, tied embeddings.
CASES = {
    "llama3-gqa2": ("llama3", {"kv_ratio": 2}),
    "llama-gqa1": ("llama", {"kv_ratio": 1}),
    "mistral": ("mistral", {"kv_ratio": 2}),
    "qwen2-gqa1": ("qwen2", {"kv_ratio": 1}),
    "qwen3-tied": ("qwen3", {"tie": True, "kv_ratio": 2}),
}

# Tolerances on max|logits - safetensors logits| relative to max|safetensors logits|, 64 tokens.
# Worst measured over these 5 cases x 3 seeds: F16 6.4e-4, BF16 4.9e-3, Q8_0 1.6e-2; set with 3-4x margin.
# Each is a few units of the format's relative rounding (F16 2^-11, BF16 2^-8, Q8_0 1/254 of a
# block's largest value) carried through two layers.
TOLERANCE = {"f16": 2e-3, "bf16": 2e-2, "q8_0": 6e-2}


def _randomize_1d(model_dir, seed=7):
    """The tiny models have unit norms and zero biases; random ones catch a swapped norm or bias."""
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    rng = np.random.default_rng(seed)
    for name, t in tensors.items():
        if t.ndim == 1:
            noise = rng.standard_normal(t.shape).astype(np.float32)
            tensors[name] = (1 + 0.2 * noise if name.endswith("norm.weight") else 0.2 * noise).astype(np.float32)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Per case: the HF directory and its GGUF files, built once for the module."""
    root = tmp_path_factory.mktemp("gguf-models")
    out = {}
    for case, (arch, kw) in CASES.items():
        hf = make_hf_model(root / case, arch, **kw)
        _randomize_1d(hf)
        out[case] = (hf, {dt: write_gguf(hf, root / f"{case}-{dt}.gguf", dt) for dt in ("f32", "f16", "bf16", "q8_0")})
    return out


@pytest.fixture(scope="module")
def loaded(models):
    """Loads each (case, format) once: "hf" or a GGUF dtype."""
    cache = {}

    def get(case, fmt):
        if (case, fmt) not in cache:
            hf, ggufs = models[case]
            cache[case, fmt] = load_model(hf if fmt == "hf" else ggufs[fmt])
        return cache[case, fmt]

    return get


def _ids(vocab, n=64, seed=1):
    return [int(i) for i in np.random.default_rng(seed).integers(0, vocab, n)]


@pytest.mark.parametrize("case", CASES)
def test_f32_weights_and_config_are_the_safetensors_ones(loaded, case):
    ref, got = loaded(case, "hf"), loaded(case, "f32")
    assert got.format == "gguf"
    assert sorted(got.weights) == sorted(ref.weights)
    for name, w in ref.weights.items():
        g = got.weights[name]
        assert g.dtype == w.dtype == "f32", name
        assert g.shape == w.shape, name
        assert np.asarray(g.data).tobytes() == np.asarray(w.data).tobytes(), name
    a, b = ref.config, got.config
    for field in ("vocab_size", "hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "rms_eps",
                  "rope_theta", "rope_neox", "tie_embeddings", "qkv_bias", "qk_norm", "max_position"):
        assert getattr(b, field) == getattr(a, field), field
    assert b.rope_inv_freq().astype(np.float32).tobytes() == a.rope_inv_freq().astype(np.float32).tobytes()


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
@pytest.mark.parametrize("case", CASES)
def test_f32_logits_are_bit_identical(loaded, case, exact):
    ref, got = loaded(case, "hf"), loaded(case, "f32")
    ids = _ids(ref.config.vocab_size)
    want = prompt_logits(ref, ids, exact=exact, kv_type="f32")
    assert prompt_logits(got, ids, exact=exact, kv_type="f32").tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0"])
@pytest.mark.parametrize("case", CASES)
def test_reduced_precision_logits_within_tolerance(loaded, case, dtype):
    ref, got = loaded(case, "hf"), loaded(case, dtype)
    assert dtype in got.tensor_types
    ids = _ids(ref.config.vocab_size)
    want = prompt_logits(ref, ids, exact=False, kv_type="f32")
    diff = np.abs(prompt_logits(got, ids, exact=False, kv_type="f32") - want).max()
    assert diff <= TOLERANCE[dtype] * np.abs(want).max()


@pytest.mark.parametrize("case", ["llama3-gqa2", "qwen2-gqa1"])
def test_stored_types_keep_their_values(loaded, case):
    """F16 holds the rounded F32 values; Q8_0 splits into int8 values and f16 scales whose product is
    within ggml's rounding of the original (q/k rows included, so the un-permuting moved both)."""
    ref = loaded(case, "hf").weights
    f16, q8 = loaded(case, "f16").weights, loaded(case, "q8_0").weights
    for name, w in ref.items():
        x = np.asarray(w.data)
        if x.ndim == 1:
            assert f16[name].dtype == q8[name].dtype == "f32", name  # as llama.cpp: 1-D stays F32
            continue
        assert np.asarray(f16[name].data).tobytes() == x.astype(np.float16).tobytes(), name
        q = q8[name]
        assert q.dtype == "q8_0" and q.data.dtype == np.int8 and q.data.shape == x.shape, name
        assert q.scales.dtype == np.float16 and q.scales.shape == (x.shape[0], x.shape[1] // 32), name
        # ggml rounds x/d with the exact d, then stores d as f16: half a step plus 127 f16 roundings.
        step = np.repeat(q.scales.astype(np.float32), 32, axis=1)
        assert np.all(np.abs(q.to_f32() - x) <= (0.5 + 127 * 2.0**-11) * step * (1 + 1e-3)), name


def test_f32_tensors_are_views_of_the_file(loaded):
    """Only llama's un-permuted q/k are copies; the rest read through the (read-only) memory map."""
    for fmt in ("f32", "f16"):
        for name, w in loaded("llama3-gqa2", fmt).weights.items():
            permuted = ".q_proj." in name or ".k_proj." in name
            assert w.data.flags.writeable == permuted, (fmt, name)


def test_tied_embeddings_when_the_file_has_no_output(loaded):
    got = loaded("qwen3-tied", "f32")
    assert got.config.tie_embeddings and "lm_head.weight" not in got.weights
    assert not loaded("qwen2-gqa1", "f32").config.tie_embeddings


def test_llama3_rope_scaling_recovered_from_rope_freqs(loaded):
    cfg = loaded("llama3-gqa2", "f32").config
    assert cfg.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def test_tokenizer_and_chat_template_from_the_file(loaded, models):
    ref, got = loaded("qwen2-gqa1", "hf"), loaded("qwen2-gqa1", "f32")
    for text in ["def fibonacci(n):\n    return n", "größe café 東京 🙂", "<|im_start|>user\nhi<|im_end|>"]:
        assert got.tokenizer.encode(text, add_special=False) == ref.tokenizer.encode(text, add_special=False)
    msgs = [{"role": "user", "content": "hi"}]
    assert got.tokenizer.apply_chat(msgs) == ref.tokenizer.apply_chat(msgs)
    override = load_model(models["qwen2-gqa1"][1]["f32"], chat_template="{{ messages[0]['content'] }}!")
    assert override.tokenizer.apply_chat(msgs) == "hi!"


# --- bad input: every failure names what is wrong


@pytest.fixture(scope="module")
def llama_dir(models):
    return models["llama3-gqa2"][0]


def test_truncated_file_is_named(models, tmp_path):
    good = models["llama3-gqa2"][1]["f32"].read_bytes()
    for cut in (len(good) // 2, 200, len(good) - 100):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(good[:cut])
        with pytest.raises(ModelLoadError, match=rf"cut{cut}\.gguf.*truncated"):
            load_model(path)


def test_wrong_magic_is_named(models, tmp_path):
    path = tmp_path / "magic.gguf"
    path.write_bytes(b"GGML" + models["llama3-gqa2"][1]["f32"].read_bytes()[4:])
    with pytest.raises(ModelLoadError, match=r"magic\.gguf: not a GGUF file \(magic b'GGML'"):
        load_model(path)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(empty)


@pytest.mark.parametrize("key", ["llama.embedding_length", "llama.block_count", "llama.attention.head_count",
                                 "llama.attention.layer_norm_rms_epsilon", "tokenizer.ggml.tokens"])
def test_missing_metadata_key_is_named(llama_dir, tmp_path, key):
    path = write_gguf(llama_dir, tmp_path / "nokey.gguf", drop_keys=(key,))
    with pytest.raises(ModelLoadError, match=f"nokey.gguf: missing metadata key '{key}'"):
        load_model(path)


def test_missing_tensor_is_named(llama_dir, tmp_path):
    path = write_gguf(llama_dir, tmp_path / "notensor.gguf", drop_tensors=("blk.1.ffn_up.weight",))
    with pytest.raises(ModelLoadError, match=r"missing tensor blk\.1\.ffn_up\.weight"):
        load_model(path)


def test_q4_0_tensor_loads_as_raw_blocks(llama_dir, tmp_path):
    """(Types outside the loadable set fail by name: tests/test_gguf_kquant_load.py.)"""
    path = write_gguf(llama_dir, tmp_path / "q4.gguf", tensor_types={"blk.0.ffn_down.weight": GGMLQuantizationType.Q4_0})
    w = load_model(path).weights["model.layers.0.mlp.down_proj.weight"]
    assert w.dtype == "q4_0" and w.data.dtype == np.uint8 and w.shape == (64, 128)


def test_unsupported_architecture_is_named(llama_dir, tmp_path):
    path = write_gguf(llama_dir, tmp_path / "gemma.gguf", arch="gemma")
    with pytest.raises(UnsupportedError, match="unsupported architecture 'gemma'"):
        load_model(path)


def test_shape_that_contradicts_metadata_is_named(llama_dir, tmp_path):
    f = GGUFFile(write_gguf(llama_dir, tmp_path / "ok.gguf"))
    kv = {k: v for k, v in ((k, f.meta(k)) for k in f.reader.fields if not k.startswith("GGUF."))
          if k != "general.architecture"}
    kv["llama.feed_forward_length"] = 96
    tensors = [(t.name, np.asarray(t.data), None) for t in f.reader.tensors]
    path = write_gguf_file(tmp_path / "ffn.gguf", "llama", kv, tensors)
    with pytest.raises(ModelLoadError, match=r"tensor blk\.0\.ffn_gate\.weight has shape \(128, 64\).*\(96, 64\)"):
        load_model(path)


def test_tensor_type_unknown_to_the_gguf_package_is_unsupported(tmp_path):
    import struct

    path = write_gguf_file(tmp_path / "newtype.gguf", "llama", {}, [("x.weight", np.zeros((2, 32), np.float32), None)])
    raw = bytearray(path.read_bytes())
    at = raw.index(b"x.weight") + len(b"x.weight") + 4 + 2 * 8  # after the name, n_dims and dims: the type
    struct.pack_into("<I", raw, at, 250)
    path.write_bytes(bytes(raw))
    with pytest.raises(UnsupportedError, match=r"newtype\.gguf: unsupported tensor type .*250"):
        load_model(path)
