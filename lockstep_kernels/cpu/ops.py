"""NumPy reference backend.

BLAS picks different kernels for one row and for many, so in exact mode every matmul row is its own
matrix-vector product from one fixed scratch buffer; reductions elsewhere run per row along the
contiguous last axis, whose summation order depends only on its length.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from lockstep_kernels.cpu import compiled, deltanet, fused, jobs, layer, rope_write, workers
from lockstep_kernels.cpu.blas_split import blas_matmul
from lockstep_kernels.cpu.moe import CpuMoeOps
from lockstep_kernels.cpu.paged import CpuKVLayer, PagedOps, as_index  # noqa: F401  (CpuKVLayer: imported from here)
from lockstep_kernels.cpu.quant_matmul import f32_tiles
from lockstep_kernels.weights import RowStack, Weight, concat_rows

BLOCK_N = 4096  # rows of a 16-bit weight converted to float32 at a time for BLAS (bounds the scratch memory)
# 16-bit weights stay as stored: the compiled row kernel widens each weight row as it reads it, which
# reads half the bytes of a float32 copy. A caller may still ask for float32 copies of models up to
# this size (fixed, not taken from free memory, so that one model always takes one path).
F32_COPY_LIMIT = 0
# Exact mode off multiplies up to this many rows with the compiled row kernel (it reads each weight row
# once for all of them); BLAS gemm is faster for more. A 16-bit weight goes to BLAS as float32 copies made
# on every call, which cost more than the row kernel's products up to about 64 rows.
KERNEL_ROWS = 16
KERNEL_ROWS_16 = 64
PARALLEL_VALUES = 1 << 16  # weights of at least this many values are split across threads


_WIDE_KINDS = {"f16": 1, "bf16": 2}  # 16-bit types the compiled kernels widen as they read them


@dataclass
class GateUp:
    """Ops.upload_gate_up on the CPU: the stacked weight; matmul gates its product."""

    stacked: Weight


def _bits16(w: Weight) -> np.ndarray:
    """A 16-bit weight's bits as a read-only uint16 view: weights come writable (stacked at load) or
    read-only (memory-mapped), two types to numba; one type means one compiled specialisation per
    kernel, all of them built by warm_up."""
    bits = np.ascontiguousarray(w.data).view(np.uint16)
    if bits.flags.writeable:
        bits = bits.view()
        bits.flags.writeable = False
    return bits


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


class CpuOps(PagedOps, CpuMoeOps):
    name = "cpu"
    recurrent_chunk = deltanet.CHUNK
    state_alloc = staticmethod(deltanet.state_alloc)
    state_read = staticmethod(deltanet.state_read)
    state_write = staticmethod(deltanet.state_write)
    conv1d_silu = staticmethod(deltanet.conv1d_silu)
    gated_rms_norm = staticmethod(deltanet.gated_rms_norm)
    sigmoid_mul = staticmethod(deltanet.sigmoid_mul)

    def gated_norm_matmul(self, x, weight, gate, eps: float, w, residual):
        gated = self.gated_rms_norm(x, weight, gate, eps)
        return self.matmul(gated.reshape(-1, w.shape[1]), w, residual=residual)

    def __init__(self, exact: bool = False, f32_copy_limit: int = F32_COPY_LIMIT, threads: int = 1):
        """`threads`: how many the compiled kernels split a large weight across (BLAS's own threads are
        set by the process: engine/threads.py)."""
        self.exact = exact
        self.f32_copy_limit = f32_copy_limit
        self._copy_f32 = False
        self.threads = compiled.usable_threads(threads)
        self._workers = workers.pool(self.threads) if self.threads > 1 else None
        # dense_layer splits its products through this (with no workers the caller computes them all)
        self._ctl = self._workers.ctl if self._workers is not None else np.zeros(workers.CTL_WORDS, np.int64)
        # a control word takes one publisher at a time (two threads computing at once wait in turn)
        self._ctl_lock = self._workers.lock if self._workers is not None else threading.Lock()
        self._layers: dict = {}  # dense_layer's fixed arguments per layer: _layer_args
        compiled.warm_up(self.threads > 1)
        fused.warm_up(self.threads > 1)
        if self.threads > 1:
            jobs.warm_up()
        PagedOps.warm_up_paged()

    def gated_delta(self, mixed, a, b, a_log, dt_bias, rows, layer: int, n_k_heads: int) -> np.ndarray:
        return deltanet.gated_delta(mixed, a, b, a_log, dt_bias, rows, layer, n_k_heads, self.exact)

    def plan_weights(self, weights: dict[str, Weight]) -> None:
        """Decides once per model whether its matrices get float32 copies (see F32_COPY_LIMIT); raw
        quantized blocks never do (lockstep_kernels/cpu/quant_matmul.py)."""
        self._copy_f32 = sum(w.size * 4 for w in weights.values() if w.data.ndim == 2 and not w.blocks) <= self.f32_copy_limit

    # --- data movement
    def upload(self, w: Weight | RowStack):
        if isinstance(w, RowStack):
            return RowStack([self.upload(p) for p in w.parts])
        if w.data.ndim == 1:
            return np.ascontiguousarray(w.to_f32())
        if w.dtype != "f32" and not w.blocks and self._copy_f32:
            return Weight(np.ascontiguousarray(w.to_f32()), "f32")
        return w

    def upload_gate_up(self, gate: Weight, up: Weight) -> GateUp:
        return GateUp(self.upload(concat_rows([gate, up])))

    def upload_qkv(self, q: Weight, k: Weight, v: Weight, bias: Weight | None, head_dim: int):
        return self.upload(concat_rows([q, k, v])), None if bias is None else self.upload(bias)

    def tensor(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a)

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x)

    def to_host_async(self, x):
        host = np.array(x)  # a copy: later steps may reuse x's memory
        return lambda: host

    # --- math
    def embedding(self, table: Weight, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if table.dtype in _WIDE_KINDS:
            ids = as_index(ids).reshape(-1)
            if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
                raise IndexError(f"token ids must lie in 0..{table.shape[0] - 1}")
            out = np.empty((ids.size, table.shape[1]), dtype=np.float32)
            fused.embed_16(_bits16(table), ids, _WIDE_KINDS[table.dtype], out)
            return out
        scales = table.scales[ids] if table.scales is not None else None
        rows = Weight(table.data[ids], table.dtype, scales)
        return np.array(rows.to_f32(), dtype=np.float32, copy=True)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        flat = x.reshape(-1, x.shape[-1])
        out = np.empty_like(flat)
        compiled.rms_norm_rows(flat, np.ascontiguousarray(weight, dtype=np.float32), np.float32(eps), out)
        return out.reshape(x.shape)

    def matmul_family(self, t: int, w: Weight) -> str:
        # the compiled row kernel (one fixed-order reduction per row) in exact mode, and for few rows off
        return "rows_gemv" if self._row_kernel(t, w) else "blas"

    def qkv_family(self, t: int, w: Weight) -> str:
        return self.matmul_family(t, w)  # norm_matmul, then the compiled rotation and cache write

    def matmul(self, x: np.ndarray, w: Weight, bias: np.ndarray | None = None,
               residual: np.ndarray | None = None) -> np.ndarray:
        gated = isinstance(w, GateUp)
        if gated and (bias is not None or residual is not None):
            raise ValueError("a gated product takes no bias or residual")
        x = np.ascontiguousarray(x, dtype=np.float32)
        t, k = x.shape
        stored = w.stacked if gated else w
        if stored.shape[1] != k:
            raise ValueError(f"matmul shape mismatch: x has {k} columns, weight is {stored.shape}")
        if stored.dtype in _WIDE_KINDS and self._row_kernel(t, stored):
            return self._rows_16(x, stored, gated, bias, residual)
        if gated:
            return self._silu_mul_stacked(self.matmul(x, stored))
        n = w.shape[0]
        out = np.empty((t, n), dtype=np.float32)
        block_rows = n if w.dtype == "f32" else BLOCK_N
        if not self._row_kernel(t, w):
            blas_matmul(x, w, out, self.threads, block_rows)
            return self._bias_residual(out, bias, residual)
        for n0, block in f32_tiles(w, block_rows):
            block = np.ascontiguousarray(block, dtype=np.float32)
            if self.threads > 1 and block.size >= PARALLEL_VALUES:
                compiled.in_threads(self.threads, compiled.rows_matvec_parallel, x, block, out, n0)
            else:
                compiled.rows_matvec(x, block, out, n0)
        return self._bias_residual(out, bias, residual)

    def _rows_16(self, x: np.ndarray, w: Weight, gated: bool, bias, residual) -> np.ndarray:
        """The compiled row kernel over a 16-bit weight, with the gate or the residual applied as it
        writes (no [T, 2F] product, no second pass over the output)."""
        data = _bits16(w)
        mode = compiled.GATE_UP if gated else compiled.PLAIN
        out = np.empty((x.shape[0], w.shape[0] // 2 if gated else w.shape[0]), dtype=np.float32)
        res = out
        if residual is not None and bias is None:
            mode, res, residual = compiled.RESIDUAL, np.ascontiguousarray(residual, dtype=np.float32), None
        args = (x, data, _WIDE_KINDS[w.dtype], out, 0, res, mode)
        self._call(self._threaded(data), compiled.rows_16, compiled.rows_16_parallel, *args)
        return self._bias_residual(out, bias, residual)

    @staticmethod
    def _bias_residual(out: np.ndarray, bias, residual) -> np.ndarray:
        if bias is not None:
            out += bias
        if residual is not None:
            out = residual + out
        return out

    def norm_matmul(self, x, norm_weight, eps: float, w, bias=None) -> np.ndarray:
        stored = w.stacked if isinstance(w, GateUp) else w
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not self._fuses(x, stored) or (bias is not None and isinstance(w, GateUp)):
            return self.matmul(self.rms_norm(x, norm_weight, eps), w, bias)
        gated = isinstance(w, GateUp)
        data = _bits16(stored)
        out = np.empty((x.shape[0], stored.shape[0] // 2 if gated else stored.shape[0]), dtype=np.float32)
        self._call(self._threaded(data), fused.norm_rows_16, fused.norm_rows_16_parallel, x, _f32(norm_weight),
                   np.float32(eps), data, _WIDE_KINDS[stored.dtype], out, out,
                   compiled.GATE_UP if gated else compiled.PLAIN)
        return self._bias_residual(out, bias, None)

    def ffn(self, x, norm_weight, eps: float, w_gate_up, w_down) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        gu = w_gate_up.stacked if isinstance(w_gate_up, GateUp) else None
        if gu is None or not (self._fuses(x, gu) and self._fuses(x, w_down)) or gu.dtype != w_down.dtype:
            return self.matmul(self.norm_matmul(x, norm_weight, eps, w_gate_up), w_down, residual=x)
        data_gu, data_d = _bits16(gu), _bits16(w_down)
        threaded = self._threaded(data_gu)
        if threaded != self._threaded(data_d):  # one split, one not: the separate ops choose each
            return self.matmul(self.norm_matmul(x, norm_weight, eps, w_gate_up), w_down, residual=x)
        out = np.empty_like(x)
        self._call(threaded, fused.ffn_16, fused.ffn_16_parallel, x, _f32(norm_weight), np.float32(eps), data_gu,
                   data_d, _WIDE_KINDS[gu.dtype], out)
        return out

    def dense_layer(self, x, attn_norm, eps: float, w_qkv, b_qkv, rows, table, cache, n_heads: int, n_kv: int,
                    scale: float, wo, ffn_norm, w_gate_up, w_down) -> np.ndarray:
        """A llama-family layer without q/k norm and with a dense FFN: one compiled call (layer.py) where
        every product takes the 16-bit row kernel and the cache one of the compiled kernels' types,
        else the ops one by one. Both give a row the same bits."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        fixed = self._layer_args(x, attn_norm, eps, w_qkv, b_qkv, table, cache, n_heads, n_kv, scale, wo, ffn_norm,
                                 w_gate_up, w_down)
        if fixed is None:
            q = self.norm_qkv_rope_write(x, attn_norm, eps, w_qkv, b_qkv, rows, table, cache, n_heads, n_kv)
            return self.ffn(self.attention_out(q, cache, rows, scale, wo, x), ffn_norm, eps, w_gate_up, w_down)
        head, tail = fixed
        if self._workers is not None:
            self._workers.wake()
        out = np.empty_like(x)
        with self._ctl_lock:
            layer.dense_layer_16(x, *head, as_index(rows.positions), as_index(rows.slots), as_index(rows.seq),
                                 as_index(rows.block_tables), *tail, self._ctl, out)
        return out

    def _layer_args(self, x, attn_norm, eps, w_qkv, b_qkv, table, cache, n_heads, n_kv, scale, wo, ffn_norm,
                    w_gate_up, w_down):
        """dense_layer_16's arguments that stay the same from step to step (weights as bits, norms,
        cache views), prepared once per layer: building them each call cost about as much as a layer's
        attention at decode. None where the layer cannot take the one-call path for x's rows."""
        if not self._row_kernel(x.shape[0], wo):
            return None
        hit = self._layers.get(id(wo))  # one entry a layer: another cache (the self-check's) replaces it
        if hit is not None and hit[0] is wo and hit[1] is cache and hit[2] is cache.k and hit[3] is cache.v:
            return hit[4]
        gu = w_gate_up.stacked if isinstance(w_gate_up, GateUp) else None
        ws = (w_qkv, wo, gu, w_down)
        kv_kind = rope_write.KV_KINDS.get(cache.kv_type)
        if (b_qkv is not None or kv_kind is None or cache.v_type != cache.kv_type
                or not all(self._fuses(x, w) and w.dtype == wo.dtype for w in ws)):
            fixed = None
        else:
            d = w_qkv.shape[0] // (n_heads + 2 * n_kv)
            view = np.float32 if kv_kind == 0 else np.uint16
            k, v = cache.k.view(view), cache.v.view(view)
            head = (_f32(attn_norm), _f32(ffn_norm), np.float32(eps), *(_bits16(w) for w in ws), _WIDE_KINDS[wo.dtype])
            tail = (table.cos, table.sin, table.neox, n_heads, k.reshape(-1, n_kv, d), v.reshape(-1, n_kv, d), k, v,
                    kv_kind, np.float32(scale))
            fixed = head, tail
        self._layers[id(wo)] = (wo, cache, cache.k, cache.v, fixed)
        return fixed

    def _fuses(self, x: np.ndarray, w) -> bool:
        """Whether x's rows go through the compiled row kernel for a 16-bit w (fused.py joins steps there)."""
        return isinstance(w, Weight) and w.dtype in _WIDE_KINDS and self._row_kernel(x.shape[0], w)

    def _row_kernel(self, t: int, w) -> bool:
        """Whether t rows times w take the compiled row kernel (always in exact mode) rather than BLAS."""
        stored = w.stacked if isinstance(w, GateUp) else w
        return self.exact or t <= (KERNEL_ROWS_16 if getattr(stored, "dtype", None) in _WIDE_KINDS else KERNEL_ROWS)

    def _threaded(self, data: np.ndarray) -> bool:
        return self.threads > 1 and data.size >= PARALLEL_VALUES

    def _call(self, threaded: bool, kernel, parallel_kernel, *args) -> None:
        if threaded:
            self._workers.wake()
            with self._ctl_lock:
                parallel_kernel(*args, self._workers.ctl)
        else:
            kernel(*args)

    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self._silu_mul_stacked(np.concatenate([gate, up], axis=-1, dtype=np.float32))

    @staticmethod
    def _silu_mul_stacked(y: np.ndarray) -> np.ndarray:
        """y [T, 2F] = gate | up (the layout of a GateUp product) -> silu(gate) * up [T, F]."""
        f = y.shape[1] // 2
        out = np.empty((y.shape[0], f), dtype=np.float32)
        compiled.silu_mul_rows(np.ascontiguousarray(y), f, out)
        return out

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def argmax(self, logits: np.ndarray) -> np.ndarray:
        return np.argmax(logits, axis=-1).astype(np.int32)  # first maximum: ties go to the lowest id
