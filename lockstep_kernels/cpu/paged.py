"""The NumPy backend's paged KV cache and attention: pages of float32, f16, bf16 or q8_0 cells, the
compiled rotation and cache write (rope_write.py) and the compiled attention (attend.py) for the
types those kernels read, NumPy for the rest."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lockstep_kernels.base import (
    KV_TYPES,
    PAGE_SIZE,
    PagedRows,
    RopeTable,
    split_qk_norm_rope_write,
    split_qkv_rope_write,
)
from lockstep_kernels.cpu import attend, rope_write
from lockstep_kernels.weights import QK8_0, bf16_to_f32, f32_to_bf16

_KERNEL_KV = {"f32": (np.float32, 0), "f16": (np.uint16, 1), "bf16": (np.uint16, 2)}  # as attend_rows reads KV


@dataclass
class CpuKVLayer:
    kv_type: str  # K's type
    v_type: str
    k: np.ndarray
    v: np.ndarray
    k_scale: np.ndarray | None = None  # q8_0 only: f16 [pages, PAGE_SIZE, heads, head_dim // 32]
    v_scale: np.ndarray | None = None


def _alloc(shape: tuple[int, ...], kv_type: str) -> tuple[np.ndarray, np.ndarray | None]:
    if kv_type not in KV_TYPES:
        raise ValueError(f"unsupported KV cache type {kv_type!r}")
    if kv_type == "q8_0":
        if shape[-1] % QK8_0:
            raise ValueError(f"KV cache type q8_0 needs a head dim divisible by {QK8_0}")
        return np.zeros(shape, np.int8), np.zeros((*shape[:-1], shape[-1] // QK8_0), np.float16)
    return np.zeros(shape, {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[kv_type]), None


def _encode(x: np.ndarray, kv_type: str) -> tuple[np.ndarray, np.ndarray | None]:
    if kv_type == "f32":
        return x, None
    if kv_type == "f16":
        return x.astype(np.float16), None
    if kv_type == "bf16":
        return f32_to_bf16(x), None
    blocks = x.reshape(*x.shape[:-1], -1, QK8_0)
    d = np.abs(blocks).max(axis=-1) / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    q = np.round(blocks * inv[..., None]).astype(np.int8).reshape(x.shape)
    return q, d.astype(np.float16)


def _decode(data: np.ndarray, scale: np.ndarray | None, kv_type: str) -> np.ndarray:
    if kv_type == "f32":
        return data
    if kv_type == "f16":
        return data.astype(np.float32)
    if kv_type == "bf16":
        return bf16_to_f32(data)
    q = data.reshape(*data.shape[:-1], -1, QK8_0).astype(np.float32)
    return (q * scale.astype(np.float32)[..., None]).reshape(data.shape)


def as_index(a) -> np.ndarray:
    """Index arrays reach the kernels as int64 only (one compiled specialisation)."""
    return np.ascontiguousarray(a, dtype=np.int64)


class PagedOps:
    """CpuOps' KV-cache and attention ops (a mixin: attention_out and norm_qkv_rope_write use its products)."""

    @staticmethod
    def warm_up_paged() -> None:
        attend.warm_up()
        rope_write.warm_up()

    def rope(self, x: np.ndarray, positions, table: RopeTable) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty_like(x)
        rope_write.rope_rows(x, np.asarray(positions, dtype=np.int64), table.cos, table.sin, table.neox, out)
        return out

    def kv_alloc(self, n_pages: int, n_kv_heads: int, head_dim: int, kv_type: str,
                 v_type: str | None = None) -> CpuKVLayer:
        shape = (n_pages, PAGE_SIZE, n_kv_heads, head_dim)
        k, k_scale = _alloc(shape, kv_type)
        v, v_scale = _alloc(shape, v_type or kv_type)
        return CpuKVLayer(kv_type, v_type or kv_type, k, v, k_scale, v_scale)

    def kv_write(self, layer: CpuKVLayer, k: np.ndarray, v: np.ndarray, slots) -> None:
        slots = np.asarray(slots)
        pages, cells = slots // PAGE_SIZE, slots % PAGE_SIZE
        for dst, dst_scale, src, kind in ((layer.k, layer.k_scale, k, layer.kv_type),
                                          (layer.v, layer.v_scale, v, layer.v_type)):
            data, scale = _encode(np.asarray(src, dtype=np.float32), kind)
            dst[pages, cells] = data
            if scale is not None:
                dst_scale[pages, cells] = scale

    def qkv_rope_write(self, qkv: np.ndarray, rows: PagedRows, table: RopeTable, layer: CpuKVLayer,
                       n_heads: int, n_kv: int) -> np.ndarray:
        kind = rope_write.KV_KINDS.get(layer.kv_type)
        if kind is None or layer.v_type != layer.kv_type:  # q8_0, or K and V of different types
            return split_qkv_rope_write(self, qkv, rows, table, layer, n_heads, n_kv)
        t, d = qkv.shape[0], qkv.shape[1] // (n_heads + 2 * n_kv)
        q = np.empty((t, n_heads, d), dtype=np.float32)
        view = np.float32 if kind == 0 else np.uint16
        cells = (a.view(view).reshape(-1, n_kv, d) for a in (layer.k, layer.v))
        rope_write.qkv_rope_write(np.ascontiguousarray(qkv, dtype=np.float32), as_index(rows.positions),
                                  as_index(rows.slots), table.cos, table.sin, table.neox, n_heads, n_kv, *cells, kind, q)
        return q

    def qk_norm_rope_write(self, qkv: np.ndarray, q_norm, k_norm, eps: float, rows: PagedRows, table: RopeTable,
                           layer: CpuKVLayer, n_heads: int, n_kv: int) -> np.ndarray:
        return split_qk_norm_rope_write(self, qkv, q_norm, k_norm, eps, rows, table, layer, n_heads, n_kv)

    def norm_qkv_rope_write(self, x, norm_weight, eps: float, w, bias, rows: PagedRows, table: RopeTable,
                            layer: CpuKVLayer, n_heads: int, n_kv: int) -> np.ndarray:
        return self.qkv_rope_write(self.norm_matmul(x, norm_weight, eps, w, bias), rows, table, layer, n_heads, n_kv)

    def _page(self, layer: CpuKVLayer, page: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        ks = layer.k_scale[page, :n] if layer.k_scale is not None else None
        vs = layer.v_scale[page, :n] if layer.v_scale is not None else None
        return (_decode(layer.k[page, :n], ks, layer.kv_type),
                _decode(layer.v[page, :n], vs, layer.v_type))

    def attention_out(self, q, layer: CpuKVLayer, rows: PagedRows, scale: float, wo, residual) -> np.ndarray:
        return self.matmul(self.attention(q, layer, rows, scale), wo, residual=residual)

    def attention_build(self, t: int, n_heads: int, n_kv: int, head_dim: int, width: int, kv_type: str = "f16") -> str:
        return "attend_rows"  # one compiled loop for every batch

    def attention(self, q: np.ndarray, layer: CpuKVLayer, rows: PagedRows, scale: float) -> np.ndarray:
        t, n_heads, hd = q.shape
        n_kv = layer.k.shape[2]
        group = n_heads // n_kv
        qs = np.ascontiguousarray((np.asarray(q, dtype=np.float32) * np.float32(scale)).reshape(t, n_kv, group, hd))
        out = np.empty((t, n_kv, group, hd), dtype=np.float32)
        positions, seqs, tables = rows.positions, rows.seq, rows.block_tables
        if layer.kv_type == layer.v_type and layer.kv_type in _KERNEL_KV:
            view, kind = _KERNEL_KV[layer.kv_type]
            index = [as_index(a) for a in (positions, seqs, tables)]
            attend.attend_rows(qs, layer.k.view(view), layer.v.view(view), kind, *index, PAGE_SIZE, out)
        else:  # q8_0, or K and V of different types: each row's pages decoded to float32
            for r in range(t):
                out[r] = self._attend_row(qs[r], layer, int(positions[r]), tables[int(seqs[r])])
        return out.reshape(t, n_heads * hd)

    def _attend_row(self, q: np.ndarray, layer: CpuKVLayer, pos: int, table) -> np.ndarray:
        # attend_rows' order: keys 0..pos in page-sized chunks, logical order, merged in ascending order
        m = l_sum = acc = None
        last = pos // PAGE_SIZE
        for c in range(last + 1):
            n = PAGE_SIZE if c < last else pos % PAGE_SIZE + 1
            k, v = self._page(layer, int(table[c]), n)
            o_c = np.empty_like(q)
            m_c, l_c = attend.attend_chunk(q, np.ascontiguousarray(k, dtype=np.float32),
                                             np.ascontiguousarray(v, dtype=np.float32), 0, o_c)
            if m is None:
                m, l_sum, acc = m_c, l_c, o_c
                continue
            m_new = np.maximum(m, m_c)
            a, b = np.exp(m - m_new), np.exp(m_c - m_new)
            l_sum = l_sum * a + l_c * b
            acc = acc * a[..., None] + o_c * b[..., None]
            m = m_new
        return acc / l_sum[..., None]

    def kv_read_pages(self, layer: CpuKVLayer, pages) -> tuple[np.ndarray, ...]:
        pages = np.asarray(pages)
        return tuple(a[pages].copy() for a in (layer.k, layer.v, layer.k_scale, layer.v_scale) if a is not None)

    def kv_write_pages(self, layer: CpuKVLayer, pages, data: tuple[np.ndarray, ...]) -> None:
        pages = np.asarray(pages)
        for a, d in zip([a for a in (layer.k, layer.v, layer.k_scale, layer.v_scale) if a is not None], data,
                        strict=True):
            a[pages] = d

    def kv_copy_pages(self, layer: CpuKVLayer, src, dst) -> None:
        self.kv_write_pages(layer, dst, self.kv_read_pages(layer, src))
