#!/bin/sh
# Installs into a venv: scripts/install.sh VENV_PYTHON PIP_INSTALL_ARGS...
# uv (from PyPI, into the venv) resolves, downloads and installs in parallel: a first `make run` install took
# 8 s with it against 60-80 s with pip, which fetches one package after another (2 busy cores). pip when uv
# cannot be had, when it fails, or with LOCKSTEP_NO_UV=1 (uv reads no pip.conf: a private index wants pip).
py=$1
shift
uv="$(dirname "$py")/uv"
if [ -z "$LOCKSTEP_NO_UV" ]; then
  if [ ! -x "$uv" ]; then
    echo "==> getting uv, a parallel installer, into the venv (LOCKSTEP_NO_UV=1 uses pip alone)"
    "$py" -m pip install --progress-bar on --disable-pip-version-check --no-compile uv || echo "==> no uv: pip it is"
  fi
  if [ -x "$uv" ]; then
    "$uv" pip install --python "$py" "$@" && exit 0
    echo "==> uv could not install it; trying pip"
  fi
fi
# --no-compile: byte-compiling every installed file was 12 of a 95 s first install; Python compiles what
# the studio imports when it first starts.
exec "$py" -m pip install --progress-bar on --disable-pip-version-check --no-compile "$@"
