"""Exact mode on the CPU: every op gives a row the same bits alone and inside any batch."""

import numpy as np
import pytest

from lockstep_kernels.base import PAGE_SIZE, PagedRows, RopeTable
from lockstep_kernels.cpu.ops import CpuOps
from lockstep_kernels.weights import Weight

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


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_exact_off_keeps_the_row_kernel_for_a_16_bit_weight_up_to_its_row_limit(dtype):
    """BLAS would need float32 copies of a 16-bit weight on every call, which cost more than the row
    kernel's products for a few dozen rows: exact off takes the row kernel up to KERNEL_ROWS_16 rows
    (the same bits as exact on there), BLAS past it and past KERNEL_ROWS for a float32 weight."""
    from lockstep_kernels.cpu.ops import KERNEL_ROWS, KERNEL_ROWS_16

    fast, exact = CpuOps(exact=False), CpuOps(exact=True)
    w = Weight.from_f32(_rand(96, 64), dtype)
    assert KERNEL_ROWS < KERNEL_ROWS_16
    assert fast.matmul_family(KERNEL_ROWS_16, w) == "rows_gemv"
    assert fast.matmul_family(KERNEL_ROWS_16 + 1, w) == "blas"
    assert fast.matmul_family(KERNEL_ROWS + 1, Weight.from_f32(_rand(96, 64), "f32")) == "blas"
    x = _rand(KERNEL_ROWS_16, 64)
    assert fast.matmul(x, w).tobytes() == exact.matmul(x, w).tobytes()
    x = _rand(KERNEL_ROWS_16 + 1, 64)
    np.testing.assert_allclose(fast.matmul(x, w), exact.matmul(x, w), rtol=1e-4, atol=1e-4)


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


