"""GGUF files of llama.cpp's `qwen35` / `qwen35moe` (Qwen3.5 hybrids): metadata to the Hugging Face
config keys, tensors to Hugging Face names and layout.

convert_hf_to_gguf stores the Gated DeltaNet tensors changed, and this undoes it so that the model
code sees transformers' tensors: value heads reordered from grouped by key head [k0v0, k0v1, k1v0,
k1v1] to tiled [k0v0, k1v0, k0v1, k1v1] (rows of in_proj_qkv's v part, in_proj_z, in_proj_a/b, the
conv's v channels, out_proj's columns, A_log and dt_bias), A_log stored as ssm_a = -exp(A_log), the
decoder's (1 + weight) RMS norms stored as 1 + weight, the conv weight as [conv_dim, kernel].
"""

from __future__ import annotations

import numpy as np

from engine.config import ModelConfig
from engine.errors import ModelLoadError, UnsupportedError
from engine.loader.gguf import _BLK, _GLOBAL
from engine.loader.gguf import gguf_name as _gguf_name
from engine.loader.moe import gguf_moe_tensor
from engine.models.qwen3_5 import FULL, LINEAR, from_hf_config, hybrid_spec
from lockstep_kernels.weights import Weight

ARCHS = {"qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe"}
_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight", "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight", "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias", "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_norm.weight": "linear_attn.norm.weight", "ssm_out.weight": "linear_attn.out_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_OFFSET_NORMS = {"attn_norm.weight", "post_attention_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"}


def gguf_name(hf: str) -> str:
    """engine.loader.gguf.gguf_name with this architecture's block tensors."""
    return _gguf_name(hf, _BLOCK)


def _scalar(value, key: str) -> int:
    """Per-layer lists (0 where a layer has no attention) give their one nonzero value."""
    if isinstance(value, list):
        nonzero = {int(v) for v in value if v}
        if len(nonzero) != 1:
            raise UnsupportedError(f"{key} varies per layer ({value[:8]}...); not supported")
        return nonzero.pop()
    return int(value)


def read_config(f) -> ModelConfig:
    """`f`: an open engine.loader.gguf.GGUFFile of a qwen35 / qwen35moe file."""
    arch = f.meta("general.architecture")

    def m(key, default=None):
        return f.meta(f"{arch}.{key}", default)

    n_layers = int(f.meta(f"{arch}.block_count"))
    head_dim = int(m("attention.key_length"))
    layer_types = [LINEAR if f"blk.{i}.ssm_a" in f.tensors else FULL for i in range(n_layers)]
    tokens = f.reader.fields.get("tokenizer.ggml.tokens")
    cfg = {
        "vocab_size": m("vocab_size", len(tokens.data) if tokens is not None else None),
        "hidden_size": f.meta(f"{arch}.embedding_length"), "num_hidden_layers": n_layers,
        "num_attention_heads": _scalar(f.meta(f"{arch}.attention.head_count"), "attention.head_count"),
        "num_key_value_heads": _scalar(f.meta(f"{arch}.attention.head_count_kv"), "attention.head_count_kv"),
        "head_dim": head_dim, "intermediate_size": m("feed_forward_length", 0),
        "rms_norm_eps": f.meta(f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(m("rope.freq_base", 10000000.0)),
                            "partial_rotary_factor": int(m("rope.dimension_count", head_dim)) / head_dim},
        "max_position_embeddings": m("context_length", 32768),
        "tie_word_embeddings": "output.weight" not in f.tensors, "layer_types": layer_types,
        "linear_conv_kernel_dim": f.meta(f"{arch}.ssm.conv_kernel"),
        "linear_key_head_dim": f.meta(f"{arch}.ssm.state_size"),
        "linear_num_key_heads": f.meta(f"{arch}.ssm.group_count"),
        "linear_num_value_heads": f.meta(f"{arch}.ssm.time_step_rank"),
        "linear_value_head_dim": int(f.meta(f"{arch}.ssm.inner_size")) // int(f.meta(f"{arch}.ssm.time_step_rank")),
    }
    if cfg["vocab_size"] is None:
        raise ModelLoadError(f"{f.name}: missing metadata key '{arch}.vocab_size' (and no tokenizer.ggml.tokens)")
    if arch == "qwen35moe":
        cfg |= {"num_experts": f.meta(f"{arch}.expert_count"), "num_experts_per_tok": f.meta(f"{arch}.expert_used_count"),
                "moe_intermediate_size": f.meta(f"{arch}.expert_feed_forward_length"),
                "shared_expert_intermediate_size": m("expert_shared_feed_forward_length", 0)}
    return from_hf_config(cfg)


