"""The MoE ops on CUDA against the NumPy backend, and exact mode's row invariance bit for bit: a token
alone vs inside batches whose other rows route elsewhere, a (token, expert) pair vs the dense matmul
on that expert's weights, a replayed decode graph vs an uncaptured step, prefill vs decode.

Tolerances (relative L2 against the CPU backend on the same stored weights): float32 weights 1e-5;
f16 and q8_0 2e-3, Q4_K 3e-3 (f16 on the GPU) and bf16 1e-2 (the tensor cores take activations rounded
to 16 bits, as tests/test_cuda_ops.py states); routing weights 1e-6 with the same experts chosen.
"""

import numpy as np
import pytest

from tests.cuda_fixtures import cp, gpu  # noqa: F401 (gpu: fixtures)

pytestmark = pytest.mark.gpu

from engine.config import ModelConfig, MoeConfig  # noqa: E402
from engine.models.llama import LlamaModel, expected_shapes  # noqa: E402
from lockstep_kernels.base import PAGE_SIZE, PagedRows  # noqa: E402
from lockstep_kernels.cpu.ops import CpuOps  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402
from lockstep_kernels.weights import Weight  # noqa: E402

RNG = np.random.default_rng()
TOL = {"f32": 1e-5, "f16": 2e-3, "q8_0": 2e-3, "q4_k": 3e-3, "bf16": 1e-2}
BATCHES = [1, 2, 5, 8, 16, 33, 64, 100, 300]


