"""cuBLAS for exact mode off only: it picks kernels by batch width, so one row's bits depend on M."""

from __future__ import annotations

import numpy as np

# Stable enum values of the CUDA and cuBLAS headers.
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1

_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)


def gemm_16bit(w, x16, out, n: int, m: int, kp: int, dtype: str) -> None:
    """out[m, n] (float32) = x16[m, kp] @ w[:n, :kp]^T, 16-bit inputs, float32 accumulation.

    Row-major C = X W^T is column-major C^T = W X^T: W as a column-major kp x n matrix transposed,
    X as a column-major kp x m matrix.
    """
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas

    kind = CUDA_R_16BF if dtype == "bf16" else CUDA_R_16F
    cublas.gemmEx(
        device.get_cublas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, kp,
        _ONE.ctypes.data, w.data.ptr, kind, kp, x16.data.ptr, kind, kp,
        _ZERO.ctypes.data, out.data.ptr, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
    )
