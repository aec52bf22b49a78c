"""Launch steps the server and `generate` share: reading the model, sizing the pool, building the runner.

Each failure becomes the studio's one-line verdict (engine.exits) rather than a traceback.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from engine import load_progress
from engine.config import ModelConfig
from engine.device import free_memory
from engine.errors import ModelLoadError
from engine.exits import MODEL_LOAD, Fatal, out_of_memory
from engine.kv_cache import pages_for
from engine.load_progress import CountedWeights
from engine.loader import LoadedModel, load_model
from engine.models.llama import GATE_UP, STACKS
from engine.models.qwen3_5 import hybrid_spec
from engine.runner import Runner, make_ops
from lockstep_kernels.base import PAGE_SIZE
from lockstep_kernels.weights import Weight

log = logging.getLogger("engine.launch")

_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 1.0 + 2.0 / 32}  # q8_0: int8 plus an f16 scale per 32


def read_model(path: str | Path, chat_template: str | None) -> LoadedModel:
    try:
        return load_model(path, chat_template)
    except ModelLoadError as e:
        raise Fatal(MODEL_LOAD, f"error: model load failed: {e}") from None
    except MemoryError:
        raise Fatal(MODEL_LOAD, "error: model load failed: not enough memory to read the weights") from None
    except Exception as e:  # a damaged file surfaces as whatever its reader raises; it is still a bad model
        log.exception("model load failed")
        raise Fatal(MODEL_LOAD, f"error: model load failed: {type(e).__name__}: {e}") from None


def pool_pages(ctx_size: int, config: ModelConfig) -> int:
    """Pages for --ctx-size rounded up to whole pages; 0 means the model's native context."""
    return max(1, pages_for(ctx_size or config.max_position))


GRAPH_ROWS = 64  # the largest decode-graph bucket (lockstep_kernels/cuda/graph_inputs.py)


def memory_need(loaded: LoadedModel, backend: str, n_pages: int, kv_type: str, ubatch: int = 512,
                max_pages_per_seq: int = 0, v_type: str | None = None, n_seqs: int = 1) -> dict[str, int]:
    """Bytes a load takes on `backend`, by part. On the CPU the weights stay memory-mapped, so only the
    KV pool (and hybrid models' recurrent state for `n_seqs` sequences) counts; on CUDA the weights as
    the kernels store them, the pool and working memory."""
    c = loaded.config
    per_cell = _BYTES[kv_type] + _BYTES[v_type or kv_type]
    spec = hybrid_spec(c)
    kv_layers = spec.n_full if spec else c.n_layers
    need = {"kv": int(n_pages * PAGE_SIZE * kv_layers * c.n_kv_heads * c.head_dim * per_cell)}
    if spec:
        need["state"] = n_seqs * spec.n_linear * spec.deltanet.state_bytes()
    if backend != "cuda":
        return need
    need["weights"] = cuda_weight_bytes(loaded.weights)
    pages = max_pages_per_seq or n_pages
    rows = max(ubatch, GRAPH_ROWS)
    # activations of the widest step (hidden, q|k|v, gate|up, with copies) and the attention scratch
    need["work"] = 4 * rows * (6 * c.hidden + 3 * c.ffn + 3 * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim)
    need["work"] += 4 * min(rows * c.n_heads * pages * (c.head_dim + 2), 256 << 20)
    if c.moe is not None:  # each (token, expert) pair's row, gated products and output
        need["work"] += 4 * rows * c.moe.top_k * (2 * c.hidden + 3 * c.moe.expert_ffn)
    need["logits"] = 4 * rows * c.vocab_size
    return need


def _stacks(weights: dict[str, Weight]):
    """Each layer's q|k|v and gate|up (llama.STACKS) present in `weights`: (names, whether its parts
    of different K-quant types may stay their runs' planes)."""
    for name in weights:
        for stack in STACKS:
            if name.endswith("." + stack[0]):
                names = [name.removesuffix(stack[0]) + part for part in stack]
                if all(n in weights for n in names):
                    yield names, stack is not GATE_UP


def cuda_weight_bytes(weights: dict[str, Weight]) -> int:
    """Device bytes of the weights as the model uploads them: each layer's q|k|v and gate|up as one
    stack, which is f16 on the device where its parts differ in type (K-quants: q|k|v as its runs'
    planes where the integer kernels read them)."""
    from lockstep_kernels.cuda.weights import device_bytes, routed_expert, stack_bytes

    stacked: set[str] = set()
    total = 0
    for names, runs in _stacks(weights):
        total += stack_bytes([weights[n] for n in names], runs=runs)
        stacked.update(names)
    return total + sum(device_bytes(w, planes=not routed_expert(n)) for n, w in weights.items()
                       if n not in stacked)


