#!/usr/bin/env bash
# delta_decode (issue 31: the DeltaNet mixer's decode rows in one launch) on a GPU machine in one call:
# its GPU tests and the hybrid decode tests it touches, beside the 4B hybrid shape's build; then the
# 4B hybrid's decode (exact on/off, solo and 16 chats) with cells nofuse (the separate launches) and
# rmsloop (rms_norm without its values in registers), ffnnorm (the FFN norm in gate_up's prologue), the solo graph's kernel profile with and without it.
# Last, with AB_OLD (an older deltanet.cu; default deltanet-main.cu where it exists) the mixer's
# launches A/B (bench/probes/delta_decode_ab.py). Each stage has its own limit; JSON lands in $OUT as
# each ends.   OUT=/tmp/x bench/gpu_delta_decode.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-delta-decode}
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stage "tests beside the 4B build"
( timeout "${TESTS_S:-75}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE --durations=5 \
    --junitxml="$work/pytest.xml" tests/test_cuda_delta_decode.py tests/test_cuda_rms_norm_reg.py tests/test_cuda_hybrid_ahead.py \
    "tests/test_cuda_deltanet.py::test_tiny_qwen3_5_decode_graphs_give_the_uncaptured_bits" \
    "tests/test_cuda_deltanet.py::test_decode_rows_are_the_same_bits_in_any_batch" \
    "tests/test_cuda_deltanet.py::test_tiny_qwen3_5_logits_match_the_cpu_backend" > "$OUT/pytest.txt" 2>&1
  python3 bench/gpu_summary.py --tests "$work/pytest.xml" "$OUT/gpu-tests-delta-decode-h200.json"
  touch "$work/tests.done" ) &
side=$!
timeout "${BENCH_S:-135}" python3 bench/hybrid_decode.py --out "$OUT/hybrid-4b-fused-h200.json" \
  --quiet-after "$work/tests.done" --matvec off --variants base,nofuse,rmsloop,ffnnorm --variant-chats 1,16 --profile "$OUT/hybrid-4b-profile-fused-h200.json" \
  --profile-variants base,nofuse,rmsloop > "$OUT/hybrid-4b.log" 2>&1
stage "4b hybrid done"
grep -v "first layers" "$OUT/hybrid-4b.log" | tail -n 60
wait "$side"
stage "tests done"
tail -n 15 "$OUT/pytest.txt"
if [ -f "${AB_OLD:-deltanet-main.cu}" ]; then  # the three launches of an older deltanet.cu against delta_decode
  timeout "${AB_S:-20}" python3 bench/probes/delta_decode_ab.py "${AB_OLD:-deltanet-main.cu}" \
    --out "$OUT/delta-decode-ab-h200.json" 2>&1 | tail -n 4
  stage "delta_decode A/B done"
fi
stage "done"
