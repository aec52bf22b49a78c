"""The integer Q4_K / Q6_K arithmetic of kquant_mm.cu, checked on the CPU.

* lockstep_kernels/cuda/kquant_ref.py (the bits the GPU kernels must give) stays close to the float32
  reference: relative L2 under 1e-4 and under the error of activations rounded to f16 (what the
  16-bit kernels feed their MMAs), so the GPU tests' 2e-3 and the model test's 1e-3 hold;
* the kernels' byte layouts: kq_quant_x's activation records and the planes' words, read as the
  one-row kernel reads them (dp4a on lane words) and as the MMA kernel's fragments (m16n8k32
  A/B layouts of the PTX ISA), give the reference's integer chunk sums.
"""

import numpy as np
import pytest

from lockstep_kernels.cuda import kquant_ref
from lockstep_kernels.cuda.kquant import _fields, pack
from lockstep_kernels.quants import dequantize
from lockstep_kernels.quants.writer import quantize

M = 0x0F0F0F0F


def _weight(n, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * rng.choice([1e-2, 1.0, 30.0], (n, 1))).astype(np.float32)
    return quantize(w, dtype)


def _acts(m, k, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, rng.integers(0, k, 4)] *= 50  # outliers, as real activations have
    x[0, :32] = 0  # an all-zero chunk
    return x


@pytest.mark.parametrize("dtype", ["q4_k", "q5_k", "q6_k"])
def test_reference_is_closer_to_float32_than_f16_activations(dtype):
    n, k = 64, 1024
    raw = _weight(n, k, dtype)
    w = dequantize(raw, dtype).astype(np.float64)
    x = _acts(8, k)
    exact = x.astype(np.float64) @ w.T
    got = kquant_ref.matmul(raw, dtype, x, split=4)
    f16 = x.astype(np.float16).astype(np.float64) @ w.T
    err = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert err < 1e-4
    assert err < np.linalg.norm(f16 - exact) / np.linalg.norm(exact)


def test_activation_quantisation_bounds():
    x = _acts(4, 256)
    xq, dx, dxs = kquant_ref.quantize_activations(x)
    assert np.abs(xq).max() == kquant_ref.XMAX
    assert (xq[0, 0] == 0).all() and dx[0, 0] == 0 and dxs[0, 0] == 0
    back = xq * dx[..., None].astype(np.float64)
    assert np.abs(back - x.reshape(back.shape)).max() <= np.abs(x).max() / (2 * kquant_ref.XMAX) * 1.001


def _records(x):
    """kq_quant_x's records as words [M, C, 16] (group j: words 4j .. 4j+3), and xq."""
    xq, _, _ = kquant_ref.quantize_activations(x)
    hi = (xq + 64) >> 7
    assert np.abs(hi).max() <= 127 and (xq - 128 * hi).min() >= -64 and (xq - 128 * hi).max() <= 63
    rec, xs = kquant_ref.records(x)
    assert (xs[..., 2:].view(np.int32) == np.stack([xq[..., :16].sum(-1), xq[..., 16:].sum(-1)], -1)).all()
    return rec.view("<u4"), xq


