"""A token's own bytes. Its decoded text is not enough: a token inside a multi-byte character decodes
to U+FFFD, while clients (OpenAI `bytes`, llama-server pieces) want the real bytes."""

from __future__ import annotations

import re
from functools import lru_cache

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece byte fallback


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: the alphabet byte-level BPE vocabularies are written in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def token_bytes(tokenizer, token_id: int) -> bytes:
    piece = tokenizer.piece(token_id)
    if "\ufffd" not in piece:
        return piece.encode("utf-8")
    raw = tokenizer.tok.id_to_token(token_id) or ""
    m = _BYTE_TOKEN.match(raw)
    if m:
        return bytes([int(m.group(1), 16)])
    table = _byte_level_decoder()
    if raw and all(ch in table for ch in raw):
        return bytes(table[ch] for ch in raw)
    return piece.encode("utf-8")


def piece_json(tokenizer, token_id: int) -> str | list[int]:
    """llama-server's /tokenize piece: the text when it is whole UTF-8, else the byte values."""
    data = token_bytes(tokenizer, token_id)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)
