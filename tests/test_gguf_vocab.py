"""GGUF vocabularies converted to `tokenizers`: the same ids as the source tokenizer (byte-level BPE)
or as llama.cpp's SentencePiece algorithm (llama vocab); BOS/EOS/EOT and add-BOS as the file says."""

import random

import pytest
from tokenizers import (
    AddedToken,
    Regex,
    SentencePieceBPETokenizer,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    trainers,
)

from engine.errors import ModelLoadError, UnsupportedError
from engine.loader.gguf import read_gguf_tokenizer
from tests.tiny_models import (
    CORPUS,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    gpt2_vocab_kv,
    train_tokenizer,
    write_gguf_file,
)

SPLITS = {
    "llama-bpe": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}
SPECIALS = ["<|begin_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot_id|>"]
_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "the", "ing", "er", "an", "st", "ion"]

TEXTS = [
    "Hello world, this is Lockstep.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "  leading spaces,   runs   of spaces and trailing  ",
    "tabs\tand\r\nwindows newlines\n\n\nthree",
    "größe café naïve 東京 🙂 Привет",
    "numbers 1234567 and 3.14159, x=42; y+=1",
    "it's they're we'LL I'M don't",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<think>reasoning</think> done",
    "",
]


def _corpus(seed=0, n=300):
    rng = random.Random(seed)
    lines = [" ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
                      for _ in range(rng.randint(3, 10))) for _ in range(n)]
    return lines + CORPUS * 10


def _byte_level(pre):
    """A Llama 3 / Qwen2 style byte-level BPE (their split regex; Llama 3 also ignores merges for
    whole words in the vocabulary), trained here, with control and user-defined added tokens."""
    tok = Tokenizer(models.BPE(ignore_merges=pre == "llama-bpe"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    return tok


def _write(tmp_path, kv, name="vocab.gguf"):
    return write_gguf_file(tmp_path / name, "llama", kv)


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "default"])
def test_byte_level_vocab_gives_the_source_ids(tmp_path, pre):
    src = train_tokenizer() if pre == "default" else _byte_level(pre)  # the lead's tiny tokenizer splits as GPT-2
    got = read_gguf_tokenizer(_write(tmp_path, gpt2_vocab_kv(src, pre)))
    assert got.vocab_size == src.get_vocab_size(with_added_tokens=True)
    for text in TEXTS + _corpus(seed=5, n=20):
        ids = got.encode(text, add_special=False)
        assert ids == src.encode(text).ids, text
        assert got.decode(ids, skip_special=False) == text


