#!/usr/bin/env bash
# The one-row matmuls' L2 prefetch (plan.L2_PREFETCH_BYTES, L2_PREFETCH_AHEAD) on a GPU machine in one
# call, each stage under its own limit (env vars, seconds), results under $OUT as each stage ends
# (a call brings back 8 files: the logs go in $OUT/logs.tgz). Beside the 4B hybrid's build: the GPU
# tests of the changed kernels (prefetch bits, the DeltaNet kernels and tiny hybrid models, hybrid
# launch-ahead), then the kernel-level A/B (bench/probes/l2_prefetch_ab.py: norm + matmul pairs in a
# graph, each budget, bits against budget 0). Then the
# 4B hybrid's decode and prefill (exact on/off, 1 and 16 chats, the solo profile) as planned
# (matmul.cu's one-row kernels, the engine's default: prefetch off), and solo exact-on cells with a 24
# MB budget (profiled too) / without the short kernels' part / with the gate|up start / the FFN norm
# in gate_up's prologue instead / a 40 MB budget; last, the tiny
# qwen3_5's exactness matrix on CUDA (exact on).
#   OUT=/tmp/x bench/gpu_prefetch.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-prefetch}
source bench/gpu_env.sh
pack() { tar -czf "$OUT/logs.tgz" -C "$work" .; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
stage "GPU tests, then the kernel A/B, beside the 4B hybrid's build"
tests() {  # $1: name, then test files
  local name=$1; shift
  timeout "${TESTS_S:-100}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE --durations=5 \
    --junitxml="$work/pytest-$name.xml" "$@" > "$work/pytest-$name.txt" 2>&1
  echo "pytest rc $?" >> "$work/pytest-$name.txt"
  [ -f "$work/pytest-$name.xml" ] && python3 bench/gpu_summary.py --tests "$work/pytest-$name.xml" "$OUT/gpu-tests-$name-h200.json"
}
(
  tests prefetch tests/test_cuda_prefetch.py tests/test_cuda_hybrid_ahead.py &
  tests deltanet-model tests/test_cuda_deltanet.py -k "tiny_qwen3_5 or exact_off_takes" &
  tests deltanet-kernels tests/test_cuda_deltanet.py -k "not tiny_qwen3_5 and not exact_off_takes" &
  wait
  timeout "${PROBE_S:-40}" python3 bench/probes/l2_prefetch_ab.py --out "$OUT/prefetch-ab-h200.json" > "$work/probe.log" 2>&1
  echo "probe rc $?" >> "$work/probe.log"
  touch "$work/side.done"
  pack
) &
side=$!
pf=L2_PREFETCH_BYTES=25165824
cells="pf24:$pf;pf24a0:$pf,L2_PREFETCH_AHEAD=0;pf24a2:$pf,L2_PREFETCH_AHEAD=2;norm16:NORM_PROLOGUE_BYTES=16777216;pf40:L2_PREFETCH_BYTES=41943040"
timeout "${BENCH_S:-260}" python3 bench/hybrid_decode.py --matvec off --chats 1,16 --modes on,off --out "$OUT/hybrid-4b-h200.json" \
  --quiet-after "$work/side.done" --profile "$OUT/hybrid-4b-profile-h200.json" --plan-cells "$cells" --profile-plan pf24 \
  > "$work/bench.log" 2>&1
echo "bench rc $?"; grep -E "exact|weights|bound" "$work/bench.log" | head -n 20
wait "$side"
stage "exactness matrix, tiny qwen3_5 on CUDA, exact on"
if [ "${EXACT_S:-50}" -gt 0 ]; then
  timeout "${EXACT_S:-50}" python3 bench/exactness.py --tiny qwen3_5 --device cuda --prompt-len 100 --exact on \
    --log-dir "$work/engine-logs" --out "$work/exactness-cuda-hybrid" > "$work/exactness-on.log" 2>&1
  echo "exactness rc $?" >> "$work/exactness-on.log"
fi
stage "summaries"
tail -n 4 "$work"/pytest-*.txt; cat "$work/probe.log"; tail -n 16 "$work/exactness-on.log" 2>/dev/null
pack
stage "done"
