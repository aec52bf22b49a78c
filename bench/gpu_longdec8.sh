#!/usr/bin/env bash
# Decode attention (issue 32, longdec8) on the H200 in one device call: attn_mma's K/V ring (RING) and the
# in-kernel merge (MERGE_LAST) against main's build. JSON under $OUT as each stage ends, summary last.
# Stages, each under its own limit (LD_T_<stage> seconds), all inside LD_T_ALL:
#   probe   bench/probes/attn_decode_ab.py: one layer, main / ring / merge_last / ring_merge, bits
#           against main's, GPU time                                                                  [50]
#   tests   tests/test_cuda_attention.py with LOCKSTEP_ATTN_RING=1 LOCKSTEP_ATTN_MERGE_LAST=1 (every decode
#           row on both; the tests also compare each with main's build bit for bit)                  [85]
#   engine  bench/longctx.py, decode after a 30000-token prompt, exact on: main and the fastest build
#           with main's bits in every probe cell (none: skipped), cells interleaved                   [80]
#   chats   bench/throughput.py, 16 chats x 4096, exact on, with that build                     [the rest]
#   profile bench/gpu_profile.py: an 8B 16-row decode step at 512 and 4096 positions, kernel by kernel
#           (no PDL), with that build                                                           [the rest]
# The 8B shape file is written in the background meanwhile. LD_STAGES: the stages to run (default all);
# without the probe LD_PICK names the build; LD_CHATS: the builds the chats cell runs ("new", or "main new").
#   OUT=/tmp/x bench/gpu_longdec8.sh      OUT=/tmp/x LD_STAGES="chats profile" LD_PICK=ring_merge LD_CHATS="main new" bench/gpu_longdec8.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-longdec8}
source bench/gpu_env.sh
lim() { local v="LD_T_$1"; echo "${!v:-$2}"; }
left() { echo $(( ${LD_T_ALL:-265} - ($(date +%s) - start) )); }
want() { [[ " ${LD_STAGES:-tests probe engine chats profile} " == *" $1 "* ]]; }
unset LOCKSTEP_ATTN_RING LOCKSTEP_ATTN_MERGE_LAST
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
shape8b_bg
if want probe; then
stage "probe"
timeout "$(lim probe 50)" python3 bench/probes/attn_decode_ab.py --out "$OUT/attn-decode-ab-h200.json" > "$work/probe.log" 2>&1
echo "probe rc $?"; cut -c1-400 "$work/probe.log" | tail -n 8
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
fi
if want tests; then
stage "tests"
LOCKSTEP_ATTN_RING=1 LOCKSTEP_ATTN_MERGE_LAST=1 timeout -s INT -k 5 "$(lim tests 85)" python3 -m pytest -m gpu --noconftest \
  -p no:cacheprovider -q -rfE -n 8 --junitxml="$work/tests.xml" tests/test_cuda_attention.py > "$work/tests.txt" 2>&1
echo "tests rc $?"; grep -E '^(FAILED|ERROR) |^E  ' "$work/tests.txt" | head -n 12; tail -n 1 "$work/tests.txt"
[ -f "$work/tests.xml" ] && python3 bench/gpu_summary.py --tests "$work/tests.xml" "$OUT/gpu-tests-attn-ring-merge.json"
fi
# the engine takes the build with main's bits in every probe cell and the least time summed over the
# 1 x 30000 and 16 x 4096 cells, if below main's
pick=$(python3 -c '
import json, sys
cells = json.load(open(sys.argv[1]))["cells"]
key = [c for c in cells if (c["rows"], c["keys"]) in ((1, 30000), (16, 4096))]
ok = [v for v in ("ring", "merge_last", "ring_merge") if all(c.get(v, {}).get("same_bits_as_main") for c in cells)]
cost = lambda v: sum(c[v]["ms"] for c in key)
best = min(ok, key=cost) if ok and len(key) == 2 else None
print(best if best and cost(best) < cost("main") else "none")' "$OUT/attn-decode-ab-h200.json" 2>/dev/null || echo "${LD_PICK:-none}")
case $pick in
  ring) envs="LOCKSTEP_ATTN_RING=1" ;;
  merge_last) envs="LOCKSTEP_ATTN_MERGE_LAST=1" ;;
  ring_merge) envs="LOCKSTEP_ATTN_RING=1,LOCKSTEP_ATTN_MERGE_LAST=1" ;;
  *) envs="" ;;
esac
echo "engine build: $pick ($envs)" | tee -a "$OUT/summary.txt"
wait "$shape"; echo "shape rc $?"; stage "shape written"
if [ -n "$envs" ] && want engine; then
  stage "engine"
  t=$(lim engine 80); [ "$(left)" -lt "$t" ] && t=$(left)
  timeout "$t" python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b --prompts 30000 --modes on \
    --env-variant "new:$envs" --out "$OUT/longctx-decode30k" > "$work/longctx.log" 2>&1
  echo "engine rc $?"; grep -E "ready|Error|refus|^prompt" "$work/longctx.log" | head -n 10
fi
if want chats; then
  for b in ${LD_CHATS:-new}; do
    [ "$b" = new ] && [ -z "$envs" ] && continue
    stage "chats $b"
    [ "$(left)" -gt 45 ] || break
    [ "$b" = new ] && e=${envs//,/ } || e="LOCKSTEP_ATTN_RING=0 LOCKSTEP_ATTN_MERGE_LAST=0"
    env $e timeout "$(( $(left) - 5 ))" python3 bench/throughput.py -m /tmp/shape-8b.gguf --shape 8b \
      --vocab 128256 --device cuda --cells 16 --prompt 4096 --gen 64 --repeats 1 --modes on \
      --out "$OUT/throughput-8b-chats4k-$b" > "$work/chats-$b.log" 2>&1
    echo "chats $b rc $?"; tail -n 4 "$work/chats-$b.log"
  done
fi
if want profile && [ "$(left)" -gt 30 ]; then
  stage "profile"
  env ${envs//,/ } timeout "$(( $(left) - 3 ))" python3 bench/gpu_profile.py --shape 8B --batch 16 --ctx 512 4096 \
    --reps 5 --out "$work/step-profile-8b-16x.json" > "$work/profile.log" 2>&1
  echo "profile rc $?"; grep -E "^== |attn|mm_|merge" "$work/profile.log" | head -n 24
fi
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "done"
{ echo "== summary"; echo "tests: $(tail -n 1 "$work/tests.txt")"
  python3 -c 'import json, sys; [print(c["rows"], "x", c["keys"], "bound", c["bound_us"], "us", {k: (v.get("ms"), v.get("same_bits_as_main"), v.get("error")) for k, v in c.items() if isinstance(v, dict)}) for c in json.load(open(sys.argv[1]))["cells"]]' "$OUT/attn-decode-ab-h200.json" 2>/dev/null
  grep -E '^prompt' "$work/longctx.log" 2>/dev/null
  for b in main new; do [ -f "$OUT/throughput-8b-chats4k-$b.md" ] && echo "chats $b: $(grep -E '^\| 16' "$OUT/throughput-8b-chats4k-$b.md")"; done
  grep -E "^== |attn|merge" "$work/profile.log" 2>/dev/null | head -n 16; } | tee -a "$OUT/summary.txt"
