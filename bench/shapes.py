"""The benchmark model shapes of DESIGN.md, written as GGUF files of random weights from a seed: F16, or
for the dense shapes Q4_K_M-like (llama-quantize's mix: Q4_K, with Q6_K for the output and for attn_v /
ffn_down of the layers its use_more_bits rule picks; blocks written by lockstep_kernels/quants/writer.py).

Random weights do not change speed; the vocabulary is synthetic (the benchmarks send token ids).
Shapes with `experts` are Qwen3-MoE files (qwen3moe: q/k norms, every layer sparse, stacked experts);
the hybrid shapes (Qwen3.5, Gated DeltaNet) are written by shapes_hybrid.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lockstep_kernels.quants import BLOCK_TYPES  # noqa: E402
from lockstep_kernels.quants.mixes import q4_k_m_type  # noqa: E402
from lockstep_kernels.quants.writer import quantize  # noqa: E402
from tests.tiny_models import write_gguf_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes_hybrid import (  # noqa: E402
    HYBRID_SHAPES,
    hybrid_kv_bytes_per_token,
    hybrid_weight_bytes,
    write_hybrid_shape,
)

QUANTS = ("f16", "q4_k_m")

SHAPES = {
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256),
    "8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256),
    "tiny": dict(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=256, vocab=512),
    "30b-a3b": dict(hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, ffn=768, vocab=151936,
                    experts=128, top_k=8),
    "tiny-moe": dict(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=64, vocab=512, experts=8, top_k=2),
    **{name: dict(s, hybrid=True) for name, s in HYBRID_SHAPES.items()},
}


def _vocab(n: int) -> dict:
    from gguf import TokenType

    base = [chr(c) for c in range(33, 127)] + ["Ġ" + chr(c) for c in range(97, 123)]
    tokens = base + [f"t{i}" for i in range(n - len(base) - 2)] + ["<|begin|>", "<|end|>"]
    types = [int(TokenType.NORMAL)] * (n - 2) + [int(TokenType.CONTROL)] * 2
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["Ġ a"],
            "tokenizer.ggml.add_bos_token": False}  # no end token: every run generates its full length


def tensor_type(shape: str, quant: str, name: str, k: int) -> str:
    return "f16" if quant == "f16" else q4_k_m_type(name, SHAPES[shape]["layers"], k)


def write_shape(path: Path, shape: str, seed: int = 0, quant: str = "f16") -> Path:
    from gguf import GGMLQuantizationType as Q
    from gguf import LlamaFileType

    s = SHAPES[shape]
    if quant != "f16" and ("experts" in s or "hybrid" in s):
        raise ValueError(f"the {shape} shape is written as F16 only")
    rng = np.random.default_rng(seed)
    h, f, v = s["hidden"], s["ffn"], s["vocab"]
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]

    def mat(n: int, k: int) -> np.ndarray:
        # 1024 random rows repeated: speed does not depend on the values, and drawing 8B normals
        # would take minutes of the benchmark's device time
        block = (rng.standard_normal((min(n, 1024), k), dtype=np.float32) * np.float32(0.02)).astype(np.float16)
        return np.resize(block, (n, k))

    def dense(name: str, n: int, k: int) -> tuple[str, np.ndarray, Q]:
        kind = tensor_type(shape, quant, name, k)
        if kind == "f16":
            return name, mat(n, k), Q.F16
        block = rng.standard_normal((min(n, 1024), k), dtype=np.float32) * np.float32(0.02)
        raw = quantize(block, kind)  # quantized once, the rows' blocks repeated
        return name, np.resize(raw, (n, raw.shape[1])), Q[kind.upper()]

    if "hybrid" in s:
        return write_hybrid_shape(path, shape, seed, mat, _vocab(v))
    ones = np.ones(h, np.float32)
    moe = "experts" in s
    arch = "qwen3moe" if moe else "llama"
    if moe:  # one set of stacked experts for every layer: 48 distinct sets would hold the whole file in memory
        n_e = s["experts"]
        exps = [mat(n_e * f, h).reshape(n_e, f, h), mat(n_e * f, h).reshape(n_e, f, h),
                mat(n_e * h, f).reshape(n_e, h, f)]
    tensors = [dense("token_embd.weight", v, h), ("output_norm.weight", ones, None), dense("output.weight", v, h)]
    for i in range(s["layers"]):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", ones, None), (b + "ffn_norm.weight", ones, None),
                    dense(b + "attn_q.weight", q, h), dense(b + "attn_k.weight", kv, h),
                    dense(b + "attn_v.weight", kv, h), dense(b + "attn_output.weight", h, q)]
        if moe:
            norm = np.ones(s["head_dim"], np.float32)
            tensors += [(b + "attn_q_norm.weight", norm, None), (b + "attn_k_norm.weight", norm, None),
                        (b + "ffn_gate_inp.weight", mat(s["experts"], h), Q.F16),
                        (b + "ffn_gate_exps.weight", exps[0], Q.F16), (b + "ffn_up_exps.weight", exps[1], Q.F16),
                        (b + "ffn_down_exps.weight", exps[2], Q.F16)]
        else:
            tensors += [dense(b + "ffn_gate.weight", f, h), dense(b + "ffn_up.weight", f, h),
                        dense(b + "ffn_down.weight", h, f)]
    meta = {f"{arch}.context_length": 131072, f"{arch}.embedding_length": h, f"{arch}.block_count": s["layers"],
            f"{arch}.feed_forward_length": f, f"{arch}.rope.dimension_count": s["head_dim"],
            f"{arch}.attention.head_count": s["heads"], f"{arch}.attention.head_count_kv": s["kv_heads"],
            f"{arch}.attention.layer_norm_rms_epsilon": 1e-5, f"{arch}.rope.freq_base": 500000.0,
            f"{arch}.vocab_size": v, "general.name": f"lockstep-bench-{shape}-{quant}", **_vocab(v),
            "general.file_type": int(LlamaFileType.MOSTLY_Q4_K_M if quant == "q4_k_m" else LlamaFileType.MOSTLY_F16)}
    if moe:
        meta |= {f"{arch}.expert_count": s["experts"], f"{arch}.expert_used_count": s["top_k"],
                 f"{arch}.expert_feed_forward_length": f, f"{arch}.attention.key_length": s["head_dim"],
                 f"{arch}.attention.value_length": s["head_dim"]}
    return write_gguf_file(path, arch, meta, tensors)


def weight_bytes(shape: str, quant: str = "f16") -> int:
    """Bytes a decode step reads from the weights (every matrix once; embedding rows are negligible;
    of a MoE layer the router and one token's top-k experts: a solo decode's active parameters)."""
    if "hybrid" in SHAPES[shape]:
        return hybrid_weight_bytes(shape)
    s = SHAPES[shape]
    h, f, v = s["hidden"], s["ffn"], s["vocab"]
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    if quant != "f16":
        def stored(name: str, n: int, k: int) -> int:
            kind = BLOCK_TYPES[tensor_type(shape, quant, name, k)]
            return n * k // kind.block_size * kind.type_size

        per = [("attn_q", q, h), ("attn_k", kv, h), ("attn_v", kv, h), ("attn_output", h, q), ("ffn_gate", f, h),
               ("ffn_up", f, h), ("ffn_down", h, f)]
        return stored("output.weight", v, h) + sum(stored(f"blk.{i}.{t}.weight", n, k)
                                                   for i in range(s["layers"]) for t, n, k in per)
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * f * s.get("top_k", 1) + h * s.get("experts", 0)
    return 2 * (s["layers"] * per_layer + v * h)


def kv_bytes_per_token(shape: str) -> int:
    if "hybrid" in SHAPES[shape]:
        return hybrid_kv_bytes_per_token(shape)
    s = SHAPES[shape]
    return 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2  # K and V, f16
