"""Weights as the CUDA kernels read them: padded to whole row tiles and K chunks (zeros add nothing
to a dot product), 16-bit types as raw uint16, Q8_0 as int8 values plus f16 scales per 32, Q4_K and
Q6_K repacked into planes (lockstep_kernels/cuda/kquant.py).

The other quantized types have no CUDA kernels yet: they are dequantised to f16 at load
(kernel_weight), and so are stacks of parts of different types (a Q4_K_M q|k|v whose v is Q6_K),
except where every part is a K-quant on the integer kernels: a CudaStack of its runs' planes. Memory
planning counts each as it is stored (device_bytes, stack_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lockstep_kernels.cpu.quant_matmul import f32_tiles
from lockstep_kernels.cuda import kquant, plan
from lockstep_kernels.cuda.plan import K_CHUNK, padded_shape
from lockstep_kernels.weights import RowStack, Weight

# Whether Q4_K and Q6_K weights stay as blocks (kquant planes the matmul kernels read); False
# dequantises them to f16 at load like the types without kernels (tests compare the two paths).
KQUANT_KERNELS = True
STORAGE = {"f32": np.float32, "f16": np.uint16, "bf16": np.uint16, "q8_0": np.int8}


@dataclass
class CudaWeight:
    dtype: str
    shape: tuple[int, int]  # logical (N, K)
    data: Any  # device [Np, Kp]
    scales: Any = None  # q8_0: device uint16 (f16 bits) [Np, Kp // 32]; q4_k, q6_k: kquant.pack's aux
    # Ops.upload_gate_up: "tiles" (rows interleaved by 8, each 16-row tile = 8 gate rows then the
    # matching 8 up rows, so a matmul epilogue holds both halves of an output) or "halves" (gate
    # rows then up rows, where F is not a multiple of 8); products are silu(gate) * up.
    gate_up: str | None = None
    # Ops.upload_qkv: each head's rows (this many) as 16-row tiles of dims 8i .. 8i+7, then D/2 + 8i ..
    # D/2 + 8i+7 (rope pairs 8 rows apart: one thread holds both); products come in that order.
    rope_tiles: int = 0

    @property
    def kp(self) -> int:
        """K padded to whole chunks (the row stride of the activations the kernels take)."""
        return self.shape[1] if self.dtype in kquant.KQUANT_TYPES else int(self.data.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes) + (int(self.scales.nbytes) if self.scales is not None else 0)


@dataclass
class CudaStack:
    """Runs of parts of one K-quant type whose output rows follow one another (Q4_K_M's q|k as Q4_K,
    v as Q6_K), each its own CudaWeight: the activations are quantised once and each run's kernel
    writes its columns (kquant_ops.py). `rope_tiles`: as CudaWeight's, each run in rope-pair tiles."""
    parts: tuple[CudaWeight, ...]
    rope_tiles: int = 0
    gate_up = None
    dtype = "stack"

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    @property
    def kp(self) -> int:
        return self.parts[0].kp

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def type_runs(parts: list[Weight]) -> list[list[Weight]] | None:
    """The runs of consecutive parts of one type where the parts are K-quants of different types and
    the integer kernels take them (a CudaStack of concat_rows of each); else None."""
    types = [w.dtype for w in parts]
    if len(set(types)) < 2 or not plan.KQ_INTEGER or not all(streams_blocks(t) for t in types):
        return None
    runs: list[list[Weight]] = []
    for w in parts:
        if runs and runs[-1][0].dtype == w.dtype:
            runs[-1].append(w)
        else:
            runs.append([w])
    return runs


