"""The load-time warm-up (engine/warmup.py): throwaway prompts give their pages back, and /health
turns ready only after the warm-up ran (real engine child on the CPU backend)."""

import urllib.request

from engine.runner import Runner, StepEntry
from engine.warmup import prompt_rows, warm_up
from lockstep_kernels.cpu.ops import CpuOps
from tests.engine_helpers import wait_serving


def test_prompt_rows_cover_the_plan_thresholds_up_to_ubatch():
    assert prompt_rows(512) == [1, 2, 4, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512]
    assert prompt_rows(100) == [1, 2, 4, 8, 9, 16, 17, 32, 33, 64, 65, 100]


def test_warm_up_returns_its_pages_and_leaves_steps_unchanged(loaded_llama):
    runner = Runner(loaded_llama, CpuOps(), n_pages=8, kv_type="f32")

    def greedy() -> list[int]:
        pages = runner.pool.alloc(1)
        out = runner.step([StepEntry(pages=pages, tokens=[1, 2, 3, 4], start=0, logits="all")])[0]
        runner.pool.release(pages)
        return [int(a) for a in out.argmax]

    before = greedy()
    done = warm_up(runner, 300)
    assert done["prompt_rows"] == prompt_rows(300) and done["buckets"] == []
    assert runner.pool.n_free == 8
    assert greedy() == before


def test_health_turns_ready_only_after_the_warm_up(engine_factory, tiny_llama):
    eng = engine_factory(tiny_llama, ready=False)
    seen: list[str] = []

    def health() -> bool:
        with urllib.request.urlopen(eng.base + "/health", timeout=2) as r:
            if r.status == 200:
                seen.append(eng.output())  # the log as it stood when the engine first said ready
                return True
        return False

    def probe() -> bool:
        try:
            return health()
        except urllib.error.HTTPError as e:  # 503 while loading
            assert e.code == 503
            return False

    wait_serving(eng.proc, "engine", probe, eng.output, 90.0)
    assert "warm-up: decode graphs none, prompts of 1 rows" in seen[0]
    load = eng.get_json("/props")["load_seconds"]
    assert load["warm_up_prompt_rows"] == [1] and load["warm_up"] >= 0 and load["weights"] > 0
    assert load["self_check_builds"] <= load["self_check"]
