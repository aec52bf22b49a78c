# Sourced by the GPU scripts from the repository root (after setting $OUT): $OUT made, the wheels
# carried in .whl/ (the device image lacks gguf) on PYTHONPATH beside the tree, unbuffered output, and
# `stage NAME`, which prints NAME and the seconds since this point; $work, a scratch folder for logs
# and tables (a call brings back 8 files from $OUT), named for the script.
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
# CuPy's kernel cache: .cupy-cache/ where a call carries it (unpacked here from an earlier call's
# cupy-cache.tgz), so a fresh machine rebuilds only the kernels whose sources changed; save_cache puts
# it under $OUT (one of the 8 files a call brings back) when it packs under 15 MB.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$([ -d .cupy-cache ] && echo "$PWD/.cupy-cache" || echo /tmp/cupy-cache)}
save_cache() {
  tar -czf /tmp/cupy-cache.tgz -C "$CUPY_CACHE_DIR" . 2>/dev/null &&
    if [ "$(stat -c %s /tmp/cupy-cache.tgz)" -lt 15000000 ]; then cp /tmp/cupy-cache.tgz "$OUT/"; else echo "kernel cache over 15 MB packed: not saved"; fi
}
work=/tmp/$(basename "$0" .sh | tr _ -)-work
mkdir -p "$work"
start=$(date +%s)
stage() { echo "== $1 at $(( $(date +%s) - start )) s"; }
# The 8B bench shape to /tmp/shape-8b.gguf in the background (kept if there), its pid in $shape.
shape8b_bg() {
  ( [ -f /tmp/shape-8b.gguf ] || python3 -c 'import sys; sys.path.insert(0, "bench"); from shapes import write_shape; write_shape("/tmp/shape-8b.gguf", "8b", 0)' ) \
    > "$work/shape.log" 2>&1 &
  shape=$!
}
# The 8B Q4_K_M-like shape to /tmp/shape-8b-q4km.gguf in the background (kept if there), its pid in $shape.
shape8b_q4km_bg() {
  ( [ -f /tmp/shape-8b-q4km.gguf ] || python3 -c 'import sys; sys.path.insert(0, "bench"); from shapes import write_shape; write_shape("/tmp/shape-8b-q4km.gguf", "8b", 0, "q4_k_m")' ) \
    > "$work/shape.log" 2>&1 &
  shape=$!
}
