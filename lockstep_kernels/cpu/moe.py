"""Mixture-of-experts ops of the NumPy backend (mixed into CpuOps).

Routing is one vectorised code path for any number of rows, every reduction along a row's own
contiguous last axis. The expert FFN groups the (token, expert) pairs by expert only to choose which
weights a matmul reads: each pair goes through CpuOps.matmul, whose exact mode computes every row
alone, so a token's output from expert e has the same bits whether e got 1 row or 500 this step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lockstep_kernels.weights import Weight


@dataclass
class CpuExperts:
    """Ops.upload_experts on the CPU: per expert its gate and up [F, H] and down [H, F] as uploaded
    (views of the stored stacked tensors where the file stacks them); the optional shared expert."""

    gate: list[Any]
    up: list[Any]
    down: list[Any]
    shared_gate_up: Any = None  # upload_gate_up of the shared expert
    shared_down: Any = None
    shared_gate: Any = None  # [1, H]: the shared expert's sigmoid gate


class CpuMoeOps:
    def upload_experts(self, gate: list[Weight], up: list[Weight], down: list[Weight],
                       shared: tuple[Weight, Weight, Weight, Weight] | None = None, active: int = 1) -> CpuExperts:
        ex = CpuExperts([self.upload(w) for w in gate], [self.upload(w) for w in up], [self.upload(w) for w in down])
        if shared is not None:
            s_gate, s_up, s_down, s_inp = shared
            ex.shared_gate_up = self.upload_gate_up(s_gate, s_up)
            ex.shared_down, ex.shared_gate = self.upload(s_down), self.upload(s_inp)
        return ex

    def moe_route(self, logits: np.ndarray, top_k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs = e / np.add.reduce(e, axis=-1, keepdims=True)
        # a stable sort of the negated probabilities: equal ones keep ascending expert order
        ids = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k].astype(np.int32)
        weights = np.take_along_axis(probs, ids, axis=-1)
        if renormalize:
            total = weights[:, 0].copy()
            for j in range(1, top_k):
                total = total + weights[:, j]
            weights = weights / total[:, None]
        return ids, np.ascontiguousarray(weights, dtype=np.float32)

    def moe(self, x: np.ndarray, norm_weight: np.ndarray, eps: float, router, experts: CpuExperts, top_k: int,
            renormalize: bool, residual: np.ndarray | None = None) -> np.ndarray:
        h = self.rms_norm(x, norm_weight, eps)
        ids, weights = self.moe_route(self.matmul(h, router), top_k, renormalize)
        return self.moe_ffn(h, experts, ids, weights, residual)

    def moe_ffn(self, x: np.ndarray, experts: CpuExperts, ids: np.ndarray, weights: np.ndarray,
                residual: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        ids = np.asarray(ids)
        t, k = ids.shape
        y = np.empty((t, k, x.shape[1]), dtype=np.float32)
        for e in np.unique(ids):
            rows, slots = np.nonzero(ids == e)
            xe = x[rows]
            h = self.silu_mul(self.matmul(xe, experts.gate[e]), self.matmul(xe, experts.up[e]))
            y[rows, slots] = self.matmul(h, experts.down[e])
        out = y[:, 0] * weights[:, 0:1]
        for j in range(1, k):  # ascending slot order, one row at a time in effect (elementwise)
            out = out + y[:, j] * weights[:, j : j + 1]
        if experts.shared_gate_up is not None:
            shared = self.matmul(self.matmul(x, experts.shared_gate_up), experts.shared_down)
            g = self.matmul(x, experts.shared_gate)
            out = out + shared * (np.float32(1.0) / (np.float32(1.0) + np.exp(-g)))
        return out if residual is None else residual + out