def mixed_stacks_line(weights: dict[str, Weight]) -> str | None:
    """The CUDA load's line for the stacks whose parts differ in type and so become one f16 weight (a
    Q4_K_M q|k|v whose v is Q6_K): how many, their types, and the memory, stored -> on the GPU."""
    from lockstep_kernels.cuda.weights import device_bytes, stack_bytes

    count, types, stored, on_gpu = 0, set(), 0, 0
    for names, runs in _stacks(weights):
        parts = [weights[n] for n in names]
        size = stack_bytes(parts, runs=runs)
        if len({w.dtype for w in parts}) > 1 and size > sum(device_bytes(w) for w in parts):
            count, stored, on_gpu = count + 1, stored + sum(w.nbytes for w in parts), on_gpu + size
            types |= {w.dtype.upper() for w in parts}
    if not count:
        return None
    gib = 1 << 30
    return (f"cuda: {count} stacks mix types ({', '.join(sorted(types))}; q|k|v or gate|up as one matmul): f16 at load, "
            f"{stored / gib:.2f} GiB stored -> {on_gpu / gib:.2f} GiB on the GPU")


def build_runner(loaded: LoadedModel, backend: str, exact: bool, n_pages: int, kv_type: str,
                 max_pages_per_seq: int = 0, ubatch: int = 512, v_type: str | None = None, n_seqs: int = 1,
                 threads: int = 1, plan=None, progress: bool = True) -> Runner:
    """The runner with its KV pool, refused up front (exit 5) when the load cannot fit in free memory,
    before anything is uploaded. `plan`: an engine.parallel.plan.TPPlan for a tensor-parallel load.
    `progress`: the load-progress lines and the memory line the studio reads; False for a second model
    (the draft), whose figures would stand in for the model's."""
    parts = memory_need(loaded, backend, n_pages, kv_type, ubatch, max_pages_per_seq, v_type, n_seqs)
    if plan is not None:
        parts = rank_share(parts, loaded, plan.tp)
    need = sum(parts.values())
    if backend == "cuda" and progress and (line := mixed_stacks_line(loaded.weights)):
        log.warning("%s", line)
    free = free_memory(backend)
    log.info("%s: needs %.2f GiB (%s), %.2f GiB free", "memory" if progress else "memory of the draft model",
             need / 2**30,
             ", ".join(f"{k} {v / 2**30:.2f}" for k, v in parts.items()), free / 2**30)
    if need > free:
        raise out_of_memory(need, free)
    try:
        if progress:
            load_progress.phase("kernels")
        if plan is not None:
            from engine.parallel.setup import build_ranks

            ranks = build_ranks(plan, backend, exact, threads)
            ops, parallel = ranks.ops[0], ranks
        else:
            ops, parallel = make_ops(backend, exact, threads), None
        weights = CountedWeights(loaded.weights) if progress else None
        runner = Runner(replace(loaded, weights=weights) if weights is not None else loaded, ops, n_pages, kv_type,
                        max_pages_per_seq, v_type, parallel=parallel)
        if weights is not None:
            weights.finish()
        return runner
    except Exception as e:
        if isinstance(e, MemoryError) or "OutOfMemory" in type(e).__name__:  # CuPy's OutOfMemoryError
            raise out_of_memory(need, free_memory(backend)) from None
        raise


def rank_share(parts: dict[str, int], loaded: LoadedModel, tp: int) -> dict[str, int]:
    """One rank's part of a tensor-parallel load (each GPU is checked against the first one's free
    memory): the KV pool and the split weights divided by the ranks, the embedding and lm_head whole."""
    out = dict(parts, kv=parts["kv"] // tp)
    if "weights" in parts:
        from lockstep_kernels.cuda.weights import device_bytes

        whole = sum(device_bytes(w) for n, w in loaded.weights.items() if not n.startswith("model.layers."))
        out["weights"] = whole + (parts["weights"] - whole) // tp
    return out


def gpu_layers(ngl: int | str, n_layers: int) -> str:
    """-ngl against the model: "all", "none" or "N of M" (partial offload)."""
    if ngl in ("all", "auto") or (isinstance(ngl, int) and ngl >= n_layers):
        return "all"
    if ngl == 0:
        return "none"
    return f"{ngl} of {n_layers}"
