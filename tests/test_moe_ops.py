"""The MoE ops on the CPU: routing and the expert FFN against float64 references, and exact mode's
row invariance (a token alone vs inside random batches that route elsewhere), bit for bit."""

import numpy as np
import pytest

from lockstep_kernels.cpu.ops import CpuOps
from lockstep_kernels.weights import Weight

RNG = np.random.default_rng(30)
H, F, E, K = 64, 32, 8, 3


def _rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _stacked(dtype):
    """Stacked [E, ...] weights as a GGUF file holds them, and their per-expert views."""
    gate, up, down = (Weight.from_f32(_rand(E * n, k, scale=0.3), dtype) for n, k in ((F, H), (F, H), (H, F)))
    views = []
    for w, n in ((gate, F), (up, F), (down, H)):
        data = w.data.reshape(E, n, -1)
        scales = None if w.scales is None else w.scales.reshape(E, n, -1)
        views.append([Weight(data[e], w.dtype, None if scales is None else scales[e]) for e in range(E)])
    return views


def _shared(dtype):
    return (Weight.from_f32(_rand(64, H, scale=0.3), dtype), Weight.from_f32(_rand(64, H, scale=0.3), dtype),
            Weight.from_f32(_rand(H, 64, scale=0.3), dtype), Weight.from_f32(_rand(1, H), dtype))


def _ops(exact=True, stored=False):
    """`stored`: weights are used as stored (a model over the copy limit), else as float32 copies."""
    ops = CpuOps(exact=exact, f32_copy_limit=0 if stored else 1 << 30)
    ops.plan_weights({"w": Weight(np.zeros((1, 1), np.float16), "f16")})
    return ops


def test_route_matches_float64_softmax_topk():
    ops = _ops()
    logits = _rand(40, E, scale=3.0)
    for renorm in (False, True):
        ids, w = ops.moe_route(logits, K, renorm)
        p = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        want = np.argsort(-p, axis=-1, kind="stable")[:, :K]
        assert ids.dtype == np.int32 and (ids == want).all()
        pw = np.take_along_axis(p, want, -1)
        if renorm:
            pw /= pw.sum(-1, keepdims=True)
        np.testing.assert_allclose(w, pw, rtol=1e-6, atol=1e-7)


def test_route_ties_go_to_the_lowest_expert():
    ops = _ops()
    logits = np.zeros((3, E), np.float32)
    logits[1, [2, 5, 6]] = 1.0
    logits[2, [7, 3]] = 2.0
    logits[2, [4, 1]] = 1.0
    ids, w = ops.moe_route(logits, K, True)
    assert ids.tolist() == [[0, 1, 2], [2, 5, 6], [3, 7, 1]]
    assert w[0].tobytes() == w[0, :1].repeat(3).tobytes()


def test_route_row_invariant():
    ops = _ops()
    row = _rand(E, scale=3.0)
    alone = ops.moe_route(row[None], K, True)
    for b in (2, 7, 33):
        batch = _rand(b, E, scale=3.0)
        i = int(RNG.integers(b))
        batch[i] = row
        ids, w = ops.moe_route(batch, K, True)
        assert ids[i].tobytes() == alone[0][0].tobytes() and w[i].tobytes() == alone[1][0].tobytes()


def _reference(x, views, ids, w, shared=None):
    gate, up, down = ([v.to_f32().astype(np.float64) for v in vs] for vs in views)
    x = x.astype(np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            g, u = gate[e] @ x[t], up[e] @ x[t]
            out[t] += w[t, j] * (down[e] @ (g / (1 + np.exp(-g)) * u))
    if shared is not None:
        sg, su, sd, sw = (s.to_f32().astype(np.float64) for s in shared)
        g, u = x @ sg.T, x @ su.T
        out += (g / (1 + np.exp(-g)) * u) @ sd.T / (1 + np.exp(-(x @ sw.T)))
    return out


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "shared"])
@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
def test_ffn_matches_float64_reference(dtype, with_shared, exact):
    ops = _ops(exact, stored=True)
    views = _stacked(dtype)
    shared = _shared(dtype) if with_shared else None
    experts = ops.upload_experts(*views, shared=shared)
    x = _rand(20, H)
    ids, w = ops.moe_route(_rand(20, E, scale=3.0), K, True)
    res = _rand(20, H)
    got = ops.moe_ffn(x, experts, ids, w, residual=res)
    want = res + _reference(x, views, ids, w, shared)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_stored_experts_are_views_not_copies():
    ops = _ops(stored=True)
    views = _stacked("f16")
    experts = ops.upload_experts(*views)
    for e in range(E):
        assert np.shares_memory(experts.gate[e].data, views[0][e].data)
        assert np.shares_memory(experts.down[e].data, views[2][e].data)


def test_ffn_sums_slots_in_ascending_order():
    """The weighted sum is slot 0, then + slot 1, ...: the bits of that order, not of expert order."""
    ops = _ops()
    views = _stacked("f32")
    experts = ops.upload_experts(*views)
    x = _rand(6, H)
    ids, w = ops.moe_route(_rand(6, E, scale=3.0), K, False)
    per = []
    for j in range(K):
        y = np.empty_like(x)
        for t in range(6):
            e = ids[t, j]
            h = ops.silu_mul(ops.matmul(x[t : t + 1], experts.gate[e]), ops.matmul(x[t : t + 1], experts.up[e]))
            y[t] = ops.matmul(h, experts.down[e])[0]
        per.append(y * w[:, j : j + 1])
    want = per[0]
    for y in per[1:]:
        want = want + y
    assert ops.moe_ffn(x, experts, ids, w).tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("stored", [False, True], ids=["f32-copies", "stored"])
@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "shared"])
def test_ffn_row_invariant(dtype, stored, with_shared):
    """Row 0 alone (its experts get 1 row each) and inside batches where its experts get many rows or
    the others route elsewhere: the same bits every time."""
    ops = _ops(exact=True, stored=stored)
    experts = ops.upload_experts(*_stacked(dtype), shared=_shared(dtype) if with_shared else None)
    row, logits = _rand(H), _rand(E, scale=3.0)
    ids, w = ops.moe_route(logits[None], K, True)
    alone = ops.moe_ffn(row[None], experts, ids, w, residual=row[None])[0]
    for b in (2, 5, 17, 64):
        x, lg = _rand(b, H), _rand(b, E, scale=3.0)
        i = int(RNG.integers(b))
        x[i], lg[i] = row, logits
        if b == 64:  # every other row to row 0's first expert: that expert's group is wide
            lg[:, ids[0, 0]] += 20.0
            lg[i] = logits
        bi, bw = ops.moe_route(lg, K, True)
        assert bi[i].tobytes() == ids[0].tobytes()
        inside = ops.moe_ffn(x, experts, bi, bw, residual=x)[i]
        assert inside.tobytes() == alone.tobytes(), f"batch {b}"


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_moe_is_norm_route_then_ffn(dtype):
    """ops.moe (the model's MoE half: norm, router, experts, residual) has the bits of the separate ops."""
    ops = _ops(True, stored=True)
    experts = ops.upload_experts(*_stacked(dtype), shared=_shared(dtype))
    router, nw = ops.upload(Weight.from_f32(_rand(E, H), dtype)), 1.0 + 0.1 * _rand(H)
    for t in (1, 7):
        x = _rand(t, H)
        h = ops.rms_norm(x, nw, 1e-6)
        want = ops.moe_ffn(h, experts, *ops.moe_route(ops.matmul(h, router), K, True), residual=x)
        assert ops.moe(x, nw, 1e-6, router, experts, K, True, x).tobytes() == want.tobytes()
