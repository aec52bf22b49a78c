"""The row kernel over 16-bit weights with its vector arithmetic written out in LLVM IR, so that the
order of every reduction is the code's, not the vectoriser's choice.

An output element x . w (K a multiple of BLOCK) is summed in LANES * SPLIT partial sums: element i
of K goes to partial sum i % BLOCK, each partial sum a chain of fused multiply-adds in ascending i;
then the SPLIT vectors are added pairwise ((0 + 1) + (2 + 3)) and the lanes halved in a fixed tree.
Up to GROUP token rows share one pass over a weight row (each weight vector widened once for all
of them), each row with its own partial sums: a row's arithmetic is the same instructions in the
same order whichever group it falls in, so its bits cannot depend on the number of rows.

The functions here are compiled without fastmath (numba would mark the reduction's additions
reassociable), and the fused multiply-adds are llvm.fma, which never rounds in between.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# compiled.py, fused.py, layer.py, workers.py and jobs.py hold numba-cached copies of this file's functions;
# numba checks only a function's own file, so a change here bumps EPOCH and their MATVEC_EPOCH (tests check them)
EPOCH = 6
LANES, SPLIT = 16, 4
BLOCK = LANES * SPLIT  # K must be a multiple of this (other shapes take compiled.rows_16)
GROUP = 4  # token rows per pass over a weight row
TILE = 16  # weight rows a pass of every row group covers before the next ones (prefill's many rows)
_FLAGS = {"cache": True, "nogil": True, "error_model": "numpy", "boundscheck": False}

_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, LANES)
_VI16 = ir.VectorType(ir.IntType(16), LANES)
_VI32 = ir.VectorType(ir.IntType(32), LANES)
_I64 = ir.IntType(64)


def _widen(builder, bits, kind):
    if kind == 1:  # f16: fpext (vcvtph2ps), exact
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), LANES)), _VF)
    wide = builder.shl(builder.zext(bits, _VI32), ir.Constant(_VI32, [16] * LANES))  # bf16: the high half
    return builder.bitcast(wide, _VF)


def _hsum(builder, vecs):
    """((v0 + v1) + (v2 + v3)), then lanes [0, n/2) + [n/2, n) until one is left."""
    return halve(builder, builder.fadd(builder.fadd(vecs[0], vecs[1]), builder.fadd(vecs[2], vecs[3])))


def halve(builder, s):
    """A vector's lanes [0, n/2) + [n/2, n) until one is left: the sum in a fixed tree."""
    n = LANES
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n))))
        hi = builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n, 2 * n))))
        s = builder.fadd(lo, hi)
    return builder.extract_element(s, ir.Constant(ir.IntType(32), 0))


