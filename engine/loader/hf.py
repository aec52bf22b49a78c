"""Hugging Face model directories: config.json, one or sharded safetensors, tokenizer files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from engine.config import ModelConfig
from engine.errors import ModelLoadError, UnsupportedError
from engine.loader.moe import hf_expert_views, hf_moe_config
from engine.loader.safetensors_file import load_tensors
from lockstep_kernels.weights import Weight

log = logging.getLogger("engine.loader")
_HYBRID_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe"}


def _need(cfg: dict, key: str, where: str = "config.json"):
    if key not in cfg:
        raise ModelLoadError(f"{where}: missing key {key!r}")
    return cfg[key]


def read_config(model_dir: Path) -> ModelConfig:
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{model_dir}: no config.json")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"config.json: not valid JSON ({e})") from e
    mt = cfg.get("model_type")
    if mt in _HYBRID_TYPES:
        from engine.models.qwen3_5 import from_hf_config

        return from_hf_config(cfg)
    if mt not in _MODEL_TYPES:
        archs = ",".join(cfg.get("architectures") or []) or "?"
        raise UnsupportedError(f"unsupported architecture {mt!r} ({archs})")
    hidden = int(_need(cfg, "hidden_size"))
    n_heads = int(_need(cfg, "num_attention_heads"))
    head_dim = cfg.get("head_dim") or hidden // n_heads
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    theta = cfg.get("rope_theta")
    if isinstance(rope, dict):
        theta = theta or rope.get("rope_theta")
        if rope.get("rope_type", rope.get("type")) in (None, "default"):
            rope = None
    sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", mt == "mistral") else None
    return ModelConfig(
        arch=_MODEL_TYPES[mt],
        vocab_size=int(_need(cfg, "vocab_size")),
        hidden=hidden,
        n_layers=int(_need(cfg, "num_hidden_layers")),
        n_heads=n_heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
        head_dim=int(head_dim),
        ffn=int(_need(cfg, "intermediate_size")),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta or 10000.0),
        rope_scaling=rope,
        max_position=int(cfg.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=mt == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=mt in ("qwen3", "qwen3_moe"),
        sliding_window=int(sliding) if sliding else None,
        moe=hf_moe_config(cfg) if mt == "qwen3_moe" else None,
    )


def _shards(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            wm = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelLoadError(f"{index.name}: damaged index ({e})") from e
        files = sorted(set(wm.values()))
        missing = [f for f in files if not (model_dir / f).is_file()]
        if missing:
            raise ModelLoadError(f"{index.name} names missing shard(s): {', '.join(missing)}")
        return [model_dir / f for f in files]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir}: no .safetensors files")
    return files


def read_weights(model_dir: Path, config: ModelConfig | None = None) -> dict[str, Weight]:
    weights: dict[str, Weight] = {}
    for shard in _shards(model_dir):
        weights.update(load_tensors(shard))
    if config is not None and config.arch.startswith("qwen3_5"):
        from engine.models.qwen3_5 import text_weights

        weights, dropped = text_weights(weights)
        if dropped:
            log.warning("%s: text only; %d tensors of the vision tower / MTP heads are not loaded",
                        model_dir.name, len(dropped))
    return hf_expert_views(weights)
