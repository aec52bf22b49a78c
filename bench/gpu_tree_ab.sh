#!/usr/bin/env bash
# The engine's 8B cells in two source trees in one device call (an A/B of a change the probes already
# timed): for each tree, bench/throughput.py 1 and 16 chats x 512-token prompts and 16 chats x 4096, and
# bench/longctx.py's 30000-token prompt (decode after it), exact on. reports in $OUT/tree-ab.tgz, tables in $OUT/summary.txt.
#   OUT=/tmp/x bench/gpu_tree_ab.sh before:.clean after:.clean_new      (trees made by git archive)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-tree-ab}
source bench/gpu_env.sh
root=$PWD
shape8b_bg
wait "$shape"; echo "shape rc $?"
for pair in "$@"; do
  label=${pair%%:*}; tree=$root/${pair#*:}
  stage "$label"
  ( cd "$tree" && export PYTHONPATH=/tmp/site:$tree &&
    timeout 120 python3 bench/throughput.py -m /tmp/shape-8b.gguf --shape 8b --vocab 128256 --device cuda \
      --cells 1,16 --modes on --prompt 512 --gen 128 --repeats 1 --out "$work/$label-512" > "$work/$label-512.log" 2>&1
    echo "$label 512 rc $?"
    timeout 100 python3 bench/throughput.py -m /tmp/shape-8b.gguf --shape 8b --vocab 128256 --device cuda \
      --cells 16 --modes on --prompt 4096 --gen 64 --repeats 1 --out "$work/$label-4096" > "$work/$label-4096.log" 2>&1
    echo "$label 4096 rc $?"
    timeout 100 python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b --prompts 30000 --modes on --gen 64 \
      --out "$work/$label-longctx" > "$work/$label-longctx.log" 2>&1
    echo "$label longctx rc $?" )
done
stage "done"
for pair in "$@"; do
  label=${pair%%:*}
  for f in "$work/$label"-*.md; do echo "== $f"; grep -E '^\| [0-9]' "$f"; done
done | tee "$OUT/summary.txt"
tar -czf "$OUT/tree-ab.tgz" -C "$work" .