def fma_loop(builder, n_acc: int, step: int, n, body):
    """IR of a counted loop of vector fused multiply-adds: i = 0, step, .. while below n (at least once),
    n_acc accumulators from zero; body(i, fma, accs) returns their next values. Returns their last ones."""
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v16f32")
    entry = builder.block
    loop = builder.append_basic_block("dots.loop")
    done = builder.append_basic_block("dots.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    i = builder.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), entry)
    accs = []
    for _ in range(n_acc):
        a = builder.phi(_VF)
        a.add_incoming(ir.Constant(_VF, [0.0] * LANES), entry)
        accs.append(a)
    new = body(i, fma, accs)
    nxt = builder.add(i, ir.Constant(_I64, step))
    i.add_incoming(nxt, loop)
    for a, b in zip(accs, new, strict=True):
        a.add_incoming(b, loop)
    builder.cbranch(builder.icmp_signed("<", nxt, n), loop, done)
    builder.position_at_end(done)
    return new


def _make_dots(rows: int, kind: int):
    """An intrinsic: out[r * out_stride] = x[r * k .. r * k + k] . w[0 .. k] for r < rows (addresses in
    bytes, k a positive multiple of BLOCK; x and out float32, w 16-bit of `kind`: 1 f16, 2 bf16)."""

    @intrinsic
    def dots(typingctx, x_addr, w_addr, k, out_addr, out_stride):
        sig = types.void(types.uintp, types.uintp, types.intp, types.uintp, types.intp)

        def codegen(context, builder, signature, args):
            xa, wa, k, oa, ostride = args
            xp = builder.inttoptr(xa, _F32.as_pointer())
            wp = builder.inttoptr(wa, ir.IntType(16).as_pointer())
            op = builder.inttoptr(oa, _F32.as_pointer())

            def body(i, fma, accs):
                new = list(accs)
                for u in range(SPLIT):
                    at = builder.add(i, ir.Constant(_I64, u * LANES))
                    wv = builder.load(builder.bitcast(builder.gep(wp, [at]), _VI16.as_pointer()), align=2)
                    wf = _widen(builder, wv, kind)
                    for r in range(rows):
                        xo = builder.add(builder.mul(k, ir.Constant(_I64, r)), at)
                        xv = builder.load(builder.bitcast(builder.gep(xp, [xo]), _VF.as_pointer()), align=4)
                        new[r * SPLIT + u] = builder.call(fma, [xv, wf, accs[r * SPLIT + u]])
                return new

            new = fma_loop(builder, rows * SPLIT, BLOCK, k, body)
            for r in range(rows):
                s = _hsum(builder, new[r * SPLIT : (r + 1) * SPLIT])
                builder.store(s, builder.gep(op, [builder.mul(ostride, ir.Constant(_I64, r))]))
            return context.get_dummy_value()

        return sig, codegen

    return dots


_F16_1, _F16_G, _BF16_1, _BF16_G = (_make_dots(r, kind) for kind in (1, 2) for r in (1, GROUP))


@njit(inline="always", **_FLAGS)
def _dots(g, kind, xa, wa, k, oa, n_out):
    if kind == 1:
        if g == GROUP:
            _F16_G(xa, wa, k, oa, n_out)
        else:
            _F16_1(xa, wa, k, oa, n_out)
    elif g == GROUP:
        _BF16_G(xa, wa, k, oa, n_out)
    else:
        _BF16_1(xa, wa, k, oa, n_out)


@njit(**_FLAGS)
def dots_at(xa, t, k, wa, kind, oa, n_out, ra, residual, j0, j1):
    """out[r, j] = x[r] . w[j] for r < t, j in j0..j1 (plus res[r, j] when `residual`), by address: x [t, k]
    and out, res [t, n_out] float32, w [N, k] 16-bit bits, all C-contiguous (the workers of workers.py
    take a job this way)."""
    for jb in range(j0, j1, TILE):  # a tile of weight rows stays in cache while every row group passes it
        je = min(j1, jb + TILE)
        r = 0
        while r < t:
            g = GROUP if r + GROUP <= t else 1
            xr, orow = xa + r * k * 4, oa + r * n_out * 4
            for j in range(jb, je):
                _dots(g, kind, xr, wa + j * k * 2, k, orow + j * 4, n_out)
            r += g
        if residual:
            for r in range(t):
                for j in range(jb, je):
                    _add_to(oa + (r * n_out + j) * 4, ra + (r * n_out + j) * 4)


@intrinsic
def _add_to(typingctx, out_addr, res_addr):
    """*out = *res + *out (float32 at the two addresses), one rounding."""
    def codegen(context, builder, signature, args):
        o = builder.inttoptr(args[0], _F32.as_pointer())
        r = builder.inttoptr(args[1], _F32.as_pointer())
        builder.store(builder.fadd(builder.load(r), builder.load(o)), o)
        return context.get_dummy_value()
    return types.void(types.uintp, types.uintp), codegen


@njit(**_FLAGS)
def blocked_rows_16(x, w, kind, out, n0, res, residual, j0, j1):
    """out[r, n0 + j] = x[r] . w[j] for j in j0..j1 (plus res[r, n0 + j] when `residual`); x [T, K]
    float32, w [N, K] 16-bit bits, out and res [T, >= n0 + j1] float32, all C-contiguous."""
    t, k = x.shape
    dots_at(x.ctypes.data, t, k, w.ctypes.data, kind, out.ctypes.data + n0 * 4, out.shape[1],
            res.ctypes.data + n0 * 4, residual, j0, j1)


def warm_up() -> None:
    x = np.ones((GROUP + 1, BLOCK), np.float32)
    w = np.ones((2, BLOCK), np.uint16)
    w.flags.writeable = False  # as CpuOps hands 16-bit weights over (ops._bits16)
    out = np.empty((GROUP + 1, 2), np.float32)
    for kind in (1, 2):
        blocked_rows_16(x, w, kind, out, 0, out, True, 0, 2)
