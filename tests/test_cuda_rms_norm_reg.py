"""rows.cu's rms_norm_reg (a row's values kept in registers between the sum and the output) against
rms_norm's loop kernel: the same bits at every length it takes, odd lengths and one past a warp
among them, and CudaOps.rms_norm picking it up to plan.RMS_NORM_REGS values."""

import numpy as np
import pytest

from tests.cuda_fixtures import cp, gpu  # noqa: F401 (gpu: fixture)

pytestmark = pytest.mark.gpu

from kernels.cuda import plan  # noqa: E402
from kernels.cuda.launch import launch  # noqa: E402
from kernels.cuda.modules import kernel  # noqa: E402


def _norm(name, x, w):
    y = cp.empty_like(x)
    launch(kernel("rows.cu", name), (x.shape[0],), (256,), (x, w, y, np.int32(x.shape[1]), np.float32(1e-6)))
    return cp.asnumpy(y)


@pytest.mark.parametrize("d", [1, 33, 255, 256, 1000, 2560, 4095, plan.RMS_NORM_REGS])
def test_rms_norm_reg_gives_rms_norm_bits(gpu, d):
    rng = np.random.default_rng(d)
    x = cp.asarray((rng.standard_normal((5, d)) * rng.uniform(0.01, 30, (5, 1))).astype(np.float32))
    w = cp.asarray((1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    ref = _norm("rms_norm", x, w)
    assert _norm("rms_norm_reg", x, w).tobytes() == ref.tobytes()
    assert cp.asnumpy(gpu.rms_norm(x, w, 1e-6)).tobytes() == ref.tobytes()
