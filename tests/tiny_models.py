"""Tiny random models for tests: a byte-level BPE tokenizer trained here and transformers models."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. Hello world, this is Lockstep.",
    "for i in range(10):\n    print(i * i)  # squares\n",
    "Exact concurrency gives byte-identical output: größe, café, naïve, 東京, 🙂.",
    "import numpy as np\nx = np.arange(16).reshape(4, 4)\nprint(x.sum(axis=0))\n",
]


def train_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer (gpt2 style) with <s>, </s> and ChatML markers as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def save_tokenizer(tok, where: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(where))


def strip_eos(model_dir: Path) -> Path:
    """No end-of-generation token: random weights would otherwise end some completions early at random."""
    import json

    cfg_path = Path(model_dir) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eos_token"] = None
    cfg_path.write_text(json.dumps(cfg))
    (Path(model_dir) / "generation_config.json").unlink(missing_ok=True)
    return Path(model_dir)


ARCHS = ("llama", "llama3", "qwen2", "qwen3", "mistral")


def make_config(arch: str, vocab: int, *, tie: bool = False, kv_ratio: int = 2, hidden: int = 64,
                layers: int = 2, heads: int = 4, head_dim: int = 32, max_pos: int = 8192):
    import transformers as tf

    kv_heads = heads // kv_ratio
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                  tie_word_embeddings=tie, bos_token_id=0, eos_token_id=1, rms_norm_eps=1e-5)
    if arch == "llama":
        return tf.LlamaConfig(head_dim=head_dim, **common), tf.LlamaForCausalLM
    if arch == "llama3":
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}
        return tf.LlamaConfig(head_dim=head_dim, rope_scaling=scaling, rope_theta=500000.0, **common), \
            tf.LlamaForCausalLM
    if arch == "mistral":
        return tf.MistralConfig(head_dim=head_dim, sliding_window=None, **common), tf.MistralForCausalLM
    if arch == "qwen2":
        return tf.Qwen2Config(**{**common, "hidden_size": heads * head_dim}), tf.Qwen2ForCausalLM
    if arch == "qwen3":
        return tf.Qwen3Config(head_dim=head_dim, **common), tf.Qwen3ForCausalLM
    raise ValueError(arch)


def make_hf_model(where: Path, arch: str = "llama", *, tie: bool = False, kv_ratio: int = 2, seed: int = 0,
                  dtype: str = "float32", **shape) -> Path:
    """Saves a random model and the test tokenizer to where/<arch>-...; returns the directory."""
    import torch

    tok = train_tokenizer()
    cfg, cls = make_config(arch, tok.get_vocab_size(), tie=tie, kv_ratio=kv_ratio, **shape)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # random weights a bit larger than init, so logits spread and ties are rare
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(2.0)
    out = Path(where) / f"{arch}-tie{int(tie)}-kv{kv_ratio}-s{seed}-{dtype}"
    model.to(getattr(torch, dtype)).save_pretrained(str(out))
    save_tokenizer(tok, out)
    return out


# --- GGUF, written the way llama.cpp's convert_hf_to_gguf.py writes it

GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",  # config.json model_type
             "qwen3_moe": "qwen3moe"}
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def to_gguf_name(hf: str) -> str:
    from engine.loader.gguf import gguf_name

    return gguf_name(hf)


def llama_permute(w, n_head: int):
    """convert_hf_to_gguf's LlamaModel.permute: q/k rows reordered for ggml's interleaved rotation."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(rope: dict, head_dim: int):
    """convert_hf_to_gguf's `rope_freqs` tensor for llama3 scaling, in float32 as it computes it."""
    import math

    import torch

    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def gpt2_vocab_kv(tok, pre: str, bos: str | None = None, eos: str | None = None, *, add_bos: bool | None = None,
                  chat_template: str | None = None, ids: dict[str, int] | None = None) -> dict:
    """`tokenizer.*` metadata of a byte-level BPE `tokenizers.Tokenizer`, as _set_vocab_gpt2 writes it:
    special added tokens are CONTROL, other added tokens USER_DEFINED, id holes [PADn] UNUSED.
    `ids` adds more `tokenizer.ggml.<key>` ids (eot_token_id, ...)."""
    import json

    added = {a.content: a for a in tok.get_added_tokens_decoder().values()}
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(max(by_id) + 1):
        t = by_id.get(i)
        tokens.append(t if t is not None else f"[PAD{i}]")
        types.append(TOKEN_UNUSED if t is None else TOKEN_NORMAL if t not in added
                     else TOKEN_CONTROL if added[t].special else TOKEN_USER_DEFINED)
    merges = json.loads(tok.to_str())["model"]["merges"]
    kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types,
          "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m) for m in merges]}
    for key, text in (("bos_token_id", bos), ("eos_token_id", eos)):
        if text is not None:
            kv[f"tokenizer.ggml.{key}"] = vocab[text]
    kv |= {f"tokenizer.ggml.{k}": v for k, v in (ids or {}).items()}
    if add_bos is not None:
        kv["tokenizer.ggml.add_bos_token"] = add_bos
    if chat_template is not None:
        kv["tokenizer.chat_template"] = chat_template
    return kv


