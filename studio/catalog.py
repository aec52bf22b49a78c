"""The models on disk: GGUF files and Hugging Face folders, described from their headers only.

Weights are never read: a GGUF header is parsed through a memory map (GGUFReader touches only the
pages holding the header and tensor table) and a .safetensors file is read up to its JSON header.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel

from studio.resources import asset

# A safetensors header beyond this is not a header we should trust (the format caps it at 100 MB).
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
SCAN_DEPTH = 3


class ModelInfo(BaseModel):
    id: str
    path: str
    format: str  # "gguf" or "hf"
    architecture: str | None = None
    parameters: int | None = None
    tensor_types: list[str] = []
    tensor_counts: dict[str, int] = {}  # tensors per stored type, most first
    quant_mix: str | None = None  # e.g. "Q4_K_M: Q4_K 190, Q6_K 33, F32 65" (the label: the file's own file_type)
    size_bytes: int = 0
    native_context: int | None = None
    # Set when the files are there but their metadata could not be read; the model is still listed.
    error: str | None = None


def bundled_models_dir() -> Path:
    return asset("models")


def read_gguf(path: Path) -> ModelInfo:
    from gguf import GGUFReader  # imported late: it pulls in numpy and its quant tables

    reader = GGUFReader(path)
    arch = _gguf_field(reader, "general.architecture")
    ctx = _gguf_field(reader, f"{arch}.context_length") if arch else None
    counts = _counts(t.tensor_type.name for t in reader.tensors)
    return ModelInfo(
        id=path.stem,
        path=str(path),
        format="gguf",
        architecture=arch,
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        tensor_types=sorted(counts),
        tensor_counts=counts,
        quant_mix=quant_mix(counts, _file_type(_gguf_field(reader, "general.file_type"))),
        size_bytes=path.stat().st_size,
        native_context=int(ctx) if ctx is not None else None,
    )


def _counts(types: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in types:
        counts[t] = counts.get(t, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _file_type(value) -> str | None:
    """general.file_type (llama.cpp's llama_ftype) by name: 15 -> "Q4_K_M"; None when absent or unknown."""
    from gguf import LlamaFileType

    if not isinstance(value, int):
        return None
    try:
        name = LlamaFileType(value & ~LlamaFileType.GUESSED).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def quant_mix(counts: dict[str, int], label: str | None = None) -> str | None:
    """"Q4_K_M: Q4_K 190, Q6_K 33, F32 65": the file's type label, then tensors per type."""
    if not counts:
        return None
    mix = ", ".join(f"{t} {n}" for t, n in counts.items())
    return f"{label}: {mix}" if label else mix


def _gguf_field(reader, key: str):
    field = reader.get_field(key)
    return field.contents() if field is not None else None


def safetensors_header(path: Path) -> dict:
    if not path.is_file():  # a FIFO would block the scan for good
        raise ValueError(f"{path.name}: not a regular file")
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path.name}: too short for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_SAFETENSORS_HEADER or n > path.stat().st_size - 8:
            raise ValueError(f"{path.name}: header length {n} is not plausible")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: header is not a JSON object")
    return header


def read_hf(directory: Path) -> ModelInfo:
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    # Multimodal configs keep the language model's fields in text_config.
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    params = 0
    types: list[str] = []
    for file in sorted(directory.glob("*.safetensors")):
        for name, entry in safetensors_header(file).items():
            if name == "__metadata__":
                continue
            params += math.prod(entry["shape"])
            types.append(entry["dtype"])
    counts = _counts(types)
    arch = text.get("model_type") or config.get("model_type")
    if arch is None and config.get("architectures"):
        arch = config["architectures"][0]
    ctx = text.get("max_position_embeddings")
    return ModelInfo(
        id=directory.name,
        path=str(directory),
        format="hf",
        architecture=arch,
        parameters=params if types else None,
        tensor_types=sorted(counts),
        tensor_counts=counts,
        quant_mix=quant_mix(counts),
        size_bytes=sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()),
        native_context=int(ctx) if isinstance(ctx, int) else None,
    )


def is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def describe(path: Path) -> ModelInfo:
    """Metadata of one model path; a read failure is recorded in `error`, not raised."""
    fmt = "gguf" if path.is_file() else "hf"
    try:
        return read_gguf(path) if fmt == "gguf" else read_hf(path)
    except Exception as exc:  # a damaged file must not hide the other models
        size = path.stat().st_size if path.is_file() else 0
        return ModelInfo(id=path.stem if fmt == "gguf" else path.name, path=str(path), format=fmt,
                         size_bytes=size, error=f"{type(exc).__name__}: {exc}")


