"""Weights in their stored form: the model keeps 16-bit and quantized tensors as they are on disk."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lockstep_kernels.quants import BLOCK_TYPES, dequantize, row_values

QK8_0 = 32  # values per Q8_0 block
# Q8_0 is split into int8 values and f16 scales (the layout the CUDA kernels read); the other block
# types stay raw ggml blocks, one row of blocks per output row.
RAW_BLOCK_TYPES = tuple(t for t in BLOCK_TYPES if t != "q8_0")
STORED_TYPES = ("f32", "f16", "bf16", "q8_0", *RAW_BLOCK_TYPES)


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bf16 is carried as raw uint16 (NumPy and CuPy have no bfloat16 dtype)."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


@dataclass
class Weight:
    """A tensor as stored. For q8_0, `data` holds int8 values [N, K] and `scales` f16 [N, K // 32]; for
    the other block types (RAW_BLOCK_TYPES) `data` is the rows' raw blocks, uint8 [N, K / block * bytes]."""

    data: np.ndarray
    dtype: str
    scales: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.dtype not in STORED_TYPES:
            raise ValueError(f"unsupported tensor type {self.dtype!r}")

    @property
    def blocks(self) -> bool:
        return self.dtype in RAW_BLOCK_TYPES

    @property
    def shape(self) -> tuple[int, ...]:
        if self.blocks:
            return (*(int(d) for d in self.data.shape[:-1]), row_values(self.data, BLOCK_TYPES[self.dtype]))
        return tuple(self.data.shape)

    @property
    def size(self) -> int:
        """Values (not bytes)."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (self.scales.nbytes if self.scales is not None else 0)

    def to_f32(self, rows: slice = slice(None)) -> np.ndarray:
        d = self.data[rows]
        if self.dtype == "f32":
            return d
        if self.dtype == "f16":
            return d.astype(np.float32)
        if self.dtype == "bf16":
            return bf16_to_f32(d)
        if self.blocks:
            return dequantize(d, self.dtype)
        s = self.scales[rows].astype(np.float32)
        n, k = d.shape
        q = d.reshape(n, k // QK8_0, QK8_0).astype(np.float32)
        return (q * s[:, :, None]).reshape(n, k)

    @classmethod
    def from_f32(cls, x: np.ndarray, dtype: str) -> Weight:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if dtype == "f32":
            return cls(x, "f32")
        if dtype == "f16":
            return cls(x.astype(np.float16), "f16")
        if dtype == "bf16":
            return cls(f32_to_bf16(x), "bf16")
        if dtype == "q8_0":
            return quantize_q8_0(x)
        if dtype in RAW_BLOCK_TYPES:
            from lockstep_kernels.quants.writer import quantize

            return cls(quantize(x, dtype), dtype)
        raise ValueError(f"unsupported tensor type {dtype!r}")


def quantize_q8_0(x: np.ndarray) -> Weight:
    """The ggml Q8_0 rule: per 32 values, d = max|x| / 127, q = round(x / d)."""
    n, k = x.shape
    if k % QK8_0:
        raise ValueError(f"Q8_0 needs a row length divisible by {QK8_0}, got {k}")
    blocks = x.reshape(n, k // QK8_0, QK8_0)
    d = np.abs(blocks).max(axis=-1) / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    q = np.round(blocks * inv[:, :, None]).astype(np.int8)
    return Weight(q.reshape(n, k), "q8_0", d.astype(np.float16))


@dataclass
class RowStack:
    """Weights of different stored types whose output rows follow one another, as one matmul operand
    (a q|k|v projection whose v has more bits, as in Q4_K_M files); each part keeps its type."""

    parts: list[Weight]
    dtype = "mixed"
    blocks = True  # no single layout to copy or convert as a whole

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(w.shape[0] for w in self.parts), self.parts[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.parts)

    def to_f32(self, rows: slice = slice(None)) -> np.ndarray:
        return np.concatenate([w.to_f32() for w in self.parts])[rows]


def concat_rows(parts: list[Weight]) -> Weight | RowStack:
    """One weight whose output rows are the parts' rows in order: one matmul instead of several
    (small matrices are launch-bound on a GPU). The split depends on the fused shape, never on M.
    Parts of different types make a RowStack."""
    if len({w.dtype for w in parts}) > 1:
        return RowStack(list(parts))
    scales = [w.scales for w in parts]
    return Weight(np.concatenate([w.data for w in parts]), parts[0].dtype,
                  None if scales[0] is None else np.concatenate(scales))
