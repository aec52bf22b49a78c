"""Tiny random Qwen3.5 hybrid models (Gated DeltaNet + gated attention) saved by transformers."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_models import save_tokenizer, train_tokenizer

# three DeltaNet layers then a full-attention one, twice: both kinds see each other's outputs
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2


def make_config(vocab: int, *, layers: int = 8, hidden: int = 64, k_heads: int = 2, v_heads: int = 4,
                k_dim: int = 16, v_dim: int = 16, heads: int = 4, kv_heads: int = 2, head_dim: int = 32,
                partial_rotary: float = 0.25, tie: bool = False):
    import transformers as tf

    return tf.Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        linear_conv_kernel_dim=4, linear_key_head_dim=k_dim, linear_value_head_dim=v_dim,
        linear_num_key_heads=k_heads, linear_num_value_heads=v_heads, layer_types=LAYER_TYPES[:layers],
        max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=tie, bos_token_id=0, eos_token_id=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial_rotary},
    )


def make_moe_config(vocab: int, *, experts: int = 8, top_k: int = 2, expert_ffn: int = 32, shared_ffn: int = 48,
                    **shape):
    """qwen3_5_moe: the hybrid's layers with a routed MoE block and a gated shared expert in each."""
    import transformers as tf

    dense = make_config(vocab, **shape).to_dict()
    keep = {k: dense[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                  "num_key_value_heads", "head_dim", "linear_conv_kernel_dim", "linear_key_head_dim",
                                  "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
                                  "layer_types", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                  "bos_token_id", "eos_token_id", "rope_parameters")}
    return tf.Qwen3_5MoeTextConfig(**keep, num_experts=experts, num_experts_per_tok=top_k,
                                   moe_intermediate_size=expert_ffn, shared_expert_intermediate_size=shared_ffn)


def make_hybrid_model(where: Path, *, seed: int = 0, name: str = "qwen3_5", moe: bool = False, **shape) -> Path:
    """Saves a random Qwen3_5ForCausalLM (Qwen3_5MoeForCausalLM with `moe`) and the test tokenizer to
    where/<name>-s<seed>; returns the directory. Norm weights (stored as offsets from 1) and the decay
    parameters are randomised too, so every part of the arithmetic shows in the logits."""
    import torch
    import transformers as tf

    tok = train_tokenizer()
    cfg = (make_moe_config if moe else make_config)(tok.get_vocab_size(), **shape)
    torch.manual_seed(seed)
    model = (tf.Qwen3_5MoeForCausalLM if moe else tf.Qwen3_5ForCausalLM)(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("mlp.gate.weight"):  # routers wide enough that the top-k are clear winners
                p.normal_(0.0, 0.5)
            elif p.dim() >= 2:
                if p.abs().max() == 0:
                    p.normal_(0.0, 0.02)
                p.mul_(2.0)
            elif pname.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.5, 4.0)))
            else:  # norms, dt_bias
                p.add_(0.1 * torch.randn_like(p))
    out = Path(where) / f"{name}{'_moe' if moe else ''}-s{seed}"
    model.save_pretrained(str(out))
    save_tokenizer(tok, out)
    return out


