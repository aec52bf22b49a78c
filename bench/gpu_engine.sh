#!/usr/bin/env bash
# The engine end to end on a GPU machine, in one go: bench/throughput.py on the 1B shape (exact on and
# off interleaved), bench/speculation.py on the bundled model, then the exactness matrix on CUDA (a tiny
# model with exact on and off, the 1B shape with exact on). JSON under $OUT; summary last.
# Needs the gguf wheel carried in .whl/ (the device image lacks it):
#   bench/gpu_engine.sh [--quick] [--8b] [--throughput-only]
#   (--quick: one repeat; --8b: also the 8B shape's throughput; --throughput-only: no speculation or
#   exactness runs)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-engine}
save() { cp "$work"/*.json "$OUT"/ 2>/dev/null; }  # after each step: a run cut short keeps what it did
source bench/gpu_env.sh
repeats=3; with_8b=0; rest=1
for arg in "$@"; do
  case $arg in --quick) repeats=1 ;; --8b) with_8b=1 ;; --throughput-only) rest=0 ;; esac
done

python3 - <<'PY'
import sys; sys.path.insert(0, "bench")
from shapes import write_shape
write_shape("/tmp/shape-1b.gguf", "1b", 0)
PY
python3 bench/throughput.py -m /tmp/shape-1b.gguf --shape 1b --vocab 128256 --device cuda --repeats $repeats \
  --out "$work/throughput-1b" 2>&1 | tee "$work/throughput-1b.log" | tail -n 20
save
if [ $with_8b = 1 ]; then
  python3 -c 'import sys; sys.path.insert(0, "bench"); from shapes import write_shape; write_shape("/tmp/shape-8b.gguf", "8b", 0)'
  python3 bench/throughput.py -m /tmp/shape-8b.gguf --shape 8b --vocab 128256 --device cuda --repeats $repeats \
    --out "$work/throughput-8b" 2>&1 | tee "$work/throughput-8b.log" | tail -n 12
  save
  rm -f /tmp/shape-8b.gguf
fi
if [ $rest = 0 ]; then echo "== done in $(( $(date +%s) - start )) s"; exit 0; fi
python3 bench/speculation.py --device cuda --out "$work/speculation-h200" 2>&1 | tail -n 22
save
python3 - <<'PY' > "$work/tiny-model.txt" 2>&1
import tempfile
from tests.tiny_models import make_hf_model
print(make_hf_model(tempfile.mkdtemp(), "llama", layers=4, hidden=128, heads=4, head_dim=64))
PY
tiny=$(tail -n 1 "$work/tiny-model.txt")
python3 bench/exactness.py -m "$tiny" --device cuda --out "$work/exactness-cuda-tiny" 2>&1 | tail -n 14
save
python3 bench/exactness.py -m "$tiny" --device cuda --exact off --out "$work/exactness-cuda-tiny-off" 2>&1 | tail -n 14
save
python3 bench/exactness.py -m /tmp/shape-1b.gguf --device cuda --out "$work/exactness-cuda-1b" 2>&1 | tail -n 14
save
echo "== done in $(( $(date +%s) - start )) s"
