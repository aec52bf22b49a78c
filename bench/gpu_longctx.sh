#!/usr/bin/env bash
# Long prompts and contexts on a GPU machine (issue 32), in one go, JSON under $OUT, summary last:
#   bench/gpu_longctx.sh kernel   the attention GPU tests, then bench/attn_bench.py (one layer, 8B shape)
#   bench/gpu_longctx.sh engine   bench/longctx.py on the 8B shape (exact on and off, -c 32768)
#   bench/gpu_longctx.sh engine1b the same on the 1B shape, one repeat
#   bench/gpu_longctx.sh sweep    bench/attn_sweep.py: decode launch plans and prefill tiles, graph-timed
#   bench/gpu_longctx.sh attn     the attention GPU tests (LC_TESTS, default test_cuda_attention and _selfcheck), 8 workers
#   bench/gpu_longctx.sh ncu      Nsight Compute on one decode and one prefill attention launch at 30000 keys
#   bench/gpu_longctx.sh chats    bench/throughput.py on the 8B shape: 16 chats of 4096-token prompts
#   bench/gpu_longctx.sh profile  bench/gpu_profile.py: an 8B decode step at 30000 positions, kernel by kernel
#   bench/gpu_longctx.sh exactness1b  the exactness matrix on the 1B shape with a 20000-token prompt cell
#                                 (LC_ONLY=x: of the cells with servers of their own only x: base and long cells)
# Each stage runs under its own timeout: LC_T_<stage> seconds, else LC_TIMEOUT, default 300.
# Needs the gguf wheel carried in .whl/ for `engine` (the device image lacks it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-longctx}
source bench/gpu_env.sh
lim() { local v="LC_T_$1"; echo "${!v:-${LC_TIMEOUT:-300}}"; }
shape8b() { [ -f /tmp/shape-8b.gguf ] || python3 -c 'import sys; sys.path.insert(0, "bench"); from shapes import write_shape; write_shape("/tmp/shape-8b.gguf", "8b", 0)'; }
for what in "$@"; do
  case $what in
    sweep)
      timeout "$(lim sweep)" python3 bench/attn_sweep.py --out "$OUT/attn-sweep.json" 2>&1 | tee "$work/sweep.log" | tail -n 40 ;;
    attn)
      timeout "$(lim attn)" python3 -m pytest -m gpu --noconftest -q -p no:cacheprovider -n "${LC_WORKERS:-8}" -rfE \
        ${LC_TESTS:-tests/test_cuda_attention.py tests/test_cuda_selfcheck.py} 2>&1 | tee "$OUT/attn-tests.log" | tail -n 15 ;;
    ncu)
      timeout "$(lim ncu)" ncu --clock-control none -k regex:attn_ --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 bench/attn_sweep.py --once > "$OUT/ncu.txt" 2>&1; tail -n 5 "$OUT/ncu.txt" ;;
    profile)  # a decode step of the 8B shape after 30000 positions, each kernel's time (CUPTI)
      timeout "$(lim profile)" python3 bench/gpu_profile.py --shape 8B --batch 1 --ctx 30000 --reps 5 \
        --out "$OUT/step-profile-8b-30k.json" 2>&1 | tail -n 14 ;;
    chats)
      shape8b
      timeout "$(lim chats)" python3 bench/throughput.py -m /tmp/shape-8b.gguf --shape 8b --vocab 128256 --device cuda \
        --cells 16 --prompt 4096 --gen 64 --repeats 1 --out "$OUT/throughput-8b-chats4k" 2>&1 \
        | tee "$work/chats.log" | tail -n 12 ;;
    kernel)
      python3 -m pytest -m gpu --noconftest -q -p no:cacheprovider tests/test_cuda_attention.py tests/test_cuda_graphs.py \
        2>&1 | tee "$OUT/tests.log" | tail -n 25
      python3 bench/attn_bench.py --out "$OUT/attn-bench.json" 2>&1 | tail -n 12 ;;
    engine)
      shape8b
      stage "shape written"
      timeout "$(lim engine)" python3 bench/longctx.py -m /tmp/shape-8b.gguf --shape 8b --prompts "${LC_PROMPTS:-512,2048,8192,30000}" \
        --out "$OUT/longctx-h200" 2>&1 | tee "$work/longctx.log" | tail -n 30 ;;
    exactness1b)  # the exactness matrix on the 1B shape with the 20000-token cell (not run yet)
      python3 -c 'import sys; sys.path.insert(0, "bench"); from shapes import write_shape; write_shape("/tmp/shape-1b.gguf", "1b", 0)'
      timeout "$(lim exactness1b)" python3 bench/exactness.py -m /tmp/shape-1b.gguf --device cuda --long-prompt 20000 \
        ${LC_ONLY:+--only "$LC_ONLY"} --out "$OUT/exactness-cuda-1b-long20k" 2>&1 | tail -n 18 ;;
    engine1b)
      python3 bench/longctx.py --shape 1b --repeats 1 --prompts 2048,8192,30000 --out "$OUT/longctx-1b-h200" 2>&1 \
        | tee "$OUT/longctx-1b.log" | tail -n 16 ;;
  esac
  stage "$what done"
done
