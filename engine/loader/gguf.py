"""GGUF files: metadata -> ModelConfig, tensors -> Weights under Hugging Face names, vocab -> tokenizer.

Tensors stay memory-mapped where their stored layout is ours already (F32, F16, BF16 and the raw
blocks of the other quantized types, lockstep_kernels.weights.RAW_BLOCK_TYPES); Q8_0 blocks are split into int8
values and f16 scales, and llama's q/k rows are put back in HF order.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from engine.config import ModelConfig
from engine.errors import ModelLoadError, UnsupportedError
from engine.loader.gguf_rope import rope_scaling
from engine.loader.gguf_vocab import build_tokenizer
from engine.loader.moe import gguf_moe_config, gguf_moe_name, gguf_moe_tensor
from engine.models.llama import expected_shapes
from engine.tokenizer import TextTokenizer
from lockstep_kernels.weights import QK8_0, RAW_BLOCK_TYPES, Weight

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe")  # Mistral files say "llama"
_CONFIG_ARCH = {"qwen3moe": "qwen3_moe"}  # GGUF architecture -> ModelConfig.arch where they differ

_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_BACK = {v: k for k, v in _GLOBAL.items()}
_BLK = re.compile(r"blk\.(\d+)\.(.+)")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_ROPE_FREQS = "rope_freqs.weight"
_REQUIRED = object()
_RAW_BLOCKS = {GGMLQuantizationType[t.upper()]: t for t in RAW_BLOCK_TYPES}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", *(t.upper() for t in RAW_BLOCK_TYPES))


def hf_name(name: str) -> str | None:
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _BLK.fullmatch(name)
    if m and m.group(2) in _BLOCK:
        return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}"
    return None


def gguf_name(hf: str, block: dict[str, str] = _BLOCK) -> str:
    """The GGUF name of an HF tensor name (`block`: the architecture's table of a layer's GGUF -> HF names), for
    messages about tensors a file lacks and for the tests that write files as llama.cpp's converter does."""
    moe = gguf_moe_name(hf)
    if moe is not None:
        return moe
    m = _HF_LAYER.fullmatch(hf)
    back = {v: k for k, v in block.items()}
    if m and m.group(2) in back:
        return f"blk.{m.group(1)}.{back[m.group(2)]}"
    return _GLOBAL_BACK.get(hf, hf)


