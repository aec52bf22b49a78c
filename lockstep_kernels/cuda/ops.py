"""CUDA backend: the op interface of lockstep_kernels/base.py on CuPy arrays, kernels from the `.cu` sources.

Exact mode keeps every rule of docs/ARCHITECTURE.md "The exactness contract": matmuls sum each output
element in an order fixed by the weight shape (plan.split_k), attention walks a row's pages in
logical order and merges chunks ascending, row reductions use one fixed thread layout. Exact mode
off sends wide matmuls (prefill) to cuBLAS, which picks its kernels by batch width; narrower ones
run the same kernels as exact mode, which are the fastest we have there.

Every op launches on CuPy's current stream and never synchronises with the host, so a decode step
can be captured into a CUDA graph (lockstep_kernels/cuda/graphs.py).
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, replace
from typing import Any

import cupy as cp
import cupyx
import numpy as np

from contract.env import MATVEC, switch
from lockstep_kernels.base import PAGE_SIZE, PagedRows, RopeTable, split_qk_norm_rope_write
from lockstep_kernels.cuda import dispatch, kquant, modules, plan, tensor_map
from lockstep_kernels.cuda.arrays import f32_rows as _rows
from lockstep_kernels.cuda.arrays import i32 as _i32
from lockstep_kernels.cuda.arrays import index as _index
from lockstep_kernels.cuda.blas import gemm_16bit
from lockstep_kernels.cuda.deltanet import DeltaNetOps
from lockstep_kernels.cuda.kquant_ops import KquantOps
from lockstep_kernels.cuda.launch import launch
from lockstep_kernels.cuda.modules import big_smem_kernel, kernel
from lockstep_kernels.cuda.moe import CudaMoeOps
from lockstep_kernels.cuda.weights import (
    CudaStack,
    CudaWeight,
    f16_at_load,
    interleave_gate_up,
    kernel_weight,
    pad_host,
    rope_tile_order,
    streams_blocks,
)
from lockstep_kernels.weights import RowStack, Weight, concat_rows

log = logging.getLogger("lockstep_kernels.cuda")

KV_CODES = {"f32": 0, "f16": 1, "bf16": 2}
KV_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}
ATTN_COUNTERS = 1 << 18  # launches with more (row, head group) pairs merge in a second kernel
EPI_BIAS, EPI_RESIDUAL, EPI_SILU, EPI_ROPE, EPI_OUT16 = 1, 2, 8, 16, 32  # matmul.cu's epilogue flags


@dataclass
class CudaKVLayer:
    kv_type: str
    k: Any  # [n_pages, PAGE_SIZE, n_kv_heads, head_dim]
    v: Any


def _halves(gate, up) -> tuple[Any, Any]:
    """gate and up as read in place: the two column halves of one float32 matrix (a fused gate|up
    output) share a row stride; anything else is made contiguous."""
    if (gate.dtype == up.dtype == cp.float32 and gate.ndim == up.ndim == 2 and gate.shape == up.shape
            and gate.strides == up.strides and gate.strides[1] == 4):
        return gate, up
    return _rows(gate), _rows(up)


def streaming_kernel(mm: plan.MatmulLaunch, defines: tuple = ()):
    """The streaming kernel of a launch (its combine fits the default shared memory: max_token_tiles)."""
    return kernel("matmul.cu", mm.kernel, defines)


def mm_tc_args(w: CudaWeight, x, out, dummy, bias=None, res=None, flags: int = 0, norm_weight=None, eps: float = 0.0,
               qkv_out: tuple = ()) -> tuple:
    """The arguments of the streaming kernel (matmul.cu's mm_tc) for x @ w^T into out; `dummy` stands
    for absent pointers. `qkv_out`: where EPI_ROPE stores (k and v caches, positions, slots, cos,
    sin, heads, kv heads, head dim, cache type code)."""
    t, (n, k), d = int(out.shape[0]), w.shape, dummy
    return ((w.data, d if w.scales is None else w.scales, x, d if bias is None else bias, d if res is None else res, out,
             _i32(t), _i32(n), _i32(k), _i32(w.kp), _i32(flags), d if norm_weight is None else norm_weight,
             np.float32(eps), _i32(x.shape[1]))
            + (qkv_out or (d,) * 6 + (_i32(0),) * 4))


class CudaOps(CudaMoeOps, DeltaNetOps, KquantOps):
    name = "cuda"
    asynchronous = True  # ops queue device work and return; a host copy waits for it

    def __init__(self, exact: bool = False, device: int = 0):
        self.exact = exact
        self.device = cp.cuda.Device(device)
        self.device.use()
        self.sm_count = int(self.device.attributes["MultiProcessorCount"])
        self._dummy = cp.zeros(4, dtype=cp.float32)  # stands for an absent bias or residual pointer
        # attention's per (row, head group) tickets: zero between launches (the kernel resets them)
        self._attn_counters = cp.zeros(ATTN_COUNTERS, dtype=cp.int32)
        # Which shared-memory kernels wide batches may take: True (all), "wide" (not mm_wgmma), "tile"
        # (not mm_wide either) or False (streaming only); tests narrow it to compare the kernels bit for bit.
        self.tiled: dispatch.Tiling = True
        self.wgmma = self.device.compute_capability == "90"  # sm_90a code runs on sm_90 alone
        # one-row 16-bit matmuls on matvec.cu's ring kernel (mm_tc's sums); off until measured on a device
        self.matvec = switch(os.environ, MATVEC, default=False)
        # prefill attention on attention_wgmma.cu (attn_mma's bits) on sm_90 unless LOCKSTEP_WGMMA_ATTN=0
        self.wgmma_attention = dispatch.wgmma_attention_on(self.device.compute_capability, os.environ)
        self.attention_ws = dispatch.attention_ws_on(os.environ)
        self.attention_ws_lean = dispatch.attention_ws_lean(os.environ)
        self.attention_ws_tma = dispatch.attention_ws_tma(os.environ)
        self.wgmma_build = dispatch.wgmma_build(os.environ)  # mm_wgmma_tma's build (plan.WGMMA_BUILDS)
        self.wgmma_kq = dispatch.wgmma_kq_switch(os.environ)  # K-quant prefills on mm_wgmma_kq (None: the plan's)

    # --- data movement
    def plan_weights(self, weights: dict[str, Weight]) -> None:
        """Every weight is stored as the kernels read it (lockstep_kernels/cuda/weights.py); says what the
        quantized weights read as f16 cost."""
        for line in f16_at_load(weights):
            log.warning("%s", line)

    def upload(self, w: Weight | RowStack):
        if isinstance(w, RowStack) and (stack := self._kq_stack(w.parts)) is not None:
            return stack
        w = kernel_weight(w)
        if w.data.ndim == 1:
            return cp.asarray(np.ascontiguousarray(w.to_f32(), dtype=np.float32))
        if w.dtype in kquant.KQUANT_TYPES:
            nib, aux = kquant.pack(cp.asarray(w.data), w.dtype, cp)
            return CudaWeight(w.dtype, (int(w.shape[0]), int(w.shape[1])), nib, aux)
        data, scales = pad_host(w)
        return CudaWeight(w.dtype, (int(w.shape[0]), int(w.shape[1])), cp.asarray(data),
                          None if scales is None else cp.asarray(scales))

    def upload_gate_up(self, gate: Weight, up: Weight) -> CudaWeight:
        both, f = concat_rows([gate, up]), int(gate.shape[0])
        if isinstance(both, RowStack):  # no stack of types here: f16, one operand
            both = kernel_weight(both)
        if streams_blocks(both.dtype) and f % 8 == 0:  # K-quant planes are packed from rows in tile order
            return replace(self.upload(Weight(interleave_gate_up(both.data, f), both.dtype)), gate_up="tiles")
        w = self.upload(both)
        if w.dtype == "f32" or f % 8:  # the float32 kernel has no tile epilogue; odd F: gated apart
            return replace(w, gate_up="halves")
        scales = None if w.scales is None else interleave_gate_up(w.scales, f)
        return replace(w, data=interleave_gate_up(w.data, f), scales=scales, gate_up="tiles")

    def upload_qkv(self, q: Weight, k: Weight, v: Weight, bias: Weight | None, head_dim: int):
        order = None if head_dim % 16 else (lambda n: rope_tile_order(n, head_dim))
        if order is not None and (stack := self._kq_stack([q, k, v], order)) is not None:
            n = stack.shape[0]  # K-quants of different types: each run in rope tiles
            b = None if bias is None else self.upload(Weight(bias.data[order(n)], bias.dtype))
            return CudaStack(tuple(replace(p, rope_tiles=head_dim) for p in stack.parts), head_dim), b
        w = kernel_weight(concat_rows([q, k, v]))
        if head_dim % 16:
            return self.upload(w), None if bias is None else self.upload(bias)
        order = rope_tile_order(w.shape[0], head_dim)  # regrouped on the host: one device copy
        w = Weight(w.data[order], w.dtype, None if w.scales is None else w.scales[order])
        b = None if bias is None else self.upload(Weight(bias.data[order], bias.dtype))
        return replace(self.upload(w), rope_tiles=head_dim), b

    def tensor(self, a: np.ndarray):
        return cp.asarray(a)

    def to_host(self, x) -> np.ndarray:
        return cp.asnumpy(x)

    @staticmethod
    def build_seconds() -> float:
        """Seconds spent building and loading kernels on first use so far (the self-check reports them)."""
        return modules.build_seconds()

    def to_host_async(self, x):
        x = cp.ascontiguousarray(x)
        host = cupyx.empty_pinned(x.shape, x.dtype)
        stream = cp.cuda.get_current_stream()
        if x.nbytes:
            x.data.copy_to_host_async(ctypes.c_void_p(host.ctypes.data), x.nbytes, stream)
        done = stream.record()

        def wait() -> np.ndarray:
            done.synchronize()
            return host

        return wait

    # --- math
    def embedding(self, table: CudaWeight, ids):
        ids = _index(ids)
        t = int(ids.shape[0])
        k = table.shape[1]
        out = cp.empty((t, k), dtype=cp.float32)
        if t == 0:
            return out
        kp = table.kp
        grid, block = plan.elementwise_grid(t * k)
        if table.dtype in kquant.KQUANT_TYPES:
            launch(kernel("pointwise.cu", "embed_" + table.dtype.replace("_", "")), grid, block,
                   (table.data, table.scales, ids, out, _i32(t), _i32(k), _i32(table.shape[0])))
        elif table.dtype == "q8_0":
            launch(kernel("pointwise.cu", "embed_q8"), grid, block,
                   (table.data, table.scales, ids, out, _i32(t), _i32(k), _i32(kp)))
        else:
            name = {"f32": "embed_f32", "f16": "embed_f16", "bf16": "embed_bf16"}[table.dtype]
            launch(kernel("pointwise.cu", name), grid, block, (table.data, ids, out, _i32(t), _i32(k), _i32(kp)))
        return out

    def rms_norm(self, x, weight, eps: float):
        x = _rows(x)
        d = int(x.shape[-1])
        y = cp.empty_like(x)
        rows = x.size // d
        if rows:
            launch(kernel("rows.cu", "rms_norm"), (rows,), (256,), (x, weight, y, _i32(d), np.float32(eps)))
        return y

    def matmul(self, x, w: CudaWeight, bias=None, residual=None):
        x = _rows(x)
        t, k = (int(s) for s in x.shape)
        n = w.shape[0]
        if w.shape[1] != k:
            raise ValueError(f"matmul shape mismatch: x has {k} columns, weight is {w.shape}")
        cublas = self._to_cublas(t, w)
        if w.gate_up is not None:
            if bias is not None or residual is not None:
                raise ValueError("a gated product takes no bias or residual")
            if w.gate_up == "halves" or cublas:  # the product, then silu_mul over its layout
                return self._gate(self.matmul(x, replace(w, gate_up=None)), w.gate_up)
        out = cp.empty((t, n // 2 if w.gate_up else n), dtype=cp.float32)
        if t == 0:
            return out
        if residual is not None:
            residual = _rows(residual)
        if cublas:
            return self._cublas(x, w, bias, residual, out)
        b = bias if bias is not None else self._dummy
        res = residual if residual is not None else self._dummy
        flags = _i32((EPI_BIAS if bias is not None else 0) | (EPI_RESIDUAL if residual is not None else 0)
                     | (EPI_SILU if w.gate_up else 0))
        if isinstance(w, CudaStack) or dispatch.kq_integer(w):
            return self._kq_matmul(self._kq_act(x, w), w, out, b, res, int(flags))
        kp = w.kp
        if w.dtype == "f32":
            grid, block = plan.f32_matmul_grid(t, n)
            launch(kernel("matmul.cu", "mm_f32"), grid, block,
                   (w.data, x, b, res, out, _i32(t), _i32(n), _i32(k), _i32(kp), flags, _i32(plan.F32_TOKENS_PER_Y)))
            return out
        scales = w.scales if w.scales is not None else self._dummy
        rows = plan.round_up(n, plan.ROW_TILE) if w.dtype in kquant.KQUANT_TYPES else int(w.data.shape[0])
        kind, wide = self._shared_memory_launch(t, w)
        if kind == "wgmma":  # long prefills on Hopper: the same sums on the warpgroup MMA (wgmma.cu)
            return self._wgmma(self._act16(x, kp, w.dtype == "bf16", perm=True), w, wide, b, res, out, flags)
        if kind == "wgmma_kq":  # K-quant prefills on Hopper: mm_tc's sums on the warpgroup MMA (wgmma_kq.cu)
            return self._wgmma_kq(self._act16(x, kp, False, perm=True), w, wide, b, res, out, flags)
        if kind == "wide":  # long prefills: the same sums on 16-bit activations staged in shared memory
            defines = (("WIDE_STAGES", plan.WIDE_STAGES), ("WIDE_KC", plan.WIDE_KC))
            launch(big_smem_kernel("matmul.cu", wide.kernel, wide.shared, defines), wide.grid, wide.block,
                   (w.data, scales, self._act16(x, kp, w.dtype == "bf16"), b, res, out, _i32(t), _i32(n), _i32(kp),
                    _i32(rows), flags, _i32(wide.split)), shared=wide.shared)
            return out
        if kind == "tile":  # wide batches: same sums, weights staged through shared memory
            launch(kernel("matmul.cu", wide.kernel), wide.grid, wide.block,
                   (w.data, scales, x, b, res, out, _i32(t), _i32(n), _i32(k), _i32(kp), _i32(rows),
                    flags, _i32(wide.split)))
            return out
        return self._streaming(x, w, out, b, res, flags)

    @staticmethod
    def _wgmma(x16, w: CudaWeight, wide: plan.MatmulLaunch, bias, res, out, flags):
        """mm_wgmma_tma over x16, t rows of 16-bit activations in its `perm` k order."""
        rows = plan.wgmma_rows(wide)
        fn = big_smem_kernel("wgmma.cu", wide.kernel, wide.shared, wide.defines)
        launch(fn, wide.grid, wide.block,
               (tensor_map.tiled_2d(w.data, (32, rows), tensor_map.SWIZZLE_NONE),
                tensor_map.tiled_2d(x16, (64, plan.wgmma_token_box(wide)), tensor_map.SWIZZLE_128B), bias, res, out,
                _i32(x16.shape[0]), _i32(w.shape[0]), _i32(w.kp), _i32(flags), _i32(wide.split)),
               shared=wide.shared)
        return out

    def _wgmma_kq(self, x16, w: CudaWeight, kq: plan.MatmulLaunch, bias, res, out, flags):
        """mm_wgmma_kq over x16 (f16 activations in act_to_16's `perm` order), Q4_K's after the tokens' ones
        sums (q4k_ones_sums)."""
        t, kp = (int(s) for s in x16.shape)
        e = self._dummy  # Q6_K reads no ones sums
        if w.dtype == "q4_k":
            e = cp.empty((plan.ceil_div(t, plan.WIDE_M), kp // plan.K_CHUNK, plan.WIDE_M), dtype=cp.float32)
            grid, block = plan.q4k_ones_grid(t, kp)
            launch(kernel("matmul.cu", "q4k_ones_sums"), grid, block, (x16, e, _i32(t), _i32(kp)))
        launch(big_smem_kernel("wgmma_kq.cu", kq.kernel, kq.shared, kq.defines), kq.grid, kq.block,
               (tensor_map.tiled_2d(x16, (64, plan.WIDE_M), tensor_map.SWIZZLE_128B), w.data, w.scales, e, bias, res,
                out, _i32(t), _i32(w.shape[0]), _i32(kp), _i32(flags), _i32(kq.split)), shared=kq.shared)
        return out

    # Which kernel an op takes for t rows: lockstep_kernels/cuda/dispatch.py (testable without a GPU).
    def _shared_memory_launch(self, t: int, w: CudaWeight) -> tuple[str | None, plan.MatmulLaunch | None]:
        return dispatch.shared_memory_launch(self, t, w)

    def matmul_family(self, t: int, w: CudaWeight | CudaStack) -> str:
        """The kernel family `matmul` runs t rows of w on (the exactness self-check probes each)."""
        return self._family(dispatch.matmul_family, t, w)

    def norm_matmul_family(self, t: int, w: CudaWeight | CudaStack) -> str:
        return self._family(dispatch.norm_matmul_family, t, w)

    def qkv_family(self, t: int, w: CudaWeight | CudaStack) -> str:
        return self._family(dispatch.qkv_family, t, w)

    def _family(self, of, t: int, w: CudaWeight | CudaStack) -> str:
        """of(self, t, w); a stack's runs' families joined."""
        if isinstance(w, CudaStack):
            return "|".join(of(self, t, p) for p in w.parts)
        return of(self, t, w)

    def attention_build(self, t: int, n_heads: int, n_kv: int, head_dim: int, width: int, kv_type: str = "f16") -> str:
        return dispatch.attention_build(self, t, n_heads, n_kv, head_dim, width, kv_type)

    def _to_cublas(self, t: int, w: CudaWeight) -> bool:
        return dispatch.to_cublas(self, t, w)

    def _streams(self, t: int, w: CudaWeight) -> bool:
        return dispatch.streams(self, t, w)

    def _prologue(self, t: int, k: int, w: CudaWeight) -> str | None:
        return dispatch.prologue(self, t, k, w)

    def _reads_16bit(self, t: int, w: CudaWeight) -> bool:
        return dispatch.reads_16bit(self, t, w)

    def _streaming(self, x, w: CudaWeight, out, bias, res, flags, prologue: str | None = None, norm_weight=None,
                   eps: float = 0.0, qkv_out: tuple = ()):
        """The streaming tensor-core kernel (mm_tc); with the norm prologue, x is its input's input.
        `qkv_out`: where EPI_ROPE stores (norm_qkv_rope_write)."""
        t = int(out.shape[0])
        if mv := dispatch.matvec_launch(self, t, w, prologue, rope=bool(qkv_out)):
            return self._matvec(mv, x, w, out, bias, res, flags, norm_weight, eps)
        mm = plan.matmul_launch(w.dtype, t, w.shape[0], w.shape[1], self.sm_count, prologue=prologue)
        launch(streaming_kernel(mm), mm.grid, mm.block,
               mm_tc_args(w, x, out, self._dummy, bias, res, flags, norm_weight, eps, qkv_out), shared=mm.shared)
        return out

    def _matvec(self, mv: plan.MatmulLaunch, x, w: CudaWeight, out, bias, res, flags, norm_weight=None, eps=0.0,
                gate=None, seg: int = 0):
        """One row on matvec.cu (mv_*: mm_tc's bits); `gate`, `seg`: the gated norm's (mv_*_gated)."""
        d = self._dummy
        launch(kernel("matvec.cu", mv.kernel, plan.matvec_build(mv.split)[0]), mv.grid, mv.block,
               (w.data, x, d if bias is None else bias, d if res is None else res, out, _i32(w.shape[0]),
                _i32(w.shape[1]), _i32(w.kp), _i32(flags), d if norm_weight is None else norm_weight,
                np.float32(eps), d if gate is None else gate, _i32(seg)), shared=mv.shared)
        return out

    def _takes_16bit(self, t: int, w: CudaWeight, k: int, bf16: bool) -> bool:
        """Whether t rows of k 16-bit values (bf16 or f16), unpadded, can feed w's streaming kernel."""
        return (w.shape[1] == k and w.kp == k and (w.dtype == "bf16") == bf16
                and self._reads_16bit(t, w))

    def _normed(self, x, norm_weight, eps: float, w: CudaWeight, prologue: str | None):
        """The streaming kernel's input for `prologue` (see _prologue)."""
        if prologue == "norm":
            return x
        if prologue != "x16":
            return self.rms_norm(x, norm_weight, eps)
        return self._norm16(x, norm_weight, eps, w)

    @staticmethod
    def _norm16(x, norm_weight, eps: float, w: CudaWeight, perm: bool = False):
        """rms_norm's rows as w's kernel takes its 16-bit input, padded to its k (`perm`: mm_wgmma's k order)."""
        t, k = (int(s) for s in x.shape)
        kp = w.kp
        y = cp.empty((t, kp), dtype=cp.uint16)
        launch(kernel("rows.cu", "rms_norm_16"), (t,), (256,),
               (x, norm_weight, y, _i32(k), _i32(kp), np.float32(eps), _i32(w.dtype == "bf16"), _i32(perm)))
        return y

    def norm_matmul(self, x, norm_weight, eps: float, w: CudaWeight, bias=None):
        x = _rows(x)
        t, k = (int(s) for s in x.shape)
        if (isinstance(w, CudaStack) or dispatch.kq_integer(w)) and w.gate_up != "halves" and w.shape[1] == k:
            if w.gate_up is not None and bias is not None:
                raise ValueError("a gated product takes no bias or residual")
            return self._kq_norm_matmul(x, norm_weight, eps, w, bias)
        prologue = self._prologue(t, k, w)
        wgmma = prologue is None and self._to_wgmma(t, k, w)
        kq = prologue is None and not wgmma and dispatch.to_wgmma_kq(self, t, k, w)
        if prologue is None and not (wgmma or kq):
            return self.matmul(self.rms_norm(x, norm_weight, eps), w, bias)
        if w.gate_up is not None and bias is not None:
            raise ValueError("a gated product takes no bias or residual")
        out = cp.empty((t, w.shape[0] // 2 if w.gate_up else w.shape[0]), dtype=cp.float32)
        flags = (EPI_BIAS if bias is not None else 0) | (EPI_SILU if w.gate_up else 0)
        if wgmma or kq:  # long prompts: the normalised rows reach mm_wgmma(_kq) as 16-bit values in its k order
            b = bias if bias is not None else self._dummy
            run = self._wgmma if wgmma else self._wgmma_kq
            return run(self._norm16(x, norm_weight, eps, w, perm=True), w, wgmma or kq, b, self._dummy, out, flags)
        return self._streaming(self._normed(x, norm_weight, eps, w, prologue), w, out, bias, None, flags, prologue,
                               norm_weight, eps)

    def gated_norm_matmul(self, x, weight, gate, eps: float, w: CudaWeight, residual):
        seg, k = int(weight.shape[0]), w.shape[1]
        t = int(x.size) // k
        mv = dispatch.matvec_launch(self, t, w, "gated") if w.gate_up is None and plan.MV_GATED else None
        if mv is None or k % seg or k // seg > plan.MV_MAX_SEGS:
            return self.matmul(self.gated_rms_norm(x, weight, gate, eps).reshape(t, k), w, residual=residual)
        row = cp.ascontiguousarray(x, dtype=cp.float32).reshape(1, k)
        gate = cp.ascontiguousarray(gate, dtype=cp.float32).reshape(1, k)
        return self._matvec(mv, row, w, cp.empty((1, w.shape[0]), dtype=cp.float32), None, _rows(residual),
                            EPI_RESIDUAL, weight, eps, gate, seg)

    def _to_wgmma(self, t: int, k: int, w: CudaWeight) -> plan.MatmulLaunch | None:
        return dispatch.to_wgmma(self, t, k, w)

    def ffn(self, x, norm_weight, eps: float, w_gate_up: CudaWeight, w_down: CudaWeight):
        x = _rows(x)
        t, k = (int(s) for s in x.shape)
        f = w_gate_up.shape[0] // 2
        # 9-16 rows (one row: plan.ONE_X16_TYPES): the gated products go to the down projection as
        # 16-bit pairs too (EPI_OUT16)
        pro = self._prologue(t, k, w_gate_up)
        if (pro in ("x16", "norm") and w_gate_up.gate_up == "tiles"
                and self._takes_16bit(t, w_down, f, w_gate_up.dtype == "bf16")):
            act = cp.empty((t, f), dtype=cp.uint16)
            self._streaming(self._normed(x, norm_weight, eps, w_gate_up, pro), w_gate_up, act, self._dummy, None,
                            EPI_SILU | EPI_OUT16, pro, norm_weight, eps)
            out = cp.empty((t, w_down.shape[0]), dtype=cp.float32)
            return self._streaming(act, w_down, out, self._dummy, x, EPI_RESIDUAL, "x16")
        if (w_gate_up.gate_up == "tiles" and w_gate_up.dtype == w_down.dtype and w_down.shape[1] == f
                and f == w_down.kp and (gate_up := self._to_wgmma(t, k, w_gate_up))
                and (down := self._to_wgmma(t, f, w_down))):
            # long prompts: the gated products go to the down projection as 16-bit values in its k order
            x16 = self._norm16(x, norm_weight, eps, w_gate_up, perm=True)
            act = self._wgmma(x16, w_gate_up, gate_up, self._dummy, self._dummy, cp.empty((t, f), dtype=cp.uint16),
                              EPI_SILU | EPI_OUT16)
            out = cp.empty((t, w_down.shape[0]), dtype=cp.float32)
            return self._wgmma(act, w_down, down, self._dummy, x, out, EPI_RESIDUAL)
        return self.matmul(self.norm_matmul(x, norm_weight, eps, w_gate_up), w_down, residual=x)

    def _cublas(self, x, w: CudaWeight, bias, residual, out):
        t, k = x.shape
        n = w.shape[0]
        if w.dtype == "f32":
            cp.matmul(x, w.data[:n, :k].T, out=out)
        else:
            kp = w.kp
            gemm_16bit(w.data, self._act16(x, kp, w.dtype == "bf16"), out, n, t, kp, w.dtype)
        if bias is not None:
            out += bias
        if residual is not None:
            out += residual
        return out

    @staticmethod
    def _act16(x, kp: int, bf16: bool, perm: bool = False):
        """Activations rounded to f16 (bf16), zero-padded to kp columns: what the MMAs are fed
        (`perm`: in mm_wgmma's k order)."""
        t, k = (int(s) for s in x.shape)
        x16 = cp.empty((t, kp), dtype=cp.uint16)
        grid, block = plan.act16_grid(t, kp)
        launch(kernel("matmul.cu", "act_to_16"), grid, block,
               (x, x16, _i32(t), _i32(k), _i32(kp), _i32(bf16), _i32(perm)))
        return x16

    def _gate(self, y, layout: str):
        """silu(gate) * up of a gated product computed in full (cuBLAS, float32 weights, odd F)."""
        t, f = int(y.shape[0]), int(y.shape[1]) // 2
        if layout == "halves":
            return self.silu_mul(y[:, :f], y[:, f:])
        out = cp.empty((t, f), dtype=cp.float32)
        if t * f:
            grid, block = plan.elementwise_grid(t * f)
            launch(kernel("pointwise.cu", "silu_tiles"), grid, block, (y, out, _i32(t), _i32(f)))
        return out

    def rope(self, x, positions, table: RopeTable):
        x = _rows(x)
        t, h, dh = (int(s) for s in x.shape)
        y = cp.empty_like(x)
        n = t * h * (dh // 2)
        if n:
            grid, block = plan.elementwise_grid(n)
            launch(kernel("pointwise.cu", "rope"), grid, block,
                   (x, y, _index(positions), table.cos, table.sin, _i32(t), _i32(h), _i32(dh), _i32(table.neox)))
        return y

    def silu_mul(self, gate, up):
        gate, up = _halves(gate, up)
        t, f = (int(s) for s in gate.shape)
        y = cp.empty((t, f), dtype=cp.float32)
        if t * f:
            grid, block = plan.elementwise_grid(t * f)
            launch(kernel("pointwise.cu", "silu_mul"), grid, block,
                   (gate, up, y, _i32(t), _i32(f), np.int64(gate.strides[0] // 4)))
        return y

    def add(self, a, b):
        a, b = _rows(a), _rows(b)
        y = cp.empty_like(a)
        if a.size:
            grid, block = plan.elementwise_grid(a.size)
            launch(kernel("pointwise.cu", "add"), grid, block, (a, b, y, np.int64(a.size)))
        return y

    def argmax(self, logits):
        """Index of each row's largest logit (ties to the lowest index), int32 on the device."""
        x = _rows(logits)
        rows, v = (int(s) for s in x.shape)
        out = cp.empty(rows, dtype=cp.int32)
        if rows:
            parts = plan.argmax_parts(v)
            pv, pi = cp.empty((rows, parts), cp.float32), cp.empty((rows, parts), cp.int32)
            launch(kernel("rows.cu", "argmax_part"), (rows, parts), (256,), (x, pv, pi, _i32(v)))
            launch(kernel("rows.cu", "argmax_final"), (rows,), (256,), (pv, pi, out, _i32(parts)))
        return out

    # --- paged KV cache and attention
    def kv_alloc(self, n_pages: int, n_kv_heads: int, head_dim: int, kv_type: str,
                 v_type: str | None = None) -> CudaKVLayer:
        if v_type not in (None, kv_type):
            raise ValueError(f"different K and V cache types ({kv_type}, {v_type}) are not supported on CUDA")
        if kv_type not in KV_CODES:
            raise ValueError(f"KV cache type {kv_type!r} is not supported on CUDA (use f16, bf16 or f32)")
        if head_dim % 8 or PAGE_SIZE % head_dim:
            raise ValueError(f"head dim {head_dim} is not supported on CUDA (32, 64, 128 or 256)")
        shape = (n_pages, PAGE_SIZE, n_kv_heads, head_dim)
        dt = KV_DTYPES[kv_type]
        return CudaKVLayer(kv_type, cp.zeros(shape, dtype=dt), cp.zeros(shape, dtype=dt))

    def kv_write(self, layer: CudaKVLayer, k, v, slots) -> None:
        k, v = _rows(k), _rows(v)
        t = int(k.shape[0])
        if not t:
            return
        hd = k.size // t
        grid, block = plan.elementwise_grid(t * hd)
        launch(kernel("kv_cache.cu", f"kv_write_{layer.kv_type}"), grid, block,
               (k, v, layer.k, layer.v, _index(slots, cp.int64), _i32(t), _i32(hd)))

    def qkv_rope_write(self, qkv, rows: PagedRows, table: RopeTable, layer: CudaKVLayer, n_heads: int,
                       n_kv: int, tiles: bool = False):
        """`tiles`: qkv is the product of an upload_qkv weight (each head's dims in rope-pair tiles)."""
        qkv = _rows(qkv)
        t = int(qkv.shape[0])
        d = int(qkv.shape[1]) // (n_heads + 2 * n_kv)
        q = cp.empty((t, n_heads, d), dtype=cp.float32)
        n = t * (n_heads + 2 * n_kv) * (d // 2)
        if n:
            grid, block = plan.elementwise_grid(n)
            launch(kernel("kv_cache.cu", f"rope_qkv_write_{layer.kv_type}"), grid, block,
                   (qkv, q, layer.k, layer.v, _index(rows.positions), _index(rows.slots, cp.int64),
                    table.cos, table.sin, _i32(t), _i32(n_heads), _i32(n_kv), _i32(d), _i32(table.neox), _i32(tiles)))
        return q

    def qk_norm_rope_write(self, qkv, q_norm, k_norm, eps: float, rows: PagedRows, table: RopeTable,
                           layer: CudaKVLayer, n_heads: int, n_kv: int):
        """One block per (row, head) of kv_cache.cu's qk_norm_rope_qkv_write (the five launches of the
        separate ops in one)."""
        qkv = _rows(qkv)
        t = int(qkv.shape[0])
        d = int(qkv.shape[1]) // (n_heads + 2 * n_kv)
        if layer.kv_type not in ("f32", "f16", "bf16") or d % 2 or d > 2048:
            return split_qk_norm_rope_write(self, qkv, q_norm, k_norm, eps, rows, table, layer, n_heads, n_kv)
        q = cp.empty((t, n_heads, d), dtype=cp.float32)
        if t:
            launch(kernel("kv_cache.cu", f"qk_norm_rope_qkv_write_{layer.kv_type}"), (t * (n_heads + 2 * n_kv),),
                   (plan.round_up(max(d // 2, 32), 32),),
                   (qkv, q_norm, k_norm, np.float32(eps), q, layer.k, layer.v, _index(rows.positions),
                    _index(rows.slots, cp.int64), table.cos, table.sin, _i32(n_heads), _i32(n_kv), _i32(d),
                    _i32(table.neox)))
        return q

    def norm_qkv_rope_write(self, x, norm_weight, eps: float, w: CudaWeight, bias, rows: PagedRows, table: RopeTable,
                            layer: CudaKVLayer, n_heads: int, n_kv: int):
        if not w.rope_tiles:
            return self.qkv_rope_write(self.norm_matmul(x, norm_weight, eps, w, bias), rows, table, layer, n_heads, n_kv)
        if not table.neox:
            raise ValueError("an upload_qkv weight pairs dims d and d + head_dim/2 (neox rotation) only")
        x = _rows(x)
        t, k = (int(s) for s in x.shape)
        if not isinstance(w, CudaStack) and not self._streams(t, w):  # the product in tile order, then the rotation
            return self.qkv_rope_write(self.norm_matmul(x, norm_weight, eps, w, bias), rows, table, layer, n_heads,
                                       n_kv, tiles=True)
        # the streaming kernel's epilogue rotates and stores: one launch fewer per layer
        d = w.rope_tiles
        q = cp.empty((t, n_heads, d), dtype=cp.float32)
        if not t:
            return q
        out = (layer.k, layer.v, _index(rows.positions), _index(rows.slots, cp.int64), table.cos, table.sin,
               _i32(n_heads), _i32(n_kv), _i32(d), _i32(KV_CODES[layer.kv_type]))
        if isinstance(w, CudaStack) or dispatch.kq_integer(w):
            return self._kq_qkv_rope(x, norm_weight, eps, w, bias, q, out)
        prologue = self._prologue(t, k, w)
        return self._streaming(self._normed(x, norm_weight, eps, w, prologue), w, q, bias, None,
                               EPI_ROPE | (EPI_BIAS if bias is not None else 0), prologue, norm_weight, eps, out)

    def attention_out(self, q, layer: CudaKVLayer, rows: PagedRows, scale: float, wo: CudaWeight, residual):
        q = _rows(q)
        t, n_heads, d = (int(s) for s in q.shape)
        k = n_heads * d
        # 9-16 rows: attention's output reaches the o projection as its 16-bit pairs (OUT16)
        if self._takes_16bit(t, wo, k, wo.dtype == "bf16"):
            attn = self.attention(q, layer, rows, scale, out16=2 if wo.dtype == "bf16" else 1)
            out = cp.empty((t, wo.shape[0]), dtype=cp.float32)
            return self._streaming(attn, wo, out, self._dummy, _rows(residual), EPI_RESIDUAL, "x16")
        return self.matmul(self.attention(q, layer, rows, scale), wo, residual=residual)

    def attention(self, q, layer: CudaKVLayer, rows: PagedRows, scale: float, out16: int = 0):
        """`out16` (attention_out): the output as the o projection's 16-bit values, 1 f16, 2 bf16."""
        q = _rows(q)
        t, n_heads, d = (int(s) for s in q.shape)
        n_kv = int(layer.k.shape[2])
        out = cp.empty((t, n_heads * d), dtype=cp.uint16 if out16 else cp.float32)
        if not t:
            return out
        positions, seq = _index(rows.positions), _index(rows.seq)
        tables = _index(rows.block_tables)
        width = int(tables.shape[1])
        if plan.mma_attention(layer.kv_type, d):
            self._attention_mma(q, layer, positions, seq, tables, scale, out16, out)
            return out
        slots = cp.full(t, -1, cp.int64) if rows.slots is None else _index(rows.slots, cp.int64)
        at = plan.attention_launch(t, n_heads, n_kv, d, width, self.sm_count)
        defines = (("HEAD_DIM", d), ("GROUP_MAX", at.gm), ("KV_T", KV_CODES[layer.kv_type]), ("OUT16", out16)) + at.build
        partial = kernel("attention.cu", "attn_partial", defines)
        merge = kernel("attention.cu", "attn_merge", defines + plan.merge_build())
        step = at.row_slice
        part = cp.empty((min(t, step), n_heads, width, d + 2), dtype=cp.float32)
        groups = n_kv * at.subgroups
        fused = min(t, step) * groups <= ATTN_COUNTERS
        for r0 in range(0, t, step):
            r1 = min(t, r0 + step)
            # Row slices only bound the scratch: rows are independent, so the bits are the same.
            launch(partial, (r1 - r0, groups, at.workers), (plan.ATTN_THREADS,),
                   (q[r0:r1], layer.k, layer.v, positions[r0:r1], seq[r0:r1], tables, slots[r0:r1], part,
                    _i32(n_heads), _i32(n_kv), _i32(width), np.float32(scale), _i32(fused),
                    self._attn_counters, out[r0:r1]))
            if not fused:
                launch(merge, (r1 - r0, n_heads), (d,),
                       (part, positions[r0:r1], out[r0:r1], _i32(n_heads), _i32(width)), early=False)
        return out

    def _attention_mma(self, q, layer: CudaKVLayer, positions, seq, tables, scale: float, out16: int, out) -> None:
        """Tensor-core attention (attention_mma.cu) of a 16-bit cache into `out`."""
        t, n_heads, d = (int(s) for s in q.shape)
        n_kv, width = int(layer.k.shape[2]), int(tables.shape[1])
        k16, v16 = layer.k.view(cp.uint16), layer.v.view(cp.uint16)
        wt = dispatch.wgmma_attention(self, t, n_heads, n_kv, d, width, layer.kv_type)
        if wt is not None:
            kv = (("KV_T", KV_CODES[layer.kv_type]), ("OUT16", out16), ("EX2", plan.MMA_EX2))
            lean = self.attention_ws_lean
            tma = wt.ws and self.attention_ws_tma and (lean or plan.WGMMA_WS_LEAN)
            fn = (big_smem_kernel("attention_ws.cu", "attn_ws", wt.shared,
                                  (("HEAD_DIM", d), ("GP", wt.gp), ("NS", wt.stages), ("PP", int(plan.WGMMA_WS_PINGPONG)),
                                   ("OV", int(plan.WGMMA_WS_OVERLAP)), ("MK", int(plan.WGMMA_WS_SKIP_MASK or lean)),
                                   *((("LN", 1),) if plan.WGMMA_WS_LEAN or lean else ()),
                                   *((("FZ", 1),) if plan.WGMMA_WS_FTZ or lean else ()),
                                   *((("VF", 1),) if plan.WGMMA_WS_VEC_FOLD or lean else ()),
                                   *((("TK", 1),) if tma else ()), *kv))
                  if wt.ws else
                  big_smem_kernel("attention_wgmma.cu", "attn_wgmma", wt.shared,
                                  (("HEAD_DIM", d), ("GP", wt.gp), ("WQ", wt.groups), ("NS", wt.stages), *kv)))
            # TMA: each cache as [pages x page keys][heads x head dim], boxes of 64 keys x 64 dims
            maps = tuple(tensor_map.tiled_2d(c.reshape(-1, n_kv * d), (64, 64), tensor_map.SWIZZLE_128B)
                         for c in (k16, v16)) if tma else ()
            launch(fn, (plan.ceil_div(t, wt.rb), n_kv * wt.subgroups, 1), (wt.threads,),
                   (q, k16, v16, positions, seq, tables, _i32(t), _i32(n_heads), _i32(n_kv), _i32(width),
                    np.float32(scale), out, *maps), shared=wt.shared)
            return
        at = plan.mma_attention_launch(t, n_heads, n_kv, d, width, self.sm_count)
        defines = (("HEAD_DIM", d), ("GP", at.gp), ("RB", at.rb), ("KV_T", KV_CODES[layer.kv_type]), ("OUT16", out16),
                   ("DW", at.dim_warps), ("MIN_BLOCKS", at.min_blocks), ("EX2", plan.MMA_EX2))
        defines += (("SHARE_S", 1),) if at.share_s else ()
        groups = n_kv * at.subgroups
        step = at.row_slice
        # the one build may serve launches with and without the folded O (captured in graphs alike): it
        # is allowed the larger
        fn = big_smem_kernel("attention_mma.cu", "attn_mma",
                             plan.mma_attention_smem(d, at.threads // (32 * at.dim_warps), False, bool(at.share_s)),
                             defines)
        part = cp.empty((min(t, step), n_heads, width, d + 2), dtype=cp.float32) if at.workers > 1 else self._dummy
        for r0 in range(0, t, step):
            r1 = min(t, r0 + step)
            # Row slices only bound the scratch: rows are independent, so the bits are the same.
            launch(fn, (plan.ceil_div(r1 - r0, at.rb), groups, at.workers), (at.threads,),
                   (q[r0:r1], k16, v16, positions[r0:r1], seq[r0:r1], tables, part, _i32(r1 - r0), _i32(n_heads),
                    _i32(n_kv), _i32(width), np.float32(scale), out[r0:r1]), shared=at.shared)
            if at.workers > 1:  # the merge waits for the whole attention: started early, its blocks slowed it
                merge = kernel("attention.cu", "attn_merge", (("HEAD_DIM", d), ("OUT16", out16)) + plan.merge_build())
                launch(merge, (r1 - r0, n_heads), (d,),
                       (part, positions[r0:r1], out[r0:r1], _i32(n_heads), _i32(width)), early=False)

    def kv_read_pages(self, layer: CudaKVLayer, pages) -> tuple[np.ndarray, ...]:
        idx = _index(pages, cp.int64)
        return cp.asnumpy(layer.k[idx]), cp.asnumpy(layer.v[idx])

    def kv_write_pages(self, layer: CudaKVLayer, pages, data: tuple[np.ndarray, ...]) -> None:
        idx = _index(pages, cp.int64)
        layer.k[idx] = cp.asarray(data[0])
        layer.v[idx] = cp.asarray(data[1])

    def kv_copy_pages(self, layer: CudaKVLayer, src, dst) -> None:
        s, d = _index(src, cp.int64), _index(dst, cp.int64)
        layer.k[d] = layer.k[s]
        layer.v[d] = layer.v[s]

    # --- CUDA graphs
    def decode_graphs(self, forward, max_pages: int, buckets=None, recurrent=None):
        """Replayed decode steps for `forward(ids, rows, None) -> logits of every row` (see graphs.py);
        `recurrent`: a hybrid model's state_alloc arguments."""
        from lockstep_kernels.cuda.graph_inputs import DEFAULT_BUCKETS
        from lockstep_kernels.cuda.graphs import DecodeGraphs

        return DecodeGraphs(forward, self.argmax, max_pages, buckets or DEFAULT_BUCKETS, recurrent)
