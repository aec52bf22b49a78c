#!/bin/sh
# Prints ",cuda12" or ",cuda13" when an NVIDIA driver is present, nothing otherwise.
command -v nvidia-smi >/dev/null 2>&1 || exit 0
ver=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
[ -n "$ver" ] || exit 0
if [ "$ver" -ge 13 ]; then echo ",cuda13"; else echo ",cuda12"; fi
