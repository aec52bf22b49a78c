"""deltanet.cu's delta_decode (a decode-only step through the DeltaNet mixer in one launch) against
the launches it replaces (conv1d_silu, gated_delta's delta_step, gated_norm_matmul): the same bits
for the output, the conv window and the delta-rule state, alone or beside other sequences, one or
several rows a sequence; and a tiny qwen3_5's decode logits with it on and off.
"""

import numpy as np
import pytest

from tests.cuda_fixtures import cp, gpu  # noqa: F401 (gpu: fixture)

pytestmark = pytest.mark.gpu

from kernels.base import RecurrentRows  # noqa: E402
from kernels.cuda import plan  # noqa: E402
from kernels.cuda.ops import CudaOps  # noqa: E402
from kernels.weights import Weight  # noqa: E402

EPS = 1e-6
# key heads, value heads, key dim, value dim, conv width: Qwen3.5-4B's layers, then other head ratios
# and widths (value dims under and over a warp's 32 columns)
DIMS = [(16, 32, 128, 128, 4), (2, 4, 16, 16, 4), (2, 2, 32, 64, 3), (1, 4, 64, 48, 4)]


class Layer:
    def __init__(self, ops, kh, vh, kd, vd, kw, seed=0):
        rng = np.random.default_rng(seed)
        self.kh, self.vh, self.kd, self.vd, self.kw = kh, vh, kd, vd, kw
        self.qkv, self.hidden = 2 * kh * kd + vh * vd, 64
        self.width = self.qkv + vh * vd + 2 * vh
        t = cp.asarray
        self.conv = t((rng.standard_normal((self.qkv, kw)) * 0.5).astype(np.float32))
        self.a_log = t(np.log(np.linspace(0.5, 3.0, vh)).astype(np.float32))
        self.dt_bias = t(np.linspace(-0.5, 0.5, vh).astype(np.float32))
        self.norm = t((1 + 0.1 * rng.standard_normal(vd)).astype(np.float32))
        self.w_out = ops.upload(Weight((rng.standard_normal((self.hidden, vh * vd)) * 0.05).astype(np.float16), "f16"))

    def state(self, ops, seed):
        rng = np.random.default_rng(seed)
        st = ops.state_alloc(1, self.qkv, self.kw, self.vh, self.kd, self.vd)
        ops.state_write(st, [rng.standard_normal((self.kw - 1, self.qkv)).astype(np.float32),
                             (rng.standard_normal((self.vh, self.kd, self.vd)) * 0.3).astype(np.float32)])
        return st

    def unfused(self, ops, y, x, rows):
        """DeltaNetLayer.forward's launches after in_proj without delta_decode."""
        t, b0 = y.shape[0], self.qkv + self.vh * self.vd
        mixed = ops.conv1d_silu(y[:, : self.qkv], self.conv, rows, 0)
        core = ops.gated_delta(mixed, y[:, b0 + self.vh :], y[:, b0 : b0 + self.vh], self.a_log, self.dt_bias, rows, 0,
                               self.kh)
        return ops.gated_norm_matmul(core.reshape(t * self.vh, self.vd), self.norm,
                                     y[:, self.qkv : b0].reshape(t * self.vh, self.vd), EPS, self.w_out, x)

    def fused(self, ops, y, x, rows):
        return ops.delta_decode(y, self.conv, self.a_log, self.dt_bias, self.norm, EPS, self.w_out, x, rows, 0, self.kh)


def _step(layer, ops, counts, seed, how):
    """One decode step of len(counts) sequences (counts[i] rows each) from fixed states -> (output,
    each state's bytes)."""
    rng = np.random.default_rng(seed)
    t = sum(counts)
    y = cp.asarray(rng.standard_normal((t, layer.width)).astype(np.float32))
    x = cp.asarray(rng.standard_normal((t, layer.hidden)).astype(np.float32))
    states = [layer.state(ops, seed + 1 + i) for i in range(len(counts))]
    edges = np.cumsum([0, *counts])
    rows = RecurrentRows([(int(a), int(b)) for a, b in zip(edges, edges[1:], strict=False)],
                         [50 + i for i in range(len(counts))], states, [False] * len(counts), [()] * len(counts))
    out = how(ops, y, x, rows)
    assert out is not None
    return cp.asnumpy(out), [b"".join(a.tobytes() for a in ops.state_read(s)) for s in states]


