#!/usr/bin/env bash
# Mixture-of-experts on CUDA in one go on a GPU machine, within a time budget, stages in the order given:
#   tests     the MoE GPU tests (tests/test_cuda_moe.py), then the fused q/k norm test and the Qwen3 graph tests
#   moetests  the MoE GPU tests only
#   decode    bench/moe_decode.py on the 30B-A3B shape built in memory (48 layers; exact on, off; kernel
#             profile with PDL and without; the kernel variants of moe_decode.py's KERNEL_VARIANTS)
#   decodeq8  the same shape with Q8_0 routed experts, exact on, 1 and 16 rows
#   decodeN   the same at N layers, exact on only (the in-memory side of the engine comparison)
#   engineN   bench/throughput.py through the HTTP engine (exact on and off, solo and 16 chats) on an
#             N-layer 30B-A3B GGUF written here (48 layers at F16 would be 60 GB)
#   exactness the exactness matrix on a tiny bf16 qwen3_moe, exact on and off (the control)
# Each stage gets at most what is left of the budget; a stage cut short keeps the results before it.
# JSON under $OUT (at most 8 files come back), a summary last.
#   bench/gpu_moe.sh [BUDGET_S] [STAGES]   (defaults: 400 s; tests,decode,engine8,exactness)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-moe}
source bench/gpu_env.sh
budget=${1:-400}; stages=${2:-tests,decode,engine8,exactness}
left() { local l=$(( budget - ($(date +%s) - start) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 1 ? l : 1 )); }
lap() { echo "== $1 done at $(( $(date +%s) - start )) s"; }

for stage in ${stages//,/ }; do
  case $stage in
  tests|moetests)
    timeout "$(left 200)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -s -rfE --durations=8 \
      --junitxml="$work/moe-tests.xml" tests/test_cuda_moe.py > "$work/moe-tests.txt" 2>&1
    grep -E "relative L2|passed|failed|Error|error|assert|^E  " "$work/moe-tests.txt" | tail -n 60
    python3 -c "import sys; sys.path.insert(0, 'bench'); from gpu_summary import junit_to_json as j; j(*sys.argv[1:])" \
      "$work/moe-tests.xml" "$OUT/moe-tests.json" || cp "$work/moe-tests.txt" "$OUT/"
    [ "$stage" = moetests ] && { lap "$stage"; continue; }
    # the fused Qwen3 q/k norm + rope + cache write, and the dense graphs it and the grouped kernels touch
    timeout "$(left 100)" python3 -m pytest -m gpu --noconftest -p no:cacheprovider -q -rfE \
      --junitxml="$work/dense-tests.xml" tests/test_cuda_ops.py tests/test_cuda_graphs.py \
      -k "qk_norm_rope_write or (replay_equals_uncaptured_step and qwen3) or follow_cpu or early_launched" 2>&1 | tail -n 6
    python3 -c "import sys; sys.path.insert(0, 'bench'); from gpu_summary import junit_to_json as j; j(*sys.argv[1:])" \
      "$work/dense-tests.xml" "$OUT/dense-tests.json"
    ;;
  decode)
    # attn_mma for the prefill (not what this stage measures): no attention_wgmma.cu build on its time
    LOCKSTEP_WGMMA_ATTN=0 timeout "$(left 150)" python3 bench/moe_decode.py --shape 30b-a3b --buckets 1,16 --steps 30 --profile \
      --profile-pdl-off --kernel-variants --out "$OUT/moe-decode-30b-a3b.json" 2>&1 | grep -v "^{" | tail -n 30
    ;;
  decodeq8)
    LOCKSTEP_WGMMA_ATTN=0 timeout "$(left 45)" python3 bench/moe_decode.py --shape 30b-a3b --buckets 1,16 --steps 30 \
      --modes on --expert-dtype q8_0 --out "$OUT/moe-decode-30b-a3b-q8.json" 2>&1 | grep -v "^{" | tail -n 8
    ;;
  decode[0-9]*)
    n=${stage#decode}
    timeout "$(left 60)" python3 bench/moe_decode.py --shape 30b-a3b --layers "$n" --buckets 1,16 --steps 30 \
      --modes on --out "$OUT/moe-decode-30b-a3b-l$n.json" 2>&1 | grep -v '^{' | tail -n 4
    ;;
  engine[0-9]*)
    n=${stage#engine}
    python3 - "$n" <<'PY'
import sys; sys.path.insert(0, "bench")
import shapes
shapes.SHAPES["30b-a3b"] = dict(shapes.SHAPES["30b-a3b"], layers=int(sys.argv[1]))
shapes.write_shape("/tmp/moe-30b-a3b.gguf", "30b-a3b", 0)
PY
    lap "gguf written"
    timeout "$(left 300)" python3 bench/throughput.py -m /tmp/moe-30b-a3b.gguf --shape 30b-a3b --vocab 151936 \
      --cells 1,16 --repeats 1 --gen 64 --out "$OUT/moe-throughput-30b-a3b-l$n" 2>&1 | tail -n 12
    rm -f /tmp/moe-30b-a3b.gguf
    ;;
  exactness)
    # bf16 like the real Qwen3-MoE files; head dim 32 (the attention builds are for 32 .. 256)
    python3 - > "$work/tiny-moe.txt" 2> "$work/tiny-moe.err" <<'PY'
import tempfile
from tests.tiny_moe import make_moe_hf_model
print(make_moe_hf_model(tempfile.mkdtemp(), dtype="bfloat16", hidden=128, heads=4, kv_heads=2, head_dim=32,
                        experts=16, top_k=4, expert_ffn=64))
PY
    tiny=$(tail -n 1 "$work/tiny-moe.txt")
    for mode in on off; do
      timeout "$(left 45)" python3 bench/exactness.py -m "$tiny" --device cuda --exact $mode \
        --out "$work/moe-exactness-cuda-$mode" 2>&1 | tail -n 17
    done
    python3 - "$work" "$OUT/moe-exactness-cuda.json" <<'PY'
import json, os, sys
got = {m: json.load(open(p)) for m in ("on", "off") if os.path.exists(p := f"{sys.argv[1]}/moe-exactness-cuda-{m}.json")}
json.dump(got, open(sys.argv[2], "w"), indent=1)
PY
    ;;
  esac
  lap "$stage"
done
python3 - "$OUT" <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try:
        d = json.load(open(p))
    except ValueError:
        continue
    name = p.rsplit("/", 1)[1]
    if isinstance(d, dict) and set(d) <= {"on", "off"}:
        for m, e in d.items():
            print(name, m, "all_identical", e["all_identical"], "differ:", [c["name"] for c in e["cells"] if not c["identical"]])
    elif isinstance(d, dict) and "decode" in d:
        print(name, json.dumps({k: d[k] for k in ("layers", "decode", "on_off") if k in d}))
    elif isinstance(d, dict) and "passed" in d:
        print(name, {k: d[k] for k in ("passed", "failed", "error", "skipped")})
    else:
        print(name, json.dumps(d)[:600])
PY
