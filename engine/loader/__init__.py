"""Model loading: a Hugging Face directory or a GGUF file -> config, stored weights, tokenizer."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.models.build import check_weights
from engine.tokenizer import TextTokenizer
from lockstep_kernels.weights import Weight


@dataclass
class LoadedModel:
    path: Path
    format: str  # "hf" | "gguf"
    config: ModelConfig
    weights: dict[str, Weight]
    tokenizer: TextTokenizer

    @property
    def tensor_types(self) -> list[str]:
        return sorted({w.dtype for w in self.weights.values()})

    @property
    def n_params(self) -> int:
        return sum(w.size for w in self.weights.values())


def _kind(p: Path) -> str:
    mode = p.stat().st_mode
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(p: Path) -> None:
    """Refuse what is not a regular file or directory: opening a FIFO or a device would wait or never end."""
    if not p.is_dir() and not p.is_file():
        raise ModelLoadError(f"{p}: {_kind(p)}, not a model file or directory")
    if p.is_dir():
        for entry in p.iterdir():
            if entry.name.endswith((".json", ".safetensors", ".model")) and not entry.is_file() and not entry.is_dir():
                raise ModelLoadError(f"{entry}: {_kind(entry)}, not a regular file")


def load_model(path: str | Path, chat_template: str | None = None) -> LoadedModel:
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file or directory")
    check_regular(p)
    if p.is_dir():
        from engine.loader.hf import read_config, read_weights
        from engine.tokenizer import load_hf_tokenizer

        config = read_config(p)
        weights = read_weights(p, config)
        tokenizer = load_hf_tokenizer(p, chat_template)
        fmt = "hf"
    else:
        from engine.loader.gguf import read_gguf

        config, weights, tokenizer = read_gguf(p, chat_template)
        fmt = "gguf"
    check_weights(config, weights)
    return LoadedModel(p, fmt, config, weights, tokenizer)
