"""What the worker threads of workers.py run: chunks of a split product (workers.split_dots) and rows of a
layer's attention (split_attend), and the loop each worker spins in between.

Attention is split one (row, KV head) a claim: a task's arithmetic is attend.attend_range's whichever
thread claims it, so neither the split nor the thread count can change a bit (tests/test_cpu_attend_split.py).
At decode each row is a sequence with its own keys, so a batch's attention (and a lone row's heads) no
longer waits on one thread while the others spin.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from lockstep_kernels.cpu.attend import attend_range
from lockstep_kernels.cpu.matvec import _FLAGS
from lockstep_kernels.cpu.workers import (
    ARGS,
    CTL_WORDS,
    DONE,
    JOB,
    LOW,
    N_CHUNKS,
    STOP,
    WORD,
    _add,
    _cas,
    _chunk,
    _cycles,
    _load,
    _store,
    _wait,
    begin,
    claim,
    finish,
    publish,
)

MATVEC_EPOCH = 6  # numba caches a function keyed on its own file only: bump with matvec.EPOCH, or a stale copy runs
ATTEND_EPOCH = 5  # bump with attend.EPOCH
ATTEND = 1  # JOB: attention rows
# the attention job's words from ARGS on
QA, KA, VA, KIND, PA, SA, TA, OA, T, N_KV, GROUP, HD, N_PAGES, PAGE, N_SEQS, WIDTH = range(ARGS, ARGS + 16)


@intrinsic
def _at(typingctx, addr):
    """An address as a pointer (carray's)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


@njit(**_FLAGS)
def _attend_at(ctl, c):
    """Task c (row c // kv, KV head c % kv) of the published attention job, its arrays rebuilt from their
    addresses and shapes."""
    t, n_kv, group, hd = _load(ctl, T), _load(ctl, N_KV), _load(ctl, GROUP), _load(ctl, HD)
    q = carray(_at(_load(ctl, QA)), (t, n_kv, group, hd), np.float32)
    out = carray(_at(_load(ctl, OA)), (t, n_kv, group, hd), np.float32)
    positions = carray(_at(_load(ctl, PA)), (t,), np.int64)
    seqs = carray(_at(_load(ctl, SA)), (t,), np.int64)
    tables = carray(_at(_load(ctl, TA)), (_load(ctl, N_SEQS), _load(ctl, WIDTH)), np.int64)
    kind, page = _load(ctl, KIND), _load(ctl, PAGE)
    shape = (_load(ctl, N_PAGES), page, n_kv, hd)
    if kind == 0:
        k, v = carray(_at(_load(ctl, KA)), shape, np.float32), carray(_at(_load(ctl, VA)), shape, np.float32)
        attend_range(q, k, v, kind, positions, seqs, tables, page, out, c, c + 1)
    else:
        k, v = carray(_at(_load(ctl, KA)), shape, np.uint16), carray(_at(_load(ctl, VA)), shape, np.uint16)
        attend_range(q, k, v, kind, positions, seqs, tables, page, out, c, c + 1)


@njit(**_FLAGS)
def split_attend(ctl, q, k_pages, v_pages, kind, positions, seqs, tables, page_size, out):
    """attend.attend_rows(q, k_pages, ..., out), its tasks shared with the workers that are awake. Every
    array C-contiguous; positions, seqs, tables int64."""
    n = publish_attend(ctl, q, k_pages.ctypes.data, v_pages.ctypes.data, k_pages.shape[0], kind, positions, seqs,
                       tables, page_size, out)
    _claim_attend(ctl, n)


@njit(**_FLAGS)
def _claim_attend(ctl, n):
    """The calling thread's part of an attention job: tasks until none is left, then the workers' last ones."""
    while True:
        c = claim(ctl, n)
        if c < 0:
            break
        _attend_at(ctl, c)
        _add(ctl, DONE, 1)
    finish(ctl, n)


@njit(**_FLAGS)
def publish_attend(ctl, q, k_addr, v_addr, n_pages, kind, positions, seqs, tables, page_size, out):
    """Opens split_attend's job (its tasks, a row's KV head each, for the taking); returns their number.
    The KV pages by address (n_pages of them), so that one compiled copy serves every KV type."""
    t, n_kv, group, hd = q.shape
    seq = begin(ctl)
    _store(ctl, QA, q.ctypes.data)
    _store(ctl, KA, k_addr)
    _store(ctl, VA, v_addr)
    _store(ctl, KIND, kind)
    _store(ctl, PA, positions.ctypes.data)
    _store(ctl, SA, seqs.ctypes.data)
    _store(ctl, TA, tables.ctypes.data)
    _store(ctl, OA, out.ctypes.data)
    _store(ctl, T, t)
    _store(ctl, N_KV, n_kv)
    _store(ctl, GROUP, group)
    _store(ctl, HD, hd)
    _store(ctl, N_PAGES, n_pages)
    _store(ctl, PAGE, page_size)
    _store(ctl, N_SEQS, tables.shape[0])
    _store(ctl, WIDTH, tables.shape[1])
    _store(ctl, JOB, ATTEND)
    publish(ctl, seq, t * n_kv)
    return t * n_kv


@njit(**_FLAGS)
def serve(ctl, idle_ticks):
    """A worker's spin: claims chunks of each job published; returns after idle_ticks cycle-counter ticks
    without one."""
    spins = 0
    since = _cycles()
    while _load(ctl, STOP) == 0:
        word = _load(ctl, WORD)
        n_chunks = _load(ctl, N_CHUNKS)
        c = word & LOW
        if c < n_chunks and _cas(ctl, WORD, word, word + 1):
            if _load(ctl, JOB) == ATTEND:
                _attend_at(ctl, c)
            else:
                _chunk(ctl, c)
            _add(ctl, DONE, 1)
            spins = 0
            since = _cycles()
            continue
        spins += 1
        if spins & 255 == 0 and _cycles() - since >= idle_ticks:
            return
        _wait(spins)


def warm_up() -> None:
    """Compiles (first run) or loads the worker loop before the workers first need it (split_attend is
    compiled with the layer that calls it)."""
    ctl = np.zeros(CTL_WORDS, np.int64)
    ctl[STOP] = 1
    serve(ctl, 1)  # returns at once: stopped
