"""Per-tensor type choices of llama-quantize's mixes, for writing files the way people get them."""

from __future__ import annotations

import re

from lockstep_kernels.quants import BLOCK_TYPES

_LAYER = re.compile(r"blk\.(\d+)\.")


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's rule (llama-quant.cpp) for the layers whose attn_v / ffn_down get more bits: the
    first and last eighth, and every third layer between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def q4_k_m_type(name: str, n_layers: int, row_length: int, tied: bool = False) -> str:
    """The type Q4_K_M gives a 2-D tensor of a llama-family model (GGUF names): Q6_K for the output
    (the token embedding when it is tied) and for attn_v / ffn_down of use_more_bits layers, Q4_K
    elsewhere; a row length that is not whole super-blocks falls back to Q8_0."""
    kind = "q4_k"
    m = _LAYER.match(name)
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        kind = "q6_k"
    elif m and (".attn_v." in name or ".ffn_down." in name) and use_more_bits(int(m.group(1)), n_layers):
        kind = "q6_k"
    if row_length % BLOCK_TYPES[kind].block_size:
        kind = "q8_0"
    return kind
