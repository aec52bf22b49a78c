"""mm_wgmma_kq (wgmma_kq.cu, Q4_K and Q6_K prefill on Hopper's warpgroup MMA) against the streaming kernel decode
uses (mm_tc) and the wide kernel it replaces (mm_wide), bit for bit: ragged rows, weights that are not
whole 128-row tiles, K in many split_k slices (slice bounds inside a two-chunk stage too), the epilogues,
the normalised input; and a row's bits alone (decode) against the same row inside a 512-row prefill.
sm_90 only (sm_90a code); elsewhere the module skips."""

import dataclasses

import numpy as np
import pytest

from tests.cuda_fixtures import cp  # noqa: F401 (before any lockstep_kernels.cuda module)

pytestmark = pytest.mark.gpu

from lockstep_kernels.cuda import kquant, plan  # noqa: E402
from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402
from lockstep_kernels.cuda.weights import CudaWeight  # noqa: E402
from lockstep_kernels.quants import BLOCK_TYPES  # noqa: E402

RNG = np.random.default_rng()
ROWS = (130, 512, 600, 17, 1)  # from 128 rows (wide_launch's), then ragged ones below it
# (N, K): N past whole 128-row tiles; split_k's S slices of 2, 4, 5.5 (bounds inside a stage), 8 and 28 chunks
SHAPES = [(200, 512), (1000, 2048), (300, 2816), (4096, 4096), (512, 14336)]


@pytest.fixture(scope="module")
def dev():
    ops = CudaOps(exact=True)
    if not ops.wgmma:
        pytest.skip("mm_wgmma_kq is sm_90a code")
    return ops


@pytest.fixture
def kq_on(monkeypatch):
    """mm_wgmma_kq wherever it may run: every row count from 1, tiles that do not fill the device."""
    monkeypatch.setattr(plan, "WGMMA_KQ", True)
    monkeypatch.setattr(plan, "WIDE_MIN_ROWS", 1)
    monkeypatch.setattr(plan, "TILE_MIN_BLOCKS_PER_SM", 0)
    return monkeypatch


