"""The recurrent ops of hybrid models on CUDA (deltanet.cu): each sequence's state on the device.

A sequence's state is one float32 buffer (per recurrent layer its conv window, then its delta-rule
state). A step's sequences reach the kernels as descriptors (rows, positions, chunk origin, the
state's address), prompt sequences first; every kernel block works on one sequence, so its bits do
not depend on the others. Prompt rows advance in chunks of CHUNK positions from position 0 in exact
mode (from the piece's first row otherwise, as the CPU backend does).

Snapshots (RecurrentRows.snap) are copied into pinned host buffers after the work queued so far;
`state_write` waits for the stream before it reads host data, so a snapshot is complete whenever it
is used.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import cupy as cp
import cupyx
import numpy as np

from lockstep_kernels.base import RecurrentRows
from lockstep_kernels.cuda.arrays import index
from lockstep_kernels.cuda.launch import launch
from lockstep_kernels.cuda.modules import big_smem_kernel, kernel
from lockstep_kernels.cuda.plan import DELTA_CHUNK as CHUNK

DESC = 8  # int64 values per sequence descriptor (deltanet.cu)
MAX_KERNEL = 8  # widest causal conv (deltanet.cu's MAXK)
CHUNK_THREADS = 256


@dataclass
class CudaRecurrentState:
    buf: cp.ndarray  # float32 [n_layers * per_layer]
    n_layers: int
    conv_shape: tuple[int, int]  # (kernel - 1, conv_dim)
    ssm_shape: tuple[int, int, int]  # (v_heads, k_dim, v_dim)

    @property
    def conv_len(self) -> int:
        return self.conv_shape[0] * self.conv_shape[1]

    @property
    def per_layer(self) -> int:
        return self.conv_len + int(np.prod(self.ssm_shape))


@dataclass
class _StepMeta:
    desc: cp.ndarray  # int64 [S, DESC], prompt sequences first
    snap_rel: cp.ndarray  # int32 [max(1, n_snap)]
    n_prompt: int
    n_decode: int
    snap_keys: list[tuple[int, int]]  # (sequence index, position) of each snapshot, in snap_rel's order
    at_chunk_end: list[bool] = field(default_factory=list)  # per snapshot: the delta rule's state is there


@dataclass
class GraphRecurrentRows(RecurrentRows):
    """A replayed decode step's rows (graphs.py): one generated row per sequence, the descriptors
    in a static device buffer each replay refreshes."""

    meta: _StepMeta | None = None


def decode_rows(shape: tuple[int, ...], desc: cp.ndarray, b: int) -> GraphRecurrentRows:
    """The recurrent rows a decode graph of b rows is captured with (`shape`: state_alloc's arguments)."""
    n_layers, conv_dim, kw, vh, kd, vd = shape
    template = CudaRecurrentState(cp.zeros(0, cp.float32), n_layers, (kw - 1, conv_dim), (vh, kd, vd))
    return GraphRecurrentRows([(i, i + 1) for i in range(b)], [0] * b, [template] * b, [False] * b, [()] * b,
                              meta=_StepMeta(desc, cp.zeros(1, cp.int32), 0, b, []))


def pack_decode_desc(host: np.ndarray, states: list) -> None:
    """A decode graph's descriptors: row i a generated token of states[i]'s sequence; the rows
    after them padding (no rows, no state)."""
    host[:] = 0
    host[:, 0] = np.arange(host.shape[0])
    for i, st in enumerate(states):
        host[i, 1] = 1
        host[i, 4] = st.buf.data.ptr


def chunk_smem(k_dim: int, vs: int) -> int:
    """Bytes of delta_chunks' shared memory (its layout in deltanet.cu)."""
    lk, lc = k_dim + 1, CHUNK + 1
    return 4 * (3 * CHUNK * lk + 2 * CHUNK * vs + 3 * CHUNK * lc + k_dim * vs + 4 * CHUNK)


def value_slice(v_dim: int) -> int:
    """Value columns per delta_chunks block: a warp's width where the head has that many."""
    return 32 if v_dim % 32 == 0 else v_dim


def _pinned_copy(x) -> np.ndarray:
    """A host copy of x started after the work queued so far (complete once the stream passes it)."""
    x = cp.ascontiguousarray(x)
    host = cupyx.empty_pinned(x.shape, x.dtype)
    x.data.copy_to_host_async(ctypes.c_void_p(host.ctypes.data), x.nbytes, cp.cuda.get_current_stream())
    return host


def _strided(x) -> tuple[cp.ndarray, int]:
    """x [T, D] as the kernels read it: unit column stride, rows `ld` floats apart."""
    x = cp.asarray(x, dtype=cp.float32)
    if x.ndim != 2 or x.strides[1] != 4 or x.strides[0] % 4:
        x = cp.ascontiguousarray(x)
    return x, max(int(x.strides[0]) // 4, int(x.shape[1]))


class DeltaNetOps:
    """The recurrent half of lockstep_kernels.base.Ops, mixed into CudaOps (which brings `exact` and `_dummy`)."""

    recurrent_chunk = CHUNK
    exact: bool
    _dummy: cp.ndarray

    def state_alloc(self, n_layers: int, conv_dim: int, kernel_w: int, v_heads: int, k_dim: int, v_dim: int):
        if kernel_w > MAX_KERNEL:
            raise ValueError(f"a causal conv of width {kernel_w} is not supported on CUDA (at most {MAX_KERNEL})")
        st = CudaRecurrentState(cp.zeros(0, cp.float32), n_layers, (kernel_w - 1, conv_dim), (v_heads, k_dim, v_dim))
        st.buf = cp.zeros(n_layers * st.per_layer, dtype=cp.float32)
        return st

    def state_read(self, state: CudaRecurrentState) -> list[np.ndarray]:
        host = cp.asnumpy(state.buf).reshape(state.n_layers, state.per_layer)
        out = []
        for layer in host:
            out.append(layer[: state.conv_len].reshape(state.conv_shape).copy())
            out.append(layer[state.conv_len :].reshape(state.ssm_shape).copy())
        return out

    def state_write(self, state: CudaRecurrentState, data: list[np.ndarray]) -> None:
        cp.cuda.get_current_stream().synchronize()  # snapshots still on their way to the host arrive first
        flat = np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in data])
        if flat.size != state.buf.size:
            raise ValueError(f"recurrent state of {flat.size} values for a state of {state.buf.size}")
        state.buf[...] = cp.asarray(flat)

    def _step_meta(self, rows: RecurrentRows) -> _StepMeta:
        """The step's descriptors, built once per RecurrentRows (every layer's ops share them)."""
        if isinstance(rows, GraphRecurrentRows):
            return rows.meta
        cached = getattr(self, "_meta_cache", None)
        if cached is not None and cached[0] is rows:
            return cached[1]
        order = [i for i, p in enumerate(rows.prompt) if p] + [i for i, p in enumerate(rows.prompt) if not p]
        desc = np.zeros((max(1, len(order)), DESC), dtype=np.int64)
        rel, keys, ends = [], [], []
        for k, i in enumerate(order):
            lo, hi = rows.bounds[i]
            start = rows.starts[i]
            origin = 0 if self.exact else start
            snaps = sorted(p for p in rows.snap[i] if start < p <= start + hi - lo) if rows.prompt[i] else []
            desc[k] = (lo, hi - lo, start, origin, rows.states[i].buf.data.ptr, len(rel), len(rel) + len(snaps), 0)
            rel += [p - start for p in snaps]
            keys += [(i, p) for p in snaps]
            ends += [(p - origin) % CHUNK == 0 or p == start + hi - lo for p in snaps]
        n_prompt = sum(rows.prompt)
        meta = _StepMeta(cp.asarray(desc), cp.asarray(np.asarray(rel or [0], dtype=np.int32)), n_prompt,
                         len(order) - n_prompt, keys, ends)
        self._meta_cache = (rows, meta)
        return meta

    def conv1d_silu(self, x, weight, rows: RecurrentRows, layer: int):
        x, ldx = _strided(x)
        t, d = (int(s) for s in x.shape)
        out = cp.empty((t, d), dtype=cp.float32)
        if not rows.bounds or t == 0:
            return out
        meta, st = self._step_meta(rows), rows.states[0]
        kw = int(weight.shape[1])
        n_snap = len(meta.snap_keys)
        snap = cp.empty((n_snap, kw - 1, d), dtype=cp.float32) if n_snap else self._dummy
        launch(kernel("deltanet.cu", "conv1d_silu"), ((d + 127) // 128, len(rows.bounds)), (128,),
               (x, np.int64(ldx), weight, out, meta.desc, np.int32(d), np.int32(kw), np.int64(layer * st.per_layer),
                meta.snap_rel, snap))
        for k, key in enumerate(meta.snap_keys):
            rows.taken.setdefault(key, []).append(_pinned_copy(snap[k]))
        return out

    def gated_delta(self, mixed, a, b, a_log, dt_bias, rows: RecurrentRows, layer: int, n_k_heads: int):
        mixed = cp.ascontiguousarray(mixed, dtype=cp.float32)
        t = int(mixed.shape[0])
        if not rows.bounds or t == 0:
            return cp.empty((t, 0, 0), dtype=cp.float32)
        meta, st = self._step_meta(rows), rows.states[0]
        vh, kd, vd = st.ssm_shape
        out = cp.empty((t, vh, vd), dtype=cp.float32)
        a, lda = _strided(a)
        b, ldb = _strided(b)
        if lda != ldb:
            a, b = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
            lda = vh
        common = (mixed, a, b, np.int64(lda), a_log, dt_bias, out)
        shape = (np.int32(n_k_heads), np.int32(vh), np.int32(vd), np.float32(kd ** -0.5),
                 np.int64(layer * st.per_layer), np.int64(st.conv_len))
        n_snap = len(meta.snap_keys)
        if meta.n_prompt:
            vs = value_slice(vd)
            smem = chunk_smem(kd, vs)
            fn = big_smem_kernel("deltanet.cu", "delta_chunks", smem, (("KD", kd), ("VS", vs), ("CH", CHUNK)))
            snap = cp.empty((n_snap, vh, kd, vd), dtype=cp.float32) if n_snap else self._dummy
            launch(fn, (vh, meta.n_prompt, vd // vs), (CHUNK_THREADS,),
                   (*common, meta.desc, *shape, meta.snap_rel, snap), shared=smem)
            for k, key in enumerate(meta.snap_keys):
                if meta.at_chunk_end[k]:  # elsewhere the snapshot is incomplete and the runner drops it
                    rows.taken.setdefault(key, []).append(_pinned_copy(snap[k]))
        if meta.n_decode:
            warps = next(w for w in (4, 2, 1) if kd % w == 0)  # each holds kd / warps rows of a column
            fn = kernel("deltanet.cu", "delta_step", (("KD", kd), ("VT", 32 * warps)))
            launch(fn, (vh, meta.n_decode, (vd + 31) // 32), (32 * warps,),
                   (*common, meta.desc[meta.n_prompt :], *shape))
        return out

    def gated_rms_norm(self, x, weight, gate, eps: float):
        x, gate = cp.ascontiguousarray(x, dtype=cp.float32), cp.ascontiguousarray(gate, dtype=cp.float32)
        d = int(x.shape[-1])
        y = cp.empty_like(x)
        if x.size:
            launch(kernel("deltanet.cu", "gated_rms_norm"), (x.size // d,), (256,),
                   (x, weight, gate, y, np.int32(d), np.float32(eps)))
        return y

    def gated_qk_norm_rope(self, y, n_heads: int, n_kv: int, head_dim: int, q_norm, k_norm, eps: float,
                           positions, table, rot: int):
        """Gated attention's (q, k, gate) from its projection rows y [T, >= (2 n_heads + n_kv) head_dim]
        (q|gate per query head, then k): q and k rms-normed per head and roped on their first `rot`
        dims, in one launch (deltanet.cu's gated_qk_norm_rope: the steps of rms_norm then rope)."""
        y, ld = _strided(y)
        t, d = int(y.shape[0]), head_dim
        q = cp.empty((t, n_heads, d), dtype=cp.float32)
        k = cp.empty((t, n_kv, d), dtype=cp.float32)
        gate = cp.empty((t, n_heads * d), dtype=cp.float32)
        if t:
            launch(kernel("deltanet.cu", "gated_qk_norm_rope"), (t, n_heads + n_kv), (256,),
                   (y, np.int64(ld), q_norm, k_norm, q, k, gate, index(positions), table.cos, table.sin,
                    np.int32(n_heads), np.int32(n_kv), np.int32(d), np.int32(rot), np.int32(table.neox),
                    np.float32(eps)))
        return q, k, gate

    def sigmoid_mul(self, x, gate):
        x, gate = cp.ascontiguousarray(x, dtype=cp.float32), cp.ascontiguousarray(gate, dtype=cp.float32)
        y = cp.empty_like(x)
        if x.size:
            launch(kernel("deltanet.cu", "sigmoid_mul"), ((x.size + 255) // 256,), (256,),
                   (x, gate, y, np.int64(x.size)))
        return y
