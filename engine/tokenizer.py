"""Text <-> token ids over a `tokenizers` tokenizer, with the model's special tokens."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from engine.chat_template import ChatTemplate
from engine.errors import ModelLoadError

LONG_TEXT = 4096  # characters or ids from which the tokenizer's GIL-releasing batch calls are used


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


@dataclass
class TextTokenizer:
    tok: Tokenizer
    bos_id: int | None
    eos_ids: set[int]
    add_bos: bool | None  # None: the tokenizer's own post-processor decides
    template: ChatTemplate
    bos_token: str = ""
    eos_token: str = ""
    extra_stop_ids: set[int] = field(default_factory=set)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def _encode(self, text: str, add_special: bool):
        # The batch call releases the GIL and the single one does not: a long text tokenized on a worker
        # thread must leave the event loop running. The fast variant skips offsets, which nothing reads, and
        # whose freeing would hold the GIL again for longer than the tokens themselves.
        if len(text) < LONG_TEXT:
            return self.tok.encode(text, add_special_tokens=add_special)
        return self.tok.encode_batch_fast([text], add_special_tokens=add_special)[0]

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        if self.add_bos is None:
            return self._encode(text, add_special).ids
        ids = self._encode(text, False).ids
        if add_special and self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        if len(ids) < LONG_TEXT:
            return self.tok.decode(list(ids), skip_special_tokens=skip_special)
        return self.tok.decode_batch([list(ids)], skip_special_tokens=skip_special)[0]  # releases the GIL

    def piece(self, token_id: int) -> str:
        return self.tok.decode([token_id], skip_special_tokens=False)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eos_ids or token_id in self.extra_stop_ids

    def apply_chat(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        return self.template.render(messages, add_generation_prompt, **extra)


def load_hf_tokenizer(model_dir: Path, template_override: str | None = None) -> TextTokenizer:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ModelLoadError(f"{model_dir}: no tokenizer.json")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:
        raise ModelLoadError(f"tokenizer.json: cannot be read ({e})") from e
    cfg = {}
    cfg_path = model_dir / "tokenizer_config.json"
    if cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"tokenizer_config.json: not valid JSON ({e})") from e
    bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
    bos_id = tok.token_to_id(bos) if bos else None
    eos_ids = {tok.token_to_id(eos)} if eos and tok.token_to_id(eos) is not None else set()
    gen_path = model_dir / "generation_config.json"
    if gen_path.is_file():
        gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
        eos_ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
    template = template_override or cfg.get("chat_template")
    if isinstance(template, list):  # several named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    add_bos = cfg.get("add_bos_token")
    # A tokenizer.json with a post-processor adds BOS itself; honour an explicit flag only without one.
    if tok.post_processor is not None:
        add_bos = None
    return TextTokenizer(tok, bos_id, eos_ids, add_bos if add_bos is None else bool(add_bos),
                         ChatTemplate(template, bos or "", eos or ""), bos or "", eos or "")
