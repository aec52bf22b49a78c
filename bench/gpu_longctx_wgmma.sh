#!/usr/bin/env bash
# attention_wgmma.cu as the sm_90 default (issue 32) on the H200 in one device call (< 215 s), JSON under
# $OUT as each stage ends, summary last. Stages, each under its own limit (WG_T_<stage> seconds):
#   default which attention build a 512-row prefill of the 8B shape takes with no variable set       [20]
#   probe   one layer's 512-row prefill at 2048/8192/30000 keys: attn_mma against attn_wgmma as planned
#           and with one and two warpgroups a block: bits, ms                                        [30]
#   tests   its GPU tests and the attention GPU tests with the default
#           (every prefill launch of those on attention_wgmma.cu: their bit-for-bit row checks then hold
#           for it; test_cuda_attention_wgmma compares it with attn_mma on the same launches)           [90]
#   engine  bench/longctx.py on the 8B shape, prompts 8192 and 30000, exact on: the default, the default
#           with LOCKSTEP_WGMMA_ATTN=0 (attn_mma) and with -ub 2048 (a quarter of the prefill steps, each
#           four times as wide), cells interleaved; each length's JSON as it ends                       [80]
# The 8B shape file is written in the background meanwhile.   OUT=/tmp/x bench/gpu_longctx_wgmma.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-longctx-wgmma}
source bench/gpu_env.sh
lim() { local v="WG_T_$1"; echo "${!v:-$2}"; }
unset LOCKSTEP_WGMMA_ATTN
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
shape8b_bg
stage "default"
timeout "$(lim default 20)" python3 -c '
from lockstep_kernels.cuda.ops import CudaOps
o = CudaOps(exact=True)
print("default", {"cc": o.device.compute_capability, "wgmma_attention": o.wgmma_attention,
      "build_512_rows": o.attention_build(512, 32, 8, 128, 128), "build_1_row": o.attention_build(1, 32, 8, 128, 128)})
' 2>&1 | tee "$work/default.txt" | tail -n 3
stage "probe"
timeout "$(lim probe 30)" python3 bench/probes/attn_wgmma_ab.py --out "$OUT/attn-wgmma-ab-default-h200.json" > "$work/probe.log" 2>&1
echo "probe rc $?"; cut -c1-400 "$work/probe.log"
stage "tests"
timeout "$(lim tests 90)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -v -rfE -n 12 \
  --junitxml="$work/tests.xml" tests/test_cuda_attention_wgmma.py tests/test_cuda_attention.py \
  > "$work/tests.txt" 2>&1
echo "tests rc $?"; grep -E '^(FAILED|ERROR) |^E  ' "$work/tests.txt" | head -n 30; tail -n 2 "$work/tests.txt"
[ -f "$work/tests.xml" ] && python3 bench/gpu_summary.py --tests "$work/tests.xml" "$OUT/gpu-tests-wgmma-default.json"
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "engine"
wait "$shape"; echo "shape rc $?"; stage "shape written"
timeout "$(lim engine 80)" python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b --prompts "${WG_PROMPTS:-8192,30000}" \
  --modes on --env-variant mma:LOCKSTEP_WGMMA_ATTN=0 --arg-variant "ub2048:-ub 2048" \
  --out "$OUT/longctx-wgmma-default-h200" > "$work/longctx.log" 2>&1
echo "engine rc $?"; grep -E "ready|Error|refus" "$work/longctx.log" | head -n 10
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "done"
{ echo "== summary"; grep default "$work/default.txt"; tail -n 1 "$work/tests.txt"
  grep -o '"same_bits_as_mma": [a-z]*' "$OUT/attn-wgmma-ab-default-h200.json" 2>/dev/null | sort | uniq -c
  python3 -c 'import json, sys; [print(c["context"], {k: (v.get("ms"), v.get("same_bits_as_mma")) for k, v in c.items() if isinstance(v, dict)}) for c in json.load(open(sys.argv[1]))["cells"]]' "$OUT/attn-wgmma-ab-default-h200.json" 2>/dev/null
  grep -E '^prompt' "$work/longctx.log"
  [ -f "$OUT/longctx-wgmma-default-h200.md" ] && grep -E '^\| [0-9]' "$OUT/longctx-wgmma-default-h200.md"; } | tee -a "$OUT/summary.txt"
