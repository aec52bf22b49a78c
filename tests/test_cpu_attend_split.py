"""A layer's attention, a (row, KV head) a task, shared with the worker threads (lockstep_kernels/cpu/jobs.py): the bits of
attend.attend_rows whichever thread computes a row, for every KV type, rows alone or among others,
and with split products and split attention published back to back on one control word."""

import time

import numpy as np
import pytest

from lockstep_kernels.base import PAGE_SIZE
from lockstep_kernels.cpu import attend, jobs, matvec, workers
from lockstep_kernels.weights import f32_to_bf16
from tests.test_cpu_matvec import _awake

RNG = np.random.default_rng(20261203)
N_KV, GROUP, HD, N_PAGES = 2, 3, 64, 12


def _pages(kv_type: str):
    x = RNG.standard_normal((N_PAGES, PAGE_SIZE, N_KV, HD)).astype(np.float32)
    return {"f32": (x, 0), "f16": (x.astype(np.float16).view(np.uint16), 1),
            "bf16": (f32_to_bf16(x).view(np.uint16), 2)}[kv_type]


def _batch(t: int):
    """t query rows of t sequences, two pages each in shuffled physical order, at positions up to two pages."""
    q = RNG.standard_normal((t, N_KV, GROUP, HD)).astype(np.float32)
    pos = RNG.integers(0, 2 * PAGE_SIZE, t).astype(np.int64)
    tables = np.array([RNG.permutation(N_PAGES)[:2] for _ in range(t)], np.int64)
    return q, pos, np.arange(t, dtype=np.int64), tables


def _reference(q, k, v, kind, pos, seqs, tables):
    out = np.empty_like(q)
    attend.attend_rows(q, k, v, kind, pos, seqs, tables, PAGE_SIZE, out)
    return out


@pytest.fixture
def pool():
    p = workers.Workers(2)
    yield p
    p.stop()


@pytest.mark.parametrize("kv_type", ["f32", "f16", "bf16"])
def test_split_attention_gives_attend_rows_bits(pool, kv_type):
    (k, kind), (v, _) = _pages(kv_type), _pages(kv_type)
    for t in (1, 2, 4, 7):
        q, pos, seqs, tables = _batch(t)
        want = _reference(q, k, v, kind, pos, seqs, tables).tobytes()
        for _ in range(10):
            out = np.full_like(q, np.nan)  # a row nobody computed shows
            _awake(pool)
            jobs.split_attend(pool.ctl, q, k, v, kind, pos, seqs, tables, PAGE_SIZE, out)
            assert out.tobytes() == want, f"{t} rows"


def test_rows_the_workers_compute_alone_have_the_callers_bits(pool):
    """The job published and left to the workers (the caller claims nothing): every task is a worker's."""
    (k, kind), (v, _) = _pages("f16"), _pages("f16")
    q, pos, seqs, tables = _batch(5)
    out = np.full_like(q, np.nan)
    n = jobs.publish_attend(pool.ctl, q, k.ctypes.data, v.ctypes.data, N_PAGES, kind, pos, seqs, tables, PAGE_SIZE,
                            out)
    deadline = time.monotonic() + 60
    while pool.ctl[workers.DONE] < n:  # a worker that went back to sleep before the job was open is woken again
        assert time.monotonic() < deadline, "the workers did not compute the job"
        pool.wake()
    assert out.tobytes() == _reference(q, k, v, kind, pos, seqs, tables).tobytes()


def test_a_row_alone_and_among_random_sequences(pool):
    (k, kind), (v, _) = _pages("bf16"), _pages("bf16")
    q1, pos1, seqs1, tables1 = _batch(1)
    alone = np.empty_like(q1)
    _awake(pool)
    jobs.split_attend(pool.ctl, q1, k, v, kind, pos1, seqs1, tables1, PAGE_SIZE, alone)
    for t in (3, 6):
        q, pos, seqs, tables = _batch(t)
        i = t // 2
        q[i], pos[i], tables[i] = q1[0], pos1[0], tables1[0]
        out = np.empty_like(q)
        _awake(pool)
        jobs.split_attend(pool.ctl, q, k, v, kind, pos, seqs, tables, PAGE_SIZE, out)
        assert out[i].tobytes() == alone[0].tobytes(), f"row {i} of {t}"


def test_products_and_attention_back_to_back_on_one_control_word(pool):
    """A decode layer publishes products and attention in turn: each job is computed as its own kind."""
    (k, kind), (v, _) = _pages("f16"), _pages("f16")
    w = (RNG.standard_normal((700, 128)) * 0.1).astype(np.float16).view(np.uint16)
    w.flags.writeable = False
    for trial in range(20):
        t = 1 + trial % 5
        x = RNG.standard_normal((t, 128)).astype(np.float32)
        want_dots = np.empty((t, 700), np.float32)
        matvec.blocked_rows_16(x, w, 1, want_dots, 0, want_dots, False, 0, 700)
        q, pos, seqs, tables = _batch(t)
        dots, att = np.full((t, 700), np.nan, np.float32), np.full_like(q, np.nan)
        _awake(pool)
        workers.split_dots(pool.ctl, x.ctypes.data, t, 128, w.ctypes.data, 1, dots.ctypes.data, 700,
                           dots.ctypes.data, False, 700)
        jobs.split_attend(pool.ctl, q, k, v, kind, pos, seqs, tables, PAGE_SIZE, att)
        assert dots.tobytes() == want_dots.tobytes(), f"trial {trial}: product"
        assert att.tobytes() == _reference(q, k, v, kind, pos, seqs, tables).tobytes(), f"trial {trial}: attention"


def test_the_files_that_cache_copies_of_the_attention_change_with_it():
    from lockstep_kernels.cpu import layer

    assert jobs.ATTEND_EPOCH == layer.ATTEND_EPOCH == attend.EPOCH
