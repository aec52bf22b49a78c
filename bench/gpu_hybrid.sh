#!/usr/bin/env bash
# Hybrid models (issue 31) on a GPU machine in one call: the GPU tests of the recurrent kernels and of
# a tiny qwen3_5 on CUDA (with the decode-graph tests, which the hybrid graphs share), the tiny
# qwen3_5's exactness matrix on CUDA with exact on (neighbours, parks, -ub 16, n=2, prompt cache),
# the 4B hybrid shape's decode and prefill speed (bench/hybrid_decode.py), then the matrix with exact
# off (the control). Each stage has its own time limit and writes its JSON as soon as it is done.
# Needs .whl/ (gguf); about 8 minutes on a fresh H200 (pytest compiles every kernel first).
#   OUT=/tmp/x bench/gpu_hybrid.sh [--parks]   (--parks: the parked-every-5 cells too)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-hybrid}
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import transformers, cupy; print('transformers', transformers.__version__, 'cupy', cupy.__version__)"

stage "gpu tests"
timeout "${TESTS_S:-300}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfEP --durations=6 \
  --junitxml="$OUT/pytest-hybrid.xml" tests/test_cuda_deltanet.py tests/test_cuda_graphs.py \
  > "$OUT/pytest-hybrid.txt" 2>&1
grep -E "relative L2|error [0-9]|passed|failed|Error" "$OUT/pytest-hybrid.txt" | tail -n 30
[ -f "$OUT/pytest-hybrid.xml" ] && python3 bench/gpu_summary.py --tests "$OUT/pytest-hybrid.xml" "$OUT/gpu-tests-hybrid.json" \
  && rm -f "$OUT/pytest-hybrid.xml"

parks=(); [ "${1:-}" = --parks ] && parks=(--parks-every 5)
stage "exactness matrix, exact on"
mkdir -p /tmp/engine-logs
timeout "${EXACT_S:-110}" python3 bench/exactness.py --tiny qwen3_5 --device cuda --prompt-len 100 "${parks[@]}" \
  --log-dir /tmp/engine-logs --out "$OUT/exactness-cuda-hybrid" 2>&1 | tail -n 24
if [ ! -f "$OUT/exactness-cuda-hybrid.json" ]; then
  echo "-- last engine log:"; tail -n 40 "$(ls -t /tmp/engine-logs/* | head -1)"
  stage "exactness matrix, exact on, decode graphs off"
  LOCKSTEP_DECODE_GRAPHS=0 timeout "${EXACT_S:-110}" python3 bench/exactness.py --tiny qwen3_5 --device cuda \
    --prompt-len 100 --out "$OUT/exactness-cuda-hybrid-eager" 2>&1 | tail -n 24
fi

stage "4b hybrid speed"
timeout "${BENCH_S:-120}" python3 bench/hybrid_decode.py --out "$OUT/hybrid-4b-h200.json" 2>&1 | tail -n 12

stage "exactness matrix, exact off (control)"
timeout "${OFF_S:-90}" python3 bench/exactness.py --tiny qwen3_5 --device cuda --prompt-len 100 --exact off \
  --out "$OUT/exactness-cuda-hybrid-off" 2>&1 | tail -n 20
stage "done"
