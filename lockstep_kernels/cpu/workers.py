"""Persistent worker threads that share a 16-bit matvec's weight rows with the calling thread.

A numba `prange` region wakes its pool for every call, which costs more than a decode step's small
products save. Here the workers stay in compiled code between products, spinning on one control
word, and go back to sleep (a threading.Event) after IDLE_S without work. The caller publishes a
product (addresses and shapes), then caller and workers claim chunks of CHUNK weight rows from the
control word until none is left; a chunk's outputs are computed by matvec.dots_at whoever claims
it, so neither the split nor the thread count can change a bit. The caller never waits for a
worker that has not claimed a chunk: with the workers asleep it computes every chunk itself.

Control word: the product's sequence number (high 32 bits) | the next chunk to claim (low 32 bits).
While the caller writes a product's fields the low half is BUSY, so no stale claim can succeed.
"""

from __future__ import annotations

import os
import platform
import threading
import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from lockstep_kernels.cpu.matvec import _FLAGS, dots_at

MATVEC_EPOCH = 6  # numba caches a function keyed on its own file only: bump with matvec.EPOCH, or a stale copy runs
CHUNK = 32  # weight rows per claim
SPINS = 64  # pauses before a waiting thread starts yielding its core
IDLE_S = 0.0005  # a worker spins this long without work before it sleeps (a decode step's gaps are shorter)
BUSY = 0xFFFFFFFF
LOW = 0xFFFFFFFF
# ctl words, one cache line apart where threads write them
WORD, DONE, AWAKE, STOP = 0, 8, 16, 24
N_CHUNKS, XA, T, K, WA, KIND, OA, N_OUT, RA, RESIDUAL, N_ROWS, JOB = range(32, 44)
ARGS = 44  # from here the words of a job other than a product (lockstep_kernels/cpu/jobs.py)
CTL_WORDS = 64
DOTS = 0  # JOB: a split product
_I64 = ir.IntType(64)


def _ptr(context, builder, aryty, ary, idx):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.gep(data, [idx])


@intrinsic
def _load(typingctx, ctl, i):
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_ptr(context, builder, sig.args[0], args[0], args[1]), "seq_cst", 8)
    return types.int64(ctl, i), codegen


@intrinsic
def _store(typingctx, ctl, i, v):
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _ptr(context, builder, sig.args[0], args[0], args[1]), "seq_cst", 8)
        return context.get_dummy_value()
    return types.void(ctl, i, types.int64), codegen


@intrinsic
def _cas(typingctx, ctl, i, old, new):
    def codegen(context, builder, sig, args):
        res = builder.cmpxchg(_ptr(context, builder, sig.args[0], args[0], args[1]), args[2], args[3], "seq_cst")
        return builder.zext(builder.extract_value(res, 1), ir.IntType(8))
    return types.uint8(ctl, i, types.int64, types.int64), codegen


@intrinsic
def _add(typingctx, ctl, i, v):
    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _ptr(context, builder, sig.args[0], args[0], args[1]), args[2], "seq_cst")
    return types.int64(ctl, i, types.int64), codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
_HAS_YIELD = hasattr(os, "sched_yield")


