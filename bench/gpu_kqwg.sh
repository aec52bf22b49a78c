#!/usr/bin/env bash
# mm_wgmma_kq (Q4_K / Q6_K prefill on wgmma, lockstep_kernels/cuda/wgmma_kq.cu) on a GPU machine in one call (KQ_DEADLINE
# s, 420), JSON under $OUT as each stage ends (8 files at most), summary last. Stages, each under its own limit
# (KQ_T_<stage> s) and the deadline:
#   build   (not by default) the probe's and the GPU tests' modules compiled side by side into CuPy's cache [70]
#   smoke   one 512-row matmul a type against mm_tc under a short timeout; where it fails (or hangs) the rest
#           runs the bulk-copy build (plan.WGMMA_KQ_CPASYNC = 0, set in this machine's copy of plan.py)   [100]
#   tests   tests/test_cuda_kq_wgmma.py (bits against mm_tc and mm_wide, row invariance); TEST_OPS=1 adds the
#           K-quant matmul tests of tests/test_cuda_ops.py with the kernel on                            [120]
#   probe   bench/probes/kq_wgmma_ab.py: the 8B matmuls at 512 and 2048 rows, mm_wide against the builds  [60]
# The engine cells with the kernel on and off: bench/gpu_kq_engine.sh.   OUT=/tmp/x bench/gpu_kqwg.sh [STAGES]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-kqwg}
source bench/gpu_env.sh
deadline=$((start + ${KQ_DEADLINE:-420}))
lim() { local v="KQ_T_$1" left=$((deadline - $(date +%s) - 3)); local want=${!v:-$2}; echo $((want < left ? want : left)); }
stages=${1:-smoke,tests,probe}
has() { [[ ",$stages," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
if has build; then
  stage "build"
  timeout "$(lim build 70)" python3 bench/probes/kq_wgmma_ab.py --compile --builds "${PROBE_BUILDS:-kq_bulk,kq,kq_s4,kq_reg}" --out /dev/null \
    > "$work/build.log" 2>&1
  echo "build rc $?"; tail -n 2 "$work/build.log"
fi
if has smoke; then
  stage "smoke"
  timeout "$(lim smoke 100)" python3 - > "$work/smoke.log" 2>&1 <<'EOF'
import sys
import cupy as cp
sys.path.insert(0, ".")
from lockstep_kernels.cuda import plan
from lockstep_kernels.cuda.ops import CudaOps
from tests.test_cuda_kq_wgmma import kq_weight
plan.WGMMA_KQ = True
kq, tc = CudaOps(exact=True), CudaOps(exact=True)
tc.tiled = False
ok = True
for dtype in ("q4_k", "q6_k"):
    w, x = kq_weight(4096, 4096, dtype), cp.random.standard_normal((512, 4096), dtype=cp.float32)
    same = kq.matmul_family(512, w) == "mm_wgmma_kq" and cp.asnumpy(kq.matmul(x, w)).tobytes() == cp.asnumpy(tc.matmul(x, w)).tobytes()
    print(dtype, "cp.async build", plan.WGMMA_KQ_CPASYNC, "same bits as mm_tc:", same, flush=True)
    ok &= same
sys.exit(0 if ok else 1)
EOF
  rc=$?
  cat "$work/smoke.log" | tail -n 4
  if [ $rc -ne 0 ]; then
    echo "smoke rc $rc: the bulk-copy build from here on" | tee -a "$OUT/summary.txt"
    sed -i 's/^WGMMA_KQ_CPASYNC = 1/WGMMA_KQ_CPASYNC = 0/' lockstep_kernels/cuda/plan.py
  fi
fi
if has tests; then
  stage "tests"
  files="tests/test_cuda_kq_wgmma.py"; sel="test_cuda_kq_wgmma"
  [ "${TEST_OPS:-0}" = 1 ] && files="$files tests/test_cuda_ops.py" && \
    sel="$sel or ((q4_k or q6_k) and (shared_memory_kernels or norm_matmul or gated or ffn or residual))"
  # LOCKSTEP_WGMMA_KQ=1: test_cuda_ops.py's wide-batch tests then compare it too (TEST_OPS=1)
  LOCKSTEP_WGMMA_KQ=1 timeout "$(lim tests 120)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE \
    --junitxml="$work/kq-tests.xml" $files -k "$sel" > "$work/kq-tests.txt" 2>&1
  rc=$?
  echo "tests rc $rc"; grep -E '^(FAILED|ERROR) |^E  ' "$work/kq-tests.txt" | cut -c1-300 | head -n 12; tail -n 1 "$work/kq-tests.txt"
  [ -f "$work/kq-tests.xml" ] && python3 bench/gpu_summary.py --tests "$work/kq-tests.xml" "$OUT/kq-tests.json"
fi
if has probe; then
  stage "probe"
  timeout "$(lim probe 60)" python3 bench/probes/kq_wgmma_ab.py --rows 512,2048 --builds "${PROBE_BUILDS:-kq_bulk,kq,kq_s4,kq_reg}" \
    --out "$OUT/kq-wgmma-ab-h200.json" > "$work/probe.log" 2>&1
  echo "probe rc $?"; tail -n 1 "$work/probe.log" | cut -c1-900
fi
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "done"
{ echo "== summary"; [ -f "$work/kq-tests.txt" ] && echo "tests: $(tail -n 1 "$work/kq-tests.txt")"
  tail -n 1 "$work/probe.log" 2>/dev/null | cut -c1-900
} | tee -a "$OUT/summary.txt"
