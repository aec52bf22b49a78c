"""The op interface every compute backend implements.

Arrays are the backend's own (NumPy on the CPU, CuPy on CUDA). Activations are float32.
Exact mode (`Ops.exact`) obliges every op to compute each token row with arithmetic that depends
only on that row's inputs and the weights: never on how many rows share the call, their contents,
or where a sequence's KV pages sit physically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from contract import PAGE_SIZE  # noqa: F401  (re-exported: the kernels' page is the contract's)
from lockstep_kernels.weights import Weight

KV_TYPES = ("f32", "f16", "bf16", "q8_0")


@dataclass
class RopeTable:
    """cos/sin per position for half the head dim; `neox` picks the rotated pairs (i, i + d/2)
    over the interleaved pairs (2i, 2i + 1)."""

    cos: Any  # [max_pos, head_dim // 2] float32
    sin: Any
    neox: bool = True


@dataclass
class PagedRows:
    """Where each token row of a step sits: its position, its sequence, the sequences' pages.

    Row r attends to positions 0..positions[r] of sequence seq[r]; logical page i of sequence s is
    physical page block_tables[s, i]. slots[r] is the KV cell the row's K/V go to (attention on
    CUDA reads them to know which cells this step writes; None there: only each row's own).
    """

    positions: Any  # [T] int32
    seq: Any  # [T] int32
    block_tables: Any  # [S, max_pages] int32
    slots: Any  # [T] int64
    recurrent: RecurrentRows | None = None  # hybrid models: the rows' sequences' recurrent state


@dataclass
class RecurrentRows:
    """Which rows of a step advance which sequence's recurrent state (hybrid models), on the host.

    Sequence i holds rows bounds[i][0]:bounds[i][1] at positions starts[i].., and its state
    states[i] (from Ops.state_alloc, one entry per recurrent layer). prompt[i]: its rows are prompt
    tokens, advanced in chunks of `Ops.recurrent_chunk` (in exact mode at multiples of it from
    position 0); otherwise they are generated tokens, advanced one at a time. At each position in
    snap[i] (a chunk end inside the rows) every recurrent layer appends its state there to
    taken[(i, position)], in Ops.state_read's order.
    """

    bounds: list[tuple[int, int]]
    starts: list[int]
    states: list[Any]
    prompt: list[bool]
    snap: list[tuple[int, ...]]
    taken: dict[tuple[int, int], list] = field(default_factory=dict)


class KVLayer(Protocol):
    """One layer's paged K and V storage: [n_pages, PAGE_SIZE, n_kv_heads, head_dim] each."""

    kv_type: str