def test_16_bit_weights_stay_stored_unless_float32_copies_are_asked_for():
    """The compiled kernel widens 16-bit rows as it reads them, with the values of a float32 copy."""
    w = Weight.from_f32(_rand(64, 32), "f16")
    stored = CpuOps(exact=True)
    stored.plan_weights({"w": w})
    copied = CpuOps(exact=True, f32_copy_limit=1 << 30)
    copied.plan_weights({"w": w})
    assert stored.upload(w).dtype == "f16" and copied.upload(w).dtype == "f32"
    x = _rand(3, 32)
    assert stored.matmul(x, stored.upload(w)).tobytes() == stored.matmul(x, stored.upload(w)).tobytes()
    np.testing.assert_allclose(stored.matmul(x, stored.upload(w)), copied.matmul(x, copied.upload(w)), rtol=1e-6)
    ref = x.astype(np.float64) @ w.to_f32().T.astype(np.float64)
    np.testing.assert_allclose(stored.matmul(x, w), ref, rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_compiled_matmul_row_invariant_over_random_batches(threads, dtype):
    """The compiled row kernel, on one thread and split across threads: a row alone and inside random
    batches of 1..40 rows, with a bias and a residual, bit for bit; and the split does not matter."""
    from lockstep_kernels.cpu.ops import PARALLEL_VALUES

    ops = CpuOps(exact=True, threads=threads)
    w = Weight.from_f32(_rand(PARALLEL_VALUES // 128 + 37, 128), dtype)  # large enough to be split
    bias, row = _rand(w.shape[0]), _rand(128)
    res_row = _rand(w.shape[0])
    for b in [1, 3, 16, 17, 40]:
        x, res = _rand(b, 128), _rand(b, w.shape[0])
        i = int(RNG.integers(b))
        x[i], res[i] = row, res_row
        inside = ops.matmul(x, w, bias, residual=res)[i]
        alone = ops.matmul(row[None], w, bias, residual=res_row[None])[0]
        assert alone.tobytes() == inside.tobytes(), f"batch {b}"
    one = CpuOps(exact=True, threads=1).matmul(row[None], w)
    assert one.tobytes() == ops.matmul(row[None], w).tobytes()


def test_strided_inputs_take_the_same_kernel():
    """A strided view and its contiguous copy give the same bits (the kernels see C-contiguous arrays
    only, so numba compiles one specialisation whose vectorised reductions cannot differ)."""
    ops = CpuOps(exact=True)
    w = Weight.from_f32(_rand(48, 32), "f32")
    wide = _rand(5, 64)
    view = wide[:, ::2]
    assert ops.matmul(view, w).tobytes() == ops.matmul(np.ascontiguousarray(view), w).tobytes()
    norm_w = _rand(32)
    assert ops.rms_norm(view, norm_w, 1e-6).tobytes() == ops.rms_norm(view.copy(), norm_w, 1e-6).tobytes()


def test_gated_product_is_silu_mul_of_the_stacked_product():
    """upload_gate_up's contract: its product has the bits of silu_mul over the two halves, for a row
    alone and inside a batch."""
    ops = CpuOps(exact=True)
    gate, up = Weight.from_f32(_rand(40, 32), "f16"), Weight.from_f32(_rand(40, 32), "f16")
    gu = ops.upload_gate_up(gate, up)
    row = _rand(32)
    for b in [1, 5, 19]:
        x = _rand(b, 32)
        i = int(RNG.integers(b))
        x[i] = row
        y = ops.matmul(x, gu.stacked)
        got = ops.matmul(x, gu)
        assert got.tobytes() == ops.silu_mul(y[:, :40], y[:, 40:]).tobytes()
        assert got[i].tobytes() == ops.matmul(row[None], gu)[0].tobytes()


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_attention_row_alone_and_among_random_sequences(kv_type):
    """A decode row of one sequence, alone and in random batches of other sequences' rows at random
    positions (some across page boundaries), bit for bit."""
    ops = CpuOps(exact=True)
    n_seq, n_pages = 4, 3
    layer = ops.kv_alloc(n_seq * n_pages, 2, 32, kv_type)
    tables = np.arange(n_seq * n_pages, dtype=np.int32)[RNG.permutation(n_seq * n_pages)].reshape(n_seq, n_pages)
    length = n_pages * PAGE_SIZE
    for s in range(n_seq):
        pos = np.arange(length)
        ops.kv_write(layer, _rand(length, 2, 32), _rand(length, 2, 32),
                     tables[s][pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE)
    q, p = _rand(1, 4, 32), PAGE_SIZE + 41
    alone = ops.attention(q, layer, PagedRows(np.array([p]), np.zeros(1, np.int32), tables, None), 0.125)
    for b in [2, 7, 12]:
        qs = _rand(b, 4, 32)
        seqs = RNG.integers(0, n_seq, size=b).astype(np.int32)
        positions = RNG.integers(0, length, size=b)
        i = int(RNG.integers(b))
        qs[i], seqs[i], positions[i] = q[0], 0, p
        inside = ops.attention(qs, layer, PagedRows(positions, seqs, tables, None), 0.125)
        assert inside[i].tobytes() == alone[0].tobytes(), f"batch {b}"


@pytest.mark.parametrize("kv_type", ["f16", "bf16"])
def test_attention_widens_16_bit_pages_exactly(kv_type):
    """The kernel reads 16-bit pages as stored: the bits of attention over float32 pages holding the
    same (rounded) values."""
    ops = CpuOps(exact=True)
    n = PAGE_SIZE + 20
    k, v, q = _rand(n, 2, 32), _rand(n, 2, 32), _rand(3, 4, 32)
    narrow, wide = ops.kv_alloc(2, 2, 32, kv_type), ops.kv_alloc(2, 2, 32, "f32")
    pos = np.arange(n)
    ops.kv_write(narrow, k, v, pos)
    k16, v16 = ops._page(narrow, 0, PAGE_SIZE), ops._page(narrow, 1, n - PAGE_SIZE)
    ops.kv_write(wide, np.concatenate([k16[0], v16[0]]), np.concatenate([k16[1], v16[1]]), pos)
    rows = PagedRows(np.array([5, PAGE_SIZE, n - 1]), np.zeros(3, np.int32), np.asarray([[0, 1]], np.int32), None)
    assert ops.attention(q, narrow, rows, 0.2).tobytes() == ops.attention(q, wide, rows, 0.2).tobytes()
