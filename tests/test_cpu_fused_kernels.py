"""The CPU backend's joined kernels (lockstep_kernels/cpu/fused.py, rope_write.py, the gated and residual row
kernel): the bits of the separate ops, and row invariance on their own."""

import numpy as np
import pytest

from lockstep_kernels.base import PAGE_SIZE, PagedRows, RopeTable, split_qkv_rope_write
from lockstep_kernels.cpu.ops import CpuOps, GateUp
from lockstep_kernels.weights import Weight

RNG = np.random.default_rng(20261202)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _alone_and_inside(op, row: np.ndarray, batch: int, extra=None):
    """op(row) alone and as row i of a batch of random rows; `extra` gives per-row companions (a residual)."""
    x = _rand(batch, *row.shape)
    i = int(RNG.integers(batch))
    x[i] = row
    if extra is None:
        return op(row[None])[0], op(x)[i]
    e_row, e = extra
    e[i] = e_row
    return op(row[None], e_row[None])[0], op(x, e)[i]


@pytest.mark.parametrize("neox", [True, False])
def test_rope_is_numpys_float32_arithmetic(neox):
    """No fused multiply-add: each element is NumPy's x1 * cos - x2 * sin, product by product."""
    ops = CpuOps()
    ang = _rand(40, 8)
    cos, sin = np.cos(ang), np.sin(ang)
    x, pos = _rand(5, 3, 16), RNG.integers(0, 40, 5)
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    ref = np.empty_like(x)
    if neox:
        x1, x2 = x[..., :8], x[..., 8:]
        ref = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    else:
        xe, xo = x[..., 0::2], x[..., 1::2]
        ref[..., 0::2], ref[..., 1::2] = xe * c - xo * s, xo * c + xe * s
    assert ops.rope(x, pos, RopeTable(cos, sin, neox)).tobytes() == ref.tobytes()


@pytest.mark.parametrize("kv_type", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("neox", [True, False])
def test_compiled_qkv_rope_write_equals_the_separate_ops(kv_type, neox):
    ops = CpuOps(exact=True)
    n_heads, n_kv, d, t = 4, 2, 32, 7
    ang = _rand(3 * PAGE_SIZE, d // 2)
    table = RopeTable(np.cos(ang), np.sin(ang), neox)
    pos = np.array([0, 5, 255, 256, 300, 511, 700])
    pages = [2, 0, 1]
    slots = np.asarray(pages)[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE
    rows = PagedRows(pos.astype(np.int32), np.zeros(t, np.int32), np.asarray([pages], np.int32), slots)
    qkv = _rand(t, (n_heads + 2 * n_kv) * d) * 3
    fused_layer, split_layer = (ops.kv_alloc(3, n_kv, d, kv_type) for _ in range(2))
    q = ops.qkv_rope_write(qkv, rows, table, fused_layer, n_heads, n_kv)
    q_ref = split_qkv_rope_write(ops, qkv, rows, table, split_layer, n_heads, n_kv)
    assert q.tobytes() == q_ref.tobytes()
    for name in ("k", "v", "k_scale", "v_scale"):
        a, b = getattr(fused_layer, name), getattr(split_layer, name)
        assert (a is None and b is None) or a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_gated_and_residual_products_row_invariant_and_equal_to_the_unjoined_arithmetic(dtype, threads):
    from lockstep_kernels.cpu.ops import PARALLEL_VALUES

    ops = CpuOps(exact=True, threads=threads)
    k, f = 64, PARALLEL_VALUES // 64 + 24  # large enough to be split across threads
    gate, up = Weight.from_f32(_rand(f, k), dtype), Weight.from_f32(_rand(f, k), dtype)
    gu = ops.upload_gate_up(gate, up)
    down = Weight.from_f32(_rand(k, f) * 0.1, dtype)
    row, res_row = _rand(k), _rand(k)
    plain = CpuOps(exact=True, threads=threads)
    for b in (1, 3, 16, 17):
        alone, inside = _alone_and_inside(lambda x: ops.matmul(x, gu), row, b)
        assert alone.tobytes() == inside.tobytes(), f"gated, batch {b}"
        # the product of the stacked weight, then the separate silu kernel
        assert alone.tobytes() == plain.silu_mul(*np.split(plain.matmul(row[None], gu.stacked), 2, axis=1))[0].tobytes()
        alone, inside = _alone_and_inside(lambda x, r: ops.matmul(x, down, residual=r), _rand(f), b,
                                          (res_row, _rand(b, k)))
        x_row = _rand(f)
        got = ops.matmul(x_row[None], down, residual=res_row[None])[0]
        assert got.tobytes() == (res_row + ops.matmul(x_row[None], down)[0]).tobytes()
        assert alone.tobytes() == inside.tobytes(), f"residual, batch {b}"


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_joined_norm_product_and_ffn_equal_the_separate_ops(exact, threads):
    ops = CpuOps(exact=exact, threads=threads)
    hidden, ffn = 48, 1400
    nw = _rand(hidden)
    gu = GateUp(Weight.from_f32(_rand(2 * ffn, hidden), "f16"))
    down = Weight.from_f32(_rand(hidden, ffn) * 0.05, "f16")
    qkv = Weight.from_f32(_rand(96, hidden), "f16")
    bias = _rand(96)
    for t in (1, 5, 16):
        x = _rand(t, hidden)
        xn = ops.rms_norm(x, nw, 1e-5)
        assert ops.norm_matmul(x, nw, 1e-5, qkv, bias).tobytes() == ops.matmul(xn, qkv, bias).tobytes()
        assert ops.norm_matmul(x, nw, 1e-5, gu).tobytes() == ops.matmul(xn, gu).tobytes()
        want = ops.matmul(ops.matmul(xn, gu), down, residual=x)
        assert ops.ffn(x, nw, 1e-5, gu, down).tobytes() == want.tobytes()
        ref = x.astype(np.float64) + _silu_ref(xn, gu.stacked, ffn) @ down.to_f32().T.astype(np.float64)
        np.testing.assert_allclose(want, ref, rtol=1e-4, atol=1e-4)


def _silu_ref(xn: np.ndarray, stacked: Weight, f: int) -> np.ndarray:
    y = xn.astype(np.float64) @ stacked.to_f32().T.astype(np.float64)
    g, u = y[:, :f], y[:, f:]
    return g / (1 + np.exp(-g)) * u


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "q8_0"])
def test_embedding_widens_exactly_and_refuses_ids_out_of_range(dtype):
    ops = CpuOps(exact=True)
    table = Weight.from_f32(_rand(50, 32), dtype)
    ids = np.array([3, 49, 0, 3])
    assert ops.embedding(table, ids).tobytes() == table.to_f32()[ids].astype(np.float32).tobytes()
    with pytest.raises(IndexError):
        ops.embedding(table, np.array([50]))
