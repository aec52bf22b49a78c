#!/usr/bin/env bash
# Mixture-of-experts on CUDA in one go on a GPU machine: the MoE GPU tests (and the dense graph test the
# grouped matmul's kernel change touches), the exactness matrix on a tiny qwen3_moe (exact on, and off as
# the control), then bench/moe_decode.py on the 30B-A3B shape built in memory. Results under $OUT (at
# most 8 files come back), summary last. Each step has its own time limit; a step cut short keeps the
# results of the steps before it.
#   bench/gpu_moe.sh [LAYERS]   (the 30B-A3B layers to build: default 48, the whole shape)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-moe}
work=/tmp/gpu-moe-work
mkdir -p "$OUT" "$work"
source bench/gpu_env.sh
layers=${1:-48}
start=$(date +%s)
lap() { echo "== $1 done at $(( $(date +%s) - start )) s"; }

timeout 150 python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE -s --durations=5 \
  --junitxml="$OUT/moe-tests.xml" tests/test_cuda_moe.py 2>&1 | tee "$work/moe-tests.txt" | grep -v '^$' | tail -n 40
lap tests
for mode in on off; do
  timeout 100 python3 bench/exactness.py --tiny qwen3_moe --device cuda --exact $mode \
    --out "$work/exactness-cuda-moe-$mode" 2>&1 | tail -n 18
  cp "$work/exactness-cuda-moe-$mode.json" "$OUT/" 2>/dev/null
  lap "exactness $mode"
done
timeout 200 python3 bench/moe_decode.py --shape 30b-a3b --layers "$layers" --buckets 1,16 \
  --out "$OUT/moe-decode-30b-a3b.json" 2>&1 | tail -n 12
lap "30b-a3b decode"
timeout 60 python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE tests/test_cuda_graphs.py \
  -k "replay_equals or prefill_chunking" 2>&1 | tail -n 5
lap "dense graphs"
python3 - "$OUT" <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(p))
    if "cells" in d:
        print(p.rsplit("/", 1)[1], "all_identical", d["all_identical"],
              "differ:", [c["name"] for c in d["cells"] if not c["identical"]])
    else:
        print(p.rsplit("/", 1)[1], json.dumps({k: d[k] for k in ("load_s", "decode", "prefill", "on_off") if k in d}))
PY
