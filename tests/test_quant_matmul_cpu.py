"""The CPU backend multiplies straight from quantized blocks: the products of the dequantised weights,
row-invariant in exact mode, embeddings dequantising only the looked-up rows."""

import numpy as np
import pytest

from lockstep_kernels.cpu import quant_matmul
from lockstep_kernels.cpu.ops import CpuOps
from lockstep_kernels.quants import BLOCK_TYPES
from lockstep_kernels.weights import RAW_BLOCK_TYPES, RowStack, Weight, concat_rows
from tests.test_quants_dequant import F16_FIELDS

RNG = np.random.default_rng(20261201)
BATCHES = list(range(2, 18))


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _weight(name: str, n: int, k: int) -> Weight:
    """Random blocks whose scales are of a weight's size (products stay finite)."""
    kind = BLOCK_TYPES[name]
    raw = RNG.integers(0, 256, (n * k // kind.block_size, kind.type_size), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        raw[:, at : at + 2] = (RNG.uniform(-1, 1, len(raw)) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if name == "mxfp4":
        raw[:, 0] = RNG.integers(118, 126, len(raw))  # exponents 2^-10 .. 2^-3
    return Weight(raw.reshape(n, -1), name)


def _embed_row(op, row, batch):
    others = _rand(batch, *row.shape)
    i = int(RNG.integers(batch))
    others[i] = row
    return op(row[None])[0], op(others)[i]


@pytest.mark.parametrize("name", sorted(RAW_BLOCK_TYPES))
def test_matmul_row_invariant_and_equal_to_dequantised(name):
    ops = CpuOps(exact=True)
    w = _weight(name, 96, 512)
    dense = Weight(w.to_f32(), "f32")
    row = _rand(512)
    for b in BATCHES:
        alone, inside = _embed_row(lambda x: ops.matmul(x, w), row, b)
        assert alone.tobytes() == inside.tobytes(), f"batch {b}"
    x = _rand(7, 512)
    got, ref = ops.matmul(x, w), ops.matmul(x, dense)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    fast = CpuOps(exact=False).matmul(x, w)
    np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_tiles_span_several_and_stay_row_invariant(monkeypatch):
    monkeypatch.setattr(quant_matmul, "TILE_VALUES", 5 * 256)  # five rows a tile: 100 rows take 20 tiles
    ops = CpuOps(exact=True)
    w = Weight.from_f32(_rand(100, 256), "q4_k")
    assert quant_matmul.tile_rows(w, 4096) == 5
    row = _rand(256)
    alone, inside = _embed_row(lambda x: ops.matmul(x, w), row, 11)
    assert alone.tobytes() == inside.tobytes()
    ref = ops.matmul(row[None], Weight(w.to_f32(), "f32"))[0]
    np.testing.assert_allclose(alone, ref, rtol=1e-5, atol=1e-6)


def test_mixed_type_stack_multiplies_each_part_in_its_type():
    """q|k|v with v in Q6_K, as Q4_K_M files store some layers."""
    ops = CpuOps(exact=True)
    parts = [Weight.from_f32(_rand(64, 256), "q4_k"), Weight.from_f32(_rand(32, 256), "q4_k"),
             Weight.from_f32(_rand(32, 256), "q6_k")]
    w = ops.upload(concat_rows(parts))
    assert isinstance(w, RowStack) and w.shape == (128, 256)
    x = _rand(5, 256)
    got = ops.matmul(x, w)
    for i, (a, b) in enumerate(((0, 64), (64, 96), (96, 128))):
        assert got[:, a:b].tobytes() == ops.matmul(x, parts[i]).tobytes()
    alone, inside = _embed_row(lambda y: ops.matmul(y, w), x[0], 9)
    assert alone.tobytes() == inside.tobytes()


def test_gated_product_from_blocks():
    ops = CpuOps(exact=True)
    gate, up = Weight.from_f32(_rand(64, 256), "q4_k"), Weight.from_f32(_rand(64, 256), "q4_k")
    x = _rand(3, 256)
    got = ops.matmul(x, ops.upload_gate_up(gate, up))
    ref = ops.silu_mul(ops.matmul(x, gate), ops.matmul(x, up))
    assert got.tobytes() == ref.tobytes()


def test_uploads_keep_blocks_even_when_small_models_get_float32_copies():
    ops = CpuOps(exact=True, f32_copy_limit=1 << 30)
    w = Weight.from_f32(_rand(64, 256), "q4_k")
    ops.plan_weights({"q": w, "f": Weight.from_f32(_rand(64, 64), "f16")})
    assert ops._copy_f32
    assert ops.upload(w) is w and ops.upload(w).data.dtype == np.uint8


@pytest.mark.parametrize("name", ["q4_k", "q6_k", "q4_0"])
def test_embedding_dequantises_only_the_looked_up_rows(name, monkeypatch):
    ops = CpuOps(exact=True)
    table = Weight.from_f32(_rand(300, 256), name)
    full = table.to_f32()
    seen = []
    real = Weight.to_f32

    def spy(self, rows=slice(None)):
        seen.append(self.data.shape[0])
        return real(self, rows)

    monkeypatch.setattr(Weight, "to_f32", spy)
    ids = np.array([5, 299, 5, 0])
    got = ops.embedding(table, ids)
    assert seen == [4]  # four rows dequantised, not 300
    assert got.tobytes() == full[ids].tobytes()
    for b in BATCHES:
        more = RNG.integers(0, 300, size=b)
        i = int(RNG.integers(b))
        assert ops.embedding(table, more[i : i + 1])[0].tobytes() == ops.embedding(table, more)[i].tobytes()
