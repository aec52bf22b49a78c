"""The architecture description every loader produces and the model code consumes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from engine.errors import UnsupportedError

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")


@dataclass
class MoeConfig:
    """The mixture-of-experts FFN: `n_experts` experts of FFN width `expert_ffn`, `top_k` routed per token;
    a layer is sparse when its index + 1 is a multiple of `sparse_step` and it is not in `dense_layers`.
    `shared_ffn` > 0 adds an always-on shared expert behind a sigmoid gate (Qwen3.5-MoE)."""

    n_experts: int
    top_k: int
    expert_ffn: int
    norm_topk: bool = True
    sparse_step: int = 1
    dense_layers: tuple[int, ...] = ()
    shared_ffn: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.n_experts:
            raise UnsupportedError(f"{self.top_k} experts per token with {self.n_experts} experts")
        if self.sparse_step < 1:
            raise UnsupportedError(f"decoder_sparse_step {self.sparse_step} is not a positive step")

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.dense_layers and (layer + 1) % self.sparse_step == 0


@dataclass
class ModelConfig:
    arch: str
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rope_neox: bool = True
    max_position: int = 4096
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    attn_softcap: float | None = None
    moe: MoeConfig | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise UnsupportedError(f"unsupported architecture {self.arch!r} (supported: {', '.join(ARCHITECTURES)})")
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedError(f"{self.n_heads} attention heads are not a multiple of {self.n_kv_heads} KV heads")

    def rope_inv_freq(self) -> np.ndarray:
        """Inverse frequencies, float64, after llama3 or linear scaling (as transformers computes them)."""
        dim = self.head_dim
        inv = 1.0 / (self.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        sc = self.rope_scaling or {}
        kind = sc.get("rope_type", sc.get("type"))
        if kind in (None, "default"):
            return inv
        if kind == "linear":
            return inv / float(sc["factor"])
        if kind == "llama3":
            factor = float(sc["factor"])
            low, high = float(sc.get("low_freq_factor", 1.0)), float(sc.get("high_freq_factor", 4.0))
            old_ctx = float(sc["original_max_position_embeddings"])
            low_wl, high_wl = old_ctx / low, old_ctx / high
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wl, inv / factor, inv)
            smooth = (old_ctx / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelen >= high_wl) & (wavelen <= low_wl)
            return np.where(medium, smoothed, scaled)
        if kind == "freq_factors":  # a GGUF rope_freqs tensor that no llama3 formula reproduces
            return inv / np.asarray(sc["factors"], dtype=np.float64)
        raise UnsupportedError(f"unsupported rope scaling {kind!r}")

    def rope_tables(self, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
        inv = self.rope_inv_freq().astype(np.float32)
        pos = np.arange(n_positions, dtype=np.float32)
        ang = np.outer(pos, inv).astype(np.float32)
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
