#!/usr/bin/env bash
# K-quant kernels on a GPU machine in one call: their GPU tests, the matmul micro-benchmark (decode
# widths and a 512-row prefill; matmul.cu's f16 MMAs against kquant_mm.cu's integer kernels) and
# bench/throughput.py on the 8B and 1B Q4_K_M shapes (exact on and off, solo and 16 chats). Stages in that order, each under its own limit; JSON under $OUT after each.
#   bench/gpu_kquant.sh [STAGES] (default "tests,mm,8b,1b"; limits: T_TESTS T_MM T_8B T_1B seconds;
#   TEST_FILES, CELLS, MODES, MM_ROWS)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-kquant}
source bench/gpu_env.sh
stages=${1:-tests,mm,8b,1b}
has() { [[ ",$stages," == *",$1,"* ]]; }

if has tests; then
  timeout "${T_TESTS:-240}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE \
    --junitxml="$work/kq-tests.xml" -k "q4_k or q5_k or q6_k or q4km or mixed" \
    ${TEST_FILES:-tests/test_cuda_kquant_integer.py tests/test_cuda_ops.py tests/test_cuda_kquant_model.py} \
    2>&1 | tail -n 25 | tee "$OUT/kq-tests.txt"
  python3 bench/gpu_summary.py --tests "$work/kq-tests.xml" "$OUT/kq-tests.json" 2>/dev/null
fi
if has mm; then
  timeout "${T_MM:-150}" python3 bench/kquant_mm.py --rows ${MM_ROWS:-1,16,512} --out "$OUT/kquant-mm.json" 2>&1 | tail -n 70
fi
for shape in 8b 1b; do
  has $shape || continue
  limit=T_${shape^^}
  timeout "${!limit:-300}" python3 bench/throughput.py --shape $shape --quant q4_k_m --cells ${CELLS:-1,16} --repeats 1 --modes ${MODES:-on,off} \
    --out "$work/throughput-$shape-q4_k_m" > "$work/throughput-$shape.log" 2>&1
  grep -E "^rep|wrote|ready|Error|error" "$work/throughput-$shape.log" | tail -n 8
  cp "$work/throughput-$shape-q4_k_m".{json,md} "$OUT"/ 2>/dev/null || tail -n 30 "$work/throughput-$shape.log"
done
echo "== done in $(( $(date +%s) - start )) s"
[ -f "$OUT/kq-tests.txt" ] && grep -E "passed|failed|error" "$OUT/kq-tests.txt" | tail -n 1
for f in "$OUT"/throughput-*.md; do [ -f "$f" ] && sed -n '5,9p' "$f"; done
