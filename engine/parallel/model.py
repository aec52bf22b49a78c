"""A llama-family model whose layers are split over ranks (engine.parallel.plan), and its KV pool.

Every rank holds the whole residual stream x [T, hidden]; per layer it computes its heads' attention
and its FFN columns, each ending in a row-parallel matmul whose [T, hidden] partial sum is reduced
over the ranks (engine.parallel.collective) before the residual add. With exact mode the partials
are row-invariant (the backend's exact ops) and so is their rank-order sum; the result is not the
TP=1 bits (the K reduction of o and down is cut in tp pieces), only close to them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.config import ModelConfig
from engine.kv_cache import PagePool, ParkedKV
from engine.models.llama import LlamaModel
from engine.parallel.collective import Collective, reduce_partials
from engine.parallel.plan import TPPlan
from engine.parallel.shard import shards
from lockstep_kernels.base import Ops, PagedRows
from lockstep_kernels.weights import Weight


class TensorParallelModel:
    def __init__(self, config: ModelConfig, weights: dict[str, Weight], plan: TPPlan, ops: list[Ops],
                 coll: Collective, max_positions: int):
        self.config, self.plan, self.ops, self.coll = config, plan, ops, coll
        self.exact = bool(ops[0].exact)
        self.ranks = [LlamaModel(c, w, o, max_positions) for (c, w), o in zip(shards(config, weights, plan), ops,
                                                                              strict=True)]
        self.n_kv_layers = config.n_layers

    def rank_models(self) -> list[tuple[Ops, LlamaModel]]:
        return list(zip(self.ops, self.ranks, strict=True))

    def _inputs(self, r: int, tokens, rows: PagedRows) -> tuple[Any, PagedRows]:
        """The step's token ids and row placement where rank r computes: the runner made them with
        rank 0's ops; on the CPU every rank reads them as they are."""
        if r == 0 or self.ops[r].name == "cpu":
            return tokens, rows
        o, host = self.ops[r], self.ops[0].to_host
        return o.tensor(host(tokens)), replace(rows, **{f: o.tensor(host(getattr(rows, f)))
                                                        for f in ("positions", "seq", "block_tables", "slots")})

    def _reduce(self, parts: list[Any], xs: list[Any]) -> list[Any]:
        sums = reduce_partials(self.coll, parts, self.exact, [o.add for o in self.ops])
        return [o.add(x, s) for o, x, s in zip(self.ops, xs, sums, strict=True)]

    def forward(self, tokens, rows: PagedRows, kv: list, logit_rows) -> Any:
        """As LlamaModel.forward; `kv` holds rank 0's layers, then rank 1's... (ShardedPagePool.layers).
        Returns rank 0's logits (every rank's are the same)."""
        c, n = self.config, self.config.n_layers
        caches = [kv[r * n : (r + 1) * n] for r in range(self.plan.tp)]
        inputs = [self._inputs(r, tokens, rows) for r in range(self.plan.tp)]
        xs = [o.embedding(m.embed, t) for o, m, (t, _) in zip(self.ops, self.ranks, inputs, strict=True)]
        for i in range(n):
            parts = []
            for o, m, x, cache, (_, rr) in zip(self.ops, self.ranks, xs, caches, inputs, strict=True):
                layer = m.layers[i]
                q = m.attention_q(x, layer, rr, cache[i])
                parts.append(o.matmul(o.attention(q, cache[i], rr, m.scale), layer.wo))
            xs = self._reduce(parts, xs)
            parts = [o.matmul(o.norm_matmul(x, m.layers[i].ffn_norm, c.rms_eps, m.layers[i].w_gate_up),
                              m.layers[i].w_down)
                     for o, m, x in zip(self.ops, self.ranks, xs, strict=True)]
            xs = self._reduce(parts, xs)
        x, head, o = xs[0], self.ranks[0], self.ops[0]
        if logit_rows is not None:
            x = x[logit_rows]
        return o.norm_matmul(x, head.norm, c.rms_eps, head.lm_head)


class ShardedPagePool(PagePool):
    """One page numbering for all ranks; rank r's layers (its KV heads only) follow rank r-1's in
    `layers`, so park, restore and copy move every rank's pages of a sequence together."""

    def __init__(self, ops: list[Ops], plan: TPPlan, n_layers: int, n_pages: int, head_dim: int, kv_type: str,
                 v_type: str | None = None):
        super().__init__(ops[0], 0, n_pages, 1, head_dim, kv_type, v_type)
        self.rank_ops = [o for o in ops for _ in range(n_layers)]
        self.layers = [o.kv_alloc(n_pages, s.n_kv_heads, head_dim, kv_type, v_type)
                       for o, s in zip(ops, plan.ranks, strict=True) for _ in range(n_layers)]

    def park(self, pages: list[int]) -> ParkedKV:
        return ParkedKV([o.kv_read_pages(layer, pages) for o, layer in zip(self.rank_ops, self.layers, strict=True)],
                        len(pages), self.park_bytes(len(pages)))

    def restore(self, pages: list[int], parked) -> None:
        for o, layer, data in zip(self.rank_ops, self.layers, parked.layers, strict=True):
            o.kv_write_pages(layer, pages, data)

    def copy(self, src: list[int], dst: list[int]) -> None:
        for o, layer in zip(self.rank_ops, self.layers, strict=True):
            o.kv_copy_pages(layer, src, dst)
