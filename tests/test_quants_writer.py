"""Our quantiser writes blocks gguf-py reads as we do, with a bounded error against the f32 source.

Bounds (per value x, its sub-block's ideal step s = range / levels, the super-block grid steps d, dmin
as stored): Q8_0 |err| <= d/2, Q4_0 <= |d|, Q6_K <= (s + d)/2, Q4_K/Q5_K <= max((s + d)/2, dmin); a
writer rounds stored steps up to f16, so d and dmin here get that rounding's worst case.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from lockstep_kernels.quants import BLOCK_TYPES, dequantize
from lockstep_kernels.quants.writer import QUANTIZERS, quantize


def _source(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((32, 1024)).astype(np.float32)
    x[1] *= 1e-4  # small weights
    x[2] *= 300.0  # large ones
    x[3, :256] = 0.0  # an all-zero super-block
    x[4, :32] = 2.5  # a constant block
    x[5] = np.abs(x[5])  # no negative values (minimum clamps to 0)
    x[6, 7] = 40.0  # one outlier
    return x


def _up(d: np.ndarray) -> np.ndarray:
    return d * (1 + 2.0**-10) + 2.0**-24  # an upper bound of d rounded up to f16


def _bound(x: np.ndarray, name: str) -> np.ndarray:
    n = x.shape[0]
    if name == "q8_0":
        return np.repeat(_up(np.abs(x.reshape(n, -1, 32)).max(axis=2) / 127) / 2, 32, axis=1)
    if name == "q4_0":
        return np.repeat(_up(np.abs(x.reshape(n, -1, 32)).max(axis=2) / 8), 32, axis=1)
    if name == "q6_k":
        s = np.abs(x.reshape(n, -1, 16, 16)).max(axis=3) / 31
        return np.repeat(((s + _up(s.max(axis=2, keepdims=True) / 127)) / 2).reshape(n, -1), 16, axis=1)
    levels = 15 if name == "q4_k" else 31
    sub = x.reshape(n, -1, 8, 32)
    low = np.minimum(sub.min(axis=3), 0)
    s = (sub.max(axis=3) - low) / levels
    d, dmin = _up(s.max(axis=2, keepdims=True) / 63), _up((-low).max(axis=2, keepdims=True) / 63)
    return np.repeat(np.maximum((s + d) / 2, dmin).reshape(n, -1), 32, axis=1)


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_round_trip_through_gguf(name):
    x = _source(seed=len(name))
    raw = quantize(x, name)
    kind = BLOCK_TYPES[name]
    assert raw.dtype == np.uint8 and raw.shape == (32, 1024 // kind.block_size * kind.type_size)
    ours = dequantize(raw, name)
    ref = gguf_dequantize(raw, GGMLQuantizationType[name.upper()])
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
    err = np.abs(ours - x)
    bound = _bound(x, name) * (1 + 1e-6)  # float32 arithmetic of the decoder
    assert (err <= bound).all(), f"{name}: worst excess {np.max(err - bound)} at {np.unravel_index(np.argmax(err - bound), err.shape)}"
    assert np.all(ours[3, :256] == 0)
    rel = np.sqrt(np.mean((ours[7:] - x[7:]) ** 2) / np.mean(x[7:] ** 2))
    assert rel < {"q8_0": 0.01, "q6_k": 0.03, "q5_k": 0.05, "q4_k": 0.1, "q4_0": 0.1}[name]


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="divisible by 256"):
        quantize(np.zeros((2, 100), np.float32), "q4_k")
    with pytest.raises(ValueError, match="no quantiser for 'iq4_xs'"):
        quantize(np.zeros((2, 256), np.float32), "iq4_xs")
