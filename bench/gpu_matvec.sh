#!/usr/bin/env bash
# matvec.cu (one-row ring kernel) on a GPU machine in one call, each stage under its own limit (env
# vars, seconds), results under $OUT as each stage ends: the one-row matmuls of the 4B hybrid and 8B
# shapes, mm_tc against matvec.cu's builds with bit checks (bench/probes/matvec_ab.py); the table of
# builds a decode step spends least on (matvec_pick.py); the GPU tests of the one-row kernels; the 4B
# hybrid's decode (solo and 16, exact on and off, with the solo profile) planned with that table; and
# solo exact on with mm_tc for the A/B. The tests run with LOCKSTEP_MATVEC=1 (the kernel is off by
# default).   OUT=/tmp/x bench/gpu_matvec.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-matvec}
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
stage "one-row matmuls: mm_tc against matvec.cu's builds"
timeout "${PROBE_S:-150}" python3 bench/probes/matvec_ab.py --out "$OUT/matvec-ab-h200.json" > "$work/probe.log" 2>&1
echo "probe rc $?"; grep -E "^best|bit-equal" "$work/probe.log"
python3 bench/probes/matvec_pick.py "$OUT/matvec-ab-h200.json" "$OUT/matvec-table.json" || cp /dev/null "$OUT/matvec-table.json"
stage "GPU tests of the one-row kernels"
tests=(tests/test_cuda_matvec.py tests/test_cuda_ops.py tests/test_cuda_selfcheck.py)
only="(matvec or row_invariant or norm_matmul or gated_product or ffn_equals or residual_epilogue or every_family)"
LOCKSTEP_MATVEC=1 timeout "${TESTS_S:-120}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE --junitxml="$work/pytest.xml" \
  "${tests[@]}" -k "$only and not q4_k and not q6_k and not q8_0 and not f32" > "$work/pytest.txt" 2>&1
echo "pytest rc $?"; tail -n 8 "$work/pytest.txt"
[ -f "$work/pytest.xml" ] && python3 bench/gpu_summary.py --tests "$work/pytest.xml" "$OUT/gpu-tests-matvec-h200.json"
table="$OUT/matvec-table.json"; [ -s "$table" ] || table=on
stage "4b hybrid decode, matvec.cu as picked ($table)"
timeout "${BENCH_S:-200}" python3 bench/hybrid_decode.py --matvec "$table" --chats 1,16 --modes on,off \
  --out "$OUT/hybrid-4b-mv-h200.json" --profile "$OUT/hybrid-4b-profile-mv-h200.json" > "$work/bench.log" 2>&1
echo "bench rc $?"; grep -E "exact|weights|step|kernels" "$work/bench.log" | head -n 30
stage "4b hybrid solo decode, mm_tc"
timeout "${BASE_S:-90}" python3 bench/hybrid_decode.py --matvec off --chats 1 --modes on --out "$OUT/hybrid-4b-mm-h200.json" \
  > "$work/base.log" 2>&1
echo "base rc $?"; grep -E "exact" "$work/base.log"
tar -czf "$OUT/logs.tgz" -C "$work" .
stage "done"
