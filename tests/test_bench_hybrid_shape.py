"""bench/shapes.py's 4B hybrid shape: its numbers, and the writer at a scaled-down size loaded by the
engine's qwen35 GGUF reader; bench/hybrid_decode.py's in-memory model reads the same bytes."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

from engine.loader import load_model
from engine.runner import prompt_logits

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _module(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


shapes = _module("shapes")


def test_4b_hybrid_shape_is_qwen3_5_4b():
    s = shapes.SHAPES["4b-hybrid"]
    assert (s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["head_dim"], s["ffn"], s["vocab"]) == (
        2560, 32, 16, 4, 256, 9216, 248320)
    assert (s["k_heads"], s["v_heads"], s["k_dim"], s["v_dim"], s["conv"]) == (16, 32, 128, 128, 4)
    assert 4.0e9 < shapes.weight_bytes("4b-hybrid") / 2 < 4.4e9  # parameters read per decode step
    assert shapes.kv_bytes_per_token("4b-hybrid") == 2 * 8 * 4 * 256 * 2  # 8 full-attention layers


def test_hybrid_shape_writer_loads_as_f16_qwen3_5(tmp_path):
    path = shapes.write_shape(tmp_path / "tiny-hybrid.gguf", "tiny-hybrid", seed=1)
    loaded = load_model(path)
    c, s = loaded.config, shapes.SHAPES["tiny-hybrid"]
    spec = c.extra["hybrid"]
    assert c.arch == "qwen3_5" and c.n_layers == s["layers"] and c.tie_embeddings
    assert spec.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert (spec.deltanet.k_heads, spec.deltanet.v_heads, spec.rope_dim) == (2, 4, 16)
    assert loaded.weights["model.layers.0.linear_attn.in_proj_qkv.weight"].dtype == "f16"
    logits = prompt_logits(loaded, [5, 9, 33, 100], exact=True)
    assert logits.shape == (4, s["vocab"]) and np.isfinite(logits).all()


def test_hybrid_decode_bench_model_reads_the_shape_s_bytes():
    decode = _module("hybrid_decode")
    loaded = decode.random_model("tiny-hybrid")
    assert decode.weight_bytes(loaded) == shapes.weight_bytes("tiny-hybrid")
    logits = prompt_logits(loaded, [5, 9, 33], exact=True)
    assert np.isfinite(logits).all()