def kq_weight(n: int, k: int, dtype: str = "q4_k", gate_up: str | None = None) -> CudaWeight:
    """Random blocks with small finite f16 scales (Q4_K d, dmin; Q6_K d: near 2^-7), planes as the engine
    uploads them."""
    size = BLOCK_TYPES[dtype].type_size
    raw = cp.asarray(RNG.integers(0, 256, (n, k // 256, size), dtype=np.uint8))
    if dtype == "q6_k":
        raw[..., size - 1] = 0x20
    else:
        raw[..., 1:4:2] = 0x20
    nib, aux = kquant.pack(raw.reshape(n, -1), dtype, cp)
    return CudaWeight(dtype, (n, k), nib, aux, gate_up=gate_up)


def _ops(tiled) -> CudaOps:
    ops = CudaOps(exact=True)
    ops.tiled = tiled
    return ops


def _x(m: int, k: int):
    return cp.asarray(RNG.standard_normal((m, k)).astype(np.float32))


def _same(got, want, what: str) -> None:
    got, want = cp.asnumpy(got), cp.asnumpy(want)
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes(), f"{what}: {np.count_nonzero(got != want)} of {got.size} differ"


@pytest.mark.parametrize("dtype", ["q4_k", "q6_k"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_wgmma_kq_gives_mm_tc_and_mm_wide_bits(dev, kq_on, shape, dtype):
    n, k = shape
    w = kq_weight(n, k, dtype)
    bias, kq, wide, streaming = cp.asarray(RNG.standard_normal(n).astype(np.float32)), _ops(True), _ops("wide"), _ops(False)
    for m in ROWS:
        assert kq.matmul_family(m, w) == "mm_wgmma_kq", (m, kq.matmul_family(m, w))
        x, r = _x(m, k), _x(m, n)
        got = kq.matmul(x, w, bias, residual=r)
        _same(got, streaming.matmul(x, w, bias, residual=r), f"mm_tc m={m}")
        _same(got, wide.matmul(x, w, bias, residual=r), f"mm_wide m={m}")
        _same(kq.matmul(x, w), streaming.matmul(x, w), f"plain m={m}")


@pytest.mark.parametrize("stages, pipe, slices, cpasync, regs", [(4, 1, 2, 1, 0), (4, 1, 4, 1, 0), (6, 1, 4, 1, 0),
                                                                 (6, 0, 2, 1, 0), (4, 1, 2, 0, 0), (6, 1, 4, 1, 1)])
def test_wgmma_kq_builds_give_the_same_bits(dev, kq_on, stages, pipe, slices, cpasync, regs):
    n, k = 1000, 2816
    kq_on.setattr(plan, "WGMMA_KQ_CPASYNC", cpasync)
    kq_on.setattr(plan, "WGMMA_KQ_TOTAL_REGS", regs)
    kq_on.setattr(plan, "WGMMA_KQ_STAGES", stages)
    kq_on.setattr(plan, "WGMMA_KQ_PIPE", pipe)
    kq_on.setattr(plan, "WGMMA_KQ_SLICES", slices)
    kq, streaming = _ops(True), _ops(False)
    for dtype in ("q4_k", "q6_k"):
        w = kq_weight(n, k, dtype)
        for m in (130, 600):
            x = _x(m, k)
            build = dict(plan.wgmma_kq_launch(dtype, m, n, k, dev.sm_count).defines)
            assert build == {"KG_STAGES": stages, "KG_PIPE": pipe, "KG_SLICES": slices, "KG_CPASYNC": cpasync,
                             "KG_TOTAL_REGS": regs}
            _same(kq.matmul(x, w), streaming.matmul(x, w), f"{dtype} {build} m={m}")


@pytest.mark.parametrize("dtype", ["q4_k", "q6_k"])
def test_wgmma_kq_gated_product_and_normalised_input(dev, kq_on, dtype):
    """gate|up tiles (EPI_SILU) and norm_matmul (rms_norm_16's rows in the wgmma k order)."""
    f, k = 640, 2048
    w = kq_weight(2 * f, k, dtype, gate_up="tiles")
    kq, streaming = _ops(True), _ops(False)
    nw = cp.asarray((1 + 0.1 * RNG.standard_normal(k)).astype(np.float32))
    for m in (17, 512):
        x = _x(m, k)
        assert kq.norm_matmul_family(m, w) == "mm_wgmma_kq+norm16"
        _same(kq.matmul(x, w), streaming.matmul(x, w), f"gated m={m}")
        _same(kq.norm_matmul(x, nw, 1e-5, w), streaming.norm_matmul(x, nw, 1e-5, w), f"norm gated m={m}")
        plain = dataclasses.replace(w, gate_up=None)
        _same(kq.norm_matmul(x, nw, 1e-5, plain), streaming.norm_matmul(x, nw, 1e-5, plain), f"norm m={m}")


@pytest.mark.parametrize("dtype", ["q4_k", "q6_k"])
@pytest.mark.parametrize("shape", [(4096, 4096), (512, 14336)], ids=str)
def test_a_row_decoded_alone_has_its_512_row_prefill_bits(dev, monkeypatch, shape, dtype):
    """The plan's own choice (no forcing below 128 rows): the row alone runs on mm_tc, the prefill on
    mm_wgmma_kq."""
    monkeypatch.setattr(plan, "WGMMA_KQ", True)
    monkeypatch.setattr(plan, "TILE_MIN_BLOCKS_PER_SM", 0)
    n, k = shape
    w = kq_weight(n, k, dtype)
    ops = _ops(True)
    assert ops.matmul_family(512, w) == "mm_wgmma_kq" and ops.matmul_family(1, w) != "mm_wgmma_kq"
    x = _x(512, k)
    inside = cp.asnumpy(ops.matmul(x, w))
    for i in (0, 129, 511):
        alone = cp.asnumpy(ops.matmul(x[i : i + 1].copy(), w))[0]
        assert alone.tobytes() == inside[i].tobytes(), f"row {i}: {np.count_nonzero(alone != inside[i])} differ"
