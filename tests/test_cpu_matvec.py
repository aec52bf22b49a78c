"""The CPU backend's vector row kernel over 16-bit weights (lockstep_kernels/cpu/matvec.py) and the worker threads
that share its weight rows (lockstep_kernels/cpu/workers.py): close to a float64 reference, and the same bits
for a row alone, inside any batch, and split across any number of threads."""

import multiprocessing
import threading
import time

import numpy as np
import pytest

from lockstep_kernels.cpu import matvec, workers
from lockstep_kernels.cpu.ops import CpuOps, GateUp
from lockstep_kernels.weights import Weight

RNG = np.random.default_rng(20261202)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _bits(w: Weight) -> np.ndarray:
    bits = np.ascontiguousarray(w.data).view(np.uint16)
    bits.flags.writeable = False
    return bits


def _dots(x, w: Weight, residual=None):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    res = out if residual is None else residual
    matvec.blocked_rows_16(x, _bits(w), {"f16": 1, "bf16": 2}[w.dtype], out, 0, res, residual is not None, 0, w.shape[0])
    return out


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("k", [64, 384, 1024])
def test_products_match_a_float64_reference(dtype, k):
    w = Weight.from_f32(_rand(200, k) * 0.1, dtype)
    x, res = _rand(6, k), _rand(6, 200)
    ref = x.astype(np.float64) @ w.to_f32().astype(np.float64).T
    scale = np.abs(x).astype(np.float64) @ np.abs(w.to_f32()).astype(np.float64).T  # error bound per element
    got = _dots(x, w)
    assert np.all(np.abs(got - ref) <= 1e-6 * scale + 1e-30)
    with_res = _dots(x, w, res)
    assert with_res.tobytes() == (res + got).tobytes()  # the residual is one rounding after the product


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_row_gets_the_same_bits_in_every_batch_size(dtype):
    """Rows go through the kernel in groups of matvec.GROUP and one by one: both give a row one result."""
    w = Weight.from_f32(_rand(70, 384), dtype)
    row = _rand(384)
    alone = _dots(row[None], w)[0]
    for b in range(2, 3 * matvec.GROUP + 2):
        x = _rand(b, 384)
        for i in {0, b // 2, b - 1}:
            x[i] = row
            assert _dots(x, w)[i].tobytes() == alone.tobytes(), f"batch {b}, row {i}"


def _awake(pool: workers.Workers) -> None:
    """Wakes the pool and polls until every worker spins on its control word."""
    deadline = time.monotonic() + 30
    pool.wake()
    while pool.ctl[workers.AWAKE] < pool.n - 1:
        assert time.monotonic() < deadline, "the workers did not wake"
        pool.wake()


@pytest.mark.parametrize("n_threads", [2, 3])
def test_split_products_equal_the_calling_threads_bits(n_threads):
    pool = workers.Workers(n_threads)
    try:
        for trial in range(60):  # products back to back, as a decode step issues them
            t = int(RNG.integers(1, 9))
            n, k = int(RNG.integers(1, 2000)), 64 * int(RNG.integers(1, 9))
            w = Weight.from_f32(_rand(n, k), "f16" if trial % 2 else "bf16")
            x, res = _rand(t, k), _rand(t, n)
            residual = bool(trial % 3 == 0)
            want = _dots(x, w, res if residual else None)
            out = np.full((t, n), np.nan, np.float32)  # a chunk nobody computed shows
            bits = _bits(w)
            _awake(pool)  # else the caller alone may compute every chunk, and the split is never tested
            workers.split_dots(pool.ctl, x.ctypes.data, t, k, bits.ctypes.data, 1 if w.dtype == "f16" else 2,
                               out.ctypes.data, n, res.ctypes.data, residual, n)
            assert out.tobytes() == want.tobytes(), f"trial {trial}"
    finally:
        pool.stop()


def test_the_caller_computes_everything_while_the_workers_sleep():
    pool = workers.Workers(2)
    pool.stop()  # no worker claims anything
    w = Weight.from_f32(_rand(300, 128), "f16")
    x = _rand(3, 128)
    out = np.empty((3, 300), np.float32)
    bits = _bits(w)
    workers.split_dots(pool.ctl, x.ctypes.data, 3, 128, bits.ctypes.data, 1, out.ctypes.data, 300, out.ctypes.data,
                       False, 300)
    assert out.tobytes() == _dots(x, w).tobytes()


def test_the_engines_ops_give_the_same_bits_on_one_thread_and_two():
    """Norm + product, the gated product and the FFN on shapes the vector kernel takes, split or not."""
    one, two = CpuOps(exact=True, threads=1), CpuOps(exact=True, threads=2)
    assert two.threads == 2  # numba's pool caps it (NUMBA_NUM_THREADS): one and one would prove nothing
    hidden, ffn = 128, 1024
    nw = _rand(hidden)
    gu = GateUp(Weight.from_f32(_rand(2 * ffn, hidden) * 0.1, "f16"))
    down = Weight.from_f32(_rand(hidden, ffn) * 0.05, "f16")
    head = Weight.from_f32(_rand(4096, hidden) * 0.1, "f16")
    down_t = Weight.from_f32(_rand(hidden, 4096) * 0.05, "f16")  # a residual product large enough to split
    res, wide = _rand(7, hidden), _rand(7, 4096)
    for t in (1, 4, 7):
        x = _rand(t, hidden)
        for name, a, b in (("ffn", one.ffn(x, nw, 1e-5, gu, down), two.ffn(x, nw, 1e-5, gu, down)),
                           ("norm_matmul", one.norm_matmul(x, nw, 1e-5, head), two.norm_matmul(x, nw, 1e-5, head)),
                           ("gated", one.matmul(x, gu), two.matmul(x, gu)),
                           ("residual", one.matmul(wide[:t], down_t, residual=res[:t]),
                            two.matmul(wide[:t], down_t, residual=res[:t]))):
            assert a.tobytes() == b.tobytes(), f"{name}, rows {t}"


def test_the_files_that_cache_copies_of_the_kernel_change_with_it():
    from lockstep_kernels.cpu import compiled, fused, jobs, layer

    assert (compiled.MATVEC_EPOCH == fused.MATVEC_EPOCH == layer.MATVEC_EPOCH == workers.MATVEC_EPOCH
            == jobs.MATVEC_EPOCH == matvec.EPOCH)


def test_two_threads_computing_at_once_share_the_workers_in_turn():
    import threading

    ops = CpuOps(exact=True, threads=2)
    w = Weight.from_f32(_rand(2048, 256) * 0.1, "f16")
    xs = [_rand(3, 256) for _ in range(4)]  # each thread alternates two: a product left unwritten shows
    want = [ops.matmul(x, w).tobytes() for x in xs]
    bad = []

    def run(i: int) -> None:
        for n in range(200):
            j = 2 * i + n % 2
            if ops.matmul(xs[j], w).tobytes() != want[j]:
                bad.append(j)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and not bad


def _split_in(pool: workers.Workers, x, bits) -> bytes:
    out = np.full((x.shape[0], bits.shape[0]), np.nan, np.float32)  # a chunk nobody computed shows
    _awake(pool)
    workers.split_dots(pool.ctl, x.ctypes.data, x.shape[0], x.shape[1], bits.ctypes.data, 1, out.ctypes.data,
                       bits.shape[0], out.ctypes.data, False, bits.shape[0])
    return out.tobytes()


def _in_forked_child(parent_pool_id: int, x, bits, queue) -> None:
    pool = workers.pool(2)
    alive = [t.is_alive() for t in threading.enumerate() if t.name == "lockstep-cpu-worker"]
    queue.put((id(pool) != parent_pool_id, alive, _split_in(pool, x, bits)))


def test_a_forked_child_gets_live_workers_and_the_parents_bits():
    """The pool is reset at fork (workers.py): the child's workers are live threads, its split products
    the parent's bits. Driven through workers.pool / split_dots as CpuOps does: a CpuOps built in the
    child would first run numba's parallel warm-up, which GNU OpenMP refuses after a fork."""
    w = Weight.from_f32(_rand(300, 128), "f16")
    x, bits = _rand(3, 128), _bits(w)
    parent = workers.pool(2)
    assert _split_in(parent, x, bits) == _dots(x, w).tobytes()  # the parent's workers are up when it forks
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_forked_child, args=(id(parent), x, bits, queue))
    child.start()
    fresh, alive, got = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert fresh and alive == [True]  # without the reset: the parent's pool, and no worker thread in the child
    assert got == _dots(x, w).tobytes()
