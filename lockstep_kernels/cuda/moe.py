"""Mixture-of-experts ops of the CUDA backend (mixed into CudaOps), kernels in moe.cu and matmul.cu's mmg_*.

A step routes on the device and groups its (token, slot) pairs by expert into a tile table (one
kernel, moe_route_schedule, for a decode step's few rows; a lone token as one_token_route says),
then runs the gate|up and down
projections of every expert in one grouped launch each: block y takes tile y's rows and its
expert's weights, with the streaming matmul's arithmetic (mm_tc, mm_f32), whose sums do not depend
on how many rows a launch holds or which of its kernels ran. The gate|up launch reads each pair's
token row itself (and normalises it, for one token); the down launch of a few tokens also writes
the weighted sum over each token's slots in slot order (else moe_combine does). So a pair's output
has the bits of the dense matmul of its row on that expert, however the neighbours routed; only the
routed experts' weights are read, and nothing waits for the host: decode steps are captured into
CUDA graphs with the MoE layers inside. Exact mode on or off runs the same kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cupy as cp
import numpy as np

from lockstep_kernels.cuda import kquant, plan
from lockstep_kernels.cuda.arrays import f32_rows, i32, index
from lockstep_kernels.cuda.launch import launch
from lockstep_kernels.cuda.modules import kernel
from lockstep_kernels.cuda.weights import kernel_weight
from lockstep_kernels.weights import Weight

MAX_EXPERTS = 1024  # common.cuh's MOE_MAX_E
SCHED_THREADS = 1024  # moe.cu's SCHED_THREADS: one thread per expert
ROUTE_SMEM = 24576  # moe.cu's ROUTE_SMEM: the fused kernel's routing scratch, (E + 32) floats a warp
ROUTE_ROWS = 64  # tokens that moe_route_schedule routes in its one block (more: a block each, then the schedule)
SUM_ROWS = 256  # tokens whose weighted sums the down projection's launch writes (its counters' rows)
SHORT = {"f16": "f16", "bf16": "bf16", "q8_0": "q8"}
EPI_SILU = 8  # matmul.cu's epilogue flag
TILES_EARLY = 1024  # matmul.cu's MMG_TILES_EARLY: the tile table was written two or more kernels back


@dataclass
class StackedWeight:
    """One projection of every expert: data [E, Np, Kp] as CudaOps.upload stores one (scales [E, Np,
    Kp / 32] for Q8_0), shape the logical (N, K) of one; gate_up as CudaWeight's."""

    dtype: str
    shape: tuple[int, int]
    data: Any
    scales: Any = None
    gate_up: str | None = None
    split: int = 1  # plan.split_k of one expert's shape (the 16-bit and int8 kernels)

    @property
    def kp(self) -> int:
        return int(self.data.shape[2])


@dataclass
class CudaExperts:
    n: int
    gate_up: StackedWeight  # products silu(gate) * up, as upload_gate_up's
    down: StackedWeight
    token_tiles_cap: int  # the most token tiles a grouped block of both projections may carry
    counts: Any = None  # [SUM_ROWS, H / 16] int32, zero between launches: the down launch's pairs done
    routed: Any = None  # [1] int32, zero between launches: the one-token router launch's blocks done
    shared_gate_up: Any = None
    shared_down: Any = None
    shared_gate: Any = None  # [1, H]: the shared expert's sigmoid gate


