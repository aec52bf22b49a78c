"""The hybrid benchmark shapes (Qwen3.5: Gated DeltaNet layers, every `interval`-th one gated full
attention) as llama.cpp's qwen35 GGUF files of random F16 weights, and as Hugging Face text configs.

Norms are stored as llama.cpp stores them (1 + w for the decoder's offset norms), ssm_a as -exp(A_log);
the value heads' order does not matter for random weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HYBRID_SHAPES = {
    # Qwen3.5-4B's text config (Qwen/Qwen3.5-4B, config.json text_config)
    "4b-hybrid": dict(hidden=2560, layers=32, heads=16, kv_heads=4, head_dim=256, ffn=9216, vocab=248320,
                      k_heads=16, v_heads=32, k_dim=128, v_dim=128, conv=4, interval=4, rotary=0.25, tied=True),
    "tiny-hybrid": dict(hidden=128, layers=4, heads=2, kv_heads=1, head_dim=64, ffn=256, vocab=512,
                        k_heads=2, v_heads=4, k_dim=32, v_dim=32, conv=4, interval=4, rotary=0.25, tied=True),
}


def hf_config(shape: str) -> dict:
    """The shape as a Hugging Face qwen3_5 text config (engine.models.qwen3_5.from_hf_config reads it)."""
    s = HYBRID_SHAPES[shape]
    return {"vocab_size": s["vocab"], "hidden_size": s["hidden"], "num_hidden_layers": s["layers"],
            "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"], "head_dim": s["head_dim"],
            "intermediate_size": s["ffn"], "rms_norm_eps": 1e-6, "full_attention_interval": s["interval"],
            "linear_conv_kernel_dim": s["conv"], "linear_key_head_dim": s["k_dim"],
            "linear_num_key_heads": s["k_heads"], "linear_num_value_heads": s["v_heads"],
            "linear_value_head_dim": s["v_dim"], "max_position_embeddings": 262144, "tie_word_embeddings": s["tied"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                                "partial_rotary_factor": s["rotary"]}}


def _is_full(s: dict, i: int) -> bool:
    return (i + 1) % s["interval"] == 0


def _dims(s: dict) -> tuple[int, int, int, int]:
    """(q|k|v of a DeltaNet layer, its value width, attention q width, kv width)."""
    qkv = 2 * s["k_heads"] * s["k_dim"] + s["v_heads"] * s["v_dim"]
    return qkv, s["v_heads"] * s["v_dim"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]


def write_hybrid_shape(path: Path, shape: str, seed: int, mat, vocab_kv: dict) -> Path:
    """`mat(n, k)`: bench/shapes.py's random F16 rows; `vocab_kv`: its synthetic vocabulary."""
    from gguf import GGMLQuantizationType as Q
    from gguf import LlamaFileType

    from tests.tiny_models import write_gguf_file

    s = HYBRID_SHAPES[shape]
    rng = np.random.default_rng(seed + 1)
    h, f = s["hidden"], s["ffn"]
    qkv, value, q, kv = _dims(s)
    ones = np.ones(h, np.float32)
    tensors = [("token_embd.weight", mat(s["vocab"], h), Q.F16), ("output_norm.weight", ones, None)]
    if not s["tied"]:
        tensors.append(("output.weight", mat(s["vocab"], h), Q.F16))
    for i in range(s["layers"]):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", ones, None), (b + "post_attention_norm.weight", ones, None),
                    (b + "ffn_gate.weight", mat(f, h), Q.F16), (b + "ffn_up.weight", mat(f, h), Q.F16),
                    (b + "ffn_down.weight", mat(h, f), Q.F16)]
        if _is_full(s, i):
            norm = np.ones(s["head_dim"], np.float32)
            tensors += [(b + "attn_q.weight", mat(2 * q, h), Q.F16), (b + "attn_k.weight", mat(kv, h), Q.F16),
                        (b + "attn_v.weight", mat(kv, h), Q.F16), (b + "attn_output.weight", mat(h, q), Q.F16),
                        (b + "attn_q_norm.weight", norm, None), (b + "attn_k_norm.weight", norm, None)]
        else:
            vh = s["v_heads"]
            tensors += [(b + "attn_qkv.weight", mat(qkv, h), Q.F16), (b + "attn_gate.weight", mat(value, h), Q.F16),
                        (b + "ssm_alpha.weight", mat(vh, h), Q.F16), (b + "ssm_beta.weight", mat(vh, h), Q.F16),
                        (b + "ssm_a", -rng.uniform(1.0, 16.0, vh).astype(np.float32), None),
                        (b + "ssm_dt.bias", np.zeros(vh, np.float32), None),
                        (b + "ssm_conv1d.weight", (rng.standard_normal((qkv, s["conv"])) * 0.3).astype(np.float32),
                         None),
                        (b + "ssm_norm.weight", np.ones(s["v_dim"], np.float32), None),
                        (b + "ssm_out.weight", mat(h, value), Q.F16)]
    a = "qwen35"
    meta = {f"{a}.context_length": 262144, f"{a}.embedding_length": h, f"{a}.block_count": s["layers"],
            f"{a}.feed_forward_length": f, f"{a}.attention.head_count": s["heads"],
            f"{a}.attention.head_count_kv": s["kv_heads"], f"{a}.attention.key_length": s["head_dim"],
            f"{a}.attention.value_length": s["head_dim"], f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
            f"{a}.rope.freq_base": 10000000.0, f"{a}.rope.dimension_count": int(s["head_dim"] * s["rotary"]),
            f"{a}.full_attention_interval": s["interval"], f"{a}.ssm.conv_kernel": s["conv"],
            f"{a}.ssm.state_size": s["k_dim"], f"{a}.ssm.group_count": s["k_heads"],
            f"{a}.ssm.time_step_rank": s["v_heads"], f"{a}.ssm.inner_size": value, f"{a}.vocab_size": s["vocab"],
            "general.name": f"lockstep-bench-{shape}-f16", "general.file_type": int(LlamaFileType.MOSTLY_F16),
            **vocab_kv}
    return write_gguf_file(path, a, meta, tensors)


def hybrid_weight_bytes(shape: str) -> int:
    """F16 bytes a decode step reads: every matrix once (a tied embedding once, as lm_head)."""
    s = HYBRID_SHAPES[shape]
    h, f = s["hidden"], s["ffn"]
    qkv, value, q, kv = _dims(s)
    linear = h * (qkv + value + 2 * s["v_heads"]) + value * h
    full = h * (2 * q + 2 * kv) + q * h
    n_full = sum(_is_full(s, i) for i in range(s["layers"]))
    per = (s["layers"] - n_full) * linear + n_full * full + s["layers"] * 3 * h * f
    return 2 * (per + s["vocab"] * h)


def hybrid_kv_bytes_per_token(shape: str) -> int:
    s = HYBRID_SHAPES[shape]
    n_full = sum(_is_full(s, i) for i in range(s["layers"]))
    return 2 * n_full * s["kv_heads"] * s["head_dim"] * 2
