#!/usr/bin/env bash
# The one-row K-quant (and f16) decode kernels (issue 29) in one device call, stages in order, each under
# its limit (KO_T_<stage> s), JSON under $OUT as stages end, tables in summary.txt:
#   tests   the GPU tests that hold their bits: a row alone = inside batches (K-quants, f16, bf16), with the
#           norm prologue = the separate ops (KO_TESTS: another -k expression)                      [240]
#   probe   bench/kquant_mm.py --probe: the one-row kernel's builds (PROBE_BUILDS; KO_BUILDS=0,1 picks
#           some) at three splits, each build's bits against the default build's; at split 16 mm_*_one
#           against mm_*_one16; mm_*_one against mm_*_oneh (16-bit input)                          [150]
#   x16     the 16-row kernel's builds (X16_BUILDS: prefetching) the same way, and mm_*_tm2h against
#           mm_*_tm2h2 (two row tiles a block, plan.X16_RT2_TYPES; RT2_BUILDS)                    [300]
#   ab      bench/gpu_profile.py --gguf on the 8B Q4_K_M shape at 1 and 16 rows for the tree in $OLD and
#           this tree: per-kernel medians and the step's logits' SHA-1 (equal when bits are kept)    [100 each]
#   engine  bench/throughput.py, this tree, solo and 16 chats, exact on                              [100]
#   engine1b  the same on the 1B Q4_K_M shape (not by default)                                     [100]
# $OLD (default .ab-old, ignored: name it in the call's carry, with .whl) is made here with
#   rm -rf .ab-old && mkdir .ab-old && git archive COMMIT contract settings lockstep_kernels engine bench | tar -x -C .ab-old
# The kernel cache comes back as cupy-cache.tgz: unpack it into .cupy-cache/ and carry that in the next call.
#   OUT=/tmp/x bench/gpu_kq_one.sh [tests,probe,ab,engine]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-kq-one}
source bench/gpu_env.sh
lim() { local v="KO_T_$1"; echo "${!v:-$2}"; }
stages=${1:-tests,probe,ab,engine}
has() { [[ ",$stages," == *",$1,"* ]]; }
model=/tmp/shape-8b-q4km.gguf
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/summary.txt"
shape=
if has ab || has engine; then shape8b_q4km_bg; fi  # the 8B file, written while the kernels build
if has tests; then
  stage "tests"
  timeout "$(lim tests 240)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE --junitxml="$work/tests.xml" \
    tests/test_cuda_ops.py -k "${KO_TESTS:-test_kquant_one_row or test_kquant_two_tile or test_matmul_row_invariant or test_norm_matmul_equals}" \
    > "$work/tests.txt" 2>&1
  echo "tests rc $?"; grep -E '^(FAILED|ERROR) ' "$work/tests.txt" | cut -c1-300 | head -n 12; tail -n 1 "$work/tests.txt" | tee -a "$OUT/summary.txt"
  [ -f "$work/tests.xml" ] && python3 bench/gpu_summary.py --tests "$work/tests.xml" "$OUT/kq-one-tests.json"
fi
if has probe; then
  stage "probe"
  timeout "$(lim probe 150)" python3 bench/kquant_mm.py --probe ${KO_BUILDS:+--builds $KO_BUILDS} --out "$OUT/kq-one-probe.json" > "$work/probe.log" 2>&1
  echo "probe rc $?"; grep -E "us .* GB/s|FAILED" "$work/probe.log" | tee -a "$OUT/summary.txt" | tail -n 40
fi
if has x16; then
  stage "x16"
  timeout "$(lim x16 300)" python3 bench/kquant_mm.py --probe --x16 --out "$OUT/kq-x16-probe.json" > "$work/x16.log" 2>&1
  echo "x16 rc $?"; grep -E "us .* GB/s|FAILED" "$work/x16.log" | tee -a "$OUT/summary.txt" | tail -n 40
fi
[ -n "$shape" ] && { wait $shape; echo "shape rc $?"; }
if has ab; then
  old=$(realpath "${OLD:-.ab-old}")
  for tree in old new; do
    stage "ab $tree"
    dir=$PWD; [ $tree = old ] && dir=$old
    ( cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout "$(lim ab 100)" python3 bench/gpu_profile.py --gguf $model --batch 1 16 \
        --ctx 600 --out "$OUT/profile-$tree.json" ) > "$work/$tree.log" 2>&1
    echo "$tree rc $?"; tail -n 2 "$work/$tree.log" | cut -c1-300; grep -E '^==|^  mm_' "$work/$tree.log" | tee -a "$OUT/summary.txt"
  done
fi
if has engine; then
  stage "engine"
  timeout "$(lim engine 100)" python3 bench/throughput.py -m $model --shape 8b --quant q4_k_m --vocab 128256 --device cuda \
    --cells 1,16 --modes on --prompt 512 --gen 64 --repeats 1 --out "$work/engine" > "$work/engine.log" 2>&1
  echo "engine rc $?"; cp "$work/engine.json" "$OUT/throughput-8b-q4km.json" 2>/dev/null
  grep -E '^\| ' "$work/engine.md" 2>/dev/null | tee -a "$OUT/summary.txt"
fi
if has engine1b; then
  stage "engine1b"
  timeout "$(lim engine1b 100)" python3 bench/throughput.py --shape 1b --quant q4_k_m --device cuda \
    --cells 1,16 --modes on --prompt 512 --gen 64 --repeats 1 --out "$work/engine1b" > "$work/engine1b.log" 2>&1
  echo "engine1b rc $?"; cp "$work/engine1b.json" "$OUT/throughput-1b-q4km.json" 2>/dev/null
  grep -E '^\| ' "$work/engine1b.md" 2>/dev/null | tee -a "$OUT/summary.txt"
fi
stage "done"
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null
save_cache
