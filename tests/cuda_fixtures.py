"""What every GPU test module starts with: CuPy and a usable CUDA device, or the whole module skips
cleanly (also under `pytest -m gpu --noconftest`, where conftest.py is not read); and the exact and
exact-off CudaOps, one of each per test module. A module imports this before any lockstep_kernels.cuda module:

    from tests.cuda_fixtures import cp, gpu, gpu_off  # noqa: F401 (gpu, gpu_off: fixtures)
"""

import pytest

cp = pytest.importorskip("cupy")

from lockstep_kernels.cuda import available  # noqa: E402

_OK, _WHY = available()
if not _OK:
    pytest.skip(_WHY, allow_module_level=True)

from lockstep_kernels.cuda.ops import CudaOps  # noqa: E402


@pytest.fixture(scope="module")
def gpu():
    return CudaOps(exact=True)


@pytest.fixture(scope="module")
def gpu_off():
    return CudaOps(exact=False)
