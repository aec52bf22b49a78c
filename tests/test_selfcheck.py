"""The exactness self-check's mechanism on the CPU: it finds each family's row count, passes the
real CPU backend, and refuses (the engine's one-line verdict, which the studio classifies) when a
family changes row 0's bits."""

import logging

import numpy as np
import pytest

from engine.exits import EXACT_REFUSED, Fatal
from engine.loader import load_model
from engine.runner import Runner, make_ops
from engine.selfcheck import model_matmuls, self_check
from kernels.selfcheck import check_matmuls, family_rows
from studio.failures import classify


class FaultyFamilyOps:
    """Fake, named as such: a kernel family that breaks row invariance from 9 rows (last bit of row
    0's first output flipped), which no CPU path produces; everything else is the real CPU backend."""

    def __init__(self, ops, from_rows: int = 9):
        self.ops, self.from_rows = ops, from_rows

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def matmul_family(self, t, w):
        return "fake_wide" if t >= self.from_rows else self.ops.matmul_family(t, w)

    def matmul(self, x, w, bias=None, residual=None):
        out = self.ops.matmul(x, w, bias, residual)
        if len(x) >= self.from_rows:
            out[0, 0] = np.frombuffer((np.float32(out[0, 0]).view(np.uint32) ^ np.uint32(1)).tobytes(), np.float32)[0]
        return out


@pytest.fixture(scope="module")
def runner(tiny_llama):
    return Runner(load_model(tiny_llama), make_ops("cpu", True), 4, "f16")


def test_the_cpu_backend_passes_with_its_one_family(runner):
    mismatch, info = check_matmuls(runner.ops, model_matmuls(runner.model) + [("lm_head", runner.model.lm_head)], 512)
    assert mismatch is None
    assert info["families"] and all(f == {"rows_gemv": 1} for f in info["families"].values())
    # one weight per shape: the tiny model's o and down are both 64x128
    assert set(info["families"]) == {"layers.0.wo", "layers.0.w_gate_up", "lm_head"}


def test_family_rows_finds_the_smallest_row_count_of_each_family(runner):
    w = runner.model.layers[0].wo
    assert family_rows(FaultyFamilyOps(runner.ops), w, 512) == {"rows_gemv": 1, "fake_wide": 9}
    assert family_rows(FaultyFamilyOps(runner.ops), w, 8) == {"rows_gemv": 1}  # never picked: not checked


def test_a_family_that_changes_bits_refuses_exact_mode_naming_it(runner):
    with pytest.raises(Fatal) as info:
        self_check(FaultyFamilyOps(runner.ops), runner.model, 512)
    fatal = info.value
    assert fatal.code == EXACT_REFUSED
    assert fatal.line.startswith("exact concurrency: kernel family fake_wide gives row 0 of 9 rows other bits")
    assert fatal.line.endswith("; use --exact-concurrency off")
    failure = classify(fatal.line + "\n", fatal.code)
    assert failure.kind == "exact_refusal" and failure.fix == "--exact-concurrency off"


def test_a_batch_too_small_to_pick_the_family_passes(runner, caplog):
    with caplog.at_level(logging.INFO, logger="engine.selfcheck"):
        self_check(FaultyFamilyOps(runner.ops), runner.model, 8)  # the faulty family is never chosen
    (line,) = [r.getMessage() for r in caplog.records if "exactness self-check" in r.getMessage()]
    assert "families rows_gemv," in line and "fake_wide" not in line, line


def test_lm_head_is_checked_only_up_to_the_rows_it_sees(runner):
    class HeadOnly(FaultyFamilyOps):
        def matmul_family(self, t, w):
            return "fake_wide" if t >= self.from_rows and w is runner.model.lm_head else self.ops.matmul_family(t, w)

        def matmul(self, x, w, bias=None, residual=None):
            if w is runner.model.lm_head:
                return super().matmul(x, w, bias, residual)
            return self.ops.matmul(x, w, bias, residual)

    self_check(HeadOnly(runner.ops), runner.model, 512, head_rows=4)  # 4 sequences: lm_head sees 4 rows
    with pytest.raises(Fatal, match="weight lm_head"):
        self_check(HeadOnly(runner.ops), runner.model, 512, head_rows=16)