class Ops(Protocol):
    name: str
    exact: bool

    # --- data movement
    def plan_weights(self, weights: dict[str, Weight]) -> None:
        """Sees the whole model once, by name, before its weights are uploaded (how to store them)."""
    def upload(self, w: Weight) -> Any: ...
    def upload_gate_up(self, gate: Weight, up: Weight) -> Any:
        """The gate and up projections [F, K] as one weight whose products are gated: matmul and
        norm_matmul with it give silu_mul(y[:, :F], y[:, F:]) [T, F], y the product with the two
        stacked (concat_rows), in those bits."""
    def upload_qkv(self, q: Weight, k: Weight, v: Weight, bias: Weight | None, head_dim: int) -> tuple[Any, Any]:
        """The q, k and v projections as one weight, and their stacked bias, for norm_qkv_rope_write
        (which alone reads its products: their columns may come in another order)."""
    def tensor(self, a: np.ndarray) -> Any: ...
    def to_host(self, x: Any) -> np.ndarray: ...
    def to_host_async(self, x: Any) -> Callable[[], np.ndarray]:
        """Starts copying x to the host after the work queued so far; the returned function waits
        for it. Work queued later may overwrite x without changing the copy."""

    # --- math; x is [T, D] float32 unless stated
    def embedding(self, table: Any, ids: Any) -> Any: ...
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any: ...
    def matmul_family(self, t: int, w: Any) -> str:
        """Which kernel family `matmul` runs t rows of w on; exact mode promises every family the
        same bits for a row (lockstep_kernels.selfcheck checks it on the device)."""
        return "matmul"

    def qkv_family(self, t: int, w: Any) -> str:
        """What norm_qkv_rope_write runs t rows of an upload_qkv weight on (the self-check probes each)."""
        return "matmul"

    def matmul(self, x: Any, w: Any, bias: Any | None = None, residual: Any | None = None) -> Any:
        """x [T, K] @ w[N, K]^T (+ bias) -> [T, N], float32 accumulation; with `residual` [T, N],
        residual + that (the bits of add(residual, matmul(x, w, bias)))."""
    def norm_matmul(self, x: Any, norm_weight: Any, eps: float, w: Any, bias: Any | None = None) -> Any:
        """matmul(rms_norm(x, norm_weight, eps), w, bias), the same bits (one kernel where that is faster)."""
    def ffn(self, x: Any, norm_weight: Any, eps: float, w_gate_up: Any, w_down: Any) -> Any:
        """The gated feed-forward block with its residual: matmul(norm_matmul(x, norm_weight, eps,
        w_gate_up), w_down, residual=x), the same bits (w_gate_up from upload_gate_up)."""
    def rope(self, x: Any, positions: Any, table: RopeTable) -> Any:
        """x [T, heads, head_dim] rotated by each row's position."""
    def silu_mul(self, gate: Any, up: Any) -> Any:
        """gate * sigmoid(gate) * up; gate and up may be the two column halves of one matrix."""
    def add(self, a: Any, b: Any) -> Any: ...
    def argmax(self, logits: Any) -> Any:
        """int32 index of each row's largest value, ties to the lowest index."""

    # --- mixture of experts
    def upload_experts(self, gate: list[Weight], up: list[Weight], down: list[Weight],
                       shared: tuple[Weight, Weight, Weight, Weight] | None = None, active: int = 1) -> Any:
        """The experts of one MoE FFN, per expert its gate and up [F, H] and down [H, F] (views of a
        stacked tensor where the file stacks them: never copied per call); `shared` is an always-on
        expert's (gate, up, down, sigmoid gate [1, H]); `active`: experts a token routes to (a
        backend may fix its summation order by it: it is the model's, never the batch's)."""
    def moe_route(self, logits: Any, top_k: int, renormalize: bool) -> tuple[Any, Any]:
        """Router logits [T, E] -> (expert ids [T, k] int32, weights [T, k] float32): softmax in
        float32, the k largest in descending order with ties to the lowest expert index, divided by
        their sum when `renormalize`. One code path for one row or many."""
    def moe_ffn(self, x: Any, experts: Any, ids: Any, weights: Any, residual: Any | None = None) -> Any:
        """x [T, H] through its routed experts: sum over slots j = 0..k-1 in that order of
        weights[t, j] * down_e(silu(gate_e x) * up_e x), e = ids[t, j], each (token, expert) pair with
        the dense matmul's row arithmetic on e's weights (bits independent of how many rows chose e);
        then + sigmoid(x . g) * shared(x) when there is a shared expert, then residual + that."""
    def moe(self, x: Any, norm_weight: Any, eps: float, router: Any, experts: Any, top_k: int, renormalize: bool,
            residual: Any | None = None) -> Any:
        """The MoE FFN of the layer's rows x: moe_ffn(h, experts, *moe_route(matmul(h, router), top_k,
        renormalize), residual) with h = rms_norm(x, norm_weight, eps), the same bits (fewer kernels where
        a backend can)."""

    # --- paged KV cache and attention
    def kv_alloc(self, n_pages: int, n_kv_heads: int, head_dim: int, kv_type: str,
                 v_type: str | None = None) -> KVLayer:
        """One layer's pages; V takes `v_type` when given, else K's type."""
    def kv_write(self, layer: KVLayer, k: Any, v: Any, slots: Any) -> None: ...
    def qkv_rope_write(self, qkv: Any, rows: PagedRows, table: RopeTable, layer: KVLayer, n_heads: int,
                       n_kv: int) -> Any:
        """The step after a fused q|k|v matmul: qkv [T, (heads + 2 kv_heads) * head_dim] -> q rotated
        [T, heads, head_dim]; k rotated and v written to the rows' slots. The bits of
        split_qkv_rope_write."""
    def qk_norm_rope_write(self, qkv: Any, q_norm: Any, k_norm: Any, eps: float, rows: PagedRows, table: RopeTable,
                           layer: KVLayer, n_heads: int, n_kv: int) -> Any:
        """qkv_rope_write with each q and k head first normalised over head_dim by q_norm, k_norm
        (Qwen3): the bits of split_qk_norm_rope_write."""
    def norm_qkv_rope_write(self, x: Any, norm_weight: Any, eps: float, w: Any, bias: Any | None, rows: PagedRows,
                            table: RopeTable, layer: KVLayer, n_heads: int, n_kv: int) -> Any:
        """qkv_rope_write(norm_matmul(x, norm_weight, eps, w, bias), ...) for upload_qkv's weight and
        bias, in those bits (on CUDA one launch where the matmul can rotate and store)."""
    def attention(self, q: Any, layer: KVLayer, rows: PagedRows, scale: float) -> Any:
        """q [T, heads, head_dim] -> [T, heads * head_dim]; row r sees keys 0..positions[r]."""
    def attention_build(self, t: int, n_heads: int, n_kv: int, head_dim: int, width: int, kv_type: str = "f16") -> str:
        """Which build of its kernel attention runs t rows on (block tables `width` pages wide, a
        `kv_type` cache); exact
        mode promises every build the same bits for a row (the self-check probes each)."""
        return "attention"
    def attention_out(self, q: Any, layer: KVLayer, rows: PagedRows, scale: float, wo: Any, residual: Any) -> Any:
        """matmul(attention(q, layer, rows, scale), wo, residual=residual), the same bits."""
    def kv_read_pages(self, layer: KVLayer, pages: Any) -> tuple[np.ndarray, ...]:
        """Copy pages to host memory (parking)."""
    def kv_write_pages(self, layer: KVLayer, pages: Any, data: tuple[np.ndarray, ...]) -> None:
        """Restore parked pages into (possibly other) physical pages."""
    def kv_copy_pages(self, layer: KVLayer, src: Any, dst: Any) -> None: ...

    # --- recurrent state and the ops of hybrid models' recurrent layers (Gated DeltaNet)
    recurrent_chunk: int  # prompt tokens per chunk of the delta rule, fixed per backend

    def state_alloc(self, n_layers: int, conv_dim: int, kernel: int, v_heads: int, k_dim: int, v_dim: int) -> Any:
        """One sequence's zeroed state for n_layers recurrent layers: a conv window [kernel - 1,
        conv_dim] and a delta-rule state [v_heads, k_dim, v_dim] each, float32."""
    def state_read(self, state: Any) -> list[np.ndarray]:
        """Host copies of a sequence's state, conv window then delta state per layer (parking,
        n > 1 copies, prompt-cache snapshots)."""
    def state_write(self, state: Any, data: list[np.ndarray]) -> None: ...
    def conv1d_silu(self, x: Any, weight: Any, rows: RecurrentRows, layer: int) -> Any:
        """x [T, D] through each sequence's causal depthwise conv (weight [D, kernel]) and silu,
        moving its conv window on."""
    def gated_delta(self, mixed: Any, a: Any, b: Any, a_log: Any, dt_bias: Any, rows: RecurrentRows, layer: int,
                    n_k_heads: int) -> Any:
        """The gated delta rule (l2-normed q and k, beta = sigmoid(b), decay exp(-exp(a_log) *
        softplus(a + dt_bias))) over mixed = q | k | v [T, ...] -> [T, v_heads, v_dim]."""
    def gated_rms_norm(self, x: Any, weight: Any, gate: Any, eps: float) -> Any:
        """rms_norm(x, weight, eps) * silu(gate)."""
    def gated_norm_matmul(self, x: Any, weight: Any, gate: Any, eps: float, w: Any, residual: Any) -> Any:
        """matmul(gated_rms_norm(x, weight, gate, eps) as [T, K], w, residual=residual), the same bits
        (x, gate [T * K / D, D], D the length of weight; one kernel where that is faster)."""
    def sigmoid_mul(self, x: Any, gate: Any) -> Any:
        """x * sigmoid(gate) (the output gate of gated attention)."""