def _planes(raw, dtype, n, k):
    """The planes as words: nib [T, C, 32 lanes, 2], top [T, C, 32] (Q6_K)."""
    nib, aux = pack(raw, dtype)
    t, c = -(-n // 16), k // 32
    top = aux[: t * c * 128].view("<u4").reshape(t, c, 32) if dtype != "q4_k" else None
    return nib.view("<u4").reshape(t, c, 32, 2), top


def _bytes(w, tb, top):
    """kq_bytes: a plane word (and the top word: Q5_K, Q6_K) as the lo and hi words of signed bytes."""
    lo, hi = w & M, (w >> 4) & M
    if top:
        lo = lo | ((tb << 4) & 0x00300030) | ((tb << 8) & 0x30003000)
        hi = hi | ((tb << 2) & 0x00300030) | ((tb << 6) & 0x30003000)
    return lo, hi


def _s8(words):
    return words[..., None].astype("<u4").view(np.int8).astype(np.int64)


def _dp4a(a, b):
    return (_s8(a) * _s8(b)).sum(axis=-1)


def _ref_sums(raw, dtype, xq):
    q, _, _ = _fields(raw, dtype, np)
    n, k = q.shape
    qc = q.reshape(n, k // 32, 32).astype(np.int64)
    if dtype != "q6_k":
        return np.einsum("nci,mci->mnc", qc, xq)[..., None]
    return np.stack([np.einsum("nci,mci->mnc", qc[..., h * 16:(h + 1) * 16] - 32, xq[..., h * 16:(h + 1) * 16])
                     for h in (0, 1)], axis=-1)


@pytest.mark.parametrize("dtype", ["q4_k", "q5_k", "q6_k"])
def test_one_row_kernel_words_give_the_chunk_sums(dtype):
    """mmq_one: lane (g, t) takes the words of lanes 4g + j (j = 0..3) of a chunk and the chunk's record."""
    n, k, q6, has_top = 32, 512, dtype == "q6_k", dtype != "q4_k"
    raw = _weight(n, k, dtype, seed=3)
    rec, xq = _records(_acts(3, k, seed=4))
    nib, top = _planes(raw, dtype, n, k)
    tiles, c = nib.shape[:2]
    want = _ref_sums(raw, dtype, xq)
    got = np.zeros_like(want)
    for half, row_shift in ((0, 0), (1, 8)):  # rows g, then g + 8
        for j in range(4):
            w = nib[:, :, 4 * np.arange(8) + j, half]  # [T, C, g]
            tb = (top[:, :, 4 * np.arange(8) + j] >> row_shift) if has_top else np.zeros_like(w)
            lo, hi = _bytes(w, tb, has_top)
            x = rec[:, None, None, :, 4 * j:4 * j + 4]  # [M, 1, 1, C, 4]
            lo, hi = lo.transpose(0, 2, 1)[None], hi.transpose(0, 2, 1)[None]  # [1, T, g, C]
            part = 128 * (_dp4a(lo, x[..., 0]) + _dp4a(hi, x[..., 1])) + _dp4a(lo, x[..., 2]) + _dp4a(hi, x[..., 3])
            rows = (np.arange(tiles)[:, None] * 16 + row_shift + np.arange(8)).reshape(-1)
            got[..., j >> 1 if q6 else 0][:, rows] += part.reshape(part.shape[0], -1, c)
    if q6:  # the kernels subtract 32 S_h after the integer sums
        s = np.stack([xq[..., :16].sum(-1), xq[..., 16:].sum(-1)], axis=-1)[:, None]
        got = got - 32 * s
    assert (got == want).all()


@pytest.mark.parametrize("dtype", ["q4_k", "q5_k", "q6_k"])
def test_mma_fragments_give_the_chunk_sums(dtype):
    """mmq_tc: A (16 x 32) and B (32 x 8) as the m16n8k32 s8 fragments place the lanes' registers:
    a0 = A[g][4t..], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]; b0 = B[4t..][g],
    b1 = B[16+4t..][g]. One tile, one chunk, 8 tokens; Q6_K's halves by masking lanes t < 2 / t >= 2."""
    n, k, q6, has_top = 16, 256, dtype == "q6_k", dtype != "q4_k"
    raw = _weight(n, k, dtype, seed=5)
    rec, xq = _records(_acts(8, k, seed=6))
    nib, top = _planes(raw, dtype, n, k)
    want = _ref_sums(raw, dtype, xq)
    for c in (0, 3, 7):
        a = np.zeros((16, 32), np.int64)
        bh, bl = np.zeros((32, 8), np.int64), np.zeros((32, 8), np.int64)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            tb = top[0, c, lane] if has_top else 0
            a0, a2 = _bytes(nib[0, c, lane, 0], tb, has_top)
            a1, a3 = _bytes(nib[0, c, lane, 1], tb >> 8 if has_top else 0, has_top)
            for reg, r, k0 in ((a0, g, 4 * t), (a1, g + 8, 4 * t), (a2, g, 16 + 4 * t), (a3, g + 8, 16 + 4 * t)):
                a[r, k0:k0 + 4] = _s8(np.uint32(reg))
            x = rec[g, c, 4 * t:4 * t + 4]
            bh[4 * t:4 * t + 4, g], bh[16 + 4 * t:20 + 4 * t, g] = _s8(x[0]), _s8(x[1])
            bl[4 * t:4 * t + 4, g], bl[16 + 4 * t:20 + 4 * t, g] = _s8(x[2]), _s8(x[3])
        if not q6:
            assert ((128 * (a @ bh) + a @ bl).T == want[:, :, c, 0]).all()
            continue
        lanes_low = np.zeros(32, bool)
        lanes_low[0:8] = lanes_low[16:24] = True  # the MMA k of lanes t = 0, 1: 4t .., 16 + 4t ..
        s = np.stack([xq[:, c, :16].sum(-1), xq[:, c, 16:].sum(-1)])
        for h, keep in ((0, lanes_low), (1, ~lanes_low)):
            ah = np.where(keep[None, :], a, 0)
            assert ((128 * (ah @ bh) + ah @ bl).T - 32 * s[h][:, None] == want[:, :, c, h]).all()


def test_mixed_kquant_stacks_are_planned_as_their_runs_planes(monkeypatch):
    """A Q4_K_M q|k|v (v Q6_K) stays blocks on the integer kernels: its runs' planes; on matmul.cu's
    f16 MMAs one f16 weight. Stacks with other types are f16 either way."""
    from lockstep_kernels.cuda import plan
    from lockstep_kernels.cuda.kquant import packed_bytes
    from lockstep_kernels.cuda.weights import stack_bytes, type_runs
    from lockstep_kernels.weights import Weight

    monkeypatch.setattr(plan, "KQ_INTEGER", True)
    q, k, v = (Weight(_weight(n, 256, t), t) for n, t in ((64, "q4_k"), (32, "q4_k"), (32, "q6_k")))
    assert [[w.shape[0] for w in r] for r in type_runs([q, k, v])] == [[64, 32], [32]]
    assert stack_bytes([q, k, v]) == packed_bytes(96, 256, "q4_k") + packed_bytes(32, 256, "q6_k")
    f16 = Weight(np.zeros((32, 256), np.float16), "f16")
    assert type_runs([q, k, f16]) is None and stack_bytes([q, k, f16]) == 128 * 256 * 2
    monkeypatch.setattr(plan, "KQ_INTEGER", False)
    assert type_runs([q, k, v]) is None and stack_bytes([q, k, v]) == 128 * 256 * 2
