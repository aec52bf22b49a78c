"""Our block dequantisers equal gguf.quants.dequantize bit for bit, for every loadable block type."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from lockstep_kernels.quants import BLOCK_TYPES, dequantize

# byte offsets of each type's f16 scale fields within a block (MXFP4 has an e8m0 byte instead)
F16_FIELDS = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,), "q2_k": (80, 82),
              "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "iq4_nl": (0,), "iq4_xs": (0,),
              "mxfp4": ()}


def _finite_f16(rng, n: int) -> np.ndarray:
    """Scales across the whole finite f16 range: normal, subnormal, zero, the extremes, both signs."""
    bits = rng.integers(0, 0x7C00, n, dtype=np.uint16)  # below the inf/nan exponent
    sub = rng.random(n) < 0.15
    bits[sub] = rng.integers(0, 0x400, int(sub.sum()), dtype=np.uint16)  # subnormals
    bits[rng.random(n) < 0.05] = 0x7BFF  # 65504
    bits[rng.random(n) < 0.05] = 0x0001  # the smallest subnormal
    bits[rng.random(n) < 0.05] = 0
    bits |= (rng.random(n) < 0.5).astype(np.uint16) << 15
    return bits


def _blocks(name: str, n: int, seed: int) -> np.ndarray:
    kind = BLOCK_TYPES[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, kind.type_size), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        raw[:, at : at + 2] = _finite_f16(rng, n).view(np.uint8).reshape(n, 2)
    raw[: n // 8] = 0  # all-zero blocks
    if name == "q8_0":
        raw[n // 8 : n // 4, 2:] = 0x80  # -128 quants
    return raw


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype == np.float32 and np.array_equal(a.view(np.uint32),
                                                                                      b.view(np.uint32))


@pytest.mark.parametrize("name", sorted(BLOCK_TYPES))
def test_dequantize_equals_gguf_bit_for_bit(name):
    kind = BLOCK_TYPES[name]
    raw = _blocks(name, 4096, seed=len(name) * 7 + kind.type_size)
    with np.errstate(all="ignore"):  # MXFP4's largest exponents overflow to inf, in both
        ours = dequantize(raw.reshape(64, -1), name)
        ref = gguf_dequantize(raw.reshape(64, -1), GGMLQuantizationType[name.upper()])
    assert ours.shape == (64, 64 * kind.block_size)
    assert _same(ours, ref)
    assert np.all(ours[: 64 // 8] == 0)  # all-zero blocks dequantise to (signed) zeros, no offsets
    if F16_FIELDS[name]:
        assert np.isfinite(ours).all()


@pytest.mark.parametrize("name", sorted(BLOCK_TYPES))
def test_rows_are_independent(name):
    """A row slice dequantises to the same bits as the row inside the whole tensor (the CPU matmul
    and embedding dequantise tiles and looked-up rows)."""
    kind = BLOCK_TYPES[name]
    raw = _blocks(name, 8 * 2 * 256 // kind.block_size, seed=3).reshape(8, -1)
    with np.errstate(all="ignore"):
        whole = dequantize(raw, name)
        assert _same(dequantize(raw[[5, 2]], name), whole[[5, 2]])


def test_partial_block_row_is_refused():
    with pytest.raises(ValueError, match="whole 144-byte blocks"):
        dequantize(np.zeros((2, 150), np.uint8), "q4_k")
