"""The exactness self-check's mechanism on the CPU: it finds each family's row count, passes the
real CPU backend, and refuses (the engine's one-line verdict, which the studio classifies) when a
family changes row 0's bits; and which CUDA kernels and attention builds it probes for real shapes
(lockstep_kernels.cuda.dispatch, plain arithmetic)."""

import logging
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from engine.exits import EXACT_REFUSED, Fatal
from engine.loader import load_model
from engine.runner import Runner, make_ops
from engine.selfcheck import model_matmuls, self_check
from lockstep_kernels.cuda import dispatch, plan
from lockstep_kernels.selfcheck import AttentionShape, attention_rows, check_matmuls, family_rows, qkv_rows
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
    assert "families attend_rows, rows_gemv," in line and "fake_wide" not in line, line


def test_the_log_and_the_result_separate_kernel_builds_from_the_checks(runner, caplog):
    class BuildingOps(FaultyFamilyOps):
        """Fake, named as such: the CPU backend builds no kernels, so each first matmul of a row count
        'builds' for 0.25 s on a counter, as CUDA's first use of a kernel does (modules.build_seconds)."""

        built, seen = 0.0, set()

        def build_seconds(self):
            return self.built

        def matmul(self, x, w, bias=None, residual=None):
            if len(x) not in self.seen:
                self.seen.add(len(x))
                self.built += 0.25
            return self.ops.matmul(x, w, bias, residual)

    ops = BuildingOps(runner.ops, from_rows=10**9)
    with caplog.at_level(logging.INFO, logger="engine.selfcheck"):
        built = self_check(ops, runner.model, 8)
    assert built == 0.25 * len(ops.seen) > 0
    (line,) = [r.getMessage() for r in caplog.records if "exactness self-check" in r.getMessage()]
    assert f"kernel builds {built:.2f} s" in line and "checks " in line, line


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


def flip_last_bit(a: np.ndarray) -> None:
    """a[0, 0]'s lowest bit flipped in place (float32 or a 16-bit KV cell)."""
    bits = a.view(np.uint32 if a.dtype == np.float32 else np.uint16)
    bits[0, 0] ^= 1


class FaultyAttentionOps(FaultyFamilyOps):
    """Fake, named as such: an attention build that changes row 0's last bit from 8 rows."""

    def attention_build(self, t, n_heads, n_kv, head_dim, width, kv_type="f16"):
        return "fake_throughput" if t >= 8 else self.ops.attention_build(t, n_heads, n_kv, head_dim, width, kv_type)

    def matmul_family(self, t, w):
        return self.ops.matmul_family(t, w)

    def matmul(self, x, w, bias=None, residual=None):
        return self.ops.matmul(x, w, bias, residual)

    def attention(self, q, layer, rows, scale):
        out = self.ops.attention(q, layer, rows, scale)
        if len(q) >= 8:
            flip_last_bit(out)
        return out


class FaultyLastRowAttentionOps(FaultyAttentionOps):
    """Fake, named as such: an attention build that from 8 rows leaves row 0 right and changes the last
    row's last bit (as a kernel whose row masks miss the far end of a tile would)."""

    def attention(self, q, layer, rows, scale):
        out = self.ops.attention(q, layer, rows, scale)
        if len(q) >= 8:
            flip_last_bit(out[len(q) - 1:])
        return out


class FaultyQkvOps(FaultyAttentionOps):
    """Fake, named as such: a fused q|k|v kernel that from 9 rows changes row 0's q, or the K it stores."""

    def __init__(self, ops, what: str):
        super().__init__(ops)
        self.what = what

    def attention_build(self, t, n_heads, n_kv, head_dim, width, kv_type="f16"):
        return self.ops.attention_build(t, n_heads, n_kv, head_dim, width, kv_type)

    def attention(self, q, layer, rows, scale):
        return self.ops.attention(q, layer, rows, scale)

    def qkv_family(self, t, w):
        return "fake_fused" if t >= 9 else self.ops.qkv_family(t, w)

    def norm_qkv_rope_write(self, x, norm_weight, eps, w, bias, rows, table, layer, n_heads, n_kv):
        q = self.ops.norm_qkv_rope_write(x, norm_weight, eps, w, bias, rows, table, layer, n_heads, n_kv)
        if len(x) >= 9:
            flip_last_bit(q.reshape(len(x), -1) if self.what == "q" else layer.k[0])
        return q


