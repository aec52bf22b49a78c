#!/usr/bin/env bash
# One H200 call for the integer K-quant kernels (kquant_mm.cu; run for the KQ_MAGIC conversion-free form,
# bench/evidence/kquant-magic-h200.txt): the 8B and 1B Q4_K_M shapes written and the other kernel sources compiled in the
# background while the integer K-quant GPU tests run (bits of every kernel = kquant_ref.py's); the
# matmul micro-bench of the integer kernels at 512 and 16 rows; bench/throughput.py with
# plan.KQ_INTEGER on (this copy's plan.py edited, then restored), exact on, on the 8B shape (solo, 16
# chats, the 512-token prompt), then the 1B shape in the time left of T_ALL. JSON under $OUT as each ends.
#   OUT=... bench/probes/kquant_magic_run.sh   (limits: T_TESTS T_MM T_ALL seconds)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kquant-magic}
source bench/gpu_env.sh
for s in 8b 1b; do
  (timeout 150 python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; from shapes import write_shape
write_shape(Path('/tmp/$s-q4_k_m.gguf'), '$s', 0, 'q4_k_m')" > "$work/write-$s.log" 2>&1
   echo "$s shape written at $(( $(date +%s) - start )) s" >> "$work/write-$s.log") &
done
for f in matmul.cu wgmma.cu attention_wgmma.cu pointwise.cu rows.cu kv_cache.cu attention.cu attention_mma.cu; do
  echo "$f"
done | xargs -P 4 -I{} timeout 150 python3 -c "import sys; from kernels.cuda.modules import module; module(sys.argv[1]).compile()" {} \
  > "$work/compile.log" 2>&1 &
stage tests
timeout "${T_TESTS:-88}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE \
  --junitxml="$work/kq-tests.xml" tests/test_cuda_kquant_integer.py 2>&1 | tail -n 25 | tee "$OUT/kq-tests.txt"
python3 bench/gpu_summary.py --tests "$work/kq-tests.xml" "$OUT/kq-tests.json" 2>/dev/null
stage mm
timeout "${T_MM:-28}" python3 bench/kquant_mm.py --rows 512,16 --shapes qo,gate_up,down --types q4_k:int,q6_k:int \
  --out "$OUT/kquant-mm-512-16.json" 2>&1 | grep -v "^kq_quant_x" | tail -n 40
sed -i -e 's/^KQ_INTEGER = False/KQ_INTEGER = True/' kernels/cuda/plan.py
for s in 8b 1b; do
  stage "$s"
  wait; cat "$work/write-$s.log"
  limit=$(( ${T_ALL:-186} - ($(date +%s) - start) ))
  [ "$limit" -gt 40 ] || { echo "no time left for $s"; break; }
  timeout "$limit" python3 bench/throughput.py -m "/tmp/$s-q4_k_m.gguf" --vocab 128256 --shape "$s" --quant q4_k_m \
    --cells 1,16 --repeats 1 --modes on --out "$work/throughput-$s-q4_k_m" > "$work/$s.log" 2>&1
  grep -E "^rep|ready|rror" "$work/$s.log" | tail -n 8 | tee "$OUT/throughput-$s.log"
  cp "$work/throughput-$s-q4_k_m".{json,md} "$OUT"/ 2>/dev/null || tail -n 20 "$work/$s.log"
done
sed -i -e 's/^KQ_INTEGER = True/KQ_INTEGER = False/' kernels/cuda/plan.py
stage done
[ -f "$OUT/kq-tests.txt" ] && grep -E "passed|failed|error" "$OUT/kq-tests.txt" | tail -n 1
