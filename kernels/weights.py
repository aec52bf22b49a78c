"""Weights in their stored form: the model keeps 16-bit and Q8_0 tensors as they are on disk."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QK8_0 = 32  # values per Q8_0 block
STORED_TYPES = ("f32", "f16", "bf16", "q8_0")


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
    """A tensor as stored. For q8_0, `data` holds int8 values [N, K] and `scales` f16 [N, K // 32]."""

    data: np.ndarray
    dtype: str
    scales: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.dtype not in STORED_TYPES:
            raise ValueError(f"unsupported tensor type {self.dtype!r}")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

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


def concat_rows(parts: list[Weight]) -> Weight:
    """One weight whose output rows are the parts' rows in order: one matmul instead of several
    (small matrices are launch-bound on a GPU). The split depends on the fused shape, never on M."""
    scales = [w.scales for w in parts]
    return Weight(np.concatenate([w.data for w in parts]), parts[0].dtype,
                  None if scales[0] is None else np.concatenate(scales))