def _rows(a: np.ndarray, k_heads: int, rep: int, width: int) -> np.ndarray:
    """Tiled value-head rows back to grouped (rows of `width` per head)."""
    rest = a.shape[1:]
    return a.reshape(rep, k_heads, width, *rest).swapaxes(0, 1).reshape(a.shape)


def _reorder_rows(w: Weight, k_heads: int, rep: int, width: int, start: int = 0) -> Weight:
    def back(a):
        if a is None:
            return None
        out = a.copy()
        n = k_heads * rep * width
        out[start : start + n] = _rows(a[start : start + n], k_heads, rep, width)
        return out

    return Weight(back(w.data), w.dtype, back(w.scales))


def _hybrid_tensor(rest: str, w: Weight, config: ModelConfig) -> Weight:
    s = hybrid_spec(config).deltanet
    rep = s.v_heads // s.k_heads
    if rest in _OFFSET_NORMS or rest == "output_norm.weight":
        return Weight(w.to_f32().astype(np.float32) - np.float32(1.0), "f32")
    if rest == "ssm_a":
        w = Weight(np.log(-w.to_f32().astype(np.float64)).astype(np.float32), "f32")
    if rest == "ssm_conv1d.weight":
        w = Weight(np.ascontiguousarray(w.to_f32().reshape(s.qkv, 1, s.kernel)), "f32")
    if rep == 1:
        return w
    if rest in ("ssm_a", "ssm_dt.bias"):
        return Weight(_rows(w.to_f32(), s.k_heads, rep, 1).copy(), "f32")
    if rest in ("attn_qkv.weight", "ssm_conv1d.weight"):
        return _reorder_rows(w, s.k_heads, rep, s.v_dim, start=2 * s.k_heads * s.k_dim)
    if rest == "attn_gate.weight":
        return _reorder_rows(w, s.k_heads, rep, s.v_dim)
    if rest in ("ssm_alpha.weight", "ssm_beta.weight"):
        return _reorder_rows(w, s.k_heads, rep, 1)
    if rest == "ssm_out.weight":
        # columns: only a float type can be moved by column (a quantized block spans several)
        a = w.to_f32() if w.dtype not in ("f32", "f16") else w.data
        moved = _rows(np.ascontiguousarray(a.T), s.k_heads, rep, s.v_dim).T
        return Weight(np.ascontiguousarray(moved), w.dtype if w.dtype in ("f32", "f16") else "f32")
    return w


def read_weights(f, config: ModelConfig, weight_of) -> dict[str, Weight]:
    """`weight_of`: engine.loader.gguf's tensor -> Weight (stored layout, HF shape)."""
    weights: dict[str, Weight] = {}
    for name, t in f.tensors.items():
        if name in _GLOBAL:
            weights[_GLOBAL[name]] = _hybrid_tensor(name, weight_of(t), config)
            continue
        blk = _BLK.fullmatch(name)
        if blk and blk.group(2) in _BLOCK:
            weights[f"model.layers.{blk.group(1)}.{_BLOCK[blk.group(2)]}"] = _hybrid_tensor(blk.group(2), weight_of(t),
                                                                                           config)
            continue
        moe = gguf_moe_tensor(blk.group(1), blk.group(2), weight_of(t)) if blk else None
        if moe is None:
            raise UnsupportedError(f"{f.name}: tensor {name} is not part of the {config.arch} architecture")
        weights |= moe
    return weights
