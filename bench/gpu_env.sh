# Sourced by the GPU scripts from the repository root (after setting $OUT): $OUT made, the wheels
# carried in .whl/ (the device image lacks gguf) on PYTHONPATH beside the tree, unbuffered output, and
# `stage NAME`, which prints NAME and the seconds since this point.
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
start=$(date +%s)
stage() { echo "== $1 at $(( $(date +%s) - start )) s"; }
