"""The CPU backend's whole layer in one compiled call (lockstep_kernels/cpu/layer.py): the bits of the ops one by one,
for the output and for the K and V it writes, and row invariance on its own."""

import numpy as np
import pytest

from lockstep_kernels.base import PAGE_SIZE, PagedRows, RopeTable
from lockstep_kernels.cpu import layer
from lockstep_kernels.cpu.ops import CpuOps
from lockstep_kernels.weights import Weight, f32_to_bf16

RNG = np.random.default_rng(20261202)
HIDDEN, N_HEADS, N_KV, D, FFN = 128, 4, 2, 32, 256


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _weights(ops: CpuOps, dtype: str):
    w = {n: Weight.from_f32(_rand(*s) * 0.1, dtype) for n, s in
         (("q", (N_HEADS * D, HIDDEN)), ("k", (N_KV * D, HIDDEN)), ("v", (N_KV * D, HIDDEN)),
          ("o", (HIDDEN, N_HEADS * D)), ("gate", (FFN, HIDDEN)), ("up", (FFN, HIDDEN)), ("down", (HIDDEN, FFN)))}
    w_qkv, _ = ops.upload_qkv(w["q"], w["k"], w["v"], None, D)
    return (_rand(HIDDEN), w_qkv, ops.upload(w["o"]), _rand(HIDDEN), ops.upload_gate_up(w["gate"], w["up"]),
            ops.upload(w["down"]))


def _rows(t: int) -> PagedRows:
    """t rows of t sequences at positions up to two pages in, each sequence with its own pages."""
    pos = RNG.integers(0, 2 * PAGE_SIZE - 1, t)
    tables = np.arange(2 * t, dtype=np.int32).reshape(t, 2)[:, ::-1].copy()  # logical order != physical
    slots = tables[np.arange(t), pos // PAGE_SIZE].astype(np.int64) * PAGE_SIZE + pos % PAGE_SIZE
    return PagedRows(pos.astype(np.int32), np.arange(t, dtype=np.int32), tables, slots)


def _cells(shape, kv_type: str) -> np.ndarray:
    x = RNG.standard_normal(shape).astype(np.float32)
    return {"f32": x, "f16": x.astype(np.float16), "bf16": f32_to_bf16(x)}[kv_type]


def _layer(ops, x, rows, table, cache, w, one_call: bool):
    attn_norm, w_qkv, wo, ffn_norm, gu, down = w
    if one_call:
        return ops.dense_layer(x, attn_norm, 1e-5, w_qkv, None, rows, table, cache, N_HEADS, N_KV, D ** -0.5, wo,
                               ffn_norm, gu, down)
    q = ops.norm_qkv_rope_write(x, attn_norm, 1e-5, w_qkv, None, rows, table, cache, N_HEADS, N_KV)
    return ops.ffn(ops.attention_out(q, cache, rows, D ** -0.5, wo, x), ffn_norm, 1e-5, gu, down)


@pytest.mark.parametrize(("dtype", "kv_type", "neox"), [("f16", "f16", True), ("bf16", "bf16", False),
                                                         ("f16", "f32", True), ("f16", "q8_0", True)])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_call_equals_the_ops_one_by_one(dtype, kv_type, neox, threads):
    ops = CpuOps(exact=True, threads=threads)
    w = _weights(ops, dtype)
    ang = _rand(2 * PAGE_SIZE, D // 2)
    table = RopeTable(np.cos(ang), np.sin(ang), neox)
    for t in (1, 4, 7):
        rows = _rows(t)
        caches = [ops.kv_alloc(2 * t, N_KV, D, kv_type) for _ in range(2)]
        if kv_type != "q8_0":  # the same earlier keys and values in both
            k, v = (_cells(caches[0].k.shape, kv_type) for _ in range(2))
            for c in caches:
                c.k[...], c.v[...] = k, v
        x = _rand(t, HIDDEN)
        one = _layer(ops, x, rows, table, caches[0], w, True)
        ref = _layer(ops, x, rows, table, caches[1], w, False)
        assert one.tobytes() == ref.tobytes(), f"rows {t}"
        assert caches[0].k.tobytes() == caches[1].k.tobytes() and caches[0].v.tobytes() == caches[1].v.tobytes()
    if kv_type != "q8_0":  # the one call ran (q8_0 caches take the ops one by one)
        assert any(str(sig[-6].dtype) == ("float32" if kv_type == "f32" else "uint16")
                   for sig in layer.dense_layer_16.signatures)


def test_one_call_is_row_invariant():
    ops = CpuOps(exact=True)
    w = _weights(ops, "f16")
    ang = _rand(2 * PAGE_SIZE, D // 2)
    table = RopeTable(np.cos(ang), np.sin(ang), True)
    rows = _rows(9)
    cache = ops.kv_alloc(18, N_KV, D, "f16")
    cache.k[...], cache.v[...] = _cells(cache.k.shape, "f16"), _cells(cache.v.shape, "f16")
    x = _rand(9, HIDDEN)
    batch = _layer(ops, x, rows, table, cache, w, True)
    for i in (0, 4, 8):
        one = PagedRows(rows.positions[i : i + 1], np.zeros(1, np.int32), rows.block_tables[i : i + 1], rows.slots[i : i + 1])
        assert _layer(ops, x[i : i + 1], one, table, cache, w, True)[0].tobytes() == batch[i].tobytes(), f"row {i}"