def pad_host(w: Weight) -> tuple[np.ndarray, np.ndarray | None]:
    """The stored arrays of a 2-D weight, padded; no copy when the shape is already whole."""
    n, k = w.shape
    np_, kp = padded_shape(n, k)
    data = w.data.view(np.uint16) if w.dtype == "f16" else w.data
    data = np.ascontiguousarray(data, dtype=STORAGE[w.dtype])
    if (np_, kp) != (n, k):
        full = np.zeros((np_, kp), dtype=data.dtype)
        full[:n, :k] = data
        data = full
    scales = None
    if w.dtype == "q8_0":
        s = np.ascontiguousarray(w.scales, dtype=np.float16).view(np.uint16)
        if s.shape != (np_, kp // K_CHUNK):
            full = np.zeros((np_, kp // K_CHUNK), dtype=np.uint16)
            full[:n, : s.shape[1]] = s
            s = full
        scales = s
    return data, scales


def kernel_weight(w: Weight | RowStack, planes: bool = True) -> Weight:
    """The weight in a type the kernels read: raw blocks without kernels (all blocks where a kernel
    reads no planes, `planes` False), and stacks of parts of different types, become f16, converted
    a tile of rows at a time (never a float32 copy of the whole tensor)."""
    if not w.blocks or (planes and streams_blocks(w.dtype)):
        return w
    out = np.empty(w.shape, dtype=np.float16)
    for n0, tile in f32_tiles(w, 4096):
        out[n0 : n0 + tile.shape[0]] = tile
    return Weight(out, "f16")


def streams_blocks(dtype: str) -> bool:
    """Whether weights of this type reach the kernels as blocks (kquant planes), not as f16."""
    return KQUANT_KERNELS and plan.kquant_planes(dtype)


def routed_expert(name: str) -> bool:
    """Whether a weight is one routed expert's projection (engine.models.moe's per-expert names):
    f16 on the device whatever its blocks, as the grouped kernels (lockstep_kernels/cuda/moe.py) read no planes yet."""
    return ".mlp.experts." in name


def f16_at_load(weights: dict[str, Weight]) -> list[str]:
    """The load's lines for quantized weights that become f16 on the device: types without kernels,
    and K-quant routed experts; each names the types, the tensors and the memory, stored -> on the GPU."""
    raw = [w for w in weights.values() if w.blocks and not streams_blocks(w.dtype)]
    experts = [w for n, w in weights.items() if routed_expert(n) and w.blocks and streams_blocks(w.dtype)]
    lines = []
    for ws, what in ((raw, "no kernels for {} yet"), (experts, "no MoE expert kernels for {} yet")):
        if ws:
            gib = 1 << 30
            lines.append(f"cuda: {what.format(', '.join(sorted({w.dtype.upper() for w in ws})))}: {len(ws)} tensors "
                         f"dequantised to f16 at load, {sum(w.nbytes for w in ws) / gib:.2f} GiB stored -> "
                         f"{sum(device_bytes(w, planes=False) for w in ws) / gib:.2f} GiB on the GPU")
    return lines


def device_bytes(w: Weight, planes: bool = True) -> int:
    """Bytes a weight takes on the device (for sizing memory before a load); `planes` as kernel_weight's."""
    if w.data.ndim != 2:  # vectors, and the causal conv's [D, 1, K] of hybrid models: float32
        return w.size * 4
    n, k = w.shape
    if planes and streams_blocks(w.dtype):
        return kquant.packed_bytes(n, k, w.dtype)
    np_, kp = padded_shape(n, k)
    dtype = "f16" if w.blocks else w.dtype
    item = np.dtype(STORAGE[dtype]).itemsize
    return np_ * kp * item + (np_ * (kp // K_CHUNK) * 2 if dtype == "q8_0" else 0)


def stack_bytes(parts: list[Weight], runs: bool = True) -> int:
    """Bytes concat_rows(parts) takes on the device: parts of one type as they are, K-quants of
    different types as their runs' planes (CudaStack; `runs` False: a gate|up pair, which needs one
    operand), other parts of different types as the one f16 weight kernel_weight makes of their RowStack."""
    if len({w.dtype for w in parts}) == 1:
        return sum(device_bytes(w) for w in parts)
    if runs and (of_type := type_runs(parts)) is not None:
        return sum(kquant.packed_bytes(sum(int(w.shape[0]) for w in r), int(r[0].shape[1]), r[0].dtype)
                   for r in of_type)
    np_, kp = padded_shape(sum(int(w.shape[0]) for w in parts), int(parts[0].shape[1]))
    return np_ * kp * np.dtype(STORAGE["f16"]).itemsize


def interleave_gate_up(a, f: int):
    """Rows [gate 0..F-1 | up 0..F-1] of a device array as 16-row tiles of 8 gate rows, then the
    same 8 up rows (F a multiple of 8)."""
    rest = a.shape[1:]
    return a[: 2 * f].reshape(2, f // 8, 8, *rest).swapaxes(0, 1).reshape(2 * f, *rest).copy()


def rope_tile_order(n: int, d: int) -> np.ndarray:
    """Row order of n rows (whole heads of d rows) with each head's rows as 16-row tiles: dims 8i ..
    8i+7, then d/2 + 8i .. d/2 + 8i+7 (d a multiple of 16)."""
    return np.arange(n).reshape(n // d, 2, d // 16, 8).swapaxes(1, 2).reshape(n)
