# Sourced by the GPU scripts from the repository root: the wheels carried in .whl/ (the device image
# lacks gguf) on PYTHONPATH beside the tree, unbuffered output.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
