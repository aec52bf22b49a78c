"""The recurrent ops of hybrid models on CUDA (lockstep_kernels/cuda/deltanet.cu) against the CPU reference, and
their bits against themselves: a sequence's rows alone or beside other sequences, its prompt in one
piece or in pieces cut at chunk ends.

Tolerances (relative L2 error against the float32 CPU ops): conv1d and gated RMSNorm 1e-6; the
delta rule 1e-4 (CUDA chunks of 32 positions, the CPU's of 16: the same sums regrouped); a tiny
qwen3_5's (and qwen3_5_moe's) logits on CUDA 1e-3 against the CPU backend (float32 weights, f32 KV).
"""

import numpy as np
import pytest

from tests.cuda_fixtures import cp, gpu, gpu_off  # noqa: F401 (gpu, gpu_off: fixtures)

pytestmark = pytest.mark.gpu

from lockstep_kernels.base import RecurrentRows  # noqa: E402
from lockstep_kernels.cpu import deltanet as cpu_dn  # noqa: E402
from lockstep_kernels.cpu.ops import CpuOps  # noqa: E402
from lockstep_kernels.cuda.deltanet import CHUNK  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402
from tests.test_hybrid_ops import step_rows  # noqa: E402

RNG = np.random.default_rng()
SMALL = (2, 4, 16, 16, 4)  # key heads, value heads, key dim, value dim, conv width
QWEN35_4B = (16, 32, 128, 128, 4)  # Qwen3.5-4B's DeltaNet layers
C = CHUNK


