"""The exactness self-check on the actual GPU (skipped without one): every matmul family the plan
picks for 1B- and 8B-shaped weights, every kernel the fused q|k|v projection may take and every
attention build gives row 0 the bits it gets alone, within 2 s once the kernels are compiled."""

import numpy as np
import pytest

from tests.cuda_fixtures import cp

pytestmark = pytest.mark.gpu

from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402
from lockstep_kernels.selfcheck import check_matmuls  # noqa: E402
from lockstep_kernels.weights import Weight  # noqa: E402

SHAPES = {"1b": [(2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)],
          "8b": [(4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]}


@pytest.mark.parametrize("shape", ["1b", "8b"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_every_family_gives_row_zero_its_bits_alone(shape, dtype):
    ops = CudaOps(exact=True)
    rng = np.random.default_rng(0)
    weights = []
    for n, k in SHAPES[shape]:
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        weights.append((f"{n}x{k}", ops.upload(Weight.from_f32(w, dtype))))
    check_matmuls(ops, weights, 512)  # the first run also compiles the kernels (NVRTC, cached on disk)
    mismatch, info = check_matmuls(ops, weights, 512)
    assert mismatch is None, mismatch.describe()
    families = {f for per in info["families"].values() for f in per}
    assert "mm_tc" in families and families & {"mm_tile", "mm_wide", "mm_wgmma_tma"}, info
    assert info["seconds"] < 2.0, info


# (hidden, heads, KV heads, head dim) of Llama 3.2 1B and Llama 3.1 8B
ATTENTION = {"1b": (2048, 32, 8, 64), "8b": (4096, 32, 8, 128)}


def _rope(positions: int, half: int):
    from lockstep_kernels.base import RopeTable
    angles = np.arange(positions)[:, None] * 10000.0 ** (-np.arange(half) / half)
    return RopeTable(cp.asarray(np.cos(angles).astype(np.float32)), cp.asarray(np.sin(angles).astype(np.float32)), True)


@pytest.mark.parametrize("shape", ["1b", "8b"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_the_fused_qkv_projection_and_every_attention_build_give_row_zero_its_bits_alone(shape, dtype):
    from lockstep_kernels.selfcheck import AttentionShape, check_attention, check_qkv
    hidden, heads, kv, hd = ATTENTION[shape]
    ops = CudaOps(exact=True)
    rng = np.random.default_rng(1)
    parts = [Weight.from_f32((rng.standard_normal((h * hd, hidden)) * 0.02).astype(np.float32), dtype)
             for h in (heads, kv, kv)]
    w, bias = ops.upload_qkv(*parts, None, hd)
    norm = cp.asarray((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    s = AttentionShape(heads, kv, hd, 64, "f16")
    rope = _rope(4096, hd // 2)
    for _ in range(2):  # the first run also compiles the kernels (NVRTC, cached on disk)
        qkv, qkv_info = check_qkv(ops, "w_qkv", norm, 1e-5, w, bias, rope, s, 512)
        attn, attn_info = check_attention(ops, s, 512)
    assert qkv is None, qkv.describe()
    assert attn is None, attn.describe()
    families = set(qkv_info["families"]["w_qkv"])
    assert any(f.endswith("+rope") for f in families) and any(not f.endswith("+rope") for f in families), families
    builds = set(attn_info["families"]["attention"])
    assert len(builds) >= (2 if ops.sm_count >= 128 else 1), builds
    assert qkv_info["seconds"] + attn_info["seconds"] < 0.5, (qkv_info, attn_info)
