"""bench/shapes.py's 30B-A3B shape, written at a scaled-down size and loaded by the engine's GGUF reader."""

import importlib.util
from pathlib import Path

import numpy as np

from engine.loader import load_model
from engine.runner import prompt_logits

_SPEC = importlib.util.spec_from_file_location("bench_shapes", Path(__file__).resolve().parent.parent / "bench" / "shapes.py")
shapes = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(shapes)


def test_30b_a3b_shape_is_the_issue_s():
    s = shapes.SHAPES["30b-a3b"]
    assert (s["hidden"], s["layers"], s["experts"], s["top_k"], s["ffn"], s["heads"], s["kv_heads"], s["head_dim"],
            s["vocab"]) == (2048, 48, 128, 8, 768, 32, 4, 128, 151936)
    # solo decode reads about 3.3B parameters (the "A3B"), not the 30B of the file
    assert 3.0e9 < shapes.weight_bytes("30b-a3b") / 2 < 3.6e9


def test_moe_shape_writer_loads_as_f16_qwen3_moe(tmp_path):
    path = shapes.write_shape(tmp_path / "tiny-moe.gguf", "tiny-moe", seed=1)
    loaded = load_model(path)
    c, s = loaded.config, shapes.SHAPES["tiny-moe"]
    assert c.arch == "qwen3_moe" and c.qk_norm and c.n_layers == s["layers"]
    assert (c.moe.n_experts, c.moe.top_k, c.moe.expert_ffn) == (s["experts"], s["top_k"], s["ffn"])
    assert all(c.moe.is_sparse(i) for i in range(c.n_layers))
    assert loaded.weights["model.layers.1.mlp.experts.7.up_proj.weight"].dtype == "f16"
    logits = prompt_logits(loaded, [5, 9, 33, 100], exact=True)
    assert logits.shape == (4, s["vocab"]) and np.isfinite(logits).all()
