"""Q4_K / Q5_K / Q6_K planes for the CUDA kernels (lockstep_kernels/cuda/kquant.py), checked on the CPU: read
back as common.cuh's kq_value (kquant_mm.cu's kqi_value for Q5_K) reads them, every value equals
gguf's dequantisation bit for bit."""

import numpy as np
import pytest

from lockstep_kernels.cuda.kquant import pack, packed_bytes
from lockstep_kernels.cuda.weights import device_bytes
from lockstep_kernels.quants import dequantize
from lockstep_kernels.quants.writer import quantize
from lockstep_kernels.weights import Weight


def _u32(a: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Little-endian uint32 at byte offsets `at` of a uint8 array."""
    return a[at].astype(np.uint32) | a[at + 1].astype(np.uint32) << 8 | a[at + 2].astype(np.uint32) << 16 \
        | a[at + 3].astype(np.uint32) << 24


def _f16(bits: np.ndarray) -> np.ndarray:
    return (bits & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)


def read_back(nib: np.ndarray, aux: np.ndarray, n: int, k: int, dtype: str) -> np.ndarray:
    """kq_value (common.cuh; Q5_K: kquant_mm.cu's kqi_value) for every (n, k), in NumPy."""
    q6, top_plane = dtype == "q6_k", dtype != "q4_k"
    tiles, c_n = -(-n // 16), k // 32
    rows, ks = np.meshgrid(np.arange(n), np.arange(k), indexing="ij")
    tile, r = rows >> 4, rows & 15
    g, half = r & 7, r >> 3
    c, t, i = ks >> 5, (ks >> 3) & 3, ks & 7
    lane = (tile * c_n + c) * 32 + 4 * g + t
    q = (_u32(nib, lane * 8 + 4 * half) >> (16 * (i & 1) + 4 * (i >> 1)).astype(np.uint32)) & 0xF
    sc_at = (tiles * c_n * 128) if top_plane else 0
    d_at = sc_at + tiles * c_n * 32
    s = _u32(aux, sc_at + ((tile * c_n + c) * 8 + g) * 4) >> (16 * half).astype(np.uint32)
    sb = tile * (c_n // 8) + (c >> 3)
    if top_plane:
        top = _u32(aux, lane * 4) >> (8 * half + 16 * (i & 1) + 2 * (i >> 1)).astype(np.uint32)
        q = q | (top & 3) << 4
    if q6:
        d = _f16(_u32(aux, d_at + (sb * 8 + g) * 4) >> (16 * half).astype(np.uint32))
        scale = np.where(t < 2, s & 0xFF, (s >> 8) & 0xFF).astype(np.uint8).view(np.int8).astype(np.float32)
        return (d * scale) * (q.astype(np.float32) - np.float32(32))
    dd = np.where(half == 1, _u32(aux, d_at + (sb * 8 + g) * 8 + 4), _u32(aux, d_at + (sb * 8 + g) * 8))
    a = _f16(dd) * (s & 0xFF).astype(np.float32)
    b = _f16(dd >> 16) * ((s >> 8) & 0xFF).astype(np.float32)
    return a * q.astype(np.float32) - b


@pytest.mark.parametrize("dtype", ["q4_k", "q5_k", "q6_k"])
@pytest.mark.parametrize("shape", [(16, 256), (37, 512), (5, 1024)], ids=str)
def test_planes_read_back_as_gguf_dequantises(dtype, shape, monkeypatch):
    from lockstep_kernels.cuda import plan

    monkeypatch.setattr(plan, "KQ_INTEGER", True)  # Q5_K's planes: the integer kernels' only
    n, k = shape
    rng = np.random.default_rng(n * k)
    x = (rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 40.0], (n, 1))).astype(np.float32)
    raw = quantize(x, dtype)
    nib, aux = pack(raw, dtype)
    assert nib.nbytes + aux.nbytes == packed_bytes(n, k, dtype) == device_bytes(Weight(raw, dtype))
    got = read_back(nib, aux, n, k, dtype)
    assert got.tobytes() == dequantize(raw, dtype).tobytes()
    # the planes cost about the blocks' own bytes (Q4_K 4.5 bits a value, Q6_K 6.56); Q5_K's fifth bit
    # takes a 2-bit field of Q6_K's top plane (6.63 bits against 5.5)
    blocks = 4096 * (4096 // 256) * (raw.nbytes // (n * k // 256))
    assert blocks <= packed_bytes(4096, 4096, dtype) <= (1.21 if dtype == "q5_k" else 1.03) * blocks
