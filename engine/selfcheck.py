"""The exactness self-check at load: the model's weight shapes through every matmul kernel family
the plan may pick on this device (kernels.selfcheck); a family that changes a row's bits refuses
exact mode with the usual one-line verdict, naming it."""

from __future__ import annotations

import logging
from typing import Any

from engine.exact import refuse
from kernels.selfcheck import check_matmuls

log = logging.getLogger("engine.selfcheck")


def model_matmuls(model: Any) -> list[tuple[str, Any]]:
    """The uploaded weights plain matmuls run on inside the layers: each layer's o, gate|up and
    down (one of each shape is checked)."""
    out = []
    for i, layer in enumerate(getattr(model, "layers", [])):
        for attr in ("wo", "w_gate_up", "w_down"):
            w = getattr(layer, attr, None)
            if w is not None:
                out.append((f"layers.{i}.{attr}", w))
    return out


def self_check(ops: Any, model: Any, max_rows: int, head_rows: int | None = None) -> None:
    """Raises the exact refusal (exit 3) when a family breaks row invariance here. `max_rows`: the
    most token rows a step runs; `head_rows`: the most rows lm_head sees in a step (each sequence's
    last row, or its draft rows), which bounds that check's memory too."""
    mismatch, info = check_matmuls(ops, model_matmuls(model), max_rows)
    if mismatch is None:
        mismatch, head = check_matmuls(ops, [("lm_head", model.lm_head)], min(max_rows, head_rows or max_rows))
        info = {"families": info["families"] | head["families"], "seconds": info["seconds"] + head["seconds"]}
    families = sorted({f for per in info["families"].values() for f in per})
    log.info("exactness self-check: %d weight shapes, families %s, %.2f s", len(info["families"]),
             ", ".join(families), info["seconds"])
    if mismatch is not None:
        raise refuse(mismatch.describe(), "--exact-concurrency off")
