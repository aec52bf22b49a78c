"""Exact mode on the CPU: every op gives a row the same bits alone and inside any batch."""

import numpy as np
import pytest

from kernels.base import PAGE_SIZE, PagedRows, RopeTable
from kernels.cpu.ops import CpuOps
from kernels.weights import Weight

RNG = np.random.default_rng(20261130)
BATCHES = list(range(2, 18))


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _embed_row(ops, op, row, batch):
    """Row `row` computed alone and as row i of a random batch of `batch` rows."""
    others = _rand(batch, *row.shape)
    i = int(RNG.integers(batch))
    others[i] = row
    return op(row[None])[0], op(others)[i]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
def test_matmul_row_invariant(dtype):
    ops = CpuOps(exact=True)
    w = Weight.from_f32(_rand(96, 64), dtype)
    bias = _rand(96)
    row = _rand(64)
    for b in BATCHES:
        alone, inside = _embed_row(ops, lambda x: ops.matmul(x, w, bias), row, b)
        assert alone.tobytes() == inside.tobytes(), f"batch {b}"


def test_large_matmul_row_invariant_across_blocks():
    ops = CpuOps(exact=True)
    w = Weight.from_f32(_rand(4096 + 100, 32), "f16")  # spans two conversion blocks
    row = _rand(32)
    alone, inside = _embed_row(ops, lambda x: ops.matmul(x, w), row, 13)
    assert alone.tobytes() == inside.tobytes()


