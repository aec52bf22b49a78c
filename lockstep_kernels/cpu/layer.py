"""A whole llama-family layer (no q/k norm, a dense FFN) in one compiled call on the CPU: a decode step's
ops are small, so the Python around each of them (argument checks, views, dispatch) costs as much as
a product. The call runs the separate ops' compiled functions in their order (fused.norm_rows_16,
rope_write.qkv_rope_write, attend.attend_rows, the residual product, fused.ffn_16, each product's
weight rows and the attention's rows shared with the worker threads when there are any: jobs.py), so a
row gets the bits the ops give it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from lockstep_kernels.cpu.compiled import PLAIN, RESIDUAL, rows_16_parallel
from lockstep_kernels.cpu.fused import ffn_16_parallel, norm_rows_16_parallel
from lockstep_kernels.cpu.jobs import split_attend
from lockstep_kernels.cpu.matvec import _FLAGS  # no fastmath: the query scaling is NumPy's float32 product
from lockstep_kernels.cpu.rope_write import qkv_rope_write

# numba caches a function keyed on its own file only, and this file's call holds copies of attend.py,
# jobs.py, rope_write.py, fused.py and compiled.py too: edit this file when they change, or a stale copy runs
MATVEC_EPOCH = 6  # and bump with matvec.EPOCH
ATTEND_EPOCH = 5  # bump with attend.EPOCH


@njit(**_FLAGS)
def dense_layer_16(x, attn_norm, ffn_norm, eps, w_qkv, w_o, w_gate_up, w_down, kind, positions, slots, seqs, tables,
                   cos, sin, neox, n_heads, k_cells, v_cells, k_pages, v_pages, kv_kind, scale, ctl, out):
    """out = the layer over x [T, hidden]; K and V written to the cache. Weights as the 16-bit row kernel
    takes them (w_gate_up = gate | up); k_cells, v_cells [cells, kv, d] and k_pages, v_pages [pages,
    page_size, kv, d] two views of the cache (float32 for kv_kind 0, else 16-bit bits)."""
    t = x.shape[0]
    n_kv, d = k_cells.shape[1], k_cells.shape[2]
    group = n_heads // n_kv
    qkv = np.empty((t, w_qkv.shape[0]), np.float32)
    norm_rows_16_parallel(x, attn_norm, eps, w_qkv, kind, qkv, qkv, PLAIN, ctl)
    q = np.empty((t, n_heads, d), np.float32)
    qkv_rope_write(qkv, positions, slots, cos, sin, neox, n_heads, n_kv, k_cells, v_cells, kv_kind, q)
    qs = np.empty((t, n_kv, group, d), np.float32)
    qf, qsf = q.reshape(-1), qs.reshape(-1)
    for i in range(qf.shape[0]):
        qsf[i] = qf[i] * scale
    att = np.empty((t, n_kv, group, d), np.float32)
    split_attend(ctl, qs, k_pages, v_pages, kv_kind, positions, seqs, tables, k_pages.shape[1], att)
    h = np.empty_like(x)
    rows_16_parallel(att.reshape(t, n_heads * d), w_o, kind, h, 0, x, RESIDUAL, ctl)
    ffn_16_parallel(h, ffn_norm, eps, w_gate_up, w_down, kind, out, ctl)