def _rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _rel(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def _experts(n_e, h, f, dtype, shared=False):
    """Per-expert gate, up, down; a shared expert of width f with a float32 sigmoid gate (as GGUF files
    keep that [1, H] tensor)."""
    ws = [[Weight.from_f32(_rand(n, k, scale=k**-0.5), dtype) for _ in range(n_e)] for n, k in ((f, h), (f, h), (h, f))]
    sh = None
    if shared:
        sh = (Weight.from_f32(_rand(f, h, scale=h**-0.5), dtype), Weight.from_f32(_rand(f, h, scale=h**-0.5), dtype),
              Weight.from_f32(_rand(h, f, scale=f**-0.5), dtype), Weight(_rand(1, h, scale=h**-0.5), "f32"))
    return ws, sh


@pytest.mark.parametrize("n_e,k", [(8, 2), (128, 8)])
def test_route_matches_cpu(gpu, n_e, k):
    logits = _rand(40, n_e, scale=3.0)
    for renorm in (False, True):
        ids, w = CpuOps(exact=True).moe_route(logits, k, renorm)
        gi, gw = gpu.moe_route(cp.asarray(logits), k, renorm)
        assert (cp.asnumpy(gi) == ids).all()
        np.testing.assert_allclose(cp.asnumpy(gw), w, rtol=1e-6, atol=1e-7)


def test_route_ties_go_to_the_lowest_expert(gpu):
    logits = np.zeros((3, 8), np.float32)
    logits[1, [2, 5, 6]] = 1.0
    logits[2, [7, 3]] = 2.0
    ids, _ = gpu.moe_route(cp.asarray(logits), 3, True)
    assert cp.asnumpy(ids).tolist() == [[0, 1, 2], [2, 5, 6], [3, 7, 0]]


def test_route_row_invariant(gpu):
    row = _rand(1, 128, scale=3.0)
    alone = [cp.asnumpy(a) for a in gpu.moe_route(cp.asarray(row), 8, True)]
    for t in BATCHES:
        batch = _rand(t, 128, scale=3.0)
        at = int(RNG.integers(0, t))
        batch[at] = row[0]
        got = gpu.moe_route(cp.asarray(batch), 8, True)
        assert all(cp.asnumpy(g)[at].tobytes() == a[0].tobytes() for g, a in zip(got, alone, strict=True))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", "q4_k"])
@pytest.mark.parametrize("shared", [False, True])
def test_ffn_follows_cpu(gpu, dtype, shared):
    h, f, n_e, k, t = 256, 256, 16, 4, 37
    (gate, up, down), sh = _experts(n_e, h, f, dtype, shared)
    cpu = CpuOps(exact=True)
    x, res = _rand(t, h), _rand(t, h)
    ids, w = cpu.moe_route(_rand(t, n_e, scale=3.0), k, True)
    ref = cpu.moe_ffn(x, cpu.upload_experts(gate, up, down, sh), ids, w, res)
    got = gpu.moe_ffn(cp.asarray(x), gpu.upload_experts(gate, up, down, sh, k), cp.asarray(ids), cp.asarray(w),
                      cp.asarray(res))
    assert _rel(cp.asnumpy(got) - res, ref - res) < TOL[dtype]


@pytest.mark.parametrize("dtype,f", [("f16", 64), ("f16", 36), ("bf16", 64), ("q8_0", 64), ("f32", 64)])
def test_ffn_row_invariant(gpu, dtype, f):
    """F = 36: gate and up side by side ("halves"), gated apart from the matmul."""
    h, n_e, k = 128, 64, 8
    (gate, up, down), sh = _experts(n_e, h, f, dtype, shared=True)
    ex = gpu.upload_experts(gate, up, down, sh, active=k)
    router = gpu.upload(Weight.from_f32(_rand(n_e, h), dtype))
    row = _rand(1, h)

    def run(x):
        x = cp.asarray(x)
        ids, w = gpu.moe_route(gpu.matmul(x, router), k, True)
        return cp.asnumpy(gpu.moe_ffn(x, ex, ids, w, x))

    alone = run(row)[0]
    for t in BATCHES:
        batch = _rand(t, h)
        at = int(RNG.integers(0, t))
        batch[at] = row[0]
        assert run(batch)[at].tobytes() == alone.tobytes(), f"{t} rows"


def _block(gpu, dtype, shared, h=256, f=128, n_e=64):
    (gate, up, down), sh = _experts(n_e, h, f, dtype, shared)
    ex = gpu.upload_experts(gate, up, down, sh, active=8)
    router = gpu.upload(Weight.from_f32(_rand(n_e, h, scale=h**-0.5 * 3.0), dtype))
    return ex, router, cp.asarray(1.0 + 0.1 * _rand(h))


@pytest.mark.parametrize("dtype,shared", [("f16", False), ("f16", True), ("bf16", False), ("q8_0", False),
                                          ("f32", False)])
def test_moe_has_the_bits_of_norm_route_then_ffn(gpu, dtype, shared):
    """ops.moe (route and schedule in one kernel up to ROUTE_ROWS tokens, the weighted sum in the down
    launch up to SUM_ROWS, one token normalised inside the router and gate|up kernels) against the
    separate ops, at widths on both sides of each switch; the down launch's counters end at zero."""
    ex, router, nw = _block(gpu, dtype, shared)
    for t in (1, 2, 16, 64, 65, 256, 257):
        x = cp.asarray(_rand(t, 256))
        got = gpu.moe(x, nw, 1e-6, router, ex, 8, True, x)
        h = gpu.rms_norm(x, nw, 1e-6)
        ids, w = gpu.moe_route(gpu.matmul(h, router), 8, True)
        want = gpu.moe_ffn(h, ex, ids, w, x)
        assert cp.asnumpy(got).tobytes() == cp.asnumpy(want).tobytes(), f"{t} rows"
        assert int(cp.count_nonzero(ex.counts)) == 0, f"{t} rows"


@pytest.mark.parametrize("dtype,n_e", [("f16", 64), ("bf16", 64), ("q8_0", 64), ("f16", 40), ("f16", 128)])
def test_one_token_has_the_same_bits_wherever_it_is_routed(gpu, dtype, n_e, monkeypatch):
    """A lone token routed once by the last block of its router's launch ("router": gate|up reads its
    table, down loads weights before it waits) or by every gate|up block ("gate_up"): the same bits; the
    counters end at zero each time (graphs:
    test_graph_replay_equals_uncaptured_and_alone)."""
    ex, router, nw = _block(gpu, dtype, False, f=1024, n_e=n_e)  # f: a gate|up split of 4 (30B-A3B's)
    x = cp.asarray(_rand(1, 256))
    monkeypatch.setattr(gpu, "one_token_route", "gate_up")
    want = cp.asnumpy(gpu.moe(x, nw, 1e-6, router, ex, 8, True, x))
    monkeypatch.setattr(gpu, "one_token_route", "router")
    for _ in range(3):
        assert cp.asnumpy(gpu.moe(x, nw, 1e-6, router, ex, 8, True, x)).tobytes() == want.tobytes()
        assert int(ex.routed[0]) == 0 and int(cp.count_nonzero(ex.counts)) == 0


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0"])
def test_moe_row_invariant(gpu, dtype):
    """A token alone (the one-token kernels) and inside batches that route elsewhere: the same bits."""
    ex, router, nw = _block(gpu, dtype, False)
    row = _rand(1, 256)
    alone = cp.asnumpy(gpu.moe(cp.asarray(row), nw, 1e-6, router, ex, 8, True, cp.asarray(row)))[0]
    for t in BATCHES:
        batch = _rand(t, 256)
        at = int(RNG.integers(0, t))
        batch[at] = row[0]
        x = cp.asarray(batch)
        got = cp.asnumpy(gpu.moe(x, nw, 1e-6, router, ex, 8, True, x))[at]
        assert got.tobytes() == alone.tobytes(), f"{t} rows"


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0", "f32"])
def test_pair_has_the_dense_matmul_bits(gpu, dtype):
    """Every row routed to one expert with weight 1: the dense gate|up and down matmuls' bits, at
    widths that take each dense kernel family (one active expert: the dense split)."""
    h, f, n_e = 256, 128, 4
    (gate, up, down), _ = _experts(n_e, h, f, dtype)
    ex = gpu.upload_experts(gate, up, down, active=1)
    e = 2
    w_gu, w_down = gpu.upload_gate_up(gate[e], up[e]), gpu.upload(down[e])
    for t in (1, 7, 16, 40, 200, 600):
        x = cp.asarray(_rand(t, h))
        dense = gpu.matmul(gpu.matmul(x, w_gu), w_down)
        ids, ones = cp.full((t, 1), e, dtype=cp.int32), cp.ones((t, 1), dtype=cp.float32)
        got = gpu.moe_ffn(x, ex, ids, ones)
        assert cp.asnumpy(got).tobytes() == cp.asnumpy(dense).tobytes(), f"{t} rows"


# --- a tiny qwen3_moe model: graphs, prefill against decode, the CPU backend
PAGES = 2
N_SEQ = 5


def _model(ops, dtype, seed=0):
    moe = MoeConfig(n_experts=32, top_k=4, expert_ffn=64, dense_layers=(1,))
    cfg = ModelConfig(arch="qwen3_moe", vocab_size=300, hidden=128, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32,
                      ffn=256, qk_norm=True, moe=moe)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in expected_shapes(cfg).items():
        if len(shape) == 1:
            weights[name] = Weight(np.asarray(1.0 + 0.1 * rng.standard_normal(shape), np.float32), "f32")
        elif name.endswith("mlp.gate.weight"):  # routers float32, so that 16-bit rounding flips no expert
            weights[name] = Weight((rng.standard_normal(shape) * shape[1] ** -0.5 * 3.0).astype(np.float32), "f32")
        else:
            x = rng.standard_normal(shape) * shape[1] ** -0.5 * 2.0
            weights[name] = Weight.from_f32(x.astype(np.float32), dtype)
    return LlamaModel(cfg, weights, ops, PAGES * PAGE_SIZE)


class Seqs:
    def __init__(self, ops, dtype, seed=0):
        from engine.kv_cache import PagePool

        self.ops, self.model = ops, _model(ops, dtype, seed)
        c = self.model.config
        self.pool = PagePool(ops, c.n_layers, PAGES * N_SEQ + 1, c.n_kv_heads, c.head_dim, "f32")
        self.pages = np.arange(PAGES * N_SEQ, dtype=np.int32).reshape(N_SEQ, PAGES)[::-1].copy()
        self.lengths = [0] * N_SEQ

    def forward(self, ids, rows, logit_rows):
        return self.model.forward(ids, rows, self.pool.layers, logit_rows)

    def inputs(self, seqs, toks):
        pos = [np.arange(self.lengths[s], self.lengths[s] + len(t)) for s, t in zip(seqs, toks, strict=True)]
        slots = [self.pages[s][p // PAGE_SIZE].astype(np.int64) * PAGE_SIZE + p % PAGE_SIZE
                 for s, p in zip(seqs, pos, strict=True)]
        seq = [np.full(len(t), i, np.int32) for i, t in enumerate(toks)]
        return (np.concatenate(toks).astype(np.int32), np.concatenate(pos).astype(np.int32), np.concatenate(seq),
                self.pages[list(seqs)], np.concatenate(slots))

    def step(self, seqs, toks):
        """An uncaptured step; logits of every row."""
        tokens, positions, seq, tables, slots = self.inputs(seqs, toks)
        o = self.ops
        rows = PagedRows(o.tensor(positions), o.tensor(seq), o.tensor(tables), o.tensor(slots))
        out = o.to_host(self.forward(o.tensor(tokens), rows, None))
        for s, t in zip(seqs, toks, strict=True):
            self.lengths[s] += len(t)
        return out


def test_graph_replay_equals_uncaptured_and_alone():
    ops = CudaOps(exact=True)
    sess = Seqs(ops, "f16")
    seqs = list(range(N_SEQ))
    for s in seqs:
        sess.step([s], [RNG.integers(0, 300, 20 + 7 * s)])
    graphs = ops.decode_graphs(sess.forward, max_pages=PAGES, buckets=(1, 2, 4, 8))
    for _ in range(3):
        tokens = RNG.integers(0, 300, N_SEQ)
        t, positions, _, tables, slots = sess.inputs(seqs, [[x] for x in tokens])
        replay = ops.to_host(graphs(t, positions, tables, slots))
        alone = [ops.to_host(graphs(*(a[i : i + 1] for a in (t, positions, tables, slots))))[0] for i in seqs]
        plain = sess.step(seqs, [[x] for x in tokens])
        assert replay.tobytes() == plain.tobytes()
        assert np.stack(alone).tobytes() == plain.tobytes()


def test_prefill_rows_equal_decode_rows_and_neighbours():
    """A prompt prefilled whole, decoded a token at a time, or beside other prompts: the same bits."""
    prompt = RNG.integers(0, 300, 40)
    whole = Seqs(CudaOps(exact=True), "bf16", seed=1).step([0], [prompt])
    one = Seqs(CudaOps(exact=True), "bf16", seed=1)
    stepped = np.concatenate([one.step([0], [prompt[i : i + 1]]) for i in range(len(prompt))])
    beside = Seqs(CudaOps(exact=True), "bf16", seed=1).step([2, 0, 3], [RNG.integers(0, 300, 70), prompt,
                                                                      RNG.integers(0, 300, 9)])[70:110]
    assert whole.tobytes() == stepped.tobytes() == beside.tobytes()


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_tiny_moe_logits_follow_cpu(dtype, record_property):
    """float32 weights: relative L2 of all logits under 1e-4. f16: the tensor cores round activations
    to f16, which in later layers moves router logits by ~1e-3, enough to swap a near-tied k-th expert
    for a row now and then (a different, equally valid routing): the median row's error is bounded."""
    prompt = RNG.integers(0, 300, 60)
    got = Seqs(CudaOps(exact=True), dtype, seed=2).step([1], [prompt])
    ref = Seqs(CpuOps(exact=True), dtype, seed=2).step([1], [prompt])
    err = _rel(got, ref)
    rows = sorted(_rel(g, r) for g, r in zip(got, ref, strict=True))
    record_property("rel_l2", err)
    record_property("median_row_rel_l2", rows[len(rows) // 2])
    print(f"tiny qwen3_moe {dtype}: logits relative L2 vs CPU {err:.2e}, median row {rows[len(rows) // 2]:.2e}, "
          f"worst row {rows[-1]:.2e}")
    if dtype == "f32":
        assert err < 1e-4, f"relative error {err:.2e}"
    else:
        assert rows[len(rows) // 2] < 1e-2, f"median row relative error {rows[len(rows) // 2]:.2e}"


def test_tiny_qwen3_5_moe_logits_follow_cpu(tmp_path):
    """qwen3_5_moe (hybrid layers, routed experts and the gated shared expert), float32 weights: the
    CUDA backend's logits over a prompt in two pieces and four decode steps against the CPU backend's,
    relative L2 under 1e-3 (the bound of the dense hybrid's test in tests/test_cuda_deltanet.py)."""
    from engine.loader import load_model
    from engine.runner import Runner, StepEntry, make_ops
    from lockstep_kernels.cuda.plan import DELTA_CHUNK
    from tests.tiny_hybrid import make_hybrid_model

    loaded = load_model(make_hybrid_model(tmp_path, moe=True))
    assert loaded.config.moe is not None and loaded.config.moe.shared_ffn
    tokens = [int(t) for t in np.random.default_rng(0).integers(4, loaded.config.vocab_size, 2 * DELTA_CHUNK + 7)]

    def run(ops):
        runner = Runner(loaded, ops, 4, "f32")
        pages, state = runner.pool.alloc(2), runner.new_state()
        out = [runner.step([StepEntry(pages, tokens[lo:hi], lo, "all", state=state, prompt=True)])[0].logits
               for lo, hi in ((0, DELTA_CHUNK), (DELTA_CHUNK, len(tokens)))]
        for j, tok in enumerate((5, 9, 11, 3)):
            out.append(runner.step([StepEntry(pages, [tok], len(tokens) + j, "last", state=state)])[0].logits)
        return np.concatenate(out)

    ref, got = run(make_ops("cpu", True)), run(CudaOps(exact=True))
    assert got.shape == ref.shape == (len(tokens) + 4, loaded.config.vocab_size)
    err = _rel(got, ref)
    print(f"tiny qwen3_5_moe logits, CUDA vs CPU: relative L2 error {err:.3e} over {got.shape[0]} rows")
    assert err < 1e-3, f"relative L2 error {err:.2e}"
