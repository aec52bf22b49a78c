#!/usr/bin/env bash
# One device call for everything issue 6 and 10 report: the GPU tests and op benchmarks
# (gpu_check.sh), then the engine runs (gpu_engine.sh --8b: 1B and 8B throughput, speculation,
# the exactness matrix). Fits the 8 files a call brings back; about 8 minutes on an H200.
# Needs the gguf wheel carried in .whl/. Afterwards, here: python bench/collect_results.py DIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-all}
mkdir -p "$OUT"
OUT=/tmp/gpu-check bash bench/gpu_check.sh 2>&1 | tail -n 30
cp /tmp/gpu-check/gpu-tests.json /tmp/gpu-check/gpu-ops.json "$OUT"/ 2>/dev/null
OUT=$OUT bash bench/gpu_engine.sh --8b "$@" 2>&1 | grep -v '^rep ' | tail -n 60
# where an 8B prompt's time goes (printed: the call's 8 returned files are taken)
PYTHONPATH=$PWD timeout 150 python3 bench/gpu_profile.py --shape 8B --prefill 512 --reps 5 2>&1 | tail -n 22
