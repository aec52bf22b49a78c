"""Decode steps as CUDA graph replays, one graph per batch-size bucket.

A decode step (one new token per sequence) launches a few hundred small kernels; launched from
Python each costs microseconds of host time, replayed from a graph well under one. A step of n
sequences runs the graph of the smallest bucket >= n; the rows past n are padding: token 0 at
position 0, their own all-zero block-table row, and slot -1, which the KV write skips. Under row
invariance the real rows get the same bits as an uncaptured step of n rows.

Inputs live in static device buffers that each replay refreshes with one host-to-device copy from
pinned memory. The graphs' own temporaries come from a private memory pool so that nothing
allocated outside a graph can ever sit in memory a replay overwrites.

Hybrid models: each replay also refreshes the rows' sequence descriptors (lockstep_kernels/cuda/deltanet.py),
so the recurrent kernels advance the states of the sequences of that step; padding rows have none.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cupy as cp
import cupyx
import numpy as np

from lockstep_kernels.base import PagedRows
from lockstep_kernels.cuda.deltanet import DESC, decode_rows, pack_decode_desc
from lockstep_kernels.cuda.graph_inputs import DEFAULT_BUCKETS, bucket_for, pack_inputs


@dataclass
class _Graph:
    bucket: int
    ints: Any  # device int32 [3 * bucket + bucket * width]
    slots: Any  # device int64 [bucket]
    host: list[np.ndarray]  # pinned staging of `ints`, two of them (see __call__)
    slots_host: list[np.ndarray]
    graph: Any
    logits: Any  # device [bucket, vocab], written by every replay
    argmax: Any  # device int32 [bucket]: each row's greedy token, computed in the same replay
    copied: list = field(default_factory=lambda: [None, None])  # events: each staging's copy done
    turn: int = 0
    desc: Any = None  # hybrid models: device int64 [bucket, DESC], the rows' sequence descriptors
    desc_host: list[np.ndarray] = field(default_factory=list)


class DecodeGraphs:
    def __init__(self, forward: Callable[[Any, PagedRows, Any], Any], argmax: Callable[[Any], Any], max_pages: int,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, recurrent: tuple[int, ...] | None = None):
        """`recurrent`: a hybrid model's Ops.state_alloc arguments (each call then names the rows'
        recurrent states)."""
        self.forward, self.argmax, self.width = forward, argmax, int(max_pages)
        self.recurrent = recurrent
        self.buckets = tuple(sorted(buckets))
        self.last_argmax = None  # device int32 [n]: the argmax rows of the latest replay
        self._graphs: dict[int, _Graph] = {}
        self._pool = cp.cuda.MemoryPool()
        self._stream = cp.cuda.Stream(non_blocking=False)

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def capture_all(self) -> list[int]:
        """Captures every bucket's graph now (engine.warmup), so that no request waits for one."""
        for b in self.buckets:
            if b not in self._graphs:
                self._capture(b)
        return list(self.buckets)

    def __call__(self, tokens, positions, block_tables, slots, ids_from=None, states=None):
        """Logits [n, vocab] on the device for n sequences' next tokens (one row each). `ids_from`
        (device int32 [n], e.g. the argmax of the replay before) replaces `tokens` on the device,
        so a step can be launched before the previous one's tokens reach the host. `states`: each
        row's recurrent state (hybrid models)."""
        n = len(tokens)
        b = bucket_for(n, self.buckets)
        if b is None:
            raise ValueError(f"{n} rows exceed the largest decode graph ({self.max_batch})")
        g = self._graphs.get(b) or self._capture(b)
        # Two staging buffers in turn: a step may be launched while the one before still waits
        # for its input copy, which must not see this step's inputs.
        k, g.turn = g.turn, 1 - g.turn
        if g.copied[k] is not None:
            g.copied[k].synchronize()
        host, slots_host = g.host[k], g.slots_host[k]
        pack_inputs(host, slots_host, b, self.width, tokens, positions, block_tables, slots)
        stream = cp.cuda.get_current_stream()
        g.ints.data.copy_from_host_async(ctypes.c_void_p(host.ctypes.data), host.nbytes, stream)
        g.slots.data.copy_from_host_async(ctypes.c_void_p(slots_host.ctypes.data), slots_host.nbytes, stream)
        if g.desc is not None:
            if states is None or len(states) != n:
                raise ValueError("a hybrid model's replay needs each row's recurrent state")
            pack_decode_desc(g.desc_host[k], states)
            g.desc.data.copy_from_host_async(ctypes.c_void_p(g.desc_host[k].ctypes.data), g.desc_host[k].nbytes,
                                             stream)
        g.copied[k] = stream.record()
        if ids_from is not None:
            g.ints.data.copy_from_device_async(ids_from.data, n * 4, stream)
        g.graph.launch(stream)
        self.last_argmax = g.argmax[:n]
        return g.logits[:n]

    def _capture(self, b: int) -> _Graph:
        w = self.width
        host = [cupyx.empty_pinned(3 * b + b * w, dtype=np.int32) for _ in range(2)]
        slots_host = [cupyx.empty_pinned(b, dtype=np.int64) for _ in range(2)]
        pack_inputs(host[0], slots_host[0], b, w, [], [], np.zeros((0, 0), np.int32), [])
        ints, slots = cp.asarray(host[0]), cp.asarray(slots_host[0])
        rows = PagedRows(positions=ints[b : 2 * b], seq=ints[2 * b : 3 * b],
                         block_tables=ints[3 * b :].reshape(b, w), slots=slots)
        desc_host, desc = [], None
        if self.recurrent is not None:  # every row padding (no state) until a replay names them
            desc_host = [cupyx.empty_pinned((b, DESC), dtype=np.int64) for _ in range(2)]
            pack_decode_desc(desc_host[0], [])
            desc = cp.asarray(desc_host[0])
            rows.recurrent = decode_rows(self.recurrent, desc, b)
        ids = ints[:b]
        with cp.cuda.using_allocator(self._pool.malloc), self._stream:
            self.argmax(self.forward(ids, rows, None))  # compiles kernels, sizes the pool outside the capture
            self._stream.synchronize()
            self._stream.begin_capture()
            try:
                logits = self.forward(ids, rows, None)  # logits of every row
                argmax = self.argmax(logits)
            finally:
                graph = self._stream.end_capture()
        graph.upload(self._stream)
        self._stream.synchronize()
        g = _Graph(b, ints, slots, host, slots_host, graph, logits, argmax, desc=desc, desc_host=desc_host)
        self._graphs[b] = g
        return g
