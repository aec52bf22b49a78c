"""Which model class builds an architecture, and the checks its weights must pass at load."""

from __future__ import annotations

from engine.config import ModelConfig
from engine.models import llama, qwen3_5
from lockstep_kernels.weights import Weight

HYBRID = ("qwen3_5", "qwen3_5_moe")


def is_hybrid(c: ModelConfig) -> bool:
    return c.arch in HYBRID


def model_class(c: ModelConfig):
    return qwen3_5.Qwen35Model if is_hybrid(c) else llama.LlamaModel


def check_weights(c: ModelConfig, weights: dict[str, Weight]) -> None:
    (qwen3_5.check_weights if is_hybrid(c) else llama.check_weights)(c, weights)
