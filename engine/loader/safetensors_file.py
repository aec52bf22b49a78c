"""Reads safetensors files by their JSON header and memory-maps the tensors (bf16 kept as raw uint16)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from engine.errors import ModelLoadError, UnsupportedError
from lockstep_kernels.weights import Weight

_DTYPES = {"F32": (np.float32, "f32"), "F16": (np.float16, "f16"), "BF16": (np.uint16, "bf16")}


def read_header(path: Path) -> tuple[dict, int]:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{path.name}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", head)
            size = path.stat().st_size
            if n > size - 8 or n > 100_000_000:
                raise ModelLoadError(f"{path.name}: not a safetensors file (header length {n} exceeds the file)")
            meta = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path.name}: damaged safetensors header ({e})") from e
    meta.pop("__metadata__", None)
    return meta, 8 + n


def load_tensors(path: Path) -> dict[str, Weight]:
    meta, offset = read_header(path)
    size = path.stat().st_size
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in meta.items():
        dt = info.get("dtype")
        if dt not in _DTYPES:
            raise UnsupportedError(f"tensor {name}: unsupported tensor type {dt} (supported: F32, F16, BF16)")
        np_dt, tag = _DTYPES[dt]
        start, end = info["data_offsets"]
        if offset + end > size:
            raise ModelLoadError(f"{path.name}: truncated file (tensor {name} ends past the end of the file)")
        shape = tuple(info["shape"])
        arr = raw[offset + start : offset + end].view(np_dt)
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ModelLoadError(f"tensor {name}: {arr.size} values do not fill shape {shape}")
        out[name] = Weight(arr.reshape(shape), tag)
    return out