def write_gguf_file(path: Path, arch: str, kv: dict, tensors=(), drop_keys=()) -> Path:
    """A GGUF file from metadata and (name, array, raw ggml type or None) tensors. Scalars are typed as
    the converter's add_* calls type them (ints uint32, floats float32), arrays by their first item."""
    from gguf import GGUFValueType, GGUFWriter

    w = GGUFWriter(str(path), arch)
    for key, value in kv.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            sub = GGUFValueType.STRING if value and isinstance(value[0], str) else None
            w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=sub)
    for key in drop_keys:
        w.kv_data[0].pop(key)
    for name, data, raw in tensors:
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_gguf(hf_dir: Path, path: Path, dtype: str = "f32", *, pre: str = "default", arch: str | None = None,
               drop_keys=(), drop_tensors=(), tensor_types: dict | None = None, extra_kv: dict | None = None,
               tensor_map=None) -> Path:
    """The model saved in `hf_dir` as GGUF with 2-D tensors in `dtype` (f32, f16, bf16, q8_0, a block type
    our writer has (q4_0, q4_k, q5_k, q6_k), or "q4_k_m": llama-quantize's mix; 1-D tensors stay F32).

    `pre` is the tokenizer.ggml.pre to state (the lead's tiny tokenizer splits as GPT-2: "default").
    For bad-input tests: `arch` overrides general.architecture, `drop_keys`/`drop_tensors` leave
    things out, `tensor_types` forces a ggml type per GGUF tensor name. Other architectures add their
    metadata in `extra_kv` and name (and stack) their tensors with `tensor_map`: HF tensors -> (GGUF name, array).
    """
    import json

    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import LlamaFileType
    from gguf.quants import quantize
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    hf_dir = Path(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    tcfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    template = tcfg.get("chat_template")
    if template is None and (hf_dir / "chat_template.jinja").is_file():
        template = (hf_dir / "chat_template.jinja").read_text()
    family = GGUF_ARCH[cfg["model_type"]]
    arch = arch or family
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kv = {
        f"{arch}.context_length": cfg["max_position_embeddings"],
        f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.block_count": cfg["num_hidden_layers"],
        f"{arch}.feed_forward_length": cfg["intermediate_size"],
        f"{arch}.rope.dimension_count": head_dim,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_kv,
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        f"{arch}.rope.freq_base": float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.vocab_size": cfg["vocab_size"],
        "general.name": hf_dir.name,
    }
    if rope.get("rope_type") == "linear":
        kv[f"{arch}.rope.scaling.type"] = "linear"
        kv[f"{arch}.rope.scaling.factor"] = float(rope["factor"])
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    kv |= gpt2_vocab_kv(tok, pre, tcfg.get("bos_token"), tcfg.get("eos_token"), add_bos=family == "llama",
                        chat_template=template)

    from lockstep_kernels.quants.mixes import q4_k_m_type
    from lockstep_kernels.quants.writer import QUANTIZERS
    from lockstep_kernels.quants.writer import quantize as quantize_ours

    default = None if dtype == "q4_k_m" else Q[dtype.upper()]
    if dtype == "q4_k_m":
        kv["general.file_type"] = int(LlamaFileType.MOSTLY_Q4_K_M)  # as llama-quantize states it
    tied = "lm_head.weight" not in load_file(str(hf_dir / "model.safetensors"))
    tensors = []
    if rope.get("rope_type") == "llama3":
        tensors.append(("rope_freqs.weight", llama3_rope_factors(rope, head_dim), None))
    kv |= {f"{arch}.{k}": v for k, v in (extra_kv or {}).items()}
    hf_tensors = load_file(str(hf_dir / "model.safetensors"))
    named = tensor_map(hf_tensors) if tensor_map else [(to_gguf_name(hf), d) for hf, d in hf_tensors.items()]
    for name, data in named:
        if name in drop_tensors:
            continue
        data = data.astype(np.float32)
        if family == "llama" and (".attn_q." in name or ".attn_k." in name):
            data = llama_permute(data, n_head if ".attn_q." in name else n_kv)
        kind = (tensor_types or {}).get(name, default if data.ndim >= 2 else Q.F32)
        if kind is None:
            kind = Q[q4_k_m_type(name, cfg["num_hidden_layers"], data.shape[-1], tied).upper()]
        if kind.name.endswith("_K") and kind.name.lower() in QUANTIZERS:  # gguf-py cannot write K-quants
            tensors.append((name, quantize_ours(data, kind.name.lower()), kind))
        elif kind == Q.F32:
            tensors.append((name, data, None))
        elif kind == Q.F16:
            tensors.append((name, data.astype(np.float16), None))
        else:
            tensors.append((name, quantize(data, kind), kind))
    return write_gguf_file(path, arch, kv, tensors, drop_keys)


def make_q4_k_m_gguf(where: Path, arch: str = "llama", **kw) -> tuple[Path, Path]:
    """A tiny model as a Q4_K_M-like GGUF (row lengths whole 256-value super-blocks) and, beside it,
    the F32 GGUF of exactly its dequantised weights: (quantized, f32 reference)."""
    shape = dict(hidden=256, heads=4, head_dim=64, layers=2) | kw
    hf = make_hf_model(where, arch, **shape)
    quantized = write_gguf(hf, Path(where) / f"{hf.name}-q4_k_m.gguf", "q4_k_m")
    return quantized, write_dequantized_gguf(quantized, Path(where) / f"{hf.name}-q4_k_m-f32.gguf")


def write_dequantized_gguf(src: Path, dst: Path) -> Path:
    """`src` with every tensor dequantised by gguf-py to F32 (the same metadata)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(src))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    w = _copy_metadata(reader, dst, arch)
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type) if t.tensor_type != GGMLQuantizationType.F32 else t.data
        w.add_tensor(t.name, np.ascontiguousarray(values, dtype=np.float32).reshape(tuple(reversed(t.shape.tolist()))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def _copy_metadata(reader, dst: Path, arch: str):
    from gguf import GGUFValueType, GGUFWriter

    w = GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.STRING:
                value = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                value = [field.parts[i].tolist()[0] for i in field.data]
            w.add_key_value(key, value, kind, sub_type=sub)
        elif kind == GGUFValueType.STRING:
            w.add_key_value(key, bytes(field.parts[-1]).decode("utf-8"), kind)
        else:
            w.add_key_value(key, field.parts[-1].tolist()[0], kind)
    return w
