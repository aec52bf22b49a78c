"""The CPU recurrent ops of hybrid models: chunked against token-by-token, and bit-exact schedules."""

import numpy as np
import pytest

from lockstep_kernels.base import RecurrentRows
from lockstep_kernels.cpu import deltanet as dn

K_HEADS, V_HEADS, K_DIM, V_DIM, KERNEL = 2, 4, 8, 6, 4
QKV = 2 * K_HEADS * K_DIM + V_HEADS * V_DIM
C = dn.CHUNK


def _inputs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    mixed = rng.standard_normal((n, QKV)).astype(np.float32)
    a = rng.standard_normal((n, V_HEADS)).astype(np.float32)
    b = rng.standard_normal((n, V_HEADS)).astype(np.float32)
    return mixed, a, b


A_LOG = np.log(np.linspace(0.5, 3.0, V_HEADS)).astype(np.float32)
DT_BIAS = np.linspace(-0.5, 0.5, V_HEADS).astype(np.float32)


def _state():
    return dn.state_alloc(1, QKV, KERNEL, V_HEADS, K_DIM, V_DIM)


def step_rows(seqs) -> tuple[RecurrentRows, list[np.ndarray]]:
    """seqs: [(inputs, start, state, prompt, snap)] -> one step's rows and its inputs, concatenated."""
    bounds, at = [], 0
    for (m, *_), *_ in seqs:
        bounds.append((at, at + len(m)))
        at += len(m)
    rows = RecurrentRows(bounds, [s[1] for s in seqs], [s[2] for s in seqs], [s[3] for s in seqs],
                         [s[4] for s in seqs])
    return rows, [np.concatenate([s[0][j] for s in seqs]) for j in range(len(seqs[0][0]))]


def _run(seqs, exact=True):
    """One gated_delta call over all of seqs (see step_rows)."""
    rows, cat = step_rows(seqs)
    out = dn.gated_delta(cat[0], cat[2], cat[1], A_LOG, DT_BIAS, rows, 0, K_HEADS, exact)
    return [out[lo:hi] for lo, hi in rows.bounds], rows


def _piece(x, lo, hi):
    return tuple(a[lo:hi] for a in x)


@pytest.mark.parametrize("n", [1, 5, C, 3 * C + 7])
def test_chunked_matches_token_by_token(n):
    x = _inputs(n, 1)
    chunked, recurrent = _state(), _state()
    (a,), _ = _run([(x, 0, chunked, True, ())])
    (b,), _ = _run([(x, 0, recurrent, False, ())])
    assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(b).max())
    assert np.abs(chunked[0].ssm - recurrent[0].ssm).max() <= 1e-5 * max(1.0, np.abs(recurrent[0].ssm).max())


def test_prompt_pieces_at_chunk_ends_and_neighbours_give_the_same_bits():
    n = 4 * C + 9
    x = _inputs(n, 2)
    whole = _state()
    (ref,), _ = _run([(x, 0, whole, True, ())])
    for cuts in ([C, 3 * C], [2 * C], [C, 2 * C, 3 * C, 4 * C]):
        st = _state()
        got, edges = [], [0, *cuts, n]
        for i, (lo, hi) in enumerate(zip(edges, edges[1:], strict=False)):
            other = _inputs(hi - lo + i + 3, 10 + i)  # a neighbour sharing the call, other length and start
            outs, _ = _run([(other, 5, _state(), True, ()), (_piece(x, lo, hi), lo, st, True, ())])
            got.append(outs[1])
        assert np.concatenate(got).tobytes() == ref.tobytes(), cuts
        assert st[0].ssm.tobytes() == whole[0].ssm.tobytes()


def test_exact_off_chunks_from_the_piece_start_so_unaligned_pieces_differ():
    n = 2 * C + 3
    x = _inputs(n, 3)
    (ref,), _ = _run([(x, 0, _state(), True, ())], exact=False)
    st = _state()
    first, _ = _run([(_piece(x, 0, 5), 0, st, True, ())], exact=False)
    rest, _ = _run([(_piece(x, 5, n), 5, st, True, ())], exact=False)
    assert np.concatenate([first[0], rest[0]]).tobytes() != ref.tobytes()
    assert np.abs(np.concatenate([first[0], rest[0]]) - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())


def test_decode_rows_are_the_same_bits_in_any_batch():
    x = _inputs(6, 4)
    alone, batched = _state(), _state()
    for j in range(6):
        (a,), _ = _run([(_piece(x, j, j + 1), 40 + j, alone, False, ())])
        outs, _ = _run([(_inputs(1, 50 + j), 7, _state(), False, ()), (_piece(x, j, j + 1), 40 + j, batched, False, ()),
                        (_inputs(3, 60 + j), 9, _state(), True, ())])
        assert outs[1].tobytes() == a.tobytes()
    assert alone[0].ssm.tobytes() == batched[0].ssm.tobytes()


def test_snapshot_at_a_chunk_end_is_the_state_of_the_prefix_alone():
    n = 3 * C + 2
    x = _inputs(n, 5)
    _, rows = _run([(x, 0, _state(), True, (C, 2 * C))])
    prefix = _state()
    _run([(_piece(x, 0, 2 * C), 0, prefix, True, ())])
    assert rows.taken[(0, 2 * C)][0].tobytes() == prefix[0].ssm.tobytes()
    assert set(rows.taken) == {(0, C), (0, 2 * C)}


def test_conv_matches_a_direct_convolution_and_moves_its_window_on():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((11, QKV)).astype(np.float32)
    w = rng.standard_normal((QKV, KERNEL)).astype(np.float32)
    st = _state()
    whole = dn.conv1d_silu(x, w, RecurrentRows([(0, 11)], [0], [st], [True], [()]), 0)
    padded = np.concatenate([np.zeros((KERNEL - 1, QKV), np.float32), x])
    direct = sum(padded[j : j + 11] * w[:, j] for j in range(KERNEL))
    assert np.abs(whole - direct / (1 + np.exp(-direct))).max() <= 1e-6
    assert st[0].conv.tobytes() == x[-(KERNEL - 1) :].tobytes()
    st2 = _state()
    parts = [dn.conv1d_silu(x[lo:hi], w, RecurrentRows([(0, hi - lo)], [lo], [st2], [True], [()]), 0)
             for lo, hi in ((0, 2), (2, 3), (3, 11))]
    assert np.concatenate(parts).tobytes() == whole.tobytes()
