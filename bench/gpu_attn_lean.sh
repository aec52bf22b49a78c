#!/usr/bin/env bash
# attention_ws.cu's lean build (plan.WGMMA_WS_LEAN / _FTZ / _SKIP_MASK, LOCKSTEP_ATTN_WS_LEAN=1) against
# the planned one on the H200 in one device call (< 280 s), JSON under $OUT as each stage ends, summary
# last. Stages, each under its own limit (LN_T_<stage> seconds):
#   probe   one layer's 512-row prefill at 2048/8192/30000 keys: attn_mma, attention_ws.cu as planned,
#           with the compares skipped (ws_mk), lean (ws_ln), with ftz weights (ws_lnfz), with the float2
#           fold (ws_lean, the switch's build), that with the softmax overlap (ws_lean_ov) and without the
#           ping-pong (ws_lean_pp0),
#           attention_wgmma.cu: bits against attn_mma's, ms                                             [90]
#   tests   test_cuda_attention_wgmma.py with LOCKSTEP_ATTN_WS_LEAN=1 (its default-path tests on the lean
#           build; the lean and lean_ov builds forced on every launch, bit for bit against attn_mma; the
#           subnormal-weight launch; NaN past the sequence ends), TMA and planned builds aside          [85]
#   engine  bench/longctx.py on the 8B shape, prompts 30000 and 8192 (WS_PROMPTS), exact on: the planned
#           build and LOCKSTEP_ATTN_WS_LEAN=1 (overlap off; skipped unless ws_lean kept attn_mma's bits
#           in every probe cell), cells interleaved, in what is left of LN_T_total                           [95]
#   tma     in what is left: the probe's ws / ws_lean / ws_lean_tma (K/V by TMA), then its tests
# The 8B shape file is written in the background meanwhile.   OUT=/tmp/x bench/gpu_attn_lean.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-attn-lean}
source bench/gpu_env.sh
lim() { local v="LN_T_$1"; echo "${!v:-$2}"; }
unset LOCKSTEP_WGMMA_ATTN LOCKSTEP_ATTN_WS LOCKSTEP_ATTN_WS_LEAN
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
{ cat COMMIT 2>/dev/null || git log -1 --format="commit %h" 2>/dev/null; } | tee -a "$OUT/summary.txt"
shape8b_bg
stage "probe"
timeout "$(lim probe 90)" python3 bench/probes/attn_wgmma_ab.py --ws --out "$OUT/attn-lean-ab-h200.json" > "$work/probe.log" 2>&1
echo "probe rc $?"; cut -c1-400 "$work/probe.log" | tail -n 8
stage "tests"
LOCKSTEP_ATTN_WS_LEAN=1 timeout "$(lim tests 85)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -v -rfE -n 8 \
  --junitxml="$work/tests-ws.xml" tests/test_cuda_attention_wgmma.py -k "not lean_tma and not planned" > "$work/tests-ws.txt" 2>&1
echo "tests rc $?"; grep -E '^(FAILED|ERROR) |^E  ' "$work/tests-ws.txt" | head -n 12; tail -n 1 "$work/tests-ws.txt"
[ -f "$work/tests-ws.xml" ] && python3 bench/gpu_summary.py --tests "$work/tests-ws.xml" "$OUT/gpu-tests-attn-lean.json"
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "engine"
# the engine's A/B only if the lean build kept attn_mma's bits in every probe cell (overlap off: the
# switch sets LN, FZ, VF and MK); its limit what the call has left (LN_T_total, default 270 s)
ok=$(python3 -c '
import json, sys
cells = json.load(open(sys.argv[1]))["cells"]
print(int(len(cells) == 3 and all(c.get("ws_lean", {}).get("same_bits_as_mma") for c in cells)))' "$OUT/attn-lean-ab-h200.json" 2>/dev/null || echo 0)
echo "engine lean bits ok: $ok" | tee -a "$OUT/summary.txt"
wait "$shape"; echo "shape rc $?"; stage "shape written"
left=$(( ${LN_T_total:-270} - ($(date +%s) - start) - 8 )); want=$(lim engine 95); [ "$left" -lt "$want" ] && want=$left
[ "$ok" = 1 ] && [ "$want" -gt 20 ] && timeout "$want" python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b \
  --prompts "${WS_PROMPTS:-30000,8192}" --modes on --gen 16 \
  --env-variant "lean:LOCKSTEP_ATTN_WS_LEAN=1" --out "$OUT/longctx-lean-h200" > "$work/longctx.log" 2>&1
echo "engine rc $?"; grep -E "ready|Error|refus" "$work/longctx.log" | head -n 10
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "tma"
# the TMA build last, in its own processes (a hang costs only this stage): probe, then its tests
left=$(( ${LN_T_total:-270} - ($(date +%s) - start) - 4 ))
if [ "$left" -ge 25 ]; then
  timeout $(( left / 2 )) python3 bench/probes/attn_wgmma_ab.py --ws --variants ws,ws_lean,ws_lean_tma \
    --out "$OUT/attn-lean-tma-h200.json" > "$work/probe-tma.log" 2>&1
  echo "tma probe rc $?"; cut -c1-400 "$work/probe-tma.log" | tail -n 4
  left=$(( ${LN_T_total:-270} - ($(date +%s) - start) - 4 ))
  [ "$left" -ge 10 ] && timeout "$left" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -v -rfE -n 6 \
    --junitxml="$work/tests-tma.xml" tests/test_cuda_attention_wgmma.py -k "lean_tma" > "$work/tests-tma.txt" 2>&1
  echo "tma tests rc $?"; tail -n 1 "$work/tests-tma.txt"
  [ -f "$work/tests-tma.xml" ] && python3 bench/gpu_summary.py --tests "$work/tests-tma.xml" "$OUT/gpu-tests-attn-tma.json"
else
  echo "tma: skipped, $left s left"
fi
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "done"
{ echo "== summary"; echo "tests: $(tail -n 1 "$work/tests-ws.txt")"; echo "tma tests: $(tail -n 1 "$work/tests-tma.txt" 2>/dev/null)"
  for f in "$OUT/attn-lean-ab-h200.json" "$OUT/attn-lean-tma-h200.json"; do
    python3 -c 'import json, sys; [print(c["context"], {k: (v.get("ms"), v.get("tflops"), v.get("same_bits_as_mma")) for k, v in c.items() if isinstance(v, dict)}) for c in json.load(open(sys.argv[1]))["cells"]]' "$f" 2>/dev/null
  done
  grep -E '^prompt' "$work/longctx.log"
  [ -f "$OUT/longctx-lean-h200.md" ] && grep -E '^\| [0-9]' "$OUT/longctx-lean-h200.md"; } | tee -a "$OUT/summary.txt"
