"""Probe: the recurrent half's own control. In-process scheduler on the CPU with exact matmuls, P0's
tokens alone (-ub 512) against beside 7 neighbours at other -ub, once as the product runs (prompt
pieces cut at multiples of the 16-token chunk, chunks from position 0) and once with the chunks cut
where each step cuts the prompt (the old way the issue describes).
  PYTHONPATH=. python3 bench/probes/hybrid_chunk_control.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.loader import load_model  # noqa: E402
from engine.scheduler.planner import Planner  # noqa: E402
from lockstep_kernels.cpu import deltanet  # noqa: E402
from lockstep_kernels.cpu.ops import CpuOps  # noqa: E402
from studio.evidence import make_prompts  # noqa: E402
from tests.test_scheduler import run  # noqa: E402
from tests.tiny_hybrid import make_hybrid_model  # noqa: E402

CELLS = (("beside_7", {}), ("ubatch_16_parks_5", {"ub": 16, "every": 5}), ("ubatch_24", {"ub": 24}),
         ("ubatch_40_parks_5", {"ub": 40, "every": 5}))


def cells(model, prompts) -> dict[str, str]:
    solo = run(model, [prompts[0]], logprobs=1, max_tokens=24)[0][(0, 0)]
    out = {}
    for name, kw in CELLS:
        got = run(model, prompts, logprobs=1, max_tokens=24, parallel=8, n_pages=16, **kw)[0][(0, 0)]
        diff = next((i for i, (a, b) in enumerate(zip(solo, got, strict=True)) if a != b), None)
        ids_same = [t for t, _ in solo] == [t for t, _ in got]
        out[name] = "identical" if diff is None else f"differs at token {diff}" + (" (logprob only)" * ids_same)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(make_hybrid_model(Path(tmp)))
        model.tokenizer.eos_ids = set()
        prompts = make_prompts(8, 100, model.config.vocab_size)
        print("product:", cells(model, prompts))
        Planner._piece = lambda self, seq, n: 1 if seq.n_computed >= seq.n_prompt else min(n, seq.n_prompt - seq.n_computed)
        CpuOps.gated_delta = lambda self, *a: deltanet.gated_delta(*a, False)
        print("chunks where the step cuts them:", cells(model, prompts))


if __name__ == "__main__":
    main()