@pytest.mark.parametrize("dims", DIMS, ids=["qwen35_4b", "small", "ratio1", "ratio4_vd48"])
@pytest.mark.parametrize("counts", [[1], [1] * 5, [2, 1, 3]], ids=["solo", "five", "several_rows"])
def test_delta_decode_gives_the_bits_of_the_launches_it_replaces(gpu, dims, counts):
    layer = Layer(gpu, *dims)
    got, got_states = _step(layer, gpu, counts, 11, layer.fused)
    ref, ref_states = _step(layer, gpu, counts, 11, layer.unfused)
    assert got.tobytes() == ref.tobytes()
    assert got_states == ref_states


def test_delta_decode_rows_are_the_same_bits_beside_neighbours(gpu):
    layer = Layer(gpu, *DIMS[0])
    alone, alone_state = _step(layer, gpu, [1], 21, layer.fused)
    rng = np.random.default_rng(21)
    y = rng.standard_normal((1, layer.width)).astype(np.float32)
    x = rng.standard_normal((1, layer.hidden)).astype(np.float32)
    many = 9
    ys = np.concatenate([np.random.default_rng(30).standard_normal((many - 1, layer.width)).astype(np.float32), y])
    xs = np.concatenate([np.zeros((many - 1, layer.hidden), np.float32), x])
    states = [layer.state(gpu, 40 + i) for i in range(many - 1)] + [layer.state(gpu, 22)]
    rows = RecurrentRows([(i, i + 1) for i in range(many)], [7] * many, states, [False] * many, [()] * many)
    out = cp.asnumpy(layer.fused(gpu, cp.asarray(ys), cp.asarray(xs), rows))
    assert out[-1:].tobytes() == alone.tobytes()
    assert b"".join(a.tobytes() for a in gpu.state_read(states[-1])) == alone_state[0]


def test_a_step_with_prompt_rows_takes_the_separate_launches(gpu):
    layer = Layer(gpu, *DIMS[1])
    st = layer.state(gpu, 3)
    rows = RecurrentRows([(0, 4)], [0], [st], [True], [()])
    y, x = cp.zeros((4, layer.width), cp.float32), cp.zeros((4, layer.hidden), cp.float32)
    assert layer.fused(gpu, y, x, rows) is None


def test_tiny_qwen3_5_decode_bits_are_the_same_with_delta_decode_off(tmp_path, monkeypatch):
    from engine.loader import load_model
    from engine.runner import Runner, StepEntry
    from tests.tiny_hybrid import make_hybrid_model

    loaded = load_model(make_hybrid_model(tmp_path))
    tokens = [int(t) for t in np.random.default_rng(0).integers(4, loaded.config.vocab_size, 40)]

    def run(fused: bool, graphs: bool) -> bytes:
        monkeypatch.setattr(plan, "DELTA_FUSED", fused)
        runner = Runner(loaded, CudaOps(exact=True), 8, "f32", **({"max_pages_per_seq": 2} if graphs else {}))
        seqs = [(runner.pool.alloc(2), runner.new_state()) for _ in range(2)]
        out = []
        for k, (pages, state) in enumerate(seqs):
            runner.step([StepEntry(pages, tokens[: 30 + k], 0, "last", state=state, prompt=True)])
        for j in range(6):
            entries = [StepEntry(p, [5 + j + k], 30 + k + j, "last", state=s) for k, (p, s) in enumerate(seqs)]
            out.append(np.concatenate([o.logits for o in runner.step(entries)]))
        return np.concatenate(out).tobytes()

    ref = run(False, False)
    assert run(True, False) == ref
    assert run(True, True) == ref
