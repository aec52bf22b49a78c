"""Q4_K / Q6_K matmuls on integer dot products (kquant_mm.cu), for CudaOps: a launch quantises the
activations per 32-value chunk (kq_quant_x; with rms_norm's values for norm_matmul and the fused
q|k|v projection), then one kernel takes them, the one-row dp4a kernel or the int8-MMA kernel of
the batch's token tiles, with the streaming kernel's epilogues. Every M sums an output element the
same way (plan.kq_integer_launch: the split of N, K, type and device), so exact mode off runs them too.
"""

from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np

from lockstep_kernels.cuda import plan
from lockstep_kernels.cuda.arrays import i32
from lockstep_kernels.cuda.launch import launch
from lockstep_kernels.cuda.modules import big_smem_kernel, kernel
from lockstep_kernels.cuda.weights import CudaStack, type_runs
from lockstep_kernels.weights import Weight, concat_rows

SOURCE = "kquant_mm.cu"
RECORD_BYTES = 64  # a chunk's xh and xl planes, per row
EPI_BIAS, EPI_SILU, EPI_ROPE = 1, 8, 16  # matmul.cu's epilogue flags (ops.py)


class KquantOps:
    _dummy: Any
    sm_count: int

    def _kq_stack(self, parts: list[Weight], order=None) -> CudaStack | None:  # runs uploaded by CudaOps.upload
        """Parts of different K-quant types as a CudaStack of their runs (type_runs), or None;
        `order(n)`: the row order of a run of n rows (upload_qkv's rope tiles)."""
        runs = type_runs(parts)
        if runs is None:
            return None
        ws = []
        for run in runs:
            w = concat_rows(run)
            if order is not None:
                w = Weight(w.data[order(int(w.shape[0]))], w.dtype)
            ws.append(self.upload(w))  # type: ignore[attr-defined]
        return CudaStack(tuple(ws))

    def _kq_act(self, x, w, norm_weight=None, eps: float = 0.0) -> tuple[Any, Any]:
        """x's rows (rms_norm's values with norm_weight) quantised as w's kernels read them: xq [t,
        C * 64] uint8 and xs [t, C * 4] float32 (dx, dx * S, S0, S1 per chunk)."""
        t, k = (int(s) for s in x.shape)
        c = w.kp // 32
        xq = cp.empty((t, c * RECORD_BYTES), dtype=cp.uint8)
        xs = cp.empty((t, c * 4), dtype=cp.float32)
        if t:
            nw = self._dummy if norm_weight is None else norm_weight
            # a warp a chunk; wide batches 8 a warp (rms_inv's pass over the row once per 64 chunks)
            launch(kernel(SOURCE, "kq_quant_x"), (plan.ceil_div(c, 8 if t < 64 else 64), t), (256,),
                   (x, nw, xq, xs, i32(t), i32(k), i32(c), i32(x.shape[1]), np.float32(eps),
                    i32(norm_weight is not None)))
        return xq, xs

    def _kq_matmul(self, act: tuple[Any, Any], w, out, bias, res, flags: int, qkv_out: tuple = ()):
        """w's kernel (each run's of a CudaStack) over quantised activations into out (t rows); bias,
        res: arrays or the dummy; `qkv_out` as ops.mm_tc_args takes it (EPI_ROPE)."""
        if not isinstance(w, CudaStack):
            return self._kq_launch(act, w, out, bias, res, flags, qkv_out, int(out.strides[0]) // 4, 0)
        if res is not self._dummy or flags & EPI_SILU:
            raise ValueError("a stack of K-quant runs takes no residual and no gated product")
        n0 = 0
        for p in w.parts:
            n = p.shape[0]
            b = bias if bias is self._dummy else bias[n0 : n0 + n]
            if qkv_out:  # the run's heads: h0 on
                self._kq_launch(act, p, out, b, res, flags, qkv_out, 0, n0 // w.rope_tiles)
            else:  # the run's columns
                self._kq_launch(act, p, out[:, n0 : n0 + n], b, res, flags, (), int(out.strides[0]) // 4, 0)
            n0 += n
        return out

    def _kq_launch(self, act, w, out, bias, res, flags: int, qkv_out: tuple, ldo: int, h0: int):
        t = int(out.shape[0])
        if not t:
            return out
        n, k = w.shape
        mm = plan.kq_integer_launch(w.dtype, t, n, k, self.sm_count)
        d = self._dummy
        # one opt-in a kernel (its largest launch): the attribute is the function's, whatever the launch
        fn = big_smem_kernel(SOURCE, mm.kernel, plan.KQ_TR_SMEM) if "_tr" in mm.kernel else kernel(SOURCE, mm.kernel)
        launch(fn, mm.grid, mm.block,
               (w.data, w.scales, *act, bias, res, out, i32(t), i32(n), i32(w.kp), i32(flags))
               + (qkv_out or (d,) * 6 + (i32(0),) * 4) + (i32(ldo), i32(h0)) + self._kq_tile_args(mm),
               shared=mm.shared)
        return out

    def _kq_tile_args(self, mm: plan.MatmulLaunch) -> tuple:
        """The tiled kernel's slice buffers (grid z > 1: each slice's sums, a counter per tile, left at
        0 by the kernel) and its split; none for the other kernels."""
        if "_tile" not in mm.kernel:
            return ()
        gx, gy, gz = mm.grid
        if gz == 1:
            return self._dummy, self._dummy, i32(mm.split)
        tiles = gx * gy
        counts = getattr(self, "_kq_counts", None)
        if counts is None or counts.size < tiles:
            counts = self._kq_counts = cp.zeros(max(tiles, 1 << 16), dtype=cp.int32)
        part = cp.empty(gz * gy * 16 * (mm.token_tiles // 2) * gx * plan.KQT_ROWS * 16, dtype=cp.float32)
        return part, counts, i32(mm.split)

    def _kq_norm_matmul(self, x, norm_weight, eps: float, w, bias=None):
        """norm_matmul on the integer kernels: rms_norm fused into the quantisation."""
        t = int(x.shape[0])
        out = cp.empty((t, w.shape[0] // 2 if w.gate_up else w.shape[0]), dtype=cp.float32)
        flags = (EPI_BIAS if bias is not None else 0) | (EPI_SILU if w.gate_up else 0)
        return self._kq_matmul(self._kq_act(x, w, norm_weight, eps), w, out,
                               self._dummy if bias is None else bias, self._dummy, flags)

    def _kq_qkv_rope(self, x, norm_weight, eps: float, w, bias, q, qkv_out: tuple):
        """norm_qkv_rope_write's one launch on the integer kernels (EPI_ROPE stores q and the cache)."""
        flags = EPI_ROPE | (EPI_BIAS if bias is not None else 0)
        return self._kq_matmul(self._kq_act(x, w, norm_weight, eps), w, q, self._dummy if bias is None else bias,
                               self._dummy, flags, qkv_out)
