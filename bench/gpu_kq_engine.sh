#!/usr/bin/env bash
# K-quant prefill on wgmma in the engine (issue 29) in one short device call: bench/throughput.py on the 8B
# Q4_K_M shape, exact on, 1 and 16 chats x 512-token prompts, with LOCKSTEP_WGMMA_KQ=0 (mm_wide), then =1
# (mm_wgmma_kq): the first engine on a fresh machine builds every kernel, the second only its own. Reports and logs in $OUT/kq-engine.tgz, tables in $OUT/summary.txt.   OUT=/tmp/x bench/gpu_kq_engine.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-kq-engine}
source bench/gpu_env.sh
model=/tmp/shape-8b-q4km.gguf
stage "shape"
shape8b_q4km_bg
wait "$shape"; echo "shape rc $?"
for kq in 0 1; do
  stage "kq=$kq"
  LOCKSTEP_WGMMA_KQ=$kq timeout "${KQ_T_RUN:-150}" python3 bench/throughput.py -m $model --shape 8b --quant q4_k_m --vocab 128256 --device cuda \
    --cells 1,16 --modes on --prompt 512 --gen 64 --repeats 1 --out "$work/kq$kq" > "$work/kq$kq.log" 2>&1
  echo "kq=$kq rc $?"; tail -n 3 "$work/kq$kq.log"
  tar -czf "$OUT/kq-engine.tgz" -C "$work" .
done
stage "done"
for kq in 0 1; do echo "== LOCKSTEP_WGMMA_KQ=$kq"; grep -E '^\| ' "$work/kq$kq.md" 2>/dev/null; done | tee "$OUT/summary.txt"
