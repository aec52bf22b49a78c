#!/usr/bin/env bash
# attention_ws.cu (warp-specialised wgmma prefill attention, LOCKSTEP_ATTN_WS=1) against the sm_90 default
# attention_wgmma.cu on the H200 in one device call (< 210 s), JSON under $OUT as each stage ends, summary
# last. Stages, each under its own limit (WS_T_<stage> seconds):
#   probe   one layer's 512-row prefill at 2048/8192/30000 keys: attn_mma, attention_ws.cu (as planned
#           and with its knobs set: the probe's WS) and attention_wgmma.cu as planned: bits against
#           attn_mma's,
#           ms (median of three 20-call runs)                                                          [45]
#   tests   test_cuda_attention_wgmma.py with LOCKSTEP_ATTN_WS=1 (its launches of two warpgroups on
#           attention_ws.cu, compared bit for bit with attn_mma) and with the default, side by side       [70]
#   engine  bench/longctx.py on the 8B shape, prompts 8192 and 30000, exact on: the default and
#           LOCKSTEP_ATTN_WS=1 (the fastest build with attn_mma's bits in the probe; none: skipped), cells
#           interleaved (the engine's load self-check runs under each)                                     [85]
# The 8B shape file is written in the background meanwhile.   OUT=/tmp/x bench/gpu_longctx_ws.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-longctx-ws}
source bench/gpu_env.sh
lim() { local v="WS_T_$1"; echo "${!v:-$2}"; }
unset LOCKSTEP_WGMMA_ATTN LOCKSTEP_ATTN_WS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
shape8b_bg
stage "probe"
timeout "$(lim probe 45)" python3 bench/probes/attn_wgmma_ab.py --ws --out "$OUT/attn-ws-ab-h200.json" > "$work/probe.log" 2>&1
echo "probe rc $?"; cut -c1-600 "$work/probe.log" | tail -n 8
stage "tests"
pids=()
for v in ws default; do
  [ "$v" = ws ] && export LOCKSTEP_ATTN_WS=1 || unset LOCKSTEP_ATTN_WS
  timeout "$(lim tests 70)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -v -rfE -n 6 \
    --junitxml="$work/tests-$v.xml" tests/test_cuda_attention_wgmma.py > "$work/tests-$v.txt" 2>&1 &
  pids+=($!)
done
unset LOCKSTEP_ATTN_WS
wait "${pids[@]}"
for v in ws default; do
  echo "tests $v:"; grep -E '^(FAILED|ERROR) |^E  ' "$work/tests-$v.txt" | head -n 12; tail -n 1 "$work/tests-$v.txt"
  [ -f "$work/tests-$v.xml" ] && python3 bench/gpu_summary.py --tests "$work/tests-$v.xml" "$OUT/gpu-tests-attn-$v.json"
done
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "engine"
# the engine takes the fastest attention_ws.cu build with attn_mma's bits in every probe cell (its knobs
# set in this copy's plan.py), none if no build kept them
pick=$(python3 -c '
import json, sys
cells = json.load(open(sys.argv[1]))["cells"]
ok = [v for v in ("ws", "ws_mk") if all(c.get(v, {}).get("same_bits_as_mma") for c in cells)]
print(min(ok, key=lambda v: cells[-1][v]["ms"]) if ok and len(cells) == 3 else "none")' "$OUT/attn-ws-ab-h200.json" 2>/dev/null || echo none)
echo "engine build: $pick" | tee -a "$OUT/summary.txt"
[ "$pick" = ws_mk ] && sed -i 's/^WGMMA_WS_SKIP_MASK = False/WGMMA_WS_SKIP_MASK = True/' lockstep_kernels/cuda/plan.py
wait "$shape"; echo "shape rc $?"; stage "shape written"
[ "$pick" != none ] && timeout "$(lim engine 85)" python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b --prompts "${WS_PROMPTS:-8192,30000}" \
  --modes on --env-variant ws:LOCKSTEP_ATTN_WS=1 --out "$OUT/longctx-ws-h200" > "$work/longctx.log" 2>&1
echo "engine rc $?"; grep -E "ready|Error|refus" "$work/longctx.log" | head -n 10
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "done"
{ echo "== summary"; for v in ws default; do echo "tests $v: $(tail -n 1 "$work/tests-$v.txt")"; done
  python3 -c 'import json, sys; [print(c["context"], {k: (v.get("ms"), v.get("tflops"), v.get("same_bits_as_mma")) for k, v in c.items() if isinstance(v, dict)}) for c in json.load(open(sys.argv[1]))["cells"]]' "$OUT/attn-ws-ab-h200.json" 2>/dev/null
  grep -E '^prompt' "$work/longctx.log"
  [ -f "$OUT/longctx-ws-h200.md" ] && grep -E '^\| [0-9]' "$OUT/longctx-ws-h200.md"; } | tee -a "$OUT/summary.txt"
