"""Which kernel each CUDA op runs a batch on: plain functions of the weight, the row count and the
device (CudaOps delegates to them; the exactness self-check probes every choice at the row counts
that make it, and tests check the choices without a GPU).

`dev` is anything with the attributes CudaOps has: `sm_count`, `exact`, `tiled` (which shared-memory
kernels wide batches may take) and `wgmma` (sm_90a code runs); `w` anything with a CudaWeight's
`dtype`, `shape` (logical N, K), `gate_up` and `rope_tiles`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from contract.env import ATTN_WS, ATTN_WS_LEAN, ATTN_WS_TMA, WGMMA_ATTN, WGMMA_BUILD, WGMMA_KQ, switch
from lockstep_kernels.cuda import plan

Tiling = Literal[True, "wide", "tile", False]
CUBLAS_MIN_ROWS = 65  # exact mode off: from this many rows 16-bit and float32 weights go to cuBLAS


def kq_integer(w: Any) -> bool:
    """Whether w's matmuls run on kquant_mm.cu's integer kernels (every M, every op)."""
    return plan.KQ_INTEGER and w.dtype in plan.KQUANT_TYPES


def to_cublas(dev: Any, t: int, w: Any) -> bool:
    return not dev.exact and t >= CUBLAS_MIN_ROWS and w.dtype in ("f32", "f16", "bf16")


def shared_memory_launch(dev: Any, t: int, w: Any) -> tuple[str | None, plan.MatmulLaunch | None]:
    """The shared-memory kernel a 16-bit, int8 or K-quant weight takes for t rows, if any: "wgmma",
    "wgmma_kq", "wide" or "tile" and its launch."""
    n, k = w.shape
    if kq_integer(w):
        return None, None
    build = getattr(dev, "wgmma_build", plan.WGMMA_BUILD)
    if dev.wgmma and dev.tiled is True and (wg := plan.wgmma_launch(w.dtype, t, n, k, dev.sm_count, build)):
        return "wgmma", wg
    kq_on = getattr(dev, "wgmma_kq", None)
    if (dev.wgmma and dev.tiled is True and (plan.WGMMA_KQ if kq_on is None else kq_on)
            and (kq := plan.wgmma_kq_launch(w.dtype, t, n, k, dev.sm_count))):
        return "wgmma_kq", kq
    if dev.tiled in (True, "wide") and (wide := plan.wide_launch(w.dtype, t, n, k, dev.sm_count)):
        return "wide", wide
    if dev.tiled and (tiled := plan.tile_launch(w.dtype, t, n, k, dev.sm_count)):
        return "tile", tiled
    return None, None


def matvec_launch(dev: Any, t: int, w: Any, prologue: str | None = None, rope: bool = False) -> plan.MatmulLaunch | None:
    """The ring kernel's launch (matvec.cu) for one row of w, if it takes it: `dev.matvec` on, 16-bit
    weights stored whole (not halves), not in rope tiles (their epilogue is mm_tc's alone)."""
    if t != 1 or not getattr(dev, "matvec", False) or rope or w.gate_up == "halves" or w.rope_tiles:
        return None
    n, k = w.shape
    return plan.matvec_launch(w.dtype, n, k, dev.sm_count, prologue)


def matmul_family(dev: Any, t: int, w: Any) -> str:
    """The kernel family `matmul` runs t rows of w on."""
    if to_cublas(dev, t, w):
        return "cublas"
    if w.dtype == "f32":
        return "mm_f32"
    if kq_integer(w):
        if t == 1:
            return "mmq_one"
        return "mmq_tile" if plan.kq_tile_grid(t, *w.shape, dev.sm_count, w.dtype) else "mmq_tc"
    kind, _ = shared_memory_launch(dev, t, w)
    if kind is None and matvec_launch(dev, t, w):
        return "mv"
    return {"wgmma": "mm_wgmma_tma", "wgmma_kq": "mm_wgmma_kq", "wide": "mm_wide", "tile": "mm_tile"}.get(kind, "mm_tc")


def streams(dev: Any, t: int, w: Any) -> bool:
    """Whether matmul runs t rows of w on the streaming kernel (mm_tc)."""
    return w.dtype != "f32" and not to_cublas(dev, t, w) and shared_memory_launch(dev, t, w)[0] is None


def reads_16bit(dev: Any, t: int, w: Any) -> bool:
    """Whether t rows for w's streaming kernel come as 16-bit pairs (plan.reads_16bit)."""
    return streams(dev, t, w) and not kq_integer(w) and plan.reads_16bit(t, w.shape[0], w.shape[1], dev.sm_count, w.dtype)


def prologue(dev: Any, t: int, k: int, w: Any) -> str | None:
    """How norm_matmul feeds the streaming kernel: "norm" (one row: the kernel normalises it), "x16"
    (rms_norm_16's 16-bit pairs) or None (rms_norm's rows, then matmul)."""
    if w.gate_up == "halves" or w.shape[1] != k or kq_integer(w):
        return None
    if t == 1 and w.dtype != "f32":
        if matvec_launch(dev, t, w, "norm"):
            return "norm" if plan.matvec_norm(w.shape[0], k, dev.sm_count, w.dtype) else None
        if plan.norm_prologue(w.shape[0], k):
            return "norm"
    return "x16" if reads_16bit(dev, t, w) else None


def to_wgmma(dev: Any, t: int, k: int, w: Any) -> plan.MatmulLaunch | None:
    """mm_wgmma's launch where matmul would take it for t rows of k values (16-bit weights, exact)."""
    if w.dtype not in ("f16", "bf16") or w.gate_up == "halves" or w.shape[1] != k or to_cublas(dev, t, w):
        return None
    kind, launch = shared_memory_launch(dev, t, w)
    return launch if kind == "wgmma" else None


def to_wgmma_kq(dev: Any, t: int, k: int, w: Any) -> plan.MatmulLaunch | None:
    """mm_wgmma_kq's launch where matmul would take it for t rows of k values (plan.WGMMA_KQ_TYPES)."""
    if w.dtype not in plan.WGMMA_KQ_TYPES or w.gate_up == "halves" or w.shape[1] != k:
        return None
    kind, launch = shared_memory_launch(dev, t, w)
    return launch if kind == "wgmma_kq" else None


def norm_matmul_family(dev: Any, t: int, w: Any) -> str:
    """What norm_matmul runs t rows of w on: the streaming kernel fed by a prologue ("+norm", "+x16"),
    mm_wgmma fed 16-bit rows in its k order ("+norm16"), or rms_norm then matmul's family."""
    k = int(w.shape[1])
    if kq_integer(w) and w.gate_up != "halves":
        return matmul_family(dev, t, w) + "+qnorm"  # kq_quant_x normalises the rows it quantises
    if p := prologue(dev, t, k, w):
        return ("mv" if p == "norm" and matvec_launch(dev, t, w, p) else "mm_tc") + f"+{p}"
    if to_wgmma(dev, t, k, w):
        return "mm_wgmma_tma+norm16"
    if to_wgmma_kq(dev, t, k, w):
        return "mm_wgmma_kq+norm16"
    return matmul_family(dev, t, w)


def qkv_family(dev: Any, t: int, w: Any) -> str:
    """What norm_qkv_rope_write runs t rows of q|k|v on: with an upload_qkv weight the streaming
    kernel's epilogue rotates and stores ("+rope"); otherwise norm_matmul, then rope_qkv_write."""
    family = norm_matmul_family(dev, t, w)
    return family + "+rope" if w.rope_tiles and streams(dev, t, w) else family


BUILD_NAMES = {plan.LATENCY_BUILD: "latency", plan.THROUGHPUT_BUILD: "throughput",
               plan.LATE_VALUES_BUILD: "late_values"}


def attention_build(dev: Any, t: int, n_heads: int, n_kv: int, head_dim: int, width: int,
                    kv_type: str = "f16") -> str:
    """The kernel and build attention runs t rows on: prefills on attention_wgmma.cu where it is on;
    the tensor-core kernel's one row or 64 MMA rows a block, chunks over workers or not
    (plan.mma_attention_launch); else the attn_partial build (plan.attention_launch)."""
    if plan.mma_attention(kv_type, head_dim):
        if wgmma_attention(dev, t, n_heads, n_kv, head_dim, width, kv_type) is not None:
            return "wgmma_tile"
        at = plan.mma_attention_launch(t, n_heads, n_kv, head_dim, width, dev.sm_count)
        return ("mma_row" if at.rb == 1 else "mma_tile") + ("+split" if at.workers > 1 else "")
    return BUILD_NAMES[plan.attention_launch(t, n_heads, n_kv, head_dim, width, dev.sm_count).build]


def wgmma_attention_on(compute_capability: str, env: Mapping[str, str]) -> bool:
    """Whether prefills may take attention_wgmma.cu: on sm_90 (sm_90a code), where it was measured
    faster with attn_mma's bits, unless LOCKSTEP_WGMMA_ATTN turns it off; every other GPU keeps attn_mma."""
    return compute_capability == "90" and switch(env, WGMMA_ATTN, default=True)


def wgmma_attention(dev: Any, t: int, n_heads: int, n_kv: int, head_dim: int, width: int,
                    kv_type: str) -> plan.WgmmaAttentionLaunch | None:
    """attention_wgmma.cu's launch where dev.wgmma_attention (wgmma_attention_on) holds and the rows are
    a prefill's; else None (attn_mma)."""
    if not getattr(dev, "wgmma_attention", False):
        return None
    return plan.wgmma_attention_launch(t, n_heads, n_kv, head_dim, width, dev.sm_count, kv_type,
                                       getattr(dev, "attention_ws", False))


def attention_ws_on(env: Mapping[str, str]) -> bool:
    """Whether attention_wgmma.cu's two-warpgroup launches take attention_ws.cu (LOCKSTEP_ATTN_WS; on: the
    H200 measured it faster with attn_mma's bits, bench/evidence/attn-ws-ab-h200.json; 0 turns it off)."""
    return switch(env, ATTN_WS, default=True)


def attention_ws_lean(env: Mapping[str, str]) -> bool:
    """Whether attention_ws.cu takes its lean build whatever plan.WGMMA_WS_LEAN / _FTZ / _VEC_FOLD / _SKIP_MASK say
    (LOCKSTEP_ATTN_WS_LEAN; default on: the H200 measured it faster with attn_mma's bits, bench/evidence/
    s22-attn-lean; 0 turns it off)."""
    return switch(env, ATTN_WS_LEAN, default=True)


def attention_ws_tma(env: Mapping[str, str]) -> bool:
    """Whether the lean attention_ws.cu build brings its K/V sub-tiles by TMA (LOCKSTEP_ATTN_WS_TMA, else
    plan.WGMMA_WS_TMA; the same bits)."""
    return switch(env, ATTN_WS_TMA, default=plan.WGMMA_WS_TMA)


def wgmma_kq_switch(env: Mapping[str, str]) -> bool | None:
    """LOCKSTEP_WGMMA_KQ's say on K-quant prefills taking mm_wgmma_kq; None where it is unset (plan.WGMMA_KQ
    decides, read at each launch)."""
    return switch(env, WGMMA_KQ, default=False) if env.get(WGMMA_KQ) else None


def wgmma_build(env: Mapping[str, str]) -> str:
    """mm_wgmma_tma's build (LOCKSTEP_WGMMA_BUILD, one of plan.WGMMA_BUILDS; default plan.WGMMA_BUILD)."""
    build = env.get(WGMMA_BUILD) or plan.WGMMA_BUILD
    if build not in plan.WGMMA_BUILDS:
        raise ValueError(f"{WGMMA_BUILD}={build!r}: one of {', '.join(plan.WGMMA_BUILDS)}")
    return build