def _rel(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


class Shape:
    def __init__(self, kh, vh, kd, vd, kw):
        self.kh, self.vh, self.kd, self.vd, self.kw = kh, vh, kd, vd, kw
        self.qkv = 2 * kh * kd + vh * vd
        self.a_log = np.log(np.linspace(0.5, 3.0, vh)).astype(np.float32)
        self.dt_bias = np.linspace(-0.5, 0.5, vh).astype(np.float32)
        self.conv_w = (RNG.standard_normal((self.qkv, kw)) * 0.5).astype(np.float32)

    def alloc(self, ops):
        return ops.state_alloc(1, self.qkv, self.kw, self.vh, self.kd, self.vd)

    def inputs(self, n, seed):
        rng = np.random.default_rng(seed)
        return (rng.standard_normal((n, self.qkv)).astype(np.float32),
                rng.standard_normal((n, self.vh)).astype(np.float32),
                rng.standard_normal((n, self.vh)).astype(np.float32))

    def random_state(self, seed):
        rng = np.random.default_rng(seed)
        return [rng.standard_normal((self.kw - 1, self.qkv)).astype(np.float32),
                (rng.standard_normal((self.vh, self.kd, self.vd)) * 0.3).astype(np.float32)]


def _delta(ops, shape, seqs, host=False):
    """seqs: [(inputs (mixed, a, b), start, state, prompt, snap)]; one gated_delta call over all."""
    rows, cat = step_rows(seqs)
    if host:
        out = cpu_dn.gated_delta(cat[0], cat[1], cat[2], shape.a_log, shape.dt_bias, rows, 0, shape.kh, ops.exact)
    else:
        out = cp.asnumpy(_delta_rows(ops, shape, cat, rows))
    return [out[lo:hi] for lo, hi in rows.bounds], rows


def _piece(x, lo, hi):
    return tuple(a[lo:hi] for a in x)


@pytest.mark.parametrize("dims", [SMALL, QWEN35_4B], ids=["small", "qwen35_4b"])
@pytest.mark.parametrize("n", [1, 5, C, 3 * C + 7])
def test_delta_rule_matches_cpu(gpu, dims, n):
    shape = Shape(*dims)
    x = shape.inputs(n, n)
    init = shape.random_state(n)
    cpu = CpuOps(exact=True)
    for prompt in (True, False):
        g, c = shape.alloc(gpu), shape.alloc(cpu)
        gpu.state_write(g, init)
        cpu.state_write(c, init)
        (got,), _ = _delta(gpu, shape, [(x, 64, g, prompt, ())])
        (ref,), _ = _delta(cpu, shape, [(x, 64, c, prompt, ())], host=True)
        assert _rel(got, ref) < 1e-4, f"prompt={prompt}: output error {_rel(got, ref):.2e}"
        ssm_got, ssm_ref = gpu.state_read(g)[1], cpu.state_read(c)[1]
        print(f"prompt={prompt}: output error {_rel(got, ref):.2e}, state error {_rel(ssm_got, ssm_ref):.2e}")
        assert _rel(ssm_got, ssm_ref) < 1e-4, f"prompt={prompt}: state error {_rel(ssm_got, ssm_ref):.2e}"


@pytest.mark.parametrize("dims", [SMALL, QWEN35_4B], ids=["small", "qwen35_4b"])
def test_prompt_pieces_at_chunk_ends_beside_neighbours_give_the_same_bits(gpu, dims):
    shape = Shape(*dims)
    n = 4 * C + 9
    x = shape.inputs(n, 2)
    whole = shape.alloc(gpu)
    (ref,), _ = _delta(gpu, shape, [(x, 0, whole, True, ())])
    for cuts in ([C, 3 * C], [2 * C], [C, 2 * C, 3 * C, 4 * C]):
        st = shape.alloc(gpu)
        got, edges = [], [0, *cuts, n]
        for i, (lo, hi) in enumerate(zip(edges, edges[1:], strict=False)):
            others = [(shape.inputs(hi - lo + i + 3, 10 + i), 5, shape.alloc(gpu), True, ()),
                      (shape.inputs(1, 20 + i), 40, shape.alloc(gpu), False, ())]
            outs, _ = _delta(gpu, shape, [others[0], (_piece(x, lo, hi), lo, st, True, ()), others[1]])
            got.append(outs[1])
        assert np.concatenate(got).tobytes() == ref.tobytes(), cuts
        assert gpu.state_read(st)[1].tobytes() == gpu.state_read(whole)[1].tobytes()


@pytest.mark.parametrize("dims", [SMALL, QWEN35_4B], ids=["small", "qwen35_4b"])
def test_decode_rows_are_the_same_bits_in_any_batch(gpu, dims):
    shape = Shape(*dims)
    x = shape.inputs(6, 4)
    alone, batched = shape.alloc(gpu), shape.alloc(gpu)
    for j in range(6):
        (a,), _ = _delta(gpu, shape, [(_piece(x, j, j + 1), 40 + j, alone, False, ())])
        neighbours = [(shape.inputs(1, 50 + k), 7, shape.alloc(gpu), False, ()) for k in range(j * 3)]
        outs, _ = _delta(gpu, shape, [*neighbours, (_piece(x, j, j + 1), 40 + j, batched, False, ()),
                                      (shape.inputs(3, 60 + j), 9, shape.alloc(gpu), True, ())])
        assert outs[len(neighbours)].tobytes() == a.tobytes()
    assert gpu.state_read(alone)[1].tobytes() == gpu.state_read(batched)[1].tobytes()


def test_exact_off_chunks_from_the_piece_start_so_unaligned_pieces_differ(gpu_off):
    shape = Shape(*SMALL)
    n = 2 * C + 3
    x = shape.inputs(n, 3)
    (ref,), _ = _delta(gpu_off, shape, [(x, 0, shape.alloc(gpu_off), True, ())])
    st = shape.alloc(gpu_off)
    first, _ = _delta(gpu_off, shape, [(_piece(x, 0, 5), 0, st, True, ())])
    rest, _ = _delta(gpu_off, shape, [(_piece(x, 5, n), 5, st, True, ())])
    got = np.concatenate([first[0], rest[0]])
    assert got.tobytes() != ref.tobytes()
    assert _rel(got, ref) < 1e-5


def _conv(ops, shape, x, rows, host=False):
    if host:
        return cpu_dn.conv1d_silu(x, shape.conv_w, rows, 0)
    return cp.asnumpy(ops.conv1d_silu(cp.asarray(x), cp.asarray(shape.conv_w), rows, 0))


def test_conv_matches_cpu_and_moves_its_window_on(gpu):
    shape = Shape(*SMALL)
    x = RNG.standard_normal((11, shape.qkv)).astype(np.float32)
    init = shape.random_state(6)
    cpu = CpuOps(exact=True)
    g, c = shape.alloc(gpu), shape.alloc(cpu)
    gpu.state_write(g, init)
    cpu.state_write(c, init)
    got = _conv(gpu, shape, x, RecurrentRows([(0, 11)], [3], [g], [True], [()]))
    ref = _conv(cpu, shape, x, RecurrentRows([(0, 11)], [3], [c], [True], [()]), host=True)
    assert _rel(got, ref) < 1e-6
    assert gpu.state_read(g)[0].tobytes() == x[-(shape.kw - 1) :].tobytes()
    g2 = shape.alloc(gpu)
    gpu.state_write(g2, init)
    parts = [_conv(gpu, shape, x[lo:hi], RecurrentRows([(0, hi - lo)], [3 + lo], [g2], [True], [()]))
             for lo, hi in ((0, 2), (2, 3), (3, 11))]
    assert np.concatenate(parts).tobytes() == got.tobytes()


def test_snapshots_at_chunk_ends_are_the_states_of_the_prefix_alone(gpu):
    shape = Shape(*QWEN35_4B)
    n = 3 * C + 2
    x = shape.inputs(n, 5)
    st = shape.alloc(gpu)
    rows = RecurrentRows([(0, n)], [0], [st], [True], [(C, 2 * C)])
    gpu.conv1d_silu(cp.asarray(x[0]), cp.asarray(shape.conv_w), rows, 0)
    _delta_rows(gpu, shape, x, rows)
    cp.cuda.get_current_stream().synchronize()
    assert set(rows.taken) == {(0, C), (0, 2 * C)}
    prefix = shape.alloc(gpu)
    pre_rows = RecurrentRows([(0, 2 * C)], [0], [prefix], [True], [()])
    gpu.conv1d_silu(cp.asarray(x[0][: 2 * C]), cp.asarray(shape.conv_w), pre_rows, 0)
    _delta_rows(gpu, shape, _piece(x, 0, 2 * C), pre_rows)
    conv, ssm = gpu.state_read(prefix)
    assert rows.taken[(0, 2 * C)][0].tobytes() == conv.tobytes()
    assert rows.taken[(0, 2 * C)][1].tobytes() == ssm.tobytes()


def _delta_rows(ops, shape, x, rows):
    t = cp.asarray
    return ops.gated_delta(t(x[0]), t(x[1]), t(x[2]), t(shape.a_log), t(shape.dt_bias), rows, 0, shape.kh)


def test_state_read_write_round_trip(gpu):
    shape = Shape(*SMALL)
    st = shape.alloc(gpu)
    data = shape.random_state(9)
    gpu.state_write(st, data)
    back = gpu.state_read(st)
    assert [a.tobytes() for a in back] == [a.tobytes() for a in data]


def test_gated_rms_norm_and_sigmoid_mul_match_cpu(gpu):
    x, gate = RNG.standard_normal((37, 128)).astype(np.float32), RNG.standard_normal((37, 128)).astype(np.float32)
    w = (1 + 0.1 * RNG.standard_normal(128)).astype(np.float32)
    got = cp.asnumpy(gpu.gated_rms_norm(cp.asarray(x), cp.asarray(w), cp.asarray(gate), 1e-6))
    assert _rel(got, cpu_dn.gated_rms_norm(x, w, gate, 1e-6)) < 1e-6
    one = cp.asnumpy(gpu.gated_rms_norm(cp.asarray(x[5:6]), cp.asarray(w), cp.asarray(gate[5:6]), 1e-6))
    assert one.tobytes() == got[5:6].tobytes()
    got = cp.asnumpy(gpu.sigmoid_mul(cp.asarray(x), cp.asarray(gate)))
    assert _rel(got, cpu_dn.sigmoid_mul(x, gate)) < 1e-6


@pytest.mark.parametrize("d,rot", [(256, 64), (64, 16)])
def test_gated_qk_norm_rope_gives_the_bits_of_rms_norm_then_rope(gpu, d, rot):
    from lockstep_kernels.base import RopeTable

    nh, nkv, t = 4, 2, 9
    y = cp.asarray(RNG.standard_normal((t, (2 * nh + 2 * nkv) * d + 8)).astype(np.float32))[:, :-8]
    qw, kw = (cp.asarray((1 + 0.1 * RNG.standard_normal(d)).astype(np.float32)) for _ in range(2))
    ang = np.arange(40)[:, None] * (1e-2 * np.arange(1, rot // 2 + 1))[None]
    table = RopeTable(cp.asarray(np.cos(ang).astype(np.float32)), cp.asarray(np.sin(ang).astype(np.float32)), True)
    pos = cp.asarray(np.array([3, 0, 39, 7, 7, 12, 1, 30, 2], np.int32))
    q, k, gate = gpu.gated_qk_norm_rope(y, nh, nkv, d, qw, kw, 1e-6, pos, table, rot)
    qg = y[:, : 2 * nh * d].reshape(t, nh, 2 * d)
    rq = gpu.rms_norm(qg[:, :, :d].reshape(-1, d), qw, 1e-6).reshape(t, nh, d)
    rk = gpu.rms_norm(y[:, 2 * nh * d : (2 * nh + nkv) * d].reshape(-1, d), kw, 1e-6).reshape(t, nkv, d)
    rq[..., :rot] = gpu.rope(rq[..., :rot], pos, table)
    rk[..., :rot] = gpu.rope(rk[..., :rot], pos, table)
    assert cp.asnumpy(q).tobytes() == cp.asnumpy(rq).tobytes()
    assert cp.asnumpy(k).tobytes() == cp.asnumpy(rk).tobytes()
    assert cp.asnumpy(gate).tobytes() == cp.asnumpy(qg[:, :, d:].reshape(t, nh * d)).tobytes()

# --- a tiny qwen3_5 on the CUDA backend against the CPU backend


@pytest.fixture(scope="module", params=[{}, {"heads": 2, "kv_heads": 1, "head_dim": 256}, {"moe": True}],
                ids=["head_dim_32", "head_dim_256", "moe"])
def hybrid(request, tmp_path_factory):
    from engine.loader import load_model
    from tests.tiny_hybrid import make_hybrid_model

    return load_model(make_hybrid_model(tmp_path_factory.mktemp("hybrid"), **request.param))


def _prompt(loaded, n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(4, loaded.config.vocab_size, n)]


def _run(runner, tokens, pieces, neighbour=None, decode=4):
    """Logits of every prompt row (prompt in `pieces`), then of `decode` more tokens fed one a step
    (fixed ones: a near tie cannot send two backends down different paths); `neighbour` (a token
    list) runs its prompt in the same steps, one piece per step, then decodes beside it."""
    from engine.runner import StepEntry

    pages = runner.pool.alloc(2)
    state = runner.new_state()
    other = (runner.pool.alloc(2), runner.new_state()) if neighbour else None
    out, edges = [], [0, *pieces, len(tokens)]
    for i, (lo, hi) in enumerate(zip(edges, edges[1:], strict=False)):
        entries = [StepEntry(pages, tokens[lo:hi], lo, "all", state=state, prompt=True)]
        if other:
            o0 = min(len(neighbour), 13 * i)
            entries.append(StepEntry(other[0], neighbour[o0 : o0 + 13] or [7], o0, "last", state=other[1],
                                     prompt=True))
        out.append(runner.step(entries)[0].logits)
    for j, tok in enumerate(_prompt(runner, decode, seed=9)):
        pos = len(tokens) + j
        entries = [StepEntry(pages, [tok], pos, "last", state=state)]
        if other:
            entries.append(StepEntry(other[0], [3], 100 + pos, "last", state=other[1]))
        out.append(runner.step(entries)[0].logits)
    return np.concatenate(out)


def test_tiny_qwen3_5_logits_match_the_cpu_backend(hybrid):
    from engine.runner import Runner, make_ops

    tokens = _prompt(hybrid, 3 * C + 5)
    ref = _run(Runner(hybrid, make_ops("cpu", True), 4, "f32"), tokens, [16, 48, 80])
    got = _run(Runner(hybrid, CudaOps(exact=True), 4, "f32"), tokens, [C, 3 * C])
    assert got.shape == ref.shape
    err = _rel(got, ref)
    print(f"tiny qwen3_5 logits, CUDA vs CPU: relative L2 error {err:.3e} over {got.shape[0]} rows")
    assert err < 1e-3, f"relative L2 error {err:.2e}"


def test_tiny_qwen3_5_bits_do_not_depend_on_pieces_or_neighbours(hybrid):
    from engine.runner import Runner

    runner = Runner(hybrid, CudaOps(exact=True), 8, "f32")
    tokens = _prompt(hybrid, 3 * C + 5)
    whole = _run(runner, tokens, [])
    cut = _run(runner, tokens, [C, 2 * C], neighbour=_prompt(hybrid, 40, seed=1))
    assert cut.tobytes() == whole.tobytes()


def test_tiny_qwen3_5_decode_graphs_give_the_uncaptured_bits(hybrid):
    from engine.runner import Runner

    tokens = _prompt(hybrid, 2 * C + 3)
    neighbour = _prompt(hybrid, 30, seed=2)
    eager = _run(Runner(hybrid, CudaOps(exact=True), 8, "f32"), tokens, [C], neighbour=neighbour, decode=6)
    graphed = Runner(hybrid, CudaOps(exact=True), 8, "f32", max_pages_per_seq=2)
    assert graphed.graphs is not None
    got = _run(graphed, tokens, [C], neighbour=neighbour, decode=6)
    assert sorted(graphed.graphs._graphs) == [2]  # the decode steps replayed the 2-row graph
    assert got.tobytes() == eager.tobytes()
    solo = _run(graphed, tokens, [C], decode=6)
    assert 1 in graphed.graphs._graphs and solo.tobytes() == got.tobytes()


def test_exact_off_takes_no_delta_state_inside_its_chunks(gpu_off):
    """Off, chunks start at the piece's first row (5 here): position 32 lies inside one, 37 ends one."""
    shape = Shape(*SMALL)
    x = shape.inputs(40, 8)
    rows = RecurrentRows([(0, 40)], [5], [shape.alloc(gpu_off)], [True], [(32, 37)])
    gpu_off.conv1d_silu(cp.asarray(x[0]), cp.asarray(shape.conv_w), rows, 0)
    _delta_rows(gpu_off, shape, x, rows)
    cp.cuda.get_current_stream().synchronize()
    assert len(rows.taken[(0, 32)]) == 1 and len(rows.taken[(0, 37)]) == 2
