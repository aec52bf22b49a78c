#!/usr/bin/env bash
# Everything the CUDA backend needs checked on a GPU machine, in one go: the GPU tests, the CPU-side
# CUDA tests, the op micro-benchmarks; results under $OUT, a short summary table last.
# Installs nothing: needs python3 with CuPy, NumPy and pytest (the device image has them).
#   bench/gpu_check.sh [--tests-only|--gpu-tests|--bench-only]
#   (--gpu-tests: only the GPU-marked tests, ~1 minute; the CPU-side CUDA tests also run in CI)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mode=${1:-all}
start=$(date +%s)

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv 2>&1 | tee "$OUT/device.txt"
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)" | tee -a "$OUT/device.txt"

if [ "$mode" != "--bench-only" ]; then
  # --noconftest: the GPU tests build their own fixtures; the suite's conftest may import packages
  # (pydantic, textual, ...) that the device image lacks.
  python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE --durations=8 \
    --junitxml="$OUT/pytest-gpu.xml" \
    tests/test_cuda_ops.py tests/test_cuda_attention.py tests/test_cuda_graphs.py 2>&1 | tee "$OUT/pytest-gpu.txt"
  python3 bench/gpu_summary.py --tests "$OUT/pytest-gpu.xml" "$OUT/gpu-tests.json"
  if [ "$mode" != "--gpu-tests" ]; then
    python3 -m pytest --noconftest -p no:cacheprovider -q tests/test_cuda_compile.py tests/test_cuda_plan.py \
      2>&1 | tee "$OUT/pytest-cpu-side.txt"
  fi
fi
if [ "$mode" != "--tests-only" ] && [ "$mode" != "--gpu-tests" ]; then
  python3 bench/gpu_ops.py --out "$OUT/gpu-ops.json" 2>&1 | tee "$OUT/bench.txt"
fi

echo
echo "== summary ($(( $(date +%s) - start )) s)"
for f in pytest-gpu.txt pytest-cpu-side.txt; do
  [ -f "$OUT/$f" ] && printf '%-22s %s\n' "$f" "$(grep -E '(passed|failed|error|skipped)' "$OUT/$f" | tail -1)"
done
[ -f "$OUT/gpu-ops.json" ] && python3 bench/gpu_summary.py "$OUT/gpu-ops.json"
exit 0
