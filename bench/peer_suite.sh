#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests, from the llama.cpp vendored in the
# llama-cpp-python sdist on PyPI), run unmodified against `lockstep-engine --device cpu` on the bundled
# model through bench/peer/llama-server (LLAMA_SERVER_BIN_PATH). Writes bench/evidence/peer-suite-cpu.{json,md}.
#
#   bench/peer_suite.sh                       # the 16 main files
#   bench/peer_suite.sh unit/test_basic.py    # chosen files or test ids (report under $CACHE only)
#   PEER_BASE=bench/evidence/peer-suite-cpu.json PEER_NOTE="why" bench/peer_suite.sh unit/test_sleep.py
#                                             # whole files re-run, their results replacing PEER_BASE's for
#                                             # them: the report under bench/evidence (report.py merge)
#
# Environment: LOCKSTEP_PEER_CACHE (default ~/.cache/lockstep-peer: sdist, extracted suite, venv),
# LOCKSTEP_PYTHON (the engine's python; default /work/main/.venv/bin/python if present, else python3),
# PEER_VERSION (default 0.3.36), PEER_PORT (default 8080), PEER_REPORT (report name, default peer-suite-cpu),
# PEER_DROP_UNKNOWN=1 (also drop flags the engine lacks: the method of the issue's baseline),
# PEER_PYTEST_ARGS (e.g. "-n 3": pytest-xdist workers, each on its own port as the suite's conftest sets).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${LOCKSTEP_PEER_CACHE:-$HOME/.cache/lockstep-peer}
VERSION=${PEER_VERSION:-0.3.36}
if [ -z "${LOCKSTEP_PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then LOCKSTEP_PYTHON=$ROOT/.venv/bin/python
  elif [ -x /work/main/.venv/bin/python ]; then LOCKSTEP_PYTHON=/work/main/.venv/bin/python
  else LOCKSTEP_PYTHON=python3; fi
fi
export LOCKSTEP_PYTHON
mkdir -p "$CACHE"

SDIST=$CACHE/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
  "$LOCKSTEP_PYTHON" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE"
fi
SRC=$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp
if [ ! -f "$SRC/tools/server/tests/utils.py" ]; then
  tar -xzf "$SDIST" -C "$CACHE" "llama_cpp_python-$VERSION/vendor/llama.cpp/tools/server/tests" \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates"
fi

# A throwaway venv that sees the project's packages and adds the suite's few others.
VENV=$CACHE/venv
if [ ! -x "$VENV/bin/python" ]; then
  "$LOCKSTEP_PYTHON" -m venv "$VENV"
  "$LOCKSTEP_PYTHON" -c "import site; print(site.getsitepackages()[0])" \
    > "$VENV/lib/python3.$("$LOCKSTEP_PYTHON" -c 'import sys; print(sys.version_info[1])')/site-packages/project.pth"
fi
"$VENV/bin/python" -c "import wget, prometheus_client, filelock, openai, requests, xdist" 2>/dev/null ||
  "$VENV/bin/pip" install -q wget prometheus-client filelock openai requests pytest pytest-xdist

MAIN_FILES="test_basic.py test_chat_completion.py test_completion.py test_compat_oai_responses.py test_ctx_shift.py
test_ignore_eos.py test_infill.py test_metrics.py test_security.py test_sleep.py test_slot_save.py test_speculative.py
test_stream.py test_template.py test_tokenize.py test_tool_call.py"
MERGE=()
if [ $# -gt 0 ] && [ -n "${PEER_BASE:-}" ]; then
  SELECT=("$@"); OUT=$ROOT/bench/evidence; MERGE=(--base "$(cd "$ROOT" && realpath "$PEER_BASE")" --note "${PEER_NOTE:-}")
elif [ $# -gt 0 ]; then SELECT=("$@"); OUT=$CACHE/partial; PEER_REPORT=${PEER_REPORT:-partial}; else
  SELECT=(); for f in $MAIN_FILES; do SELECT+=("unit/$f"); done; OUT=$ROOT/bench/evidence; fi
mkdir -p "$OUT"
DESELECT=$("$LOCKSTEP_PYTHON" "$ROOT/bench/peer/report.py" --deselect)

# Each run works in its own copy of the suite (its tests write ./tmp), on its own port (PEER_PORT).
RUN=$(mktemp -d "$CACHE/run.XXXXXX")
trap 'rm -rf "$RUN"' EXIT
mkdir -p "$RUN/llama.cpp/tools/server" "$RUN/llama.cpp/models"
cp -r "$SRC/tools/server/tests" "$RUN/llama.cpp/tools/server/"
cp -r "$SRC/models/templates" "$RUN/llama.cpp/models/"
export LLAMA_SERVER_BIN_PATH=$ROOT/bench/peer/llama-server
export LLAMA_CACHE=$RUN/llama-cache
export PORT=${PEER_PORT:-8080}
JUNIT=$RUN/junit.xml
cd "$RUN/llama.cpp/tools/server/tests"
mkdir -p tmp
# -p no:cacheprovider: the suite's tree stays as extracted; one worker: 2 cores serve one engine at a time
set +e
"$VENV/bin/python" -m pytest -p no:cacheprovider -q -rfE -m "not slow" --junitxml="$JUNIT" $DESELECT ${PEER_PYTEST_ARGS:-} \
  "${SELECT[@]}"
rc=$?
set -e
cp "$JUNIT" "$CACHE/last-junit.xml"  # the run's own copy goes with $RUN; report.py --junit reads it again
"$LOCKSTEP_PYTHON" "$ROOT/bench/peer/report.py" --junit "$JUNIT" --out "$OUT/${PEER_REPORT:-peer-suite-cpu}" \
  --version "$VERSION" --drop-unknown "${PEER_DROP_UNKNOWN:-0}" "${MERGE[@]}"
echo "pytest exit $rc; report: $OUT/peer-suite-cpu.md"