def test_an_attention_build_that_changes_bits_refuses_exact_mode_naming_it(runner):
    c = runner.model.config
    with pytest.raises(Fatal) as info:
        self_check(FaultyAttentionOps(runner.ops), runner.model, 512, kv_type="f16", width=4)
    assert info.value.line.startswith("exact concurrency: kernel family fake_throughput gives row 0 of 8 rows")
    assert f"(attention, {c.n_heads} heads, {c.n_kv_heads} KV heads, head dim {c.head_dim}, f16 KV)" in info.value.line
    self_check(FaultyAttentionOps(runner.ops), runner.model, 4)  # never picked below 8 rows: passes


def test_an_attention_build_that_changes_only_the_last_rows_bits_is_found(runner):
    with pytest.raises(Fatal) as info:
        self_check(FaultyLastRowAttentionOps(runner.ops), runner.model, 512, kv_type="f16", width=4)
    assert info.value.line.startswith("exact concurrency: kernel family fake_throughput gives row 7 of 8 rows")


@pytest.mark.parametrize("what", ["q", "k"])
def test_a_fused_qkv_kernel_that_changes_bits_refuses_exact_mode_naming_it(runner, what):
    with pytest.raises(Fatal) as info:
        self_check(FaultyQkvOps(runner.ops, what), runner.model, 512)
    assert info.value.line.startswith("exact concurrency: kernel family fake_fused gives row 0 of 9 rows")
    assert "(q|k|v layers.0.w_qkv, " in info.value.line, info.value.line


def test_the_cpu_backend_passes_qkv_and_attention_with_one_build_each(runner):
    c = runner.model.config
    shape = AttentionShape(c.n_heads, c.n_kv_heads, c.head_dim, 4, "f16")
    assert attention_rows(runner.ops, shape, 512) == {"attend_rows": 1}
    assert qkv_rows(runner.ops, runner.model.layers[0].w_qkv, 512) == {"rows_gemv": 1}


# What the CUDA backend's plan picks (lockstep_kernels.cuda.dispatch is the code CudaOps runs), for real shapes.
H200 = SimpleNamespace(sm_count=132, exact=True, tiled=True, wgmma=True)
A100 = SimpleNamespace(sm_count=108, exact=True, tiled=True, wgmma=False)
RTX3060 = SimpleNamespace(sm_count=28, exact=True, tiled=True, wgmma=False)


@dataclass
class FakeCudaWeight:
    """Stands for a CudaWeight: only the fields dispatch reads."""

    dtype: str
    shape: tuple[int, int]
    gate_up: str | None = None
    rope_tiles: int = 0


class Dispatching:
    """The CUDA backend's choices without a GPU."""

    def __init__(self, dev):
        self.dev = dev

    def matmul_family(self, t, w):
        return dispatch.matmul_family(self.dev, t, w)

    def qkv_family(self, t, w):
        return dispatch.qkv_family(self.dev, t, w)

    def attention_build(self, t, n_heads, n_kv, head_dim, width, kv_type="f16"):
        return dispatch.attention_build(self.dev, t, n_heads, n_kv, head_dim, width, kv_type)


QKV_8B = FakeCudaWeight("f16", (6144, 4096), rope_tiles=128)