def test_exact_off_matmul_is_the_fast_path():
    """The control: BLAS gemm over many rows is not required to match one row's bits."""
    fast, exact = CpuOps(exact=False), CpuOps(exact=True)
    w = Weight.from_f32(_rand(64, 64), "f32")
    x = _rand(8, 64)
    np.testing.assert_allclose(fast.matmul(x, w), exact.matmul(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["rms_norm", "silu_mul", "add", "rope_neox", "rope_interleaved", "embedding"])
def test_elementwise_ops_row_invariant(name):
    ops = CpuOps(exact=True)
    cos, sin = (np.cos(a := _rand(64, 16)), np.sin(a))
    norm_w = _rand(32)
    table = Weight.from_f32(_rand(50, 32), "bf16")
    for b in BATCHES:
        if name == "rms_norm":
            alone, inside = _embed_row(ops, lambda x: ops.rms_norm(x, norm_w, 1e-6), _rand(32), b)
        elif name == "silu_mul":
            alone, inside = _embed_row(ops, lambda x: ops.silu_mul(x[:, :16], x[:, 16:]), _rand(32), b)
        elif name == "add":
            alone, inside = _embed_row(ops, lambda x: ops.add(x[:, :16], x[:, 16:]), _rand(32), b)
        elif name.startswith("rope"):
            rt = RopeTable(cos, sin, neox=name == "rope_neox")
            pos = RNG.integers(0, 64, size=b)
            x = _rand(b, 4, 32)
            full = ops.rope(x, pos, rt)
            i = int(RNG.integers(b))
            alone, inside = ops.rope(x[i : i + 1], pos[i : i + 1], rt)[0], full[i]
        else:
            ids = RNG.integers(0, 50, size=b)
            i = int(RNG.integers(b))
            alone, inside = ops.embedding(table, ids[i : i + 1])[0], ops.embedding(table, ids)[i]
        assert alone.tobytes() == inside.tobytes(), f"{name} batch {b}"


def test_rope_layouts_agree_up_to_a_permutation():
    ops = CpuOps()
    a = _rand(10, 8)
    cos, sin = np.cos(a), np.sin(a)
    x = _rand(3, 2, 16)
    pos = np.array([0, 4, 9])
    neox = ops.rope(x, pos, RopeTable(cos, sin, neox=True))
    perm = np.concatenate([np.arange(0, 16, 2), np.arange(1, 16, 2)])  # interleaved -> halves
    inter = ops.rope(x[..., perm.argsort()], pos, RopeTable(cos, sin, neox=False))
    np.testing.assert_array_equal(inter[..., perm], neox)


def _pool(ops, n_pages, kv_type="f16"):
    return ops.kv_alloc(n_pages, 2, 32, kv_type)


@pytest.mark.parametrize("kv_type", ["f32", "f16", "bf16", "q8_0"])
def test_attention_row_invariant_prefill_decode_and_moved_pages(kv_type):
    ops = CpuOps(exact=True)
    n_tok = 2 * PAGE_SIZE + 37
    layer = _pool(ops, 8, kv_type)
    pages = [5, 2, 7]
    k, v = _rand(n_tok, 2, 32), _rand(n_tok, 2, 32)
    pos = np.arange(n_tok)
    slots = np.asarray(pages)[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE
    ops.kv_write(layer, k, v, slots)
    q = _rand(n_tok, 4, 32)
    tables = np.asarray([pages], dtype=np.int32)
    prefill = ops.attention(q, layer, PagedRows(pos, np.zeros(n_tok, np.int32), tables, slots), 0.17)

    # one decode row at the last position, alone
    last = n_tok - 1
    one = ops.attention(q[last:], layer, PagedRows(pos[last:], np.zeros(1, np.int32), tables, slots[last:]), 0.17)
    assert one[0].tobytes() == prefill[last].tobytes()

    # the same rows beside another sequence's rows in one call
    other = [0, 1]
    ops.kv_write(layer, _rand(300, 2, 32), _rand(300, 2, 32),
                 np.asarray(other)[np.arange(300) // PAGE_SIZE] * PAGE_SIZE + np.arange(300) % PAGE_SIZE)
    both_tables = np.asarray([pages, [0, 1, 0]], dtype=np.int32)
    mixed_pos = np.array([last, 299, 100, 17])
    mixed = ops.attention(q[[last, 0, 100, 17]], layer,
                          PagedRows(mixed_pos, np.array([0, 1, 0, 0], np.int32), both_tables, None), 0.17)
    assert mixed[0].tobytes() == prefill[last].tobytes()
    assert mixed[2].tobytes() == prefill[100].tobytes()

    # pages moved to other physical pages (a park and a restore elsewhere)
    moved = [4, 6, 3]
    ops.kv_write_pages(layer, moved, ops.kv_read_pages(layer, pages))
    again = ops.attention(q, layer, PagedRows(pos, np.zeros(n_tok, np.int32), np.asarray([moved], np.int32), None), 0.17)
    assert again.tobytes() == prefill.tobytes()


def test_attention_matches_dense_softmax():
    ops = CpuOps()
    n = PAGE_SIZE + 9
    layer = _pool(ops, 2, "f32")
    k, v, q = _rand(n, 2, 32), _rand(n, 2, 32), _rand(n, 4, 32)
    pos = np.arange(n)
    ops.kv_write(layer, k, v, pos)
    out = ops.attention(q, layer, PagedRows(pos, np.zeros(n, np.int32), np.asarray([[0, 1]], np.int32), pos), 0.2)
    kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)  # GQA: 2 query heads per KV head
    s = np.einsum("thd,shd->hts", q.astype(np.float64), kk) * 0.2
    s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = np.einsum("hts,shd->thd", p, vv).reshape(n, -1)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_small_models_keep_float32_copies_large_ones_their_stored_form():
    w = Weight.from_f32(_rand(64, 32), "f16")
    small = CpuOps(exact=True)
    small.plan_weights([w])
    large = CpuOps(exact=True, f32_copy_limit=64 * 32 * 4 - 1)
    large.plan_weights([w])
    assert small.upload(w).dtype == "f32" and large.upload(w).dtype == "f16"
    x = _rand(3, 32)
    assert small.matmul(x, small.upload(w)).tobytes() == small.matmul(x, small.upload(w)).tobytes()
    np.testing.assert_allclose(small.matmul(x, small.upload(w)), large.matmul(x, large.upload(w)), rtol=1e-6)


def test_k_and_v_may_have_different_types():
    ops = CpuOps(exact=True)
    mixed, same = ops.kv_alloc(2, 2, 32, "q8_0", "f16"), ops.kv_alloc(2, 2, 32, "q8_0")
    k, v = _rand(300, 2, 32), _rand(300, 2, 32)
    pos = np.arange(300)
    for layer in (mixed, same):
        ops.kv_write(layer, k, v, pos)
    assert mixed.v.dtype == np.float16 and mixed.v_scale is None and same.v.dtype == np.int8
    q = _rand(1, 4, 32)
    rows = PagedRows(np.array([299]), np.zeros(1, np.int32), np.asarray([[0, 1]], np.int32), None)
    exact_v = ops.attention(q, mixed, rows, 0.2)
    np.testing.assert_allclose(exact_v, ops.attention(q, same, rows, 0.2), atol=0.05)
    moved = ops.kv_alloc(2, 2, 32, "q8_0", "f16")
    ops.kv_write_pages(moved, [1, 0], ops.kv_read_pages(mixed, [0, 1]))
    rows_moved = PagedRows(np.array([299]), np.zeros(1, np.int32), np.asarray([[1, 0]], np.int32), None)
    assert ops.attention(q, moved, rows_moved, 0.2).tobytes() == exact_v.tobytes()