@pytest.mark.parametrize(("pre", "pieces"), [("llama-bpe", ["abc"]), ("qwen2", ["ab", "c"])])
def test_llama3_looks_whole_words_up_before_merging(tmp_path, pre, pieces):
    """"abc" is in the vocabulary but no merge builds it: llama.cpp (and Llama 3's tokenizer.json,
    ignore_merges) take it whole for llama-bpe and merge for other pre-tokenizers."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokens = sorted(alphabet) + ["ab", "bc", "abc"]
    kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": [TOKEN_NORMAL] * len(tokens), "tokenizer.ggml.merges": ["a b", "b c"]}
    got = read_gguf_tokenizer(_write(tmp_path, kv))
    assert got.encode("abc", add_special=False) == [tokens.index(p) for p in pieces]


def test_byte_level_special_tokens_are_whole_and_skipped_when_decoding(tmp_path):
    src = _byte_level("qwen2")
    got = read_gguf_tokenizer(_write(tmp_path, gpt2_vocab_kv(src, "qwen2")))
    im_start, think = src.token_to_id("<|im_start|>"), src.token_to_id("<think>")
    ids = got.encode("<|im_start|>user <think>", add_special=False)
    assert ids[0] == im_start and ids[-1] == think
    assert got.decode(ids) == "user <think>"  # control tokens are special, user-defined ones text


def test_bos_eos_eot_and_add_bos(tmp_path):
    src = _byte_level("llama-bpe")
    bos, eos, eot = (src.token_to_id(t) for t in ("<|begin_of_text|>", "<|im_end|>", "<|eot_id|>"))
    kv = gpt2_vocab_kv(src, "llama-bpe", "<|begin_of_text|>", "<|im_end|>", ids={"eot_token_id": eot})

    plain = read_gguf_tokenizer(_write(tmp_path, kv, "plain.gguf"))  # gpt2 vocab: no BOS unless stated
    assert plain.add_bos is False and plain.bos_id == bos
    assert plain.encode("hi") == src.encode("hi").ids
    assert plain.eos_ids == {eos, eot} and plain.is_eog(eot)
    assert plain.is_eog(src.token_to_id("<|endoftext|>"))  # llama.cpp's end-of-generation names
    assert not plain.is_eog(src.token_to_id("<|im_start|>"))
    assert (plain.bos_token, plain.eos_token) == ("<|begin_of_text|>", "<|im_end|>")

    with_bos = read_gguf_tokenizer(_write(tmp_path, kv | {"tokenizer.ggml.add_bos_token": True}, "bos.gguf"))
    assert with_bos.encode("hi") == [bos, *src.encode("hi").ids]
    assert with_bos.encode("<|begin_of_text|>hi") == [bos, *src.encode("hi").ids]  # not twice
    assert with_bos.encode("hi", add_special=False) == src.encode("hi").ids


def test_chat_template_from_the_file_and_override(tmp_path):
    src = _byte_level("qwen2")
    template = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    kv = gpt2_vocab_kv(src, "qwen2", "<|begin_of_text|>", "<|im_end|>", chat_template=template)
    path = _write(tmp_path, kv)
    msgs = [{"role": "user", "content": "hi"}]
    assert read_gguf_tokenizer(path).apply_chat(msgs, add_generation_prompt=False) == "<|begin_of_text|>[user]hi"
    assert read_gguf_tokenizer(path, "{{ messages|length }}").apply_chat(msgs) == "1"


# --- llama (SentencePiece BPE) vocabularies


def _spm_vocab(add_space_prefix=True):
    """A Llama 2 shaped vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces from a SentencePiece
    BPE trained here, scored -rank as SentencePiece scores its BPE pieces."""
    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(_corpus(), vocab_size=350, special_tokens=["<unk>"], show_progress=False)
    trained = sorted(sp.get_vocab().items(), key=lambda kv: kv[1])
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    scores = [0.0] * len(tokens)
    for piece, rank in trained:
        if piece != "<unk>":
            tokens.append(piece)
            types.append(TOKEN_NORMAL)
            scores.append(-float(rank))
    tokens.append("<tool>")  # a user-defined token, matched whole
    types.append(TOKEN_USER_DEFINED)
    scores.append(0.0)
    kv = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
          "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_space_prefix": add_space_prefix}
    return sp, kv


def _spm_reference(text, kv):
    """llama.cpp's llm_tokenizer_spm: a space before the text (and after each special token), spaces
    as ▁, then repeatedly merge the adjacent pair whose joined piece scores highest (leftmost on
    ties); symbols outside the vocabulary become <0xXX> byte tokens."""
    tokens, scores, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.scores"], kv["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (TOKEN_NORMAL, TOKEN_USER_DEFINED)}
    specials = [t for i, t in enumerate(tokens) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    ids = []
    while text:
        hit = min(((text.find(s), s) for s in specials if s in text), default=None)
        head, special = (text, None) if hit is None else (text[: hit[0]], hit[1])
        if head:
            pieces = list(("▁" if kv["tokenizer.ggml.add_space_prefix"] else "") + head.replace(" ", "▁"))
            while True:
                best = max(((scores[vocab[a + b]], -i) for i, (a, b) in enumerate(zip(pieces, pieces[1:], strict=False))
                            if a + b in vocab), default=None)
                if best is None:
                    break
                i = -best[1]
                pieces[i : i + 2] = [pieces[i] + pieces[i + 1]]
            for p in pieces:
                ids.extend([vocab[p]] if p in vocab else [tokens.index(f"<0x{b:02X}>") for b in p.encode()])
        if special is None:
            break
        ids.append(tokens.index(special))
        text = text[hit[0] + len(special):]
    return ids


SPM_TEXTS = [
    "kalo mine theing", "Hello world, this is Lockstep.", "def fibonacci(n): return n",
    "  two leading spaces and  double spaces", "café 東京 🙂 Ω 🚀",  # unseen characters fall back to bytes
    "<s>after a control token", "text <tool> more", "",
]


@pytest.mark.parametrize("space_prefix", [True, False])
def test_sentencepiece_vocab_gives_llama_cpp_ids(tmp_path, space_prefix):
    _, kv = _spm_vocab(space_prefix)
    got = read_gguf_tokenizer(_write(tmp_path, kv))
    assert got.vocab_size == len(kv["tokenizer.ggml.tokens"])
    for text in SPM_TEXTS + _corpus(seed=9, n=30):
        ids = got.encode(text, add_special=False)
        assert ids == _spm_reference(text, kv), text
        if space_prefix and "<" not in text:  # llama.cpp adds a space after a special token
            assert got.decode(ids, skip_special=False) == text


def test_sentencepiece_pieces_match_the_source_tokenizer(tmp_path):
    """On single-spaced text without leading spaces the source (which pre-splits on spaces)
    and llama.cpp's algorithm agree: the same pieces."""
    sp, kv = _spm_vocab()
    got = read_gguf_tokenizer(_write(tmp_path, kv))
    for text in ["kalo mine theing", "Hello world, this is Lockstep."] + _corpus(seed=3, n=30):
        ids = got.encode(text, add_special=False)
        assert [kv["tokenizer.ggml.tokens"][i] for i in ids] == sp.encode(text).tokens, text


