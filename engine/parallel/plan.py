"""Which rank holds which heads and FFN columns (llama-server's `--split-mode row` with `-ts`).

Layout (Megatron's): q|k|v and gate|up are column-parallel (a rank holds whole KV-head groups, its
query heads with them, and a contiguous slice of the FFN columns); o and down are row-parallel (a
rank's slice of their input dimension), so each layer needs two reductions of a [T, hidden] partial
sum. Attention runs per rank on its own heads and each rank keeps only its KV heads' pages.
The embedding table and lm_head are replicated: the embedding is a gather that needs no
communication, and a replicated lm_head gives rank 0 whole logits rows without a gather of
vocabulary slices (its memory, vocab x hidden per rank, is the price; a vocabulary-parallel
lm_head with an all-gather of logit columns would be exact too, as a gather adds nothing).

Process model: one process, one stream per GPU. The scheduler, page tables, parks and sampling stay
single (every rank uses the same physical page numbers, so a park or restore moves all ranks' pages
together), and each rank's step is replayed from its own CUDA graph, which takes the host launch cost
that would otherwise favour a process per GPU; NCCL calls for all ranks go from one thread inside
groupStart/groupEnd.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig


class PlanError(ValueError):
    """A split that cannot be made; the message names the flag that fixes it."""


@dataclass(frozen=True)
class RankShard:
    """Rank r's part: KV heads [kv0, kv1), query heads [q0, q1), FFN columns [f0, f1)."""

    rank: int
    kv0: int
    kv1: int
    q0: int
    q1: int
    f0: int
    f1: int

    @property
    def n_kv_heads(self) -> int:
        return self.kv1 - self.kv0

    @property
    def n_heads(self) -> int:
        return self.q1 - self.q0

    @property
    def ffn(self) -> int:
        return self.f1 - self.f0


@dataclass(frozen=True)
class TPPlan:
    tp: int
    split: tuple[float, ...]  # normalised proportions, one per rank
    ranks: tuple[RankShard, ...]
    devices: tuple[int, ...]  # device index of each rank (rank 0 on the main GPU)


def parse_tensor_split(text: str) -> tuple[float, ...]:
    """`-ts 3,1` (llama-server also accepts `3/1`): proportions per device, not all zero."""
    try:
        parts = tuple(float(p) for p in text.replace("/", ",").split(","))
    except ValueError:
        raise PlanError(f"--tensor-split {text!r}: expects proportions like 1,1 or 3,1") from None
    if any(p < 0 or p != p or p == float("inf") for p in parts) or not any(parts):
        raise PlanError(f"--tensor-split {text!r}: proportions must be finite, >= 0 and not all 0")
    return parts


def resolve_tp(tp: int | None, split_mode: str | None, tensor_split: tuple[float, ...] | None) -> tuple[int, tuple]:
    """The rank count and per-rank proportions from --tp, --split-mode and -ts (devices with a zero
    proportion get no rank, as in llama.cpp)."""
    used = tuple(p for p in tensor_split or () if p > 0)
    if tp is None:
        tp = len(used) if used and split_mode == "row" else 1
    if split_mode == "layer" and tp > 1:
        raise PlanError("--split-mode layer (layers spread over GPUs) is not supported yet; use --split-mode row "
                        "for tensor parallelism")
    if split_mode == "none" and tp > 1:
        raise PlanError(f"--split-mode none uses one GPU, which contradicts --tp {tp}; use --split-mode row")
    if used and tp > 1 and len(used) != tp:
        raise PlanError(f"--tensor-split gives {len(used)} non-zero proportions for --tp {tp}")
    return tp, used if tp > 1 and used else (1.0,) * tp


def _cuts(total: int, split: tuple[float, ...], unit: int) -> list[int]:
    """Boundaries of `total` items cut in whole units in proportion to `split` (cumulative rounding)."""
    units, acc, cuts = total // unit, 0.0, [0]
    whole = sum(split)
    for p in split:
        acc += p
        cuts.append(round(units * acc / whole) * unit)
    cuts[-1] = total
    return cuts


def plan_tp(config: ModelConfig, tp: int, split: tuple[float, ...] | None = None, n_devices: int | None = None,
            main_gpu: int = 0, ffn_unit: int = 1) -> TPPlan:
    """The shard of each rank. `n_devices` None: ranks are not devices (the CPU backend runs them in
    one process). `ffn_unit`: the FFN is cut in multiples of it (the block size of a quantized down
    projection, whose input dimension is cut)."""
    split = tuple(split or (1.0,) * tp)
    if tp < 1:
        raise PlanError(f"--tp {tp}: expects at least 1 rank")
    if len(split) != tp:
        raise PlanError(f"--tensor-split has {len(split)} proportions for --tp {tp}")
    if n_devices is not None and tp > n_devices:
        raise PlanError(f"--tp {tp}: more ranks than the {n_devices} GPU(s) found")
    if n_devices is not None and not 0 <= main_gpu < n_devices:
        raise PlanError(f"--main-gpu {main_gpu}: no such GPU ({n_devices} found)")
    if tp > 1 and (config.moe is not None or config.arch.startswith("qwen3_5")):
        raise PlanError(f"--tp {tp}: tensor parallelism covers dense llama-family models; {config.arch} is not "
                        "covered yet (use --tp 1)")
    even = len(set(split)) == 1
    if even and config.n_kv_heads % tp:
        raise PlanError(f"--tp {tp} does not divide the model's {config.n_kv_heads} KV heads")
    if even and config.ffn % (tp * ffn_unit):
        raise PlanError(f"--tp {tp} does not divide the model's FFN width {config.ffn} in blocks of {ffn_unit}")
    group = config.n_heads // config.n_kv_heads
    kv = _cuts(config.n_kv_heads, split, 1)
    ff = _cuts(config.ffn, split, ffn_unit)
    ranks = []
    for r in range(tp):
        if kv[r + 1] == kv[r] or ff[r + 1] == ff[r]:
            raise PlanError(f"--tensor-split {','.join(f'{p:g}' for p in split)}: rank {r} would get no KV head or "
                            f"no FFN column ({config.n_kv_heads} KV heads, FFN {config.ffn})")
        ranks.append(RankShard(r, kv[r], kv[r + 1], kv[r] * group, kv[r + 1] * group, ff[r], ff[r + 1]))
    count = n_devices if n_devices is not None else tp
    devices = tuple((main_gpu + r) % count for r in range(tp))
    whole = sum(split)
    return TPPlan(tp, tuple(p / whole for p in split), tuple(ranks), devices)
