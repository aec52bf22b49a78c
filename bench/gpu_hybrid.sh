#!/usr/bin/env bash
# Hybrid models (issue 31) on a GPU machine in one call: the GPU tests of the recurrent kernels and of
# a tiny qwen3_5 on CUDA (with the decode-graph tests, which the hybrid graphs share), the tiny
# qwen3_5's exactness matrix on CUDA (exact on, with parks every 5 tokens at -ub 512/16/24; exact off
# as the control), then the 4B hybrid shape's decode and prefill speed (bench/hybrid_decode.py).
# Each stage has its own time limit and writes its JSON as soon as it is done. Needs .whl/ (gguf).
#   OUT=/tmp/x bench/gpu_hybrid.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-hybrid}
mkdir -p "$OUT"
source bench/gpu_env.sh
start=$(date +%s)
stage() { echo "== $1 at $(( $(date +%s) - start )) s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import transformers, cupy; print('transformers', transformers.__version__, 'cupy', cupy.__version__)"

stage "gpu tests"
timeout 210 python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfEP --durations=6 \
  --junitxml="$OUT/pytest-hybrid.xml" tests/test_cuda_deltanet.py tests/test_cuda_graphs.py \
  > "$OUT/pytest-hybrid.txt" 2>&1
grep -E "relative L2|error [0-9]|passed|failed|Error" "$OUT/pytest-hybrid.txt" | tail -n 30
python3 bench/gpu_summary.py --tests "$OUT/pytest-hybrid.xml" "$OUT/gpu-tests-hybrid.json" && rm -f "$OUT/pytest-hybrid.xml"

stage "exactness matrix, exact on"
timeout 170 python3 bench/exactness.py --tiny qwen3_5 --device cuda --prompt-len 100 --parks-every 5 \
  --out "$OUT/exactness-cuda-hybrid" 2>&1 | tail -n 24

stage "exactness matrix, exact off (control)"
timeout 90 python3 bench/exactness.py --tiny qwen3_5 --device cuda --prompt-len 100 --exact off \
  --out "$OUT/exactness-cuda-hybrid-off" 2>&1 | tail -n 20

stage "4b hybrid speed"
timeout "${HYBRID_BENCH_S:-120}" python3 bench/hybrid_decode.py --out "$OUT/hybrid-4b-h200.json" 2>&1 | tail -n 12
stage "done"