@pytest.mark.parametrize("dev, want", [
    # one row normalises itself; 9-16 rows take 16-bit input; 64-row tiles once they fill 0.75 of the SMs
    # (96 x 2 from 65 rows on 132 SMs, 96 x 1 from 33 on 108); wgmma or mm_wide from 129 rows
    (H200, {"mm_tc+norm+rope": 1, "mm_tc+rope": 2, "mm_tc+x16+rope": 9, "mm_tile": 65, "mm_wgmma_tma+norm16": 129}),
    (A100, {"mm_tc+norm+rope": 1, "mm_tc+rope": 2, "mm_tc+x16+rope": 9, "mm_tile": 33, "mm_wide": 129}),
])
def test_the_fused_qkv_projection_is_checked_under_each_kernel_it_may_take(dev, want):
    assert qkv_rows(Dispatching(dev), QKV_8B, 512) == want
    assert qkv_rows(Dispatching(dev), QKV_8B, 16) == {k: v for k, v in want.items() if v <= 16}
    # a weight without rope tiles (head dim not a multiple of 16): norm_matmul, then the rotation kernel
    assert "mm_tc+rope" not in qkv_rows(Dispatching(dev), FakeCudaWeight("f16", (6144, 4096)), 512)


@pytest.mark.parametrize("dev, heads, kv, want", [
    # scalar kernel (f32 cache): (row, head group) blocks up to a quarter of the SMs take the latency
    # build (8B: 32 blocks up to 4 rows)
    (H200, (32, 8, 128), "f32", {"latency": 1, "throughput": 8}),
    (H200, (32, 8, 64), "f32", {"latency": 1, "late_values": 8}),  # 1B: values loaded late at head dim 64
    (RTX3060, (32, 8, 128), "f32", {"throughput": 1}),  # 28 SMs: even one row's 32 blocks are too many
    # tensor-core kernel (16-bit cache): one row a block up to 64 rows, chunks over workers while two
    # or more a row fit three blocks an SM in one wave (8B: 8 a row, 132 SMs: up to 24 rows); prefill
    # tiles while the blocks do not fill the SMs
    (H200, (32, 8, 128), "f16", {"mma_row+split": 1, "mma_row": 32, "mma_tile+split": 65, "mma_tile": 257}),
])
def test_attention_is_checked_under_each_build_it_may_compile(dev, heads, kv, want):
    shape = AttentionShape(*heads, 64, kv)
    assert attention_rows(Dispatching(dev), shape, 512) == want


def test_matmul_families_of_8b_weights_on_an_h200(monkeypatch):
    ops = Dispatching(H200)
    # 64 x 2 tiles from 65 rows fill 0.75 of 132 SMs; 32 x 2 wgmma tiles from 129 rows fill 0.45
    assert family_rows(ops, FakeCudaWeight("f16", (4096, 4096)), 512) == {"mm_tc": 1, "mm_tile": 65,
                                                                          "mm_wgmma_tma": 129}
    # K-quants: the integer kernels, one row (dp4a), the int8-MMA batches, from 65 rows (2 x 64 blocks
    # of 64 x 64: half the SMs) the tiled one; on matmul.cu's f16 MMAs the tiled and wide kernels read
    # their planes (no wgmma)
    monkeypatch.setattr(plan, "KQ_INTEGER", True)
    assert family_rows(ops, FakeCudaWeight("q4_k", (4096, 4096)), 512) == {"mmq_one": 1, "mmq_tc": 2, "mmq_tile": 65}
    monkeypatch.setattr(plan, "KQ_INTEGER", False)
    assert family_rows(ops, FakeCudaWeight("q4_k", (4096, 4096)), 512) == {"mm_tc": 1, "mm_tile": 65,
                                                                           "mm_wgmma_kq": 512}
    monkeypatch.setattr(plan, "WGMMA_KQ", False)
    assert family_rows(ops, FakeCudaWeight("q4_k", (4096, 4096)), 512) == {"mm_tc": 1, "mm_tile": 65,
                                                                           "mm_wide": 512}
