#!/usr/bin/env bash
# attention_ws.cu's K/V by TMA (LOCKSTEP_ATTN_WS_TMA=1) against the default lean build on the H200 in one
# device call (< 420 s), JSON under $OUT as each stage ends, summary last. Stages (TM_T_<stage> seconds):
#   tests   tests/test_cuda_attention.py (default build) and test_cuda_attention_wgmma.py with
#           LOCKSTEP_ATTN_WS_TMA=1 (its default-path tests on the TMA build)                        [150]
#   engine  bench/longctx.py on the 8B shape, prompts 30000 and 8192, exact on: default and TMA,
#           cells interleaved                                                                      [150]
#   chats   bench/throughput.py on the 8B shape, 16 chats x 4096-token prompts, exact on            [90]
# The 8B shape file is written in the background meanwhile.   OUT=/tmp/x bench/gpu_attn_tma.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-attn-tma}
source bench/gpu_env.sh
lim() { local v="TM_T_$1"; echo "${!v:-$2}"; }
unset LOCKSTEP_WGMMA_ATTN LOCKSTEP_ATTN_WS LOCKSTEP_ATTN_WS_LEAN LOCKSTEP_ATTN_WS_TMA
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
{ cat COMMIT 2>/dev/null || git log -1 --format="commit %h" 2>/dev/null; } | tee -a "$OUT/summary.txt"
shape8b_bg
stage "tests"
LOCKSTEP_ATTN_WS_TMA=1 timeout "$(lim tests 150)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -v -rfE -n 8 \
  --junitxml="$work/tests.xml" tests/test_cuda_attention.py tests/test_cuda_attention_wgmma.py > "$work/tests.txt" 2>&1
echo "tests rc $?"; grep -E '^(FAILED|ERROR) |^E  ' "$work/tests.txt" | head -n 12; tail -n 1 "$work/tests.txt"
[ -f "$work/tests.xml" ] && python3 bench/gpu_summary.py --tests "$work/tests.xml" "$OUT/gpu-tests-attn-tma.json"
ok=$(grep -cE '^(FAILED|ERROR) ' "$work/tests.txt"); [ -f "$work/tests.xml" ] || ok=1
echo "tests failed: $ok" | tee -a "$OUT/summary.txt"
wait "$shape"; echo "shape rc $?"; stage "engine"
[ "$ok" = 0 ] && timeout "$(lim engine 150)" python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b \
  --prompts 30000,8192 --modes on --gen 32 --env-variant "tma:LOCKSTEP_ATTN_WS_TMA=1" \
  --out "$OUT/longctx-tma-h200" > "$work/longctx.log" 2>&1
echo "engine rc $?"; grep -E "ready|Error|refus" "$work/longctx.log" | head -n 10
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "chats"
timeout "$(lim chats 90)" python3 bench/throughput.py -m /tmp/shape-8b.gguf --shape 8b --vocab 128256 --device cuda \
  --cells 16 --modes on --prompt 4096 --gen 64 --repeats 1 --out "$OUT/throughput-16x4096-h200" > "$work/chats.log" 2>&1
echo "chats rc $?"; tail -n 5 "$work/chats.log"
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "done"
{ echo "== summary"; echo "tests: $(tail -n 1 "$work/tests.txt")"
  [ -f "$OUT/longctx-tma-h200.md" ] && grep -E '^\| ' "$OUT/longctx-tma-h200.md"
  [ -f "$OUT/throughput-16x4096-h200.md" ] && grep -E '^\| ' "$OUT/throughput-16x4096-h200.md"; } | tee -a "$OUT/summary.txt"
