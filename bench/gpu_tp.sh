#!/usr/bin/env bash
# Tensor parallelism on nvidia-h200-x2 (written without a multi-GPU machine; first run verifies the
# NCCL layer): the gpu-marked TP tests, then the 8B shape TP=2 vs TP=1 (solo and 16 chats, exact on
# and off), then the exactness matrix twice at TP=2 (tiny model, parks every 5 tokens; every cell must
# be identical in both runs; TP=2 is not promised equal to TP=1). JSON under $OUT.
#   bench/gpu_tp.sh [--quick]   (--quick: one repeat, tests and the 8B cells only)
# Targets (issue 33): 8B TP=2 solo decode >= 1.6x TP=1, 16 chats >= 1.7x; exact on/off >= 0.95 each cell.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-tp}
save() { cp "$work"/*.json "$OUT"/ 2>/dev/null; }
source bench/gpu_env.sh
repeats=3; quick=0
for arg in "$@"; do case $arg in --quick) repeats=1; quick=1 ;; esac; done
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$work/gpus.txt"
python3 -c 'import cupy; from cupy.cuda import nccl; print("nccl", nccl.get_version(), "gpus",
  cupy.cuda.runtime.getDeviceCount())' 2>&1 | tee "$work/nccl.txt"

python3 -m pytest -q -p no:cacheprovider tests/test_tp_gpu.py tests/test_tp_cpu.py tests/test_tp_plan.py \
  --junitxml="$work/tp-tests.xml" 2>&1 | tail -n 25
python3 - "$work/tp-tests.xml" > "$work/tp-tests.json" <<'PY'
import json, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
s = root if root.tag == "testsuite" else root.find("testsuite")
print(json.dumps({k: s.get(k) for k in ("tests", "failures", "errors", "skipped", "time")}))
PY
save

python3 -c 'import sys; sys.path.insert(0, "bench"); from shapes import write_shape; write_shape("/tmp/shape-8b.gguf", "8b", 0)'
for tp in 1 2; do
  python3 bench/throughput.py -m /tmp/shape-8b.gguf --shape 8b --vocab 128256 --device cuda --cells 1,16 \
    --repeats $repeats --engine-args "--tp $tp" --out "$work/throughput-8b-tp$tp" 2>&1 \
    | tee "$work/throughput-8b-tp$tp.log" | tail -n 8
  save
done
python3 - "$work" > "$work/tp-speedup.json" <<'PY'
import json, sys
w = sys.argv[1]
r = {tp: json.load(open(f"{w}/throughput-8b-tp{tp}.json")) for tp in (1, 2)}
out = {}
for row1, row2 in zip(r[1]["cells"], r[2]["cells"]):
    for m in ("on", "off"):
        a, b = row1.get(m, {}).get("decode_tps"), row2.get(m, {}).get("decode_tps")
        out[f"{row1['chats']}_{m}"] = {"tp1": a, "tp2": b, "speedup": round(b / a, 3) if a and b else None}
print(json.dumps(out, indent=1))
PY
cat "$work/tp-speedup.json"; save
rm -f /tmp/shape-8b.gguf
if [ $quick = 1 ]; then echo "== done in $(( $(date +%s) - start )) s"; exit 0; fi

python3 - <<'PY' > "$work/tiny-model.txt" 2>&1
import tempfile
from tests.tiny_models import make_hf_model
print(make_hf_model(tempfile.mkdtemp(), "llama", layers=4, hidden=128, heads=8, kv_ratio=2, head_dim=64))
PY
tiny=$(tail -n 1 "$work/tiny-model.txt")
for run in 1 2; do
  python3 bench/exactness.py -m "$tiny" --device cuda --parks-every 5 --engine-args "--tp 2" \
    --out "$work/exactness-cuda-tp2-run$run" 2>&1 | tail -n 16
  save
done
# Each matrix compares its cells with P0 from its first server, and several cells start servers of
# their own (--parallel 2, --ctx-size 1024): identity across TP=2 engine restarts is inside each run.
python3 - "$work" <<'PY' | tee "$work/exactness-tp2-runs.json"
import json, sys
w = sys.argv[1]
a, b = (json.load(open(f"{w}/exactness-cuda-tp2-run{i}.json")) for i in (1, 2))
verdicts = [[(c["name"], c["identical"]) for c in r["cells"]] for r in (a, b)]
print(json.dumps({"run1_all_identical": a["all_identical"], "run2_all_identical": b["all_identical"],
                  "same_verdicts": verdicts[0] == verdicts[1], "cells": len(verdicts[0])}))
PY
save
echo "== done in $(( $(date +%s) - start )) s"