class CudaMoeOps:
    # Where a lone token is routed (route_row, the same bits in each): "router", once, by the last block of
    # its router's launch (mm_*_norm_route, a 16-bit or Q8_0 router; gate|up reads the tile table it
    # writes, and the down launch's first weights load before it waits), or "gate_up", by every gate|up
    # block (other routers). Tests and bench/moe_decode.py compare them (30B-A3B on the H200: 309.1
    # against 299.6 tok/s; routing in every block of both expert launches, 295.9, is gone).
    one_token_route = "router"

    def upload_experts(self, gate: list[Weight], up: list[Weight], down: list[Weight],
                       shared: tuple[Weight, Weight, Weight, Weight] | None = None, active: int = 1) -> CudaExperts:
        if len(gate) > MAX_EXPERTS:
            raise ValueError(f"{len(gate)} experts: the CUDA router takes at most {MAX_EXPERTS}")
        # K-quant experts are f16 here: the grouped kernels read no planes yet
        f16 = [[kernel_weight(w, planes=False) for w in ws] for ws in (gate, up, down)]
        gate_up = self._stack([self.upload_gate_up(g, u) for g, u in zip(f16[0], f16[1], strict=True)], active)
        down_w = self._stack([self.upload(w) for w in f16[2]], active)
        cap = min(plan.max_token_tiles(gate_up.split), plan.max_token_tiles(down_w.split))
        counts = cp.zeros((SUM_ROWS, plan.ceil_div(down_w.shape[0], plan.ROW_TILE)), dtype=cp.int32)
        ex = CudaExperts(len(gate), gate_up, down_w, cap, counts, cp.zeros(1, dtype=cp.int32))
        if shared is not None:
            s_gate, s_up, s_down, s_inp = shared
            ex.shared_gate_up = self.upload_gate_up(s_gate, s_up)
            ex.shared_down, ex.shared_gate = self.upload(s_down), self.upload(s_inp)
        return ex

    def _stack(self, ws: list, active: int) -> StackedWeight:
        """Per-expert uploads (all of one type and shape) as one [E, ...] device array each. Split as
        plan.split_k splits one weight of `active` times the rows: a decode step streams that many
        experts at once, so each needs fewer warps to keep the device's loads in flight."""
        first = ws[0]
        if first.dtype in kquant.KQUANT_TYPES or any(w.dtype != first.dtype or w.shape != first.shape for w in ws):
            raise ValueError("experts of one projection must share a type and shape")
        data = cp.empty((len(ws),) + first.data.shape, dtype=first.data.dtype)
        scales = None if first.scales is None else cp.empty((len(ws),) + first.scales.shape, first.scales.dtype)
        for e, w in enumerate(ws):
            data[e] = w.data
            if scales is not None:
                scales[e] = w.scales
        n, k = first.shape
        split = 1 if first.dtype == "f32" else plan.split_k(n * max(1, active), k, self.sm_count, first.dtype)
        return StackedWeight(first.dtype, first.shape, data, scales, first.gate_up, split)

    def moe_route(self, logits, top_k: int, renormalize: bool):
        x = f32_rows(logits)
        t, e = (int(s) for s in x.shape)
        if e > MAX_EXPERTS or not 0 < top_k <= min(e, 32):
            raise ValueError(f"top {top_k} of {e} experts: the CUDA router takes 1 to 32 of at most {MAX_EXPERTS}")
        ids, weights = cp.empty((t, top_k), dtype=cp.int32), cp.empty((t, top_k), dtype=cp.float32)
        if t:
            launch(kernel("moe.cu", "moe_route"), (t,), (32,), (x, ids, weights, i32(e), i32(top_k), i32(renormalize)))
        return ids, weights

    def moe(self, x, norm_weight, eps: float, router, experts: CudaExperts, top_k: int, renormalize: bool,
            residual=None):
        x = f32_rows(x)
        t, h = (int(s) for s in x.shape)
        e = experts.n
        if e > MAX_EXPERTS or not 0 < top_k <= min(e, 32):
            raise ValueError(f"top {top_k} of {e} experts: the CUDA router takes 1 to 32 of at most {MAX_EXPERTS}")
        if not t:
            return cp.empty((t, h), dtype=cp.float32)
        # one token: the router and gate|up kernels normalise the row themselves (rms_norm's bits) and the
        # gate|up kernel routes it, where the blocks' reads of the row stay small (plan.norm_prologue)
        norm = (t == 1 and experts.shared_gate_up is None and "f32" not in (experts.gate_up.dtype, experts.down.dtype)
                and self._prologue(1, h, router) == "norm" and plan.norm_prologue(experts.gate_up.shape[0] * top_k, h))
        if norm:
            return self._one_token(x, norm_weight, eps, router, experts, top_k, renormalize, residual)
        xn = self.rms_norm(x, norm_weight, eps)
        logits = self.matmul(xn, router)
        if t > ROUTE_ROWS:
            ids, weights = self.moe_route(logits, top_k, renormalize)
            return self._experts(xn, experts, ids, weights, residual)
        p = t * top_k
        tm, n_tiles = self._tiles(t, p, experts)
        ids, weights = cp.empty((t, top_k), dtype=cp.int32), cp.empty((t, top_k), dtype=cp.float32)
        pos, src, tiles = cp.empty(p, dtype=cp.int32), cp.empty(p, dtype=cp.int32), cp.empty((n_tiles, 4), dtype=cp.int32)
        launch(kernel("moe.cu", "moe_route_schedule"), (1,), (SCHED_THREADS,),
               (f32_rows(logits), i32(t), i32(e), i32(top_k), i32(renormalize), i32(plan.TOKEN_TILE * tm),
                i32(n_tiles), ids, weights, pos, src, tiles))
        return self._ffn(xn, experts, weights, (pos, src, tiles, tm), residual)

    def _one_token(self, x, norm_weight, eps: float, router, experts: CudaExperts, top_k: int, renormalize: bool,
                   residual):
        """One token: routed where one_token_route says, the gate|up launch, then the down launch with the
        weighted sum; two launches after the router's."""
        gu, h = experts.gate_up, int(x.shape[1])
        n, k = gu.shape
        silu = gu.gate_up == "tiles"
        act = cp.empty((top_k, n // 2 if silu else n), dtype=cp.float32)
        ids, weights = cp.empty((1, top_k), dtype=cp.int32), cp.empty((1, top_k), dtype=cp.float32)
        pos, src, tiles = (cp.empty(top_k, dtype=cp.int32), cp.empty(top_k, dtype=cp.int32),
                           cp.empty((top_k, 4), dtype=cp.int32))
        weight_args = (gu.data, self._dummy if gu.scales is None else gu.scales, np.int64(gu.data[0].nbytes),
                       np.int64(0 if gu.scales is None else gu.scales[0].size))
        grid, block = (plan.ceil_div(n, plan.ROW_TILE), top_k, 1), (32 * gu.split, 1, 1)
        row_args = (x, act, i32(n), i32(k), i32(gu.kp), i32(EPI_SILU if silu else 0), i32(act.shape[1]), norm_weight,
                    np.float32(eps))
        route = self.one_token_route
        if route == "router" and router.dtype not in SHORT:
            route = "gate_up"
        if route == "router":
            mm = plan.matmul_launch(router.dtype, 1, experts.n, h, self.sm_count, prologue="norm")
            logits = cp.empty((1, experts.n), dtype=cp.float32)
            launch(kernel("matmul.cu", f"mm_{SHORT[router.dtype]}_norm_route"), mm.grid, mm.block,
                   (router.data, self._dummy if router.scales is None else router.scales, x, logits, i32(experts.n),
                    i32(h), i32(router.kp), norm_weight, np.float32(eps), i32(top_k), i32(renormalize), experts.routed,
                    ids, weights, tiles, pos, src), shared=mm.shared)
            launch(kernel("matmul.cu", f"mmg_{SHORT[gu.dtype]}_norm"), grid, block, (*weight_args, tiles, *row_args),
                   shared=plan.combine_bytes(gu.split, 1))
        else:
            logits = self.norm_matmul(x, norm_weight, eps, router)
            launch(kernel("matmul.cu", f"mmg_{SHORT[gu.dtype]}_route"), grid, block,
                   (*weight_args, f32_rows(logits), i32(experts.n), i32(top_k), i32(renormalize), *row_args, ids,
                    weights, tiles, pos, src), shared=plan.combine_bytes(gu.split, 1))
        if gu.gate_up == "halves":
            act = self.silu_mul(act[:, : n // 2], act[:, n // 2 :])
        out = cp.empty((1, h), dtype=cp.float32)
        res = self._dummy if residual is None else f32_rows(residual)
        d = self._dummy
        self._grouped(experts.down, act, tiles, 1, top_k, src=src, gather=False, one=True, early=route == "router",
                      tail=(pos, weights, d, d, res, out, experts.counts, i32(top_k), i32(0), i32(residual is not None)))
        return out

    def moe_ffn(self, x, experts: CudaExperts, ids, weights, residual=None):
        return self._experts(f32_rows(x), experts, index(ids), f32_rows(weights), residual)

    def _tiles(self, t: int, p: int, experts: CudaExperts) -> tuple[int, int]:
        tm = plan.moe_token_tiles(p, experts.n, experts.token_tiles_cap, t)
        return tm, plan.moe_tiles(p, experts.n, plan.TOKEN_TILE * tm)

    def _experts(self, x, experts: CudaExperts, ids, weights, residual):
        t = int(x.shape[0])
        if not t:
            return cp.empty(x.shape, dtype=cp.float32)
        k = int(ids.shape[1])
        p = t * k
        tm, n_tiles = self._tiles(t, p, experts)
        pos, src, tiles = cp.empty(p, dtype=cp.int32), cp.empty(p, dtype=cp.int32), cp.empty((n_tiles, 4), dtype=cp.int32)
        launch(kernel("moe.cu", "moe_schedule"), (1,), (SCHED_THREADS,),
               (ids, i32(p), i32(k), i32(experts.n), i32(plan.TOKEN_TILE * tm), i32(n_tiles), pos, src, tiles))
        return self._ffn(x, experts, weights, (pos, src, tiles, tm), residual)

    def _ffn(self, x, experts: CudaExperts, weights, sched, residual):
        """x [T, H] (normalised) through the experts that the schedule (pos, src, tiles, tm) groups its
        pairs by; residual + the sum."""
        pos, src, tiles, tm = sched
        t, h = (int(s) for s in x.shape)
        k = int(weights.shape[1])
        act = self._grouped(experts.gate_up, x, tiles, tm, t * k, src=src, one=t == 1)
        if experts.gate_up.gate_up == "halves":
            f = experts.gate_up.shape[0] // 2
            act = self.silu_mul(act[:, :f], act[:, f:])
        shared = gate = self._dummy
        if experts.shared_gate_up is not None:
            shared = self.matmul(self.matmul(x, experts.shared_gate_up), experts.shared_down)
            gate = self.matmul(x, experts.shared_gate)
        res = self._dummy if residual is None else f32_rows(residual)
        out = cp.empty((t, h), dtype=cp.float32)
        tail = (pos, weights, shared, gate, res, out, experts.counts, i32(k), i32(experts.shared_gate_up is not None),
                i32(residual is not None))
        if t <= SUM_ROWS and experts.down.dtype != "f32":
            self._grouped(experts.down, act, tiles, tm, t * k, src=src, gather=False, one=t == 1, tail=tail, early=True)
            return out
        y = self._grouped(experts.down, act, tiles, tm, t * k, one=t == 1, early=True)
        grid, block = plan.elementwise_grid(t * h)
        launch(kernel("moe.cu", "moe_combine"), grid, block, (y, *tail[:6], i32(t), i32(h), *tail[7:]))
        return out

    def _grouped(self, w: StackedWeight, xs, tiles, tm: int, pairs: int, src=None, gather=True, one=False, tail=None,
                 early=False):
        """The rows of the pairs (token rows src[q] of xs with `src` and `gather`, else xs's rows in place order)
        through each pair's expert as `tiles` groups them: [P, N], or [P, N / 2] gated products for a
        "tiles" gate|up weight. `one`: every tile holds one row (a one-token step); `tail`: the arguments of the weighted sum the launch writes (MM_TCG's); `early`:
        the tile table was written two or more kernels back (the down projection's). The sum reads src
        (each place's token) too."""
        n, k = w.shape
        n_tiles = int(tiles.shape[0])
        silu = w.gate_up == "tiles"
        out = cp.empty((pairs, n // 2 if silu else n), dtype=cp.float32)
        xs = f32_rows(xs)
        gather = i32(src is not None and gather)
        src = self._dummy if src is None else src
        if w.dtype == "f32":
            launch(kernel("matmul.cu", "mmg_f32"), (plan.ceil_div(n, 8), n_tiles, 1), (256, 1, 1),
                   (w.data, np.int64(w.data[0].size), tiles, xs, out, i32(n), i32(k), i32(w.kp), i32(0), src, gather))
            return out
        scales = self._dummy if w.scales is None else w.scales
        s_stride = 0 if w.scales is None else int(w.scales[0].size)
        d = self._dummy
        tail = tail or (d, d, d, d, d, np.int64(0), d, i32(0), i32(0), i32(0))
        variant = "one" if one else f"tm{tm}"
        launch(kernel("matmul.cu", f"mmg_{SHORT[w.dtype]}_{variant}"), (plan.ceil_div(n, plan.ROW_TILE), n_tiles, 1),
               (32 * w.split, 1, 1),
               (w.data, scales, np.int64(w.data[0].nbytes), np.int64(s_stride), tiles, xs, out, i32(n), i32(k),
                i32(w.kp), i32((EPI_SILU if silu else 0) | (TILES_EARLY if early else 0)), i32(xs.shape[1]),
                i32(out.shape[1]), src, gather, *tail),
               shared=plan.combine_bytes(w.split, 1 if one else tm))
        return out
