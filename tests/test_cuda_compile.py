"""Every CUDA source compiles for Hopper (sm_90; wgmma.cu sm_90a) with the options NVRTC gets at run time.

Runs wherever `nvcc` is on PATH (CI included); no GPU needed.
"""

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

from lockstep_kernels.cuda import plan
from lockstep_kernels.cuda.modules import ARCH, OPTIONS, sources

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
SOURCES = {p.name: p for p in sources()}


class Job(NamedTuple):
    """One nvcc run: a source and its -D defines."""
    source: str
    defines: tuple = ()


def _arch(path) -> str:
    a = ARCH.get(path.name)  # nvcc 13 takes -arch=sm_90a as compute_90; the gencode pair is explicit
    return f"-gencode=arch=compute_{a[3:]},code={a}" if a else "-arch=sm_90"


def _nvcc(job: Job, out: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """Device code only (-cubin), as NVRTC compiles it, its PTX kept in `out` (--keep)."""
    path = SOURCES[job.source]
    flags = [o for o in OPTIONS if o != "-std=c++17"]
    spills = ["-Xptxas", "--warn-on-spills"] if job.source in ("wgmma.cu", "wgmma_kq.cu") else []  # MMAs' registers
    cmd = [NVCC, _arch(path), "-std=c++17", *flags, *spills, *(f"-D{k}={v}" for k, v in job.defines), "--keep",
           f"--keep-dir={out}", "-cubin", str(path), "-o", str(out / "out.cubin")]
    return out, subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def compiled(request, tmp_path_factory):
    """The compiles of the tests selected in this file, started at once on every core (one at a
    time they took 167 s on two cores, matmul.cu alone 47 s); a test waits for its own."""
    jobs = {item.callspec.params["job"] for item in request.session.items
            if item.module is request.module and "job" in getattr(getattr(item, "callspec", None), "params", {})}
    pool = ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0)))
    futures = {job: pool.submit(_nvcc, job, tmp_path_factory.mktemp(Path(job.source).stem))
               for job in sorted(jobs, key=lambda j: j.source != "matmul.cu")}  # the longest first
    yield lambda job: futures[job].result()
    pool.shutdown(cancel_futures=True)


