"""GGUF vocabularies (llama.cpp's `tokenizer.ggml.*` keys) turned into a `tokenizers` tokenizer.

The goal is llama.cpp's token ids for the same text: a GGUF's vocabulary means what llama.cpp does
with it, not what the original tokenizer.json did (which the file no longer carries).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from engine.chat_template import ChatTemplate
from engine.errors import ModelLoadError, UnsupportedError
from engine.tokenizer import TextTokenizer

# llama.cpp's token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the split its merges were learned on; anything else gets GPT-2's.
_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "megrez": _QWEN2_SPLIT,
}
# llama.cpp looks a whole pre-split word up before merging for these (Llama 3's tokenizer.json
# says `ignore_merges`); a word in the vocabulary can otherwise merge into other pieces.
_IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "falcon3"}
# Control tokens llama.cpp also ends generation on, whatever the eos id says.
_EOG_TEXTS = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>"}

Meta = Callable[..., Any]  # meta(key) -> value, raising ModelLoadError when absent; meta(key, default)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level vocabularies are spelled in it)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _vocab(tokens: list[str], spell: Callable[[int, str], str]) -> dict[str, int]:
    """Text -> id. As in llama.cpp, an empty token gets a placeholder name and a repeated one maps
    to its last id; the earlier id keeps a placeholder so every id still exists."""
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        key = spell(i, t) if t else f"[EMPTY_{i}]"
        if key in vocab:
            vocab[f"[DUPLICATE_{vocab[key]}]"] = vocab[key]
        vocab[key] = i
    return vocab


def _byte_level(tokens: list[str], types: list[int], merges: list[str], pre: str) -> Tokenizer:
    b2u = bytes_to_unicode()
    alphabet = set(b2u.values())

    def spell(i: int, t: str) -> str:
        # Added tokens are stored as raw text and matched whole in raw text; a normal token outside
        # the byte alphabet is a mislabelled raw string, re-spelled so BPE can reach it.
        if types[i] in (CONTROL, USER_DEFINED, UNKNOWN) or set(t) <= alphabet:
            return t
        return "".join(b2u[b] for b in t.encode("utf-8"))

    vocab = _vocab(tokens, spell)
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep:
            raise ModelLoadError(f"tokenizer.ggml.merges: malformed merge {m!r}")
        # BPE refuses merges that build tokens it does not know; llama.cpp just never matches them.
        if left in vocab and right in vocab and left + right in vocab:
            pairs.append((left, right))
    tok = Tokenizer(models.BPE(vocab, pairs, ignore_merges=pre in _IGNORE_MERGES))
    split = _SPLITS.get(pre)
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    return tok


def _merges_from_scores(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges the adjacent pair whose joined piece scores highest (llama.cpp's
    SPM tokenizer does the same). As BPE merges: every split of a piece into two known pieces, ranked
    by the joined piece's score."""
    mergeable = {t: i for i, t in enumerate(tokens) if types[i] not in (CONTROL, UNKNOWN, BYTE)}
    ranked = []
    for t, i in mergeable.items():
        for k in range(1, len(t)):
            left, right = t[:k], t[k:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[i], i, k, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece(tokens: list[str], types: list[int], scores: list[float] | None, merges: list[str] | None,
                   unk_id: int | None, add_space_prefix: bool) -> Tokenizer:
    vocab = _vocab(tokens, lambda i, t: t)
    if merges is not None:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    elif scores is not None:
        pairs = _merges_from_scores(tokens, types, scores)
    else:
        raise ModelLoadError("SentencePiece vocabulary has neither tokenizer.ggml.scores nor tokenizer.ggml.merges")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tok = Tokenizer(models.BPE(vocab, pairs, unk_token=unk, fuse_unk=True, byte_fallback=True))
    # As llama.cpp: a space before the text and after every special token, spaces become ▁, and the
    # pieces may span words (no whitespace pre-split).
    space = [normalizers.Prepend("▁")] if add_space_prefix else []
    tok.normalizer = normalizers.Sequence([*space, normalizers.Replace(" ", "▁")])
    strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    return tok


def _token_id(meta: Meta, key: str, n: int) -> int | None:
    v = meta(key, None)
    if v is None:
        return None
    v = int(v)
    if not 0 <= v < n:
        raise ModelLoadError(f"{key} = {v} is outside the vocabulary (size {n})")
    return v


def _model(meta: Meta, kind: str, tokens: list[str], types: list[int]) -> tuple[Tokenizer, bool]:
    """The tokenizer for `tokenizer.ggml.model`, and whether that model adds BOS by default."""
    n = len(tokens)
    if kind == "gpt2":
        pre = str(meta("tokenizer.ggml.pre", "default"))
        return _byte_level(tokens, types, meta("tokenizer.ggml.merges"), pre), False
    if kind == "llama":
        scores = meta("tokenizer.ggml.scores", None)
        if scores is not None and len(scores) != n:
            raise ModelLoadError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
        tok = _sentencepiece(tokens, types, None if scores is None else [float(s) for s in scores],
                             meta("tokenizer.ggml.merges", None),
                             _token_id(meta, "tokenizer.ggml.unknown_token_id", n),
                             bool(meta("tokenizer.ggml.add_space_prefix", True)))
        return tok, True
    raise UnsupportedError(f"unsupported tokenizer model {kind!r} (supported: gpt2, llama)")


def _add_special(tok: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """Control and user-defined tokens are matched whole in raw text, as llama.cpp does. Their text
    is already in the model's vocabulary, so they keep the file's ids."""
    special = [AddedToken(t, special=True, normalized=False)
               for i, t in enumerate(tokens) if types[i] in (CONTROL, UNKNOWN)]
    user = [AddedToken(t, special=False, normalized=False) for i, t in enumerate(tokens) if types[i] == USER_DEFINED]
    tok.add_special_tokens(special)
    tok.add_tokens(user)


def build_tokenizer(meta: Meta, template_override: str | None = None) -> TextTokenizer:
    kind = meta("tokenizer.ggml.model")
    tokens: list[str] = meta("tokenizer.ggml.tokens")
    n = len(tokens)
    types = [int(t) for t in meta("tokenizer.ggml.token_type", [NORMAL] * n)]
    if len(types) != n:
        raise ModelLoadError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    try:
        tok, default_bos = _model(meta, kind, tokens, types)
        _add_special(tok, tokens, types)
    except ModelLoadError:
        raise
    except Exception as e:  # tokenizers reports what it cannot build as a bare Exception
        raise ModelLoadError(f"cannot build a tokenizer from the GGUF vocabulary ({e})") from e
    got = tok.get_vocab_size(with_added_tokens=True)
    if got != n:
        raise ModelLoadError(f"GGUF vocabulary of {n} tokens became {got} in conversion (duplicate tokens?)")

    bos_id = _token_id(meta, "tokenizer.ggml.bos_token_id", n)
    eos_id = _token_id(meta, "tokenizer.ggml.eos_token_id", n)
    eos_ids = {i for k in ("eos", "eot", "eom") if (i := _token_id(meta, f"tokenizer.ggml.{k}_token_id", n)) is not None}
    extra = {i for i, t in enumerate(tokens) if types[i] == CONTROL and t in _EOG_TEXTS} - eos_ids
    bos_text = tokens[bos_id] if bos_id is not None else ""
    eos_text = tokens[eos_id] if eos_id is not None else ""
    template = template_override or meta("tokenizer.chat_template", None)
    add_bos = bool(meta("tokenizer.ggml.add_bos_token", default_bos))
    return TextTokenizer(tok, bos_id, eos_ids, add_bos, ChatTemplate(template, bos_text, eos_text),
                         bos_text, eos_text, extra)
