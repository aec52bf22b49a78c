#!/usr/bin/env bash
# One H200 call for the 16-row integer K-quant kernel (mmq_*_tr): the 8B Q4_K_M shape written and the
# kernel sources compiled into CuPy's cache in the background while the integer K-quant GPU tests run;
# bench/throughput.py on the written file with plan.KQ_INTEGER on and plan.KQ_TR = None (mmq_*_tr at
# 2-16 rows; this copy's plan.py edited, then restored), exact on: solo, 16 chats, the 512-token prompt; the matmul micro-bench at 16 rows (mmq_tc
# against mmq_*_tr at 1, 2, 4 tiles a warp, the f16 family), then 1 and 512 rows in the time left of
# T_ALL. JSON under $OUT as each ends.
#   OUT=... bench/probes/kquant_tr_run.sh   (limits: T_TESTS T_8B T_MM T_ALL seconds; MODES, CELLS)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kquant-tr}
source bench/gpu_env.sh
(timeout 200 python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path; from shapes import write_shape
write_shape(Path('/tmp/8b-q4_k_m.gguf'), '8b', 0, 'q4_k_m')" > "$work/write.log" 2>&1
 echo "shape written at $(( $(date +%s) - start )) s" >> "$work/write.log") &
writer=$!
for f in matmul.cu wgmma.cu attention_wgmma.cu pointwise.cu rows.cu kv_cache.cu attention.cu attention_mma.cu; do
  echo "$f"
done | xargs -P 4 -I{} timeout 200 python3 -c "import sys; from lockstep_kernels.cuda.modules import module; module(sys.argv[1]).compile()" {} \
  > "$work/compile.log" 2>&1 &
stage tests
timeout "${T_TESTS:-130}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE \
  --junitxml="$work/kq-tests.xml" tests/test_cuda_kquant_integer.py 2>&1 | tail -n 25 | tee "$OUT/kq-tests.txt"
python3 bench/gpu_summary.py --tests "$work/kq-tests.xml" "$OUT/kq-tests.json" 2>/dev/null
stage 8b
wait "$writer"; cat "$work/write.log"
sed -i -e 's/^KQ_INTEGER = False/KQ_INTEGER = True/' -e 's/^KQ_TR: int | None = 0/KQ_TR: int | None = None/' lockstep_kernels/cuda/plan.py
timeout "${T_8B:-110}" python3 bench/throughput.py -m /tmp/8b-q4_k_m.gguf --vocab 128256 --shape 8b --quant q4_k_m \
  --cells "${CELLS:-1,16}" --repeats 1 --modes "${MODES:-on}" --out "$work/throughput-8b-q4_k_m" > "$work/8b.log" 2>&1
sed -i -e 's/^KQ_INTEGER = True/KQ_INTEGER = False/' -e 's/^KQ_TR: int | None = None/KQ_TR: int | None = 0/' lockstep_kernels/cuda/plan.py
grep -E "^rep|ready|rror" "$work/8b.log" | tail -n 8
cp "$work/throughput-8b-q4_k_m".{json,md} "$OUT"/ 2>/dev/null || tail -n 30 "$work/8b.log"
stage mm
timeout "${T_MM:-40}" python3 bench/kquant_mm.py --rows 16 --shapes qo,gate_up,down,lm_head \
  --out "$OUT/kquant-mm16.json" 2>&1 | grep -v "^kq_quant_x" | tail -n 60
left=$(( ${T_ALL:-290} - ($(date +%s) - start) ))
[ "$left" -gt 10 ] && timeout "$left" python3 bench/kquant_mm.py --rows 512,1 --shapes qo,gate_up,down \
  --out "$OUT/kquant-mm-1-512.json" 2>&1 | grep -v "^kq_quant_x" | tail -n 40
stage done
[ -f "$OUT/kq-tests.txt" ] && grep -E "passed|failed|error" "$OUT/kq-tests.txt" | tail -n 1
