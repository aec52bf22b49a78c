#!/usr/bin/env bash
# Long prompts and contexts on a GPU machine (issue 32), in one go, JSON under $OUT, summary last:
#   bench/gpu_longctx.sh kernel   the attention GPU tests, then bench/attn_bench.py (one layer, 8B shape)
#   bench/gpu_longctx.sh engine   bench/longctx.py on the 8B shape (exact on and off, -c 32768)
#   bench/gpu_longctx.sh engine1b the same on the 1B shape, one repeat
#   bench/gpu_longctx.sh exactness1b  the exactness matrix on the 1B shape with a 20000-token prompt cell
# Needs the gguf wheel carried in .whl/ for `engine` (the device image lacks it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-longctx}
source bench/gpu_env.sh
for what in "$@"; do
  case $what in
    kernel)
      python3 -m pytest -m gpu --noconftest -q -p no:cacheprovider tests/test_cuda_attention.py tests/test_cuda_graphs.py \
        2>&1 | tee "$OUT/tests.log" | tail -n 25
      python3 bench/attn_bench.py --out "$OUT/attn-bench.json" 2>&1 | tail -n 12 ;;
    engine)
      python3 -c 'import sys; sys.path.insert(0, "bench"); from shapes import write_shape; write_shape("/tmp/shape-8b.gguf", "8b", 0)'
      stage "shape written"
      python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b --out "$OUT/longctx-h200" 2>&1 | tee "$OUT/longctx.log" | tail -n 30
      rm -f /tmp/shape-8b.gguf ;;
    exactness1b)  # the exactness matrix on the 1B shape with the 20000-token cell (not run yet)
      python3 -c 'import sys; sys.path.insert(0, "bench"); from shapes import write_shape; write_shape("/tmp/shape-1b.gguf", "1b", 0)'
      python3 bench/exactness.py -m /tmp/shape-1b.gguf --device cuda --long-prompt 20000 \
        --out "$OUT/exactness-cuda-1b-long20k" 2>&1 | tail -n 18 ;;
    engine1b)
      python3 bench/longctx.py --shape 1b --repeats 1 --prompts 2048,8192,30000 --out "$OUT/longctx-1b-h200" 2>&1 \
        | tee "$OUT/longctx-1b.log" | tail -n 16 ;;
  esac
  stage "$what done"
done
