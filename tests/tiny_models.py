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