class GGUFFile:
    """An open GGUF file: typed metadata access with named errors, and its tensors by name."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.name = self.path.name
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelLoadError(f"{self.name}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            self.reader = GGUFReader(self.path)
        except (ValueError, IndexError, KeyError, OverflowError, TypeError, UnicodeDecodeError, OSError) as e:
            if "GGMLQuantizationType" in str(e):  # a type id newer than the gguf package
                raise UnsupportedError(f"{self.name}: unsupported tensor type ({e})") from e
            # The reader reads past a short file into short arrays and fails later on their shapes.
            raise ModelLoadError(f"{self.name}: truncated or damaged GGUF file ({e})") from e
        if self.reader.byte_order != "I":
            raise UnsupportedError(f"{self.name}: big-endian GGUF files are not supported")
        self.tensors = {t.name: t for t in self.reader.tensors}

    def meta(self, key: str, default=_REQUIRED):
        field = self.reader.fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise ModelLoadError(f"{self.name}: missing metadata key {key!r}")
            return default
        return _field_value(field)


def _field_value(field):
    kind = field.types[0]
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", errors="replace")
    if kind == GGUFValueType.FLOAT32:  # the shortest decimal of the float32: 1e-05, not 9.99999974e-06
        return float(str(field.parts[-1][0]))
    if kind != GGUFValueType.ARRAY:
        return field.parts[-1].tolist()[0]
    if len(field.types) < 2:  # empty array
        return []
    if field.types[-1] == GGUFValueType.STRING:
        return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
    return [field.parts[i].tolist()[0] for i in field.data]


def _uniform(value, key: str) -> int:
    """A per-layer list with one value is fine; varying values are another architecture."""
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            raise UnsupportedError(f"{key} varies per layer ({value[:8]}...); not supported")
        value = value[0]
    return int(value)


def _tensor_f32(f: GGUFFile, name: str) -> np.ndarray | None:
    t = f.tensors.get(name)
    if t is None:
        return None
    return _weight(t).to_f32().reshape(-1).astype(np.float64)


def read_config(f: GGUFFile) -> ModelConfig:
    arch = f.meta("general.architecture")
    if arch in ("qwen35", "qwen35moe"):
        from engine.loader.gguf_hybrid import read_config as hybrid_config

        return hybrid_config(f)
    if arch not in ARCHITECTURES:
        raise UnsupportedError(f"{f.name}: unsupported architecture {arch!r} "
                               f"(supported: {', '.join(ARCHITECTURES)}, qwen35, qwen35moe)")

    def m(key, default=_REQUIRED):
        return f.meta(f"{arch}.{key}", default)

    hidden = int(m("embedding_length"))
    n_heads = _uniform(m("attention.head_count"), f"{arch}.attention.head_count")
    n_kv = _uniform(m("attention.head_count_kv", n_heads), f"{arch}.attention.head_count_kv")
    head_dim = int(m("attention.key_length", hidden // n_heads))
    if int(m("attention.value_length", head_dim)) != head_dim:
        raise UnsupportedError(f"{f.name}: value length differs from key length {head_dim}")
    rot = m("rope.dimension_count", head_dim)
    if int(rot) != head_dim:
        raise UnsupportedError(f"{f.name}: partial rotary embedding ({rot} of {head_dim} dims)")
    theta = float(m("rope.freq_base", 10000.0))
    kind = m("rope.scaling.type", None)
    factor = m("rope.scaling.factor", None)
    if kind is None and m("rope.scale_linear", None) is not None:  # the key older converters wrote
        kind, factor = "linear", m("rope.scale_linear")
    scaling = rope_scaling(kind, factor, m("rope.scaling.original_context_length", None),
                           _tensor_f32(f, _ROPE_FREQS), theta, head_dim)
    tokens = f.reader.fields.get("tokenizer.ggml.tokens")
    vocab = m("vocab_size", len(tokens.data) if tokens is not None else None)
    if vocab is None:
        raise ModelLoadError(f"{f.name}: missing metadata key '{arch}.vocab_size' (and no tokenizer.ggml.tokens)")
    n_layers = int(m("block_count"))
    moe = gguf_moe_config(m, f.tensors, n_layers)
    return ModelConfig(
        arch=_CONFIG_ARCH.get(arch, arch),
        vocab_size=int(vocab),
        hidden=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        ffn=_uniform(m("feed_forward_length", 0 if moe else _REQUIRED), f"{arch}.feed_forward_length"),
        rms_eps=float(m("attention.layer_norm_rms_epsilon")),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_neox=True,  # llama's q/k are un-permuted at load, so every family rotates halves
        max_position=int(m("context_length")),
        tie_embeddings="output.weight" not in f.tensors,
        qkv_bias=arch == "qwen2" or "blk.0.attn_q.bias" in f.tensors,
        qk_norm=arch in ("qwen3", "qwen3moe") or "blk.0.attn_q_norm.weight" in f.tensors,
        moe=moe,
    )


def _weight(t) -> Weight:
    """A GGUF tensor as a Weight of HF shape (GGUF lists dims fastest first; the reader reverses them)."""
    kind = t.tensor_type
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if kind == GGMLQuantizationType.F32:
        return Weight(t.data.reshape(shape), "f32")
    if kind == GGMLQuantizationType.F16:
        return Weight(t.data.reshape(shape), "f16")
    if kind == GGMLQuantizationType.BF16:  # the reader hands out raw bytes; bf16 is carried as uint16
        return Weight(t.data.view(np.uint16).reshape(shape), "bf16")
    if kind == GGMLQuantizationType.Q8_0:
        k = shape[-1]
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        # ggml block: f16 scale then 32 int8 values; ours are two arrays, so this one copies.
        blocks = t.data.reshape(rows, k // QK8_0, 2 + QK8_0)
        scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).reshape(rows, k // QK8_0)
        values = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(rows, k)
        w = Weight(values, "q8_0", scales)
        if len(shape) == 3:  # stacked experts stay as stored, [E, N, K] values and [E, N, K // 32] scales
            return Weight(values.reshape(shape), "q8_0", scales.reshape(*shape[:-1], -1))
        return w if len(shape) == 2 else Weight(w.to_f32().reshape(shape), "f32")
    if kind in _RAW_BLOCKS:  # one row of raw blocks per output row, still memory-mapped
        w = Weight(t.data.reshape(*shape[:-1], -1), _RAW_BLOCKS[kind])  # stacked experts: [E, N, bytes]
        return w if len(shape) in (2, 3) else Weight(w.to_f32().reshape(shape), "f32")
    raise UnsupportedError(
        f"tensor {t.name}: unsupported tensor type {kind.name} (supported: {', '.join(SUPPORTED_TYPES)})")


def _unpermute(w: Weight, n_head: int) -> Weight:
    """Undo convert_hf_to_gguf's q/k row permutation (made for ggml's interleaved rotation), so
    the rows are HF's again and the halves rotation applies; the values are only moved."""

    def back(a: np.ndarray) -> np.ndarray:
        half = a.shape[0] // n_head // 2
        return a.reshape(n_head, half, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

    return Weight(back(w.data), w.dtype, None if w.scales is None else back(w.scales))


def read_weights(f: GGUFFile, config: ModelConfig) -> dict[str, Weight]:
    if config.arch in ("qwen3_5", "qwen3_5_moe"):
        from engine.loader.gguf_hybrid import read_weights as hybrid_weights

        return hybrid_weights(f, config, _weight)  # loader/__init__ checks them against the config
    weights: dict[str, Weight] = {}
    for name, t in f.tensors.items():
        if name == _ROPE_FREQS:
            continue
        hf = hf_name(name)
        if hf is not None:
            weights[hf] = _weight(t)
            continue
        blk = _BLK.fullmatch(name)
        moe = gguf_moe_tensor(blk.group(1), blk.group(2), _weight(t)) if blk else None
        if moe is None:
            raise UnsupportedError(f"{f.name}: tensor {name} is not part of the {config.arch} architecture")
        weights |= moe
    for hf, shape in expected_shapes(config).items():
        w = weights.get(hf)
        if w is None:
            raise ModelLoadError(f"{f.name}: missing tensor {gguf_name(hf)}")
        if w.shape != shape:
            raise ModelLoadError(f"{f.name}: tensor {gguf_name(hf)} has shape {w.shape}, the metadata implies {shape}")
    if config.arch == "llama":
        for i in range(config.n_layers):
            for proj, heads in (("q_proj", config.n_heads), ("k_proj", config.n_kv_heads)):
                for part in ("weight", "bias"):
                    key = f"model.layers.{i}.self_attn.{proj}.{part}"
                    if key in weights:
                        weights[key] = _unpermute(weights[key], heads)
    return weights


def read_gguf_tokenizer(path: str | Path, chat_template: str | None = None) -> TextTokenizer:
    """The tokenizer alone (also for vocabulary-only GGUF files)."""
    f = GGUFFile(Path(path))
    return _tokenizer(f, chat_template)


def _tokenizer(f: GGUFFile, chat_template: str | None) -> TextTokenizer:
    try:
        return build_tokenizer(f.meta, chat_template)
    except ModelLoadError as e:
        if str(e).startswith(f.name):
            raise
        raise type(e)(f"{f.name}: {e}") from e


def read_gguf(path: str | Path, chat_template: str | None = None) -> tuple[ModelConfig, dict[str, Weight], TextTokenizer]:
    f = GGUFFile(Path(path))
    config = read_config(f)
    weights = read_weights(f, config)
    return config, weights, _tokenizer(f, chat_template)
