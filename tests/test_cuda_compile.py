"""Every CUDA source compiles for Hopper (sm_90; wgmma.cu sm_90a) with the options NVRTC gets at run time.

Runs wherever `nvcc` is on PATH (CI included); no GPU needed.
"""

import shutil
import subprocess

import pytest

from kernels.cuda import plan
from kernels.cuda.modules import ARCH, OPTIONS, sources

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")

# attention.cu is compiled per (head dim, query heads per block, KV type)
ATTENTION_VARIANTS = [(d, g, kv) for d in (32, 64, 128, 256) for g in (1, 2, 4, 8) for kv in (0, 1, 2)]


def _arch(path) -> str:
    a = ARCH.get(path.name)  # nvcc 13 takes -arch=sm_90a as compute_90; the gencode pair is explicit
    return f"-gencode=arch=compute_{a[3:]},code={a}" if a else "-arch=sm_90"


def _compile(path, tmp_path, defines=()):
    flags = [o for o in OPTIONS if o != "-std=c++17"]
    cmd = [NVCC, _arch(path), "-std=c++17", *flags, *(f"-D{k}={v}" for k, v in defines),
           "-c", str(path), "-o", str(tmp_path / "out.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr.lower(), done.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each source compiled once with its PTX kept (--keep): matmul.cu alone takes about a minute, and
    the PTX checks read the PTX of the same compile."""
    done: dict = {}

    def build(path):
        if path not in done:
            out = tmp_path_factory.mktemp(path.stem)
            flags = [o for o in OPTIONS if o != "-std=c++17"]
            done[path] = out, subprocess.run([NVCC, _arch(path), "-std=c++17", *flags, "--keep", f"--keep-dir={out}",
                                              "-c", str(path), "-o", str(out / "out.o")],
                                             capture_output=True, text=True, timeout=300)
        return done[path]

    return build


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.name)
def test_source_compiles(path, built):
    _, done = built(path)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr.lower(), done.stderr


@pytest.mark.parametrize("build", [plan.LATENCY_BUILD, plan.THROUGHPUT_BUILD, plan.LATE_VALUES_BUILD],
                         ids=["latency", "throughput", "late_values"])
@pytest.mark.parametrize("variant", ATTENTION_VARIANTS[::5] + [ATTENTION_VARIANTS[-1]], ids=str)
def test_attention_variants_compile(variant, build, tmp_path):
    d, g, kv = variant
    path = next(p for p in sources() if p.name == "attention.cu")
    _compile(path, tmp_path, (("HEAD_DIM", d), ("GROUP_MAX", g), ("KV_T", kv), ("OUT16", kv), *build))


# deltanet.cu's delta-rule kernels are compiled per (key dim, value threads, value slice, chunk)
DELTANET_VARIANTS = [(("KD", 128), ("VT", 128), ("VS", 32), ("CH", plan.DELTA_CHUNK)),
                     (("KD", 16), ("VT", 128), ("VS", 16), ("CH", plan.DELTA_CHUNK))]


@pytest.mark.parametrize("defines", DELTANET_VARIANTS, ids=lambda d: f"kd{d[0][1]}")
def test_deltanet_variants_compile(defines, tmp_path):
    path = next(p for p in sources() if p.name == "deltanet.cu")
    _compile(path, tmp_path, defines)


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.name)
def test_every_kernel_waits_for_its_predecessor(path, built):
    """Captured decode steps launch kernels early (programmatic dependent launch): each must wait
    for the kernel before it (griddepcontrol.wait, through pdl_start) or it could read stale data."""
    out, done = built(path)
    assert done.returncode == 0, done.stderr
    entries = (out / f"{path.stem}.ptx").read_text().split(".entry ")[1:]
    assert entries
    for body in entries:
        name = body.split("(", 1)[0]
        assert "griddepcontrol.wait" in body, f"{name} never waits for the kernel before it"
        assert "griddepcontrol.launch_dependents" in body, f"{name} never lets the next kernel start"


@pytest.mark.parametrize("groups", [1, 2])
def test_wgmma_kernel_keeps_its_mmas_in_flight(groups, tmp_path):
    """ptxas serialises the warpgroup MMAs (C7513) or waits for all of them (C7517) where the code
    lets other instructions touch their registers; either cost mm_wgmma most of its speed."""
    path = next(p for p in sources() if p.name == "wgmma.cu")
    flags = [o for o in OPTIONS if o != "-std=c++17"]
    done = subprocess.run([NVCC, _arch(path), "-std=c++17", *flags, f"-DWG_GROUPS={groups}", "-cubin", str(path),
                           "-o", str(tmp_path / "k")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "C7513" not in done.stderr and "C7517" not in done.stderr, done.stderr