def assert_clean(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr.lower(), done.stderr


WHOLE = [Job(name) for name in SOURCES]


@pytest.mark.parametrize("job", WHOLE, ids=lambda j: j.source)
def test_source_compiles(job, compiled):
    assert_clean(compiled(job)[1])


# attention.cu is compiled per (head dim, query heads per block, KV type) and build
ATTENTION_VARIANTS = [(d, g, kv) for d in (32, 64, 128, 256) for g in (1, 2, 4, 8) for kv in (0, 1, 2)]
BUILDS = {"latency": plan.LATENCY_BUILD, "throughput": plan.THROUGHPUT_BUILD, "late_values": plan.LATE_VALUES_BUILD}
ATTENTION = [Job("attention.cu", (("HEAD_DIM", d), ("GROUP_MAX", g), ("KV_T", kv), ("OUT16", kv), *build))
             for d, g, kv in ATTENTION_VARIANTS[::5] + [ATTENTION_VARIANTS[-1]] for build in BUILDS.values()]


@pytest.mark.parametrize("job", ATTENTION, ids=lambda j: "-".join(str(v) for _, v in j.defines[:3]) + "-"
                         + next(n for n, b in BUILDS.items() if j.defines[4:] == b))
def test_attention_variants_compile(job, compiled):
    assert_clean(compiled(job)[1])


# attention_mma.cu's one-row decode builds whose dim warps split S's key tiles (SHARE_S), per (head dim,
# MMA rows per query row, dim warps, KV type)
MMA_SHARED_S = [Job("attention_mma.cu", (("HEAD_DIM", d), ("GP", gp), ("RB", 1), ("DW", dw), ("KV_T", kv), ("OUT16", kv),
                                         ("MIN_BLOCKS", 3), ("SHARE_S", 1)))
                for d, gp, dw, kv in ((128, 4, 4, 1), (64, 16, 4, 2), (32, 2, 2, 1))]


@pytest.mark.parametrize("job", MMA_SHARED_S, ids=lambda j: "-".join(str(v) for _, v in j.defines[:4]))
def test_mma_attention_shared_s_builds_compile(job, compiled):
    assert_clean(compiled(job)[1])


# matmul.cu's probe builds (bench/kquant_mm.py's PROBE_BUILDS, X16_BUILDS, RT2_BUILDS): a GPU call's probe
# must not be the first to find that one no longer compiles
MATMUL_PROBES = [Job("matmul.cu", (("KQ_ONE_PREFETCH", 1), ("KQ_REGS_ONE", 96), ("KQ6_REGS_ONE", 104))),
                 Job("matmul.cu", (("KQ_X16_PREFETCH", 1),)), Job("matmul.cu", (("KQ_U12_RT", 4),)),
                 Job("matmul.cu", (("KQ_PAIR_FMA", 1), ("KQ_LANE_SCALES", 1))),
                 Job("matmul.cu", (("KQ_PAIR_FMA", 0),))]


@pytest.mark.parametrize("job", MATMUL_PROBES, ids=lambda j: j.defines[0][0])
def test_matmul_probe_builds_compile(job, compiled):
    assert_clean(compiled(job)[1])


# deltanet.cu's delta-rule kernels are compiled per (key dim, value threads, value slice, chunk)
DELTANET = [Job("deltanet.cu", (("KD", 128), ("VT", 128), ("VS", 32), ("CH", plan.DELTA_CHUNK))),
            Job("deltanet.cu", (("KD", 16), ("VT", 128), ("VS", 16), ("CH", plan.DELTA_CHUNK)))]


@pytest.mark.parametrize("job", DELTANET, ids=lambda j: f"kd{j.defines[0][1]}")
def test_deltanet_variants_compile(job, compiled):
    assert_clean(compiled(job)[1])


@pytest.mark.parametrize("job", WHOLE, ids=lambda j: j.source)
def test_every_kernel_waits_for_its_predecessor(job, compiled):
    """Captured decode steps launch kernels early (programmatic dependent launch): each must wait
    for the kernel before it (griddepcontrol.wait, through pdl_start) or it could read stale data."""
    out, done = compiled(job)
    assert done.returncode == 0, done.stderr
    entries = (out / f"{Path(job.source).stem}.ptx").read_text().split(".entry ")[1:]
    assert entries
    for body in entries:
        name = body.split("(", 1)[0]
        assert "griddepcontrol.wait" in body, f"{name} never waits for the kernel before it"
        assert "griddepcontrol.launch_dependents" in body, f"{name} never lets the next kernel start"


# mm_wgmma_tma per (warpgroups, persistent, producer warpgroup, multicast, early weights): the probe's builds
WGMMA = [Job("wgmma.cu", (("WG_GROUPS", g), ("WG_PERSIST", p), ("WG_SETMAXNREG", int(g == 3 or p == 1)), ("WG_MC", mc),
                          ("WG_EARLY", e)))
         for g, p, mc, e in ((1, 0, 0, 0), (2, 0, 0, 0), (2, 1, 0, 0), (3, 0, 0, 0), (3, 1, 0, 0), (2, 0, 1, 0), (2, 1, 1, 0),
                             (3, 0, 1, 0), (2, 0, 0, 1), (2, 1, 0, 1), (2, 1, 1, 1))]


@pytest.mark.parametrize("job", WGMMA, ids=lambda j: "-".join(str(v) for _, v in j.defines))
def test_wgmma_kernel_keeps_its_mmas_in_flight(job, compiled):
    """ptxas serialises the warpgroup MMAs (C7513) or waits for all of them (C7517) where the code
    lets other instructions touch their registers; either cost mm_wgmma most of its speed. A spill
    (a build that raises its registers by setmaxnreg loses them to any trap) costs it too."""
    _, done = compiled(job)
    assert done.returncode == 0, done.stderr
    assert "C7513" not in done.stderr and "C7517" not in done.stderr, done.stderr
    assert "spill" not in done.stderr.lower(), done.stderr


# mm_wgmma_kq per (stages, pipelined token slices, Q4_K's slices, cp.async planes, joins in registers): the
# plan's build, the probe's and the GPU tests'
WGMMA_KQ = [Job("wgmma_kq.cu", (("KG_STAGES", s), ("KG_PIPE", p), ("KG_SLICES", q), ("KG_CPASYNC", a), ("KG_TOTAL_REGS", r)))
            for s, p, q, a, r in ((plan.WGMMA_KQ_STAGES, plan.WGMMA_KQ_PIPE, plan.WGMMA_KQ_SLICES, plan.WGMMA_KQ_CPASYNC,
                                   plan.WGMMA_KQ_TOTAL_REGS), (4, 1, 2, 1, 0), (4, 1, 4, 1, 0), (6, 1, 4, 1, 0),
                                  (6, 0, 2, 1, 0), (4, 1, 2, 0, 0), (6, 1, 4, 1, 1))]
WGMMA_KQ = list(dict.fromkeys(WGMMA_KQ))


@pytest.mark.parametrize("job", WGMMA_KQ, ids=lambda j: "-".join(str(v) for _, v in j.defines))
def test_wgmma_kq_kernel_keeps_its_mmas_in_flight(job, compiled):
    """As mm_wgmma_tma: no serialised MMAs (C75xx: ptxas serialises them wherever an accumulator of an MMA
    that may be in flight is read, e.g. across a loop's back edge) and no spills."""
    _, done = compiled(job)
    assert_clean(done)
    assert "C75" not in done.stderr, done.stderr


# attention_wgmma.cu per (head dim, MMA rows per query row, warpgroups, stages, KV type); its plan's builds
WGMMA_ATTENTION_VARIANTS = [(128, 4, 2, 3, 1), (128, 4, 1, 2, 2), (128, 8, 2, 3, 1), (64, 16, 2, 3, 2), (64, 2, 1, 2, 1)]


WGMMA_ATTENTION = [Job("attention_wgmma.cu", (("HEAD_DIM", d), ("GP", gp), ("WQ", wq), ("NS", ns), ("KV_T", kv),
                                               ("OUT16", kv))) for d, gp, wq, ns, kv in WGMMA_ATTENTION_VARIANTS]


@pytest.mark.parametrize("job", WGMMA_ATTENTION, ids=lambda j: "-".join(str(v) for _, v in j.defines[:5]))
def test_wgmma_attention_keeps_its_mmas_in_flight(job, compiled):
    """Every build compiles without ptxas serialising its warpgroup MMAs (C75xx: a wgmma in a divergent
    branch, or registers an MMA in flight uses touched by other instructions)."""
    _, done = compiled(job)
    assert_clean(done)
    assert "C75" not in done.stderr, done.stderr


# attention_ws.cu per (head dim, MMA rows per query row, stages, KV type): the plan's two-warpgroup builds
WS_ATTENTION = [Job("attention_ws.cu", (("HEAD_DIM", d), ("GP", gp), ("NS", plan.WGMMA_WS_STAGES), ("KV_T", kv),
                                         ("OUT16", kv))) for d, gp, kv in ((128, 4, 1), (128, 8, 2), (64, 16, 2))]
# and its lean builds (plan.WGMMA_WS_LEAN / _FTZ with the compares skipped), softmax overlap off and on
WS_ATTENTION += [Job("attention_ws.cu", (("HEAD_DIM", d), ("GP", gp), ("NS", plan.WGMMA_WS_STAGES), ("KV_T", kv),
                                          ("OUT16", kv), ("LN", 1), ("FZ", 1), ("VF", 1), ("MK", 1), ("OV", ov)))
                 for d, gp, kv, ov in ((128, 4, 1, 0), (128, 4, 1, 1), (128, 8, 2, 0), (64, 16, 2, 0))]
WS_ATTENTION += [Job("attention_ws.cu", (("HEAD_DIM", d), ("GP", gp), ("NS", plan.WGMMA_WS_STAGES), ("KV_T", kv),
                                          ("OUT16", kv), ("LN", 1), ("FZ", 1), ("VF", 1), ("MK", 1), ("OV", 0), ("TK", 1)))
                 for d, gp, kv in ((128, 4, 1), (64, 16, 2))]


@pytest.mark.parametrize("job", WS_ATTENTION, ids=lambda j: "-".join(str(v) for _, v in j.defines))
def test_ws_attention_keeps_its_mmas_in_flight(job, compiled):
    _, done = compiled(job)
    assert_clean(done)
    assert "C75" not in done.stderr, done.stderr


def test_the_wgmma_attention_plan_builds_only_compiled_variants():
    for t, heads, kv, d in ((512, 32, 8, 128), (4096, 32, 8, 128), (100, 32, 8, 128), (512, 28, 4, 128),
                            (512, 32, 2, 64), (512, 16, 8, 64)):
        wt = plan.wgmma_attention_launch(t, heads, kv, d, 64, 132)
        assert wt is not None
        assert any(v[:4] == (d, wt.gp, wt.groups, wt.stages) for v in WGMMA_ATTENTION_VARIANTS), (t, heads, kv, d)
        ws = plan.wgmma_attention_launch(t, heads, kv, d, 64, 132, ws=True)
        assert not ws.ws or any(j.defines[:3] == (("HEAD_DIM", d), ("GP", ws.gp), ("NS", ws.stages)) for j in WS_ATTENTION)
