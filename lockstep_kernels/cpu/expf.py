"""exp for float32 in plain float32 operations (Cephes' expf: Cody-Waite reduction by ln 2, a degree-6
polynomial by fused multiply-adds, the power of two built in the exponent's bits), within about
1.5 ulp. libm's expf is a call per element, which LLVM cannot vectorise without a vector library;
these operations it can, and with every one of them spelled out (llvm.fma, no fastmath on the
functions that use them) a vectorised loop gives each element the bits a scalar one does, in
whatever function the loop is compiled into.

numba caches a function keyed on its own file only: attend.py, compiled.py, fused.py, jobs.py and layer.py
hold cached copies of exp32, so a change here bumps matvec.EPOCH and attend.EPOCH with their followers.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_FLAGS = {"cache": True, "nogil": True, "error_model": "numpy", "boundscheck": False}  # no fastmath
_F32 = ir.FloatType()
LOW, HIGH = -87.33654, 88.3  # 2 ** -126 .. 2 ** 127.4: the result stays a normal float32


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma), whether or not LLVM vectorises the loop around it."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
        return builder.call(fn, args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def _pow2(typingctx, n):
    """2.0 ** n as float32 for an int32 n in -126..127 (the exponent's bits)."""
    def codegen(context, builder, sig, args):
        bits = builder.shl(builder.add(args[0], ir.Constant(ir.IntType(32), 127)), ir.Constant(ir.IntType(32), 23))
        return builder.bitcast(bits, _F32)
    return types.float32(types.int32), codegen


@njit(inline="always", **_FLAGS)
def exp32(x):
    """exp(x) for float32 x, x clamped to LOW..HIGH first (below LOW the result is 2 ** -126, not 0)."""
    x = min(max(x, np.float32(LOW)), np.float32(HIGH))
    fx = np.floor(fma(x, np.float32(1.44269504088896341), np.float32(0.5)))
    r = fma(fx, np.float32(-0.693359375), x)
    r = fma(fx, np.float32(2.12194440e-4), r)
    y = np.float32(1.9875691500e-4)
    y = fma(y, r, np.float32(1.3981999507e-3))
    y = fma(y, r, np.float32(8.3334519073e-3))
    y = fma(y, r, np.float32(4.1665795894e-2))
    y = fma(y, r, np.float32(1.6666665459e-1))
    y = fma(y, r, np.float32(5.0000001201e-1))
    y = fma(y, r * r, r) + np.float32(1.0)
    return y * _pow2(np.int32(fx))