def find_model_paths(folder: Path, depth: int = SCAN_DEPTH, problems: list[str] | None = None) -> Iterable[Path]:
    """Model paths under `folder`; a path that cannot be read is skipped and named in `problems`."""
    try:
        if folder.is_file() and folder.suffix == ".gguf":
            yield folder
            return
        if not folder.is_dir():
            return
        if is_hf_dir(folder):
            yield folder
            return
        entries = sorted(folder.iterdir())
    except OSError as exc:
        if problems is not None:
            problems.append(f"{folder}: skipped, cannot be read ({exc.strerror or exc})")
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            is_model_file = entry.is_file() and entry.suffix == ".gguf"
            is_dir = entry.is_dir()
        except OSError as exc:
            if problems is not None:
                problems.append(f"{entry}: skipped, cannot be read ({exc.strerror or exc})")
            continue
        if is_model_file:
            yield entry
        elif is_dir and depth > 0:
            yield from find_model_paths(entry, depth - 1, problems)


class Catalog:
    """Scans folders on demand; metadata is cached per (path, mtime, size) so rescans are cheap."""

    def __init__(self, folders: Iterable[str | os.PathLike[str]] = (), include_bundled: bool = True) -> None:
        self.folders = [Path(f).expanduser() for f in folders]
        self.include_bundled = include_bundled
        self._cache: dict[Path, tuple[tuple[float, int], ModelInfo]] = {}
        self.problems: list[str] = []  # paths the last scan skipped, each with why

    def roots(self) -> list[Path]:
        roots = list(self.folders)
        if self.include_bundled:
            roots.append(bundled_models_dir())
        return roots

    def scan(self) -> list[ModelInfo]:
        models: list[ModelInfo] = []
        seen_paths: set[Path] = set()
        seen_ids: set[str] = set()
        problems: list[str] = []
        for root in self.roots():
            for path in find_model_paths(root, problems=problems):
                real = path.resolve()
                if real in seen_paths:
                    continue
                seen_paths.add(real)
                try:
                    info = self._describe_cached(real)
                except OSError as exc:
                    problems.append(f"{path}: skipped, cannot be read ({exc.strerror or exc})")
                    continue
                unique = info.id
                n = 1
                while unique in seen_ids:  # same name in two folders: the later one gets a suffix
                    n += 1
                    unique = f"{info.id}~{n}"
                seen_ids.add(unique)
                models.append(info.model_copy(update={"id": unique}))
        self.problems = problems
        return models

    def find(self, ref: str) -> ModelInfo | None:
        """A model by catalog id, or by a path to a GGUF file or an HF folder."""
        for info in self.scan():
            if info.id == ref:
                return info
        path = Path(ref).expanduser()
        try:
            if (path.is_file() and path.suffix == ".gguf") or (path.is_dir() and (path / "config.json").is_file()):
                return self._describe_cached(path.resolve())
        except OSError:
            return None  # unreadable: answered as not found, like a path that is not there
        return None

    def _describe_cached(self, path: Path) -> ModelInfo:
        st = path.stat()
        key = (st.st_mtime, st.st_size)
        if path.is_dir():
            files = [p.stat() for p in path.glob("*") if p.is_file()]
            key = (max((s.st_mtime for s in files), default=st.st_mtime), sum(s.st_size for s in files))
        hit = self._cache.get(path)
        if hit and hit[0] == key:
            return hit[1]
        info = describe(path)
        self._cache[path] = (key, info)
        return info


def beyond_native(ctx_size: int | None, parallel: int, native_context: int | None) -> str | None:
    """Why an asked-for context is refused: more positions a chat than the model was trained for.

    The engine has no RoPE scaling flags, so nothing can stretch a model past its native context;
    `parallel` slots may share `parallel` times it.
    """
    if not ctx_size or not native_context or ctx_size <= native_context * parallel:
        return None
    return (f"context {ctx_size} is beyond the model's native context: {native_context} tokens a chat, "
            f"{native_context * parallel} for {parallel} slot{'s' if parallel != 1 else ''}")


def weights_per_gpu(size_bytes: int, tp: int | None = None, tensor_split: str | None = None) -> int:
    """The weights' share of the most loaded GPU: the size on disk divided by the split (by the
    largest -ts proportion when given; the engine's replicated embedding makes it a lower bound)."""
    shares = [float(p) for p in re.split("[,/]", tensor_split) if float(p) > 0] if tensor_split else []
    if shares and (tp or len(shares)) == len(shares):
        return int(size_bytes * max(shares) / sum(shares))
    return size_bytes // max(1, tp or 1)