def test_sentencepiece_byte_fallback_and_bos(tmp_path):
    _, kv = _spm_vocab()
    tokens = kv["tokenizer.ggml.tokens"]
    got = read_gguf_tokenizer(_write(tmp_path, kv))
    assert got.add_bos is True and got.bos_id == 1 and got.eos_ids == {2}  # llama vocab: BOS by default
    ids = got.encode("🚀")  # not in the training text: UTF-8 bytes
    assert [tokens[i] for i in ids] == ["<s>", "▁", "<0xF0>", "<0x9F>", "<0x9A>", "<0x80>"]
    assert got.decode(ids) == "🚀"
    no_bos = read_gguf_tokenizer(_write(tmp_path, kv | {"tokenizer.ggml.add_bos_token": False}, "nobos.gguf"))
    assert no_bos.encode("🚀") == ids[1:]


# --- bad vocabularies


def test_unsupported_tokenizer_model_is_named(tmp_path):
    _, kv = _spm_vocab()
    with pytest.raises(UnsupportedError, match="unsupported tokenizer model 'bert'"):
        read_gguf_tokenizer(_write(tmp_path, kv | {"tokenizer.ggml.model": "bert"}))


def test_missing_merges_and_bad_ids_are_named(tmp_path):
    kv = gpt2_vocab_kv(_byte_level("qwen2"), "qwen2")
    with pytest.raises(ModelLoadError, match=r"vocab\.gguf: missing metadata key 'tokenizer\.ggml\.merges'"):
        read_gguf_tokenizer(write_gguf_file(tmp_path / "vocab.gguf", "llama", kv, drop_keys=("tokenizer.ggml.merges",)))
    with pytest.raises(ModelLoadError, match=r"tokenizer\.ggml\.eos_token_id = 99999 is outside the vocabulary"):
        read_gguf_tokenizer(_write(tmp_path, kv | {"tokenizer.ggml.eos_token_id": 99999}, "ids.gguf"))
