"""Mixture-of-experts parts of the loaders: the MoE config from config.json or GGUF metadata, and the
expert tensors of either format under the per-expert Hugging Face names engine.models.moe uses.

GGUF (llama.cpp's names): `blk.N.ffn_gate_inp` is the router, `ffn_{gate,up,down}_exps` stack the
experts [E, ...], `ffn_{gate,up,down}_shexp` and `ffn_gate_inp_shexp` are the shared expert and its gate.
"""

from __future__ import annotations

import re

from engine.config import MoeConfig
from engine.errors import ModelLoadError
from engine.models.moe import expert_views, fused_gate_up_views
from lockstep_kernels.weights import Weight

GGUF_BLOCK = {
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
GGUF_STACKED = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj", "ffn_down_exps.weight": "down_proj"}
_HF_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_HF_STACKED = re.compile(r"(.*\.mlp\.)experts\.(gate_up_proj|down_proj)")


def hf_moe_config(cfg: dict, *, always_renormalize: bool = False) -> MoeConfig | None:
    """qwen3_moe's keys (qwen3_5_moe's router renormalises whatever the config says)."""
    n = cfg.get("num_experts", cfg.get("num_local_experts"))
    if not n:
        return None
    for key in ("num_experts_per_tok", "moe_intermediate_size"):
        if key not in cfg:
            raise ModelLoadError(f"config.json: missing key {key!r}")
    return MoeConfig(
        n_experts=int(n), top_k=int(cfg["num_experts_per_tok"]), expert_ffn=int(cfg["moe_intermediate_size"]),
        norm_topk=always_renormalize or bool(cfg.get("norm_topk_prob", False)),
        sparse_step=int(cfg.get("decoder_sparse_step") or 1), dense_layers=tuple(cfg.get("mlp_only_layers") or ()),
        shared_ffn=int(cfg.get("shared_expert_intermediate_size") or 0))


def hf_expert_views(weights: dict[str, Weight]) -> dict[str, Weight]:
    """transformers' stacked layout (`mlp.experts.gate_up_proj` [E, 2F, H], `mlp.experts.down_proj`
    [E, H, F]) split into per-expert views; per-expert checkpoints pass through."""
    out = {}
    for name, w in weights.items():
        m = _HF_STACKED.fullmatch(name)
        if m is None or len(w.shape) != 3:
            out[name] = w
        elif m.group(2) == "gate_up_proj":
            out |= fused_gate_up_views(m.group(1), w)
        else:
            out |= expert_views(m.group(1), "down_proj", w)
    return out


def gguf_moe_config(meta, tensors: dict, n_layers: int) -> MoeConfig | None:
    """`meta(key, default)` reads `{arch}.key`; a layer is sparse when the file has its router."""
    n = meta("expert_count", 0)
    if not n:
        return None
    shexp = tensors.get("blk.0.ffn_up_shexp.weight")
    shared = meta("expert_shared_feed_forward_length", None)
    if shared is None and shexp is not None:
        shared = int(shexp.shape[-1])  # GGUF lists dims fastest first: [H, S]
    return MoeConfig(
        n_experts=int(n), top_k=int(meta("expert_used_count")), expert_ffn=int(meta("expert_feed_forward_length")),
        norm_topk=bool(meta("expert_weights_norm", True)),  # llama.cpp renormalises qwen3moe's top-k always
        dense_layers=tuple(i for i in range(n_layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensors),
        shared_ffn=int(shared or 0))


def gguf_moe_tensor(layer: str, rest: str, w: Weight) -> dict[str, Weight] | None:
    """A GGUF block tensor of the MoE FFN under its HF name(s); None when it is not one."""
    prefix = f"model.layers.{layer}."
    if rest in GGUF_STACKED:
        return expert_views(prefix + "mlp.", GGUF_STACKED[rest], w)
    if rest not in GGUF_BLOCK:
        return None
    if rest == "ffn_gate_inp_shexp.weight" and len(w.shape) == 1:  # llama.cpp keeps it as one row [H]
        w = Weight(w.data.reshape(1, -1), w.dtype, None if w.scales is None else w.scales.reshape(1, -1))
    return {prefix + GGUF_BLOCK[rest]: w}


def gguf_moe_name(hf: str) -> str | None:
    """The GGUF name of a per-expert HF tensor name, for messages about what a file lacks."""
    m = _HF_EXPERT.fullmatch(hf)
    if m is None:
        layer = _HF_LAYER.fullmatch(hf)
        back = {v: k for k, v in GGUF_BLOCK.items()}
        return f"blk.{layer.group(1)}.{back[layer.group(2)]}" if layer and layer.group(2) in back else None
    kind = {v: k for k, v in GGUF_STACKED.items()}[m.group(3)]
    return f"blk.{m.group(1)}.{kind} (expert {m.group(2)})"