def as_multimodal(text_dir: Path, out: Path) -> Path:
    """The text model as Qwen3_5ForConditionalGeneration's checkpoint lays it out: config with a
    text_config and a vision_config, weights under model.language_model., a vision tower tensor."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    shutil.copytree(text_dir, out)
    text = json.loads((text_dir / "config.json").read_text())
    cfg = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
           "tie_word_embeddings": text.get("tie_word_embeddings", False),
           "text_config": {**text, "model_type": "qwen3_5_text"}, "vision_config": {"model_type": "qwen3_5_vision"}}
    (out / "config.json").write_text(json.dumps(cfg))
    tensors = {}
    for name, data in load_file(str(text_dir / "model.safetensors")).items():
        tensors[name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name] = data
    tensors["model.visual.patch_embed.proj.weight"] = np.zeros((4, 4), np.float32)
    save_file(tensors, str(out / "model.safetensors"))
    return out


# --- GGUF, laid out as llama.cpp's convert_hf_to_gguf writes qwen35 / qwen35moe


def _tiled(a, k_heads: int, rep: int, width: int):
    """Grouped value-head rows [k0v0, k0v1, k1v0, ...] to tiled [k0v0, k1v0, k0v1, ...]."""
    return a.reshape(k_heads, rep, width, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)


def _gguf_tensor(rest: str, data, cfg: dict):
    """One HF tensor as convert_hf_to_gguf stores it (see engine/loader/gguf_hybrid.py)."""
    import numpy as np

    kh, vh, kd, vd = (cfg[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                      "linear_value_head_dim"))
    rep, qk = vh // kh, 2 * kh * kd
    if rest in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                "self_attn.k_norm.weight", "model.norm.weight"):
        return data + np.float32(1.0)
    if rest == "linear_attn.A_log":
        return _tiled(-np.exp(data), kh, rep, 1)
    if rest == "linear_attn.dt_bias":
        return _tiled(data, kh, rep, 1)
    if rest in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
        data = data.reshape(data.shape[0], -1).copy()
        data[qk:] = _tiled(data[qk:], kh, rep, vd)
        return data
    if rest == "linear_attn.in_proj_z.weight":
        return _tiled(data, kh, rep, vd)
    if rest in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight"):
        return _tiled(data, kh, rep, 1)
    if rest == "linear_attn.out_proj.weight":
        return np.ascontiguousarray(_tiled(np.ascontiguousarray(data.T), kh, rep, vd).T)
    if rest == "mlp.shared_expert_gate.weight":
        return data.reshape(-1)
    return data


def write_hybrid_gguf(hf_dir: Path, path: Path) -> Path:
    """The qwen3_5 / qwen3_5_moe model saved in `hf_dir` as an F32 GGUF file."""
    import re

    import numpy as np
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from engine.loader.gguf_hybrid import gguf_name
    from tests.tiny_models import gpt2_vocab_kv, write_gguf_file

    hf_dir = Path(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    tcfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    moe = "num_experts" in cfg
    arch = "qwen35moe" if moe else "qwen35"
    rope = cfg["rope_parameters"]
    kv = {
        f"{arch}.context_length": cfg["max_position_embeddings"], f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.block_count": cfg["num_hidden_layers"], f"{arch}.feed_forward_length": cfg.get("intermediate_size", 0),
        f"{arch}.attention.head_count": cfg["num_attention_heads"],
        f"{arch}.attention.head_count_kv": cfg["num_key_value_heads"],
        f"{arch}.attention.key_length": cfg["head_dim"], f"{arch}.attention.value_length": cfg["head_dim"],
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        f"{arch}.rope.freq_base": float(rope["rope_theta"]),
        f"{arch}.rope.dimension_count": int(cfg["head_dim"] * rope["partial_rotary_factor"]),
        f"{arch}.rope.dimension_sections": [11, 11, 10, 0],
        f"{arch}.full_attention_interval": 4, f"{arch}.ssm.conv_kernel": cfg["linear_conv_kernel_dim"],
        f"{arch}.ssm.state_size": cfg["linear_key_head_dim"], f"{arch}.ssm.group_count": cfg["linear_num_key_heads"],
        f"{arch}.ssm.time_step_rank": cfg["linear_num_value_heads"],
        f"{arch}.ssm.inner_size": cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"],
        f"{arch}.vocab_size": cfg["vocab_size"], "general.name": hf_dir.name,
    }
    if moe:
        kv |= {f"{arch}.expert_count": cfg["num_experts"], f"{arch}.expert_used_count": cfg["num_experts_per_tok"],
               f"{arch}.expert_feed_forward_length": cfg["moe_intermediate_size"],
               f"{arch}.expert_shared_feed_forward_length": cfg["shared_expert_intermediate_size"]}
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    kv |= gpt2_vocab_kv(tok, "default", tcfg.get("bos_token"), tcfg.get("eos_token"), add_bos=False,
                        chat_template=tcfg.get("chat_template"))
    tensors, experts = [], {}
    for hf, data in load_file(str(hf_dir / "model.safetensors")).items():
        data = data.astype(np.float32)
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", hf)
        if m:
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = data
            continue
        rest = hf.split(".", 3)[3] if hf.startswith("model.layers.") else hf
        tensors.append((gguf_name(hf), _gguf_tensor(rest, data, cfg), None))
    for (layer, proj), per in sorted(experts.items()):
        tensors.append((f"blk.{layer}.ffn_{proj}_exps.weight", np.stack([per[e] for e in sorted(per)]), None))
    return write_gguf_file(path, arch, kv, tensors)
