"""The CPU backend's compiled kernels on an x86-64 CPU without AVX, AVX2, FMA or F16C: numba compiles
for that CPU (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES) in a child process with an empty kernel cache.
LLVM then lowers the vector fma and the half conversions to library calls; the 16-bit row kernel,
whose reduction order its IR fixes, gives the host's bits, and f16 stores round as NumPy does."""

import os
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.machine() == "x86_64"),
                                reason="an x86-64 Linux feature set")

BASELINE = {"NUMBA_CPU_NAME": "x86-64", "NUMBA_CPU_FEATURES": "+sse,+sse2,-avx,-avx2,-fma,-f16c,-avx512f"}

# Computes the products and conversions, and saves them to the .npz named by argv[1].
SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from numba import njit
    from lockstep_kernels.cpu import matvec
    from lockstep_kernels.cpu.rope_write import _to_f16

    @njit
    def to_f16(x, out):
        for i in range(x.shape[0]):
            out[i] = _to_f16(x[i])

    rng = np.random.default_rng(7)
    x, res = rng.standard_normal((5, 256)).astype(np.float32), rng.standard_normal((5, 40)).astype(np.float32)
    got = {}
    for kind, bits in ((1, rng.standard_normal((40, 256)).astype(np.float16).view(np.uint16)),
                       (2, (rng.standard_normal((40, 256)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))):
        bits.flags.writeable = False
        for residual in (False, True):
            out = np.empty((5, 40), np.float32)
            matvec.blocked_rows_16(x, bits, kind, out, 0, res, residual, 0, 40)
            got[f"dots{kind}{residual}"] = out
        got[f"w{kind}"] = bits
    got["x"], got["res"] = x, res
    v = np.concatenate([rng.standard_normal(1000).astype(np.float32) * 1e3,
                        np.float32([6e-8, 3e-5, 65504.0, 7e4, -0.0, np.inf, -np.inf, 1e-9])])
    h = np.empty(v.shape[0], np.uint16)
    to_f16(v, h)
    got["v"], got["h"] = v, h
    np.savez(sys.argv[1], **got)
""")


def test_kernels_run_and_keep_their_bits_without_avx_fma_or_f16c(tmp_path):
    from lockstep_kernels.cpu import matvec

    env = {**os.environ, **BASELINE, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "got.npz")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.load(tmp_path / "got.npz")
    x, res = got["x"], got["res"]
    for kind in (1, 2):
        for residual in (False, True):
            out = np.empty((5, 40), np.float32)
            matvec.blocked_rows_16(x, got[f"w{kind}"], kind, out, 0, res, residual, 0, 40)  # this CPU's build
            assert got[f"dots{kind}{residual}"].tobytes() == out.tobytes(), f"kind {kind}, residual {residual}"
    with np.errstate(over="ignore"):  # 7e4 rounds to inf, as it must
        want = got["v"].astype(np.float16).view(np.uint16)
    assert got["h"].tobytes() == want.tobytes()