@intrinsic
def _pause(typingctx):
    """A spin-wait hint (x86 `pause`), nothing elsewhere."""
    def codegen(context, builder, sig, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _cycles(typingctx):
    """The CPU's cycle counter (rdtsc on x86): a clock that costs no system call."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, []), "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@intrinsic
def _yield(typingctx):
    """sched_yield(): under load a spinning thread gives its core to the one it waits for."""
    def codegen(context, builder, sig, args):
        if _HAS_YIELD:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@njit(**_FLAGS)
def _wait(spins):
    """One turn of a spin-wait: a pause at first, then a yield of the core."""
    if spins < SPINS:
        _pause()
    else:
        _yield()


@njit(**_FLAGS)
def _chunk(ctl, c):
    n = _load(ctl, N_ROWS)
    j0 = c * CHUNK
    dots_at(_load(ctl, XA), _load(ctl, T), _load(ctl, K), _load(ctl, WA), _load(ctl, KIND), _load(ctl, OA),
            _load(ctl, N_OUT), _load(ctl, RA), _load(ctl, RESIDUAL) != 0, j0, min(n, j0 + CHUNK))


@njit(**_FLAGS)
def _claim_all(ctl, n_chunks):
    """Claims and computes chunks of the published product until none is left."""
    while True:
        c = claim(ctl, n_chunks)
        if c < 0:
            return
        _chunk(ctl, c)
        _add(ctl, DONE, 1)


@njit(**_FLAGS)
def split_dots(ctl, xa, t, k, wa, kind, oa, n_out, ra, residual, n):
    """matvec.dots_at over weight rows 0..n, shared with the workers that are awake."""
    seq = begin(ctl)
    n_chunks = (n + CHUNK - 1) // CHUNK
    _store(ctl, XA, xa)
    _store(ctl, T, t)
    _store(ctl, K, k)
    _store(ctl, WA, wa)
    _store(ctl, KIND, kind)
    _store(ctl, OA, oa)
    _store(ctl, N_OUT, n_out)
    _store(ctl, RA, ra)
    _store(ctl, RESIDUAL, 1 if residual else 0)
    _store(ctl, N_ROWS, n)
    _store(ctl, JOB, DOTS)
    publish(ctl, seq, n_chunks)
    _claim_all(ctl, n_chunks)
    finish(ctl, n_chunks)


@njit(**_FLAGS)
def begin(ctl):
    """Marks the control word busy for a new job's fields; returns the job's sequence number."""
    seq = (_load(ctl, WORD) >> 32) + 1
    _store(ctl, WORD, (seq << 32) | BUSY)
    return seq


@njit(**_FLAGS)
def publish(ctl, seq, n_chunks):
    """The job's fields are written: its chunks may be claimed."""
    _store(ctl, N_CHUNKS, n_chunks)
    _store(ctl, DONE, 0)
    _store(ctl, WORD, seq << 32)


@njit(**_FLAGS)
def claim(ctl, n_chunks):
    """The next chunk of the open job for this thread, or -1 when none is left."""
    while True:
        word = _load(ctl, WORD)
        c = word & LOW
        if c >= n_chunks:
            return -1
        if _cas(ctl, WORD, word, word + 1):
            return c


@njit(**_FLAGS)
def finish(ctl, n_chunks):
    """Waits until every claimed chunk is computed (a worker finishes a chunk it claimed)."""
    spins = 0
    while _load(ctl, DONE) < n_chunks:
        spins += 1
        _wait(spins)


@njit(**_FLAGS)
def _bump(ctl, i, v):
    _add(ctl, i, v)


class Workers:
    """n - 1 worker threads beside the calling one; `wake()` before a product rouses sleeping ones."""

    def __init__(self, n: int):
        self.ctl = np.zeros(CTL_WORDS, np.int64)
        self.lock = threading.Lock()  # split_dots has one publisher at a time: callers hold this
        self.n = n
        self._events = [threading.Event() for _ in range(n - 1)]
        self._idle_ticks = _calibrate()
        for ev in self._events:
            threading.Thread(target=self._run, args=(ev,), daemon=True, name="lockstep-cpu-worker").start()

    def _run(self, ev: threading.Event) -> None:
        from lockstep_kernels.cpu import jobs  # it imports the kernels, which import this module

        while not self.ctl[STOP]:
            ev.wait()
            ev.clear()
            _bump(self.ctl, AWAKE, 1)
            jobs.serve(self.ctl, self._idle_ticks)
            _bump(self.ctl, AWAKE, -1)

    def wake(self) -> None:
        if self.ctl[AWAKE] < self.n - 1:
            for ev in self._events:
                ev.set()

    def stop(self) -> None:
        self.ctl[STOP] = 1
        for ev in self._events:
            ev.set()


def _calibrate() -> int:
    """Cycle-counter ticks in IDLE_S."""
    c0, t0 = _ticks(), time.perf_counter()
    time.sleep(0.01)
    return max(1, int((_ticks() - c0) / (time.perf_counter() - t0) * IDLE_S))


@njit(**_FLAGS)
def _ticks():
    return _cycles()


_POOL: Workers | None = None
_LOCK = threading.Lock()


def pool(n: int) -> Workers:
    """The process's workers (one pool: the thread count is fixed per process, engine/threads.py)."""
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL.n != n:
            if _POOL is not None:
                _POOL.stop()
            _POOL = Workers(n)
        return _POOL


def _forget_in_child() -> None:
    """A forked child has only the forking thread: the pool's workers are gone and its counters are the
    parent's (AWAKE may count workers that no longer exist, so wake() would rouse none); the lock may
    have been held by a parent thread. The child starts its own pool on first use."""
    global _POOL, _LOCK
    _POOL, _LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
