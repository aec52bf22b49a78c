#!/usr/bin/env bash
# Which kernels of a decode step gain or lose by PDL (bench/probes/pdl_sweep.py) for the 8B, the 30B-A3B MoE
# and the 4B hybrid shapes in one device call (~300 s), JSON under $OUT as each model ends, summary last.
# Per model a limit (PS_T_<model> s): 8b [110] (16 x 4096, 16 x 600, 1 x 600), moe [120] (16 x 512, 1 x 512),
# hybrid [70] (one row).   OUT=/tmp/x bench/gpu_pdl_sweep.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-pdl-sweep}
source bench/gpu_env.sh
lim() { local v="PS_T_$1"; echo "${!v:-$2}"; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
run() {  # label, limit, probe arguments
  local label=$1 limit=$2; shift 2
  stage "$label"
  timeout "$limit" python3 bench/probes/pdl_sweep.py "$@" --out "$OUT/pdl-$label-h200.json" > "$work/$label.log" 2>&1
  echo "$label rc $?"; grep "vs all" "$work/$label.log" | cut -c1-600 | tee -a "$OUT/summary.txt"
  tar -czf "$OUT/logs.tgz" -C "$work" .
}
run 8b "$(lim 8b 110)" --model 8b --cases 16x4096,16x600,1x600
run moe "$(lim moe 120)" --model 30b-a3b --cases 16x512,1x512 --repeats 1
run hybrid "$(lim hybrid 70)" --model 4b-hybrid
stage "done"
