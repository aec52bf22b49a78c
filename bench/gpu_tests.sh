#!/usr/bin/env bash
# Every GPU test file in one device call, in five parallel pytest groups: kernel builds (NVRTC, CPU
# bound) dominate a fresh machine's time, and the device has 16 cores. Each group has its own time
# limit and writes its junit XML as JSON under $OUT as soon as it ends; logs stay in /tmp/gpu-tests-work
# (a call brings back 8 files), $OUT/summary.txt has each group's last line and a failing group's tail.
#   OUT=/tmp/x GROUP_S=360 bench/gpu_tests.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-tests}
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
groups=(
  "ops:tests/test_cuda_ops.py"
  "kquant:tests/test_cuda_kquant_integer.py"
  "attention:tests/test_cuda_attention.py tests/test_cuda_attention_wgmma.py tests/test_cuda_selfcheck.py"
  "models:tests/test_cuda_graphs.py tests/test_cuda_kquant_pack.py tests/test_cuda_kquant_model.py tests/test_cuda_matvec.py"
  "moe_hybrid:tests/test_cuda_moe.py tests/test_cuda_deltanet.py tests/test_cuda_hybrid_ahead.py"
)
for g in "${groups[@]}"; do
  name=${g%%:*}
  # shellcheck disable=SC2086
  ( timeout "${GROUP_S:-360}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE \
      --durations=5 --junitxml="$work/$name.xml" ${g#*:} > "$work/$name.txt" 2>&1
    [ -f "$work/$name.xml" ] && python3 bench/gpu_summary.py --tests "$work/$name.xml" "$OUT/gpu-tests-$name.json" ) &
done
wait
for g in "${groups[@]}"; do
  name=${g%%:*}
  printf '%-11s %s\n' "$name" "$(grep -E '(passed|failed|error|skipped)' "$work/$name.txt" | tail -1)"
  grep -qE '^(FAILED|ERROR) ' "$work/$name.txt" && { grep -E '^(FAILED|ERROR) ' "$work/$name.txt" | head -n 20
    grep -E '^E  ' "$work/$name.txt" | head -n 30; }
done | tee -a "$OUT/summary.txt"
