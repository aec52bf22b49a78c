#!/usr/bin/env bash
# mm_wgmma_tma's builds (lockstep_kernels/cuda/plan.py WGMMA_BUILDS, LOCKSTEP_WGMMA_BUILD) against the default on the
# H200 in one device call (MM_DEADLINE s, 270), JSON under $OUT as each stage ends, summary last. Stages, each
# under its own limit (MM_T_<stage> seconds) and the deadline:
#   build   the probe's modules (matmul.cu, every wgmma.cu build) compiled side by side into CuPy's cache [60]
#   probe   bench/probes/mm_wgmma_ab.py: the 8B matmuls at 512 and 2048 rows, every build, TFLOP/s, and every
#           element's bits against the default build's and mm_tc's                                    [120]
#   mc      the same for the multicast builds, a process of its own (a cluster bug cannot cost the rest) [45]
#   tests   tests/test_cuda_ops.py's mm_wgmma tests (every build forced; the wide-batch, ffn and norm_matmul
#           tests under LOCKSTEP_WGMMA_BUILD=the pick, or persist), beside test_cuda_attention_wgmma.py
#           (its kernels are the engine's: built here, the engine finds them in CuPy's cache)           [60]
#   engine  bench/longctx.py on the 8B shape, prompt 8192 (MM_PROMPTS), exact on: the default and the pick,
#           the plan build with the shortest 512-row layer, equal bits in every probe cell and >= 1 %
#           faster than the default (none: skipped), cells interleaved                        [the rest]
# MM_PICK=<build> skips the build, probe and mc stages and takes that build. The 8B shape file is written in
# the background meanwhile.   OUT=/tmp/x bench/gpu_mm_wgmma.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-mm-wgmma}
source bench/gpu_env.sh
deadline=$((start + ${MM_DEADLINE:-270}))
lim() { local v="MM_T_$1" left=$((deadline - $(date +%s) - 3)); local want=${!v:-$2}; echo $((want < left ? want : left)); }
unset LOCKSTEP_WGMMA_BUILD
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
shape8b_bg
if [ -z "${MM_PICK:-}" ]; then  # MM_PICK=<build>: no probes, the tests and the engine cells of that build
stage "build"
timeout "$(lim build 60)" python3 bench/probes/mm_wgmma_ab.py --compile --builds tiles,persist,g3,g3p,mc,mcp,g3mc > "$work/build.log" 2>&1
echo "build rc $?"; tail -n 3 "$work/build.log"
stage "probe"
timeout "$(lim probe 120)" python3 bench/probes/mm_wgmma_ab.py --builds tiles,persist,g3,g3p --out "$OUT/mm-wgmma-ab-h200.json" > "$work/probe.log" 2>&1
echo "probe rc $?"; cut -c1-400 "$work/probe.log" | tail -n 14
timeout "$(lim mc 45)" python3 bench/probes/mm_wgmma_ab.py --builds tiles,mc,mcp,g3mc --out "$OUT/mm-wgmma-mc-h200.json" > "$work/mc.log" 2>&1
echo "multicast probe rc $?"; cut -c1-400 "$work/mc.log" | tail -n 10
pick=$(python3 bench/probes/mm_wgmma_ab.py --pick "$OUT/mm-wgmma-ab-h200.json" "$OUT/mm-wgmma-mc-h200.json" 2>/dev/null || echo none)
else
pick=$MM_PICK
fi
echo "engine build: $pick" | tee -a "$OUT/summary.txt"
stage "tests"
tb=$([ "$pick" = none ] && echo persist || echo "$pick")
LOCKSTEP_WGMMA_BUILD=$tb timeout "$(lim tests 60)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -v -rfE -n 4 \
  --junitxml="$work/tests-mm.xml" tests/test_cuda_ops.py \
  -k "wgmma_builds or shared_memory_kernels_give or ffn or norm_matmul$(case $tb in *mc*) echo ' or wgmma_multicast';; esac)" \
  > "$work/tests-mm.txt" 2>&1 &
mm=$!
timeout "$(lim tests 60)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -n 4 tests/test_cuda_attention_wgmma.py \
  > "$work/tests-attn.txt" 2>&1 &
attn=$!
wait $mm $attn
echo "tests ($tb):"; grep -E '^(FAILED|ERROR) |^E  ' "$work/tests-mm.txt" | head -n 12; tail -n 1 "$work/tests-mm.txt"
echo "attention tests: $(tail -n 1 "$work/tests-attn.txt")"
[ -f "$work/tests-mm.xml" ] && python3 bench/gpu_summary.py --tests "$work/tests-mm.xml" "$OUT/gpu-tests-mm-$tb.json"
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "engine"
wait "$shape"; echo "shape rc $?"; stage "shape written"
[ "$pick" != none ] && timeout "$(lim engine 200)" python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b --prompts "${MM_PROMPTS:-8192}" \
  --modes on --env-variant "$pick:LOCKSTEP_WGMMA_BUILD=$pick" --out "$OUT/longctx-mm-h200" > "$work/longctx.log" 2>&1
echo "engine rc $?"; grep -E "ready|Error|refus" "$work/longctx.log" | head -n 10
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
stage "done"
{ echo "== summary"; echo "tests ($tb): $(tail -n 1 "$work/tests-mm.txt")"; echo "attention tests: $(tail -n 1 "$work/tests-attn.txt")"
  grep -E '^(qkv|o |gate_up|down|layer)' "$work/probe.log" "$work/mc.log" | cut -c1-600
  grep -E '^prompt' "$work/longctx.log"
  [ -f "$OUT/longctx-mm-h200.md" ] && grep -E '^\| [0-9]' "$OUT/longctx-mm-h200.md"; } | tee -a "$OUT/summary.txt"
