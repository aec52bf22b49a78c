#!/usr/bin/env bash
# Hybrid models (issue 31) on a GPU machine in one call. Side by side, tiny models (their timings do
# not matter): the GPU tests of the recurrent kernels and of tiny qwen3_5 / qwen3_5_moe models on
# CUDA, and the tiny qwen3_5's exactness matrix on CUDA with exact on and off (the control). Beside
# them the 4B hybrid shape is built and its kernels compiled; its timed cells (decode and prefill,
# exact on and off, and the solo decode graph's kernel profile: bench/hybrid_decode.py --profile)
# wait until the tiny runs are done. With AB_OLD=an older deltanet.cu, then the delta_step A/B
# probe; last, the 4B hybrid's decode matmuls at each split. Each stage has its own time limit (env vars, seconds); everything lands in $OUT/hybrid.tgz.
# Needs .whl/ (gguf).   OUT=/tmp/x bench/gpu_hybrid.sh [--parks]   (--parks: parked-every-5 cells too)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-hybrid}
RES=/tmp/hybrid-res
source bench/gpu_env.sh
mkdir -p "$RES" /tmp/engine-logs/on /tmp/engine-logs/off
pack() { tar -czf "$OUT/hybrid.tgz" -C "$RES" .; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import transformers, cupy; print('transformers', transformers.__version__, 'cupy', cupy.__version__)"

tests() {  # $1: name, $2: -k expression
  timeout "${TESTS_S:-150}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfEP --durations=5 \
    --junitxml="$RES/pytest-$1.xml" tests/test_cuda_deltanet.py -k "$2" > "$RES/pytest-$1.txt" 2>&1
}
parks=(); [ "${1:-}" = --parks ] && parks=(--parks-every 5)
matrix() {  # $1: on|off
  timeout "${EXACT_S:-150}" python3 bench/exactness.py --tiny qwen3_5 --device cuda --prompt-len 100 "${parks[@]}" \
    --exact "$1" --log-dir "/tmp/engine-logs/$1" --out "$RES/exactness-cuda-hybrid$([ "$1" = off ] && echo -off)" \
    > "$RES/exactness-$1.log" 2>&1
}
stage "tiny-model GPU tests and exactness matrices, beside the 4B hybrid's build"
( tests model "tiny_qwen3_5 or exact_off_takes" & tests kernels "not tiny_qwen3_5 and not exact_off_takes" &
  matrix on & matrix off & wait; touch "$RES/side.done" ) &
side=$!
timeout "${BENCH_S:-250}" python3 bench/hybrid_decode.py --out "$RES/hybrid-4b-h200.json" --quiet-after "$RES/side.done" \
  --profile "$RES/hybrid-4b-profile-h200.json" > "$RES/hybrid-4b.log" 2>&1
stage "4b hybrid done"
tail -n 30 "$RES/hybrid-4b.log"; pack
wait "$side"
for f in model kernels; do
  echo "-- pytest $f:"; grep -E "relative L2|error [0-9]|passed|failed|Error" "$RES/pytest-$f.txt" | tail -n 12
  [ -f "$RES/pytest-$f.xml" ] && python3 bench/gpu_summary.py --tests "$RES/pytest-$f.xml" "$RES/gpu-tests-hybrid-$f.json"
done
for m in on off; do echo "-- exactness $m:"; tail -n 14 "$RES/exactness-$m.log"; done
pack
if [ -n "${AB_OLD:-}" ]; then
  stage "delta_step A/B"
  timeout "${AB_S:-40}" python3 bench/probes/delta_step_ab.py "$AB_OLD" --out "$RES/delta-step-ab-h200.json" 2>&1 | tail -n 4
  pack
fi
stage "the 4B hybrid's decode matmuls at each split"
timeout "${MM_S:-45}" python3 bench/probes/hybrid_matmuls.py --out "$RES/hybrid-matmuls-h200.json" 2>&1 | tail -n 40
pack
stage "done"
