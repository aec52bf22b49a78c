"""The ranks of a tensor-parallel load: the plan for this model, each rank's ops, the collective."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import ModelConfig
from engine.parallel.collective import Collective, InProcessCollective
from engine.parallel.plan import TPPlan, plan_tp
from engine.parallel.shard import ffn_unit
from lockstep_kernels.weights import Weight


@dataclass
class TPSetup:
    plan: TPPlan
    ops: list[Any]
    coll: Collective


def tp_plan(config: ModelConfig, weights: dict[str, Weight], backend: str, tp: int,
            split: tuple[float, ...] | None = None, main_gpu: int = 0) -> TPPlan:
    """The plan, with the checks that need the model (heads, FFN) and, on CUDA, the device count.
    Raises PlanError."""
    n_devices = None
    if backend == "cuda":
        from engine.parallel.nccl import device_count

        n_devices = device_count()
    return plan_tp(config, tp, split, n_devices, main_gpu, ffn_unit(weights))


def build_ranks(plan: TPPlan, backend: str, exact: bool, threads: int = 1) -> TPSetup:
    if backend == "cuda":
        from engine.parallel.nccl import cuda_ranks

        return TPSetup(plan, *cuda_ranks(plan.devices, exact))
    from lockstep_kernels.cpu.ops import CpuOps

    return TPSetup(plan, [CpuOps(exact=exact, threads=threads) for _ in range(plan.tp)], InProcessCollective(plan.tp))
