"""The exactness self-check on the actual GPU (skipped without one): every matmul family the plan
picks for 1B- and 8B-shaped weights gives row 0 the bits it gets alone, within 2 s once the kernels
are compiled."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from kernels.cuda import available  # noqa: E402

_OK, _WHY = available()
if not _OK:
    pytest.skip(_WHY, allow_module_level=True)

from kernels.cuda.ops import CudaOps  # noqa: E402
from kernels.selfcheck import check_matmuls  # noqa: E402
from kernels.weights import Weight  # noqa: E402

pytestmark = pytest.mark.gpu
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
