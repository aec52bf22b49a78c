#!/usr/bin/env bash
# Mixture-of-experts on CUDA in one go on a GPU machine, within a time budget: the MoE GPU tests, the
# exactness matrix on a tiny bf16 qwen3_moe (exact on, and off as the control), bench/moe_decode.py on the
# 30B-A3B shape built in memory, then the dense graph tests the grouped matmul's kernel change touches.
# Each step gets at most what is left of the budget; a step cut short keeps the results before it.
# JSON under $OUT (at most 8 files come back), a summary last.
#   bench/gpu_moe.sh [BUDGET_S] [LAYERS] [engine]   (defaults: 220 s; 48 layers, the whole 30B-A3B shape;
#   engine: only bench/throughput.py on a LAYERS-layer 30B-A3B GGUF, its bandwidth column counts 48 layers)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-moe}
work=/tmp/gpu-moe-work
mkdir -p "$work"
source bench/gpu_env.sh
budget=${1:-220}; layers=${2:-48}
left() { local l=$(( budget - ($(date +%s) - start) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 1 ? l : 1 )); }
lap() { echo "== $1 done at $(( $(date +%s) - start )) s"; }

if [ "${3:-}" = engine ]; then  # instead: the real engine's throughput on the shape at LAYERS layers (a GGUF on disk)
  python3 - "$layers" <<'PY'
import sys; sys.path.insert(0, "bench")
import shapes
shapes.SHAPES["30b-a3b"] = dict(shapes.SHAPES["30b-a3b"], layers=int(sys.argv[1]))
shapes.write_shape("/tmp/moe-30b-a3b.gguf", "30b-a3b", 0)
PY
  lap "gguf written"
  timeout "$(left 300)" python3 bench/throughput.py -m /tmp/moe-30b-a3b.gguf --shape 30b-a3b --vocab 151936 \
    --cells 1,16 --repeats 1 --gen 64 --out "$OUT/throughput-30b-a3b-l$layers" 2>&1 | tail -n 12
  lap throughput
  exit 0
fi

timeout "$(left 110)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE -s --durations=5 \
  --junitxml="$OUT/moe-tests.xml" tests/test_cuda_moe.py 2>&1 | tee "$work/moe-tests.txt" | grep -v '^$' | tail -n 30
lap tests
# bf16 like the real Qwen3-MoE files; head dim 32 (the attention builds are for 32 .. 256)
python3 - > "$work/tiny-moe.txt" 2> "$work/tiny-moe.err" <<'PY'
import tempfile
from tests.tiny_moe import make_moe_hf_model
print(make_moe_hf_model(tempfile.mkdtemp(), dtype="bfloat16", hidden=128, heads=4, kv_heads=2, head_dim=32,
                        experts=16, top_k=4, expert_ffn=64))
PY
tiny=$(tail -n 1 "$work/tiny-moe.txt")
for mode in on off; do
  timeout "$(left 40)" python3 bench/exactness.py -m "$tiny" --device cuda --exact $mode \
    --out "$work/exactness-cuda-moe-$mode" 2>&1 | tail -n 17
  cp "$work/exactness-cuda-moe-$mode.json" "$OUT/" 2>/dev/null
  lap "exactness $mode"
done
timeout "$(left 80)" python3 bench/moe_decode.py --shape 30b-a3b --layers "$layers" --buckets 1,16 --steps 30 \
  --out "$OUT/moe-decode-30b-a3b.json" 2>&1 | grep -v '^{' | tail -n 8
lap "30b-a3b decode"
timeout "$(left 40)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE tests/test_cuda_graphs.py \
  -k "replay_equals_uncaptured_step and f16 or prefill_chunking" 2>&1 | tail -n 4
lap "dense graphs"
python3 - "$OUT" <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(p))
    if "cells" in d:
        print(p.rsplit("/", 1)[1], "all_identical", d["all_identical"], "seconds", d.get("seconds"),
              "differ:", [c["name"] for c in d["cells"] if not c["identical"]])
    else:
        print(p.rsplit("/", 1)[1], json.dumps({k: d[k] for k in ("load_s", "decode", "prefill", "on_off") if k in d}))
PY