def split_qkv_rope_write(ops: Ops, qkv: Any, rows: PagedRows, table: RopeTable, layer: KVLayer, n_heads: int,
                         n_kv: int) -> Any:
    """Ops.qkv_rope_write from the separate ops (the reference a fused kernel must equal)."""
    t = qkv.shape[0]
    d = qkv.shape[1] // (n_heads + 2 * n_kv)
    q = qkv[:, : n_heads * d].reshape(t, n_heads, d)
    k = qkv[:, n_heads * d : (n_heads + n_kv) * d].reshape(t, n_kv, d)
    v = qkv[:, (n_heads + n_kv) * d :].reshape(t, n_kv, d)
    ops.kv_write(layer, ops.rope(k, rows.positions, table), v, rows.slots)
    return ops.rope(q, rows.positions, table)


def split_qk_norm_rope_write(ops: Ops, qkv: Any, q_norm: Any, k_norm: Any, eps: float, rows: PagedRows,
                             table: RopeTable, layer: KVLayer, n_heads: int, n_kv: int) -> Any:
    """Ops.qk_norm_rope_write from the separate ops (the reference a fused kernel must equal)."""
    t = qkv.shape[0]
    d = qkv.shape[1] // (n_heads + 2 * n_kv)
    nq, nkv = n_heads * d, n_kv * d
    q = ops.rms_norm(qkv[:, :nq].reshape(-1, d), q_norm, eps)
    k = ops.rms_norm(qkv[:, nq : nq + nkv].reshape(-1, d), k_norm, eps)
    v = qkv[:, nq + nkv :].reshape(t, n_kv, d)
    ops.kv_write(layer, ops.rope(k.reshape(t, n_kv, d), rows.positions, table), v, rows.slots)
    return ops.rope(q.reshape(t, n_heads, d), rows.positions, table)
