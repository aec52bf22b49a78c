#!/usr/bin/env bash
# attention_wgmma.cu (issue 32: prefill attention on wgmma, LOCKSTEP_WGMMA_ATTN, off by default) on an
# sm_90 GPU in one device call (< 400 s), JSON under $OUT, summary last. Stages, each under its own limit
# (WG_T_<stage> seconds):
#   tests   its GPU tests, and the attention and self-check GPU tests with the switch on (every prefill
#           launch of those on attention_wgmma.cu: their bit-for-bit row checks then hold for it)   [150]
#   probe   one layer's 512-row prefill at 2048/8192/30000 keys: attn_mma against attn_wgmma as planned
#           and with one and two warpgroups a block (bits, ms, TFLOP/s)                               [45]
#   engine  bench/longctx.py on the 8B shape, prompts 8192 and 30000, exact on, the switch off and on
#           (two engines, cells interleaved; an engine whose self-check finds other bits refuses)    [190]
# The 8B shape file is written in the background meanwhile.   OUT=/tmp/x bench/gpu_longctx_wgmma.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-longctx-wgmma}
source bench/gpu_env.sh
lim() { local v="WG_T_$1"; echo "${!v:-$2}"; }
unset LOCKSTEP_WGMMA_ATTN
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
( [ -f /tmp/shape-8b.gguf ] || python3 -c 'import sys; sys.path.insert(0, "bench"); from shapes import write_shape; write_shape("/tmp/shape-8b.gguf", "8b", 0)' ) \
  > "$work/shape.log" 2>&1 &
shape=$!
stage "tests"
LOCKSTEP_WGMMA_ATTN=1 timeout "$(lim tests 150)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE -n 8 \
  --junitxml="$work/tests.xml" tests/test_cuda_attention_wgmma.py tests/test_cuda_attention.py tests/test_cuda_selfcheck.py \
  > "$work/tests.txt" 2>&1
echo "tests rc $?"; grep -E '^(FAILED|ERROR) |^E  ' "$work/tests.txt" | head -n 30; tail -n 2 "$work/tests.txt"
[ -f "$work/tests.xml" ] && python3 bench/gpu_summary.py --tests "$work/tests.xml" "$OUT/gpu-tests-wgmma-attn.json"
stage "probe"
timeout "$(lim probe 45)" python3 bench/probes/attn_wgmma_ab.py --out "$OUT/attn-wgmma-ab-h200.json" > "$work/probe.log" 2>&1
echo "probe rc $?"; cat "$work/probe.log" | cut -c1-600
stage "engine"
wait "$shape"; echo "shape rc $?"
timeout "$(lim engine 190)" python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b --prompts "${WG_PROMPTS:-8192,30000}" \
  --modes on --env-variant wgmma:LOCKSTEP_WGMMA_ATTN=1 --out "$OUT/longctx-wgmma-h200" > "$work/longctx.log" 2>&1
echo "engine rc $?"; grep -E "prompt|ready|Error|refus" "$work/longctx.log" | head -n 20
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "done"
{ echo "== summary"; tail -n 2 "$work/tests.txt"; grep -o '"same_bits_as_mma": [a-z]*' "$OUT/attn-wgmma-ab-h200.json" 2>/dev/null | sort | uniq -c
  [ -f "$OUT/longctx-wgmma-h200.md" ] && tail -n +1 "$OUT/longctx-wgmma-h200.md" | grep -E '^\| [0-9]'; } | tee -a "$OUT/summary.txt"
