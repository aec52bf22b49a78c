"""The exactness self-check at load: the model's shapes through every kernel family or build the
plan may pick on this device (lockstep_kernels.selfcheck): its matmuls, its fused q|k|v projection and its
attention; a choice that changes a row's bits refuses exact mode with the usual one-line verdict,
naming it."""

from __future__ import annotations

import logging
from typing import Any

from engine.exact import refuse
from lockstep_kernels.selfcheck import AttentionShape, check_attention, check_matmuls, check_qkv

log = logging.getLogger("engine.selfcheck")


def model_matmuls(model: Any) -> list[tuple[str, Any]]:
    """The uploaded weights plain matmuls run on inside the layers: each layer's o, gate|up and
    down; a hybrid layer's mixer projections (DeltaNet in/out, gated attention q|k|v and o) and its
    dense FFN pair (one of each shape is checked)."""
    out = []
    for i, layer in enumerate(getattr(model, "layers", [])):
        for attr in ("wo", "w_gate_up", "w_down"):
            w = getattr(layer, attr, None)
            if w is not None:
                out.append((f"layers.{i}.{attr}", w))
        mixer = getattr(layer, "mixer", None)
        for attr in ("w_in", "w_out", "w_qkv", "wo"):
            w = getattr(mixer, attr, None)
            if w is not None:
                out.append((f"layers.{i}.mixer.{attr}", w))
        ffn = getattr(layer, "ffn", None)
        if isinstance(ffn, tuple):
            out += [(f"layers.{i}.ffn.gate_up", ffn[0]), (f"layers.{i}.ffn.down", ffn[1])]
    return out


def attention_shape(model: Any, kv_type: str, width: int) -> AttentionShape | None:
    c = getattr(model, "config", None)
    if c is None or not getattr(c, "n_heads", 0) or not getattr(c, "n_kv_heads", 0):
        return None
    return AttentionShape(c.n_heads, c.n_kv_heads, c.head_dim, max(1, width), kv_type)


def fused_qkv(model: Any) -> tuple[int, Any] | None:
    """The first layer (index, layer) whose q|k|v goes through norm_qkv_rope_write (no per-head q/k
    norm); every layer's projection has its shape."""
    for i, layer in enumerate(getattr(model, "layers", [])):
        if getattr(layer, "w_qkv", None) is not None and getattr(layer, "q_norm", True) is None:
            return i, layer
    return None


def self_check(ops: Any, model: Any, max_rows: int, head_rows: int | None = None, kv_type: str = "f16",
               width: int = 1) -> float:
    """Raises the exact refusal (exit 3) when a choice breaks row invariance here; else returns the
    seconds of it spent building kernels on first use (ops.build_seconds), which the warm-up would
    otherwise pay. `max_rows`: the
    most token rows a step runs; `head_rows`: the most rows lm_head sees in a step (each sequence's
    last row, or its draft rows), which bounds that check's memory too; `kv_type` and `width` (pages
    a sequence's block table holds): the KV cache attention reads."""
    head = min(max_rows, head_rows or max_rows)
    checks = [lambda: check_matmuls(ops, model_matmuls(model), max_rows),
              lambda: check_matmuls(ops, [("lm_head", model.lm_head)], head)]
    shape = attention_shape(model, kv_type, width)
    qkv = fused_qkv(model)
    if shape is not None and qkv is not None and hasattr(ops, "qkv_family"):
        i, layer = qkv
        checks.append(lambda: check_qkv(ops, f"layers.{i}.w_qkv", layer.attn_norm, model.config.rms_eps,
                                        layer.w_qkv, layer.b_qkv, model.rope, shape, max_rows))
    if shape is not None and hasattr(ops, "attention_build"):
        checks.append(lambda: check_attention(ops, shape, max_rows))
    builds = getattr(ops, "build_seconds", lambda: 0.0)
    built = builds()
    families: dict[str, dict[str, int]] = {}
    seconds, mismatch = 0.0, None
    for check in checks:
        mismatch, info = check()
        families |= info["families"]
        seconds += info["seconds"]
        if mismatch is not None:
            break
    built = builds() - built
    names = sorted({f for per in families.values() for f in per})
    log.info("exactness self-check: %d shapes, families %s, %.2f s: kernel builds %.2f s (first uses, which the "
             "warm-up would pay), checks %.2f s", len(families), ", ".join(names), seconds, built, seconds - built)
    if mismatch is not None:
        raise refuse(mismatch.describe(), "--exact-concurrency off")
    return built
