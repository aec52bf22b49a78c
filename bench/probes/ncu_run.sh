#!/usr/bin/env bash
# Nsight Compute on the kernels of bench/probes/ncu_targets.py; one text report per target under $OUT.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/ncu}
mkdir -p "$OUT"
sections="--section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats"
# targets to profile: the arguments (e.g. tm1 tm2), else all
declare -A kernels=([wgmma]=mm_wgmma_tma [tm2]=mm_f16_tm2 [tm1]=mm_f16_tm1
                    [attn_prefill]=attn_partial [attn_decode]=attn_partial
                    [q4k1]=mm_q4k_one [q4k16]=mm_q4k_tm2 [q6k1]=mm_q6k_one)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wgmma tm2 tm1 attn_prefill attn_decode)
for target in "${targets[@]}"; do
  kernel=${kernels[$target]:-}
  [ -n "$kernel" ] || { echo "unknown target $target (known: ${!kernels[*]})"; exit 2; }
  timeout 150 ncu $sections --print-details all --launch-skip 1 --launch-count 1 -k "regex:^$kernel" \
    python3 bench/probes/ncu_targets.py "$target" > "$OUT/ncu-$target.txt" 2>&1
  echo "$target rc=$? $(wc -l < "$OUT/ncu-$target.txt") lines"
done
