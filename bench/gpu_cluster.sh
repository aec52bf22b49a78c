#!/usr/bin/env bash
# The one-row builds of issue 31 (the 4B hybrid's solo decode) on a GPU machine in one call: the
# cluster, gated and sums kernels' GPU tests (bits against the launches they replace), tiny dense
# models' decode graphs with clusters and sums on (test_cuda_graphs) and the tiny hybrids' decode with
# the conv in the delta rule's launch, beside the 4B hybrid's build; then its decode cells (exact on,
# solo and 16 chats, plain and launched ahead): the base build (0), the gated out_proj (g:
# plan.gated_launch) with the residual rows' sums for their norms (s: CudaOps.row_sums), the conv in the
# delta rule's launch (c: CudaOps.delta_conv), clusters of 4 (plan.cluster_launch), all (4gsc),
# clusters of 8; 0, 0gs, 4, 4gsc with a profile of the solo graph's kernels (profiles.tgz); last the
# one-row A/B (bench/probes/cluster_ab.py: times and bits).   OUT=/tmp/x bench/gpu_cluster.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-cluster}
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
pack() { tar -czf "$OUT/profiles.tgz" -C "$work" . 2>/dev/null; }
stage "tests beside the 4B build"
( timeout "${TESTS_S:-120}" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE --durations=5 \
    --junitxml="$work/pytest-cluster.xml" tests/test_cuda_matmul_cluster.py > "$OUT/pytest.txt" 2>&1 &
  # one-row graphs (clusters and sums on) against uncaptured many-row steps; the fused conv's decode
  LOCKSTEP_MM_CLUSTER=4 LOCKSTEP_MM_SUMS=1 timeout "${GRAPHS_S:-100}" python3 -m pytest -m gpu --noconftest \
    -p no:cacheprovider -q -rfE --junitxml="$work/pytest-graphs.xml" tests/test_cuda_graphs.py \
    tests/test_cuda_deltanet.py -k "graph_replay_equals or early_launched or fused_conv" \
    > "$work/pytest-graphs.txt" 2>&1 &
  wait
  cat "$work/pytest-graphs.txt" >> "$OUT/pytest.txt"
  python3 bench/gpu_summary.py --tests "$work/pytest-cluster.xml" "$OUT/gpu-tests-cluster-h200.json"
  python3 bench/gpu_summary.py --tests "$work/pytest-graphs.xml" "$work/gpu-tests-graphs-h200.json"
  touch "$work/tests.done" ) &
side=$!
timeout "${BENCH_S:-200}" python3 bench/hybrid_decode.py --out "$OUT/hybrid-4b-cluster-h200.json" \
  --quiet-after "$work/tests.done" --matvec off --modes on --cluster "${CLUSTERS:-0,0gs,0c,4,4gsc,8}" \
  --profile-builds 0,0gs,4,4gsc \
  --profile "$work/hybrid-4b-profile-cluster-h200.json" > "$OUT/hybrid-4b.log" 2>&1
stage "4b hybrid done"
grep -v "first layers" "$OUT/hybrid-4b.log" | tail -n 70
pack
wait "$side"
stage "tests done"
grep -E "passed|failed|error" "$OUT/pytest.txt" | tail -n 8
timeout "${AB_S:-30}" python3 bench/probes/cluster_ab.py --out "$OUT/cluster-ab-h200.json" 2>&1 | tail -n 24
pack
stage "done"
