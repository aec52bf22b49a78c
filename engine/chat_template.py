"""Chat templates rendered with jinja2 in a sandbox (templates come from model files, not from us)."""

from __future__ import annotations

import json
from datetime import datetime

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used when a model carries no template: ChatML, which most small instruction models follow.
DEFAULT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplateError(ValueError):
    pass


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.source = source or DEFAULT_TEMPLATE
        self.bos_token, self.eos_token = bos_token, eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self.source)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template does not parse: {e}") from e

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token, **extra,
            )
        except ChatTemplateError:
            raise
        except Exception as e:  # a template is foreign code: any failure is the template's
            raise ChatTemplateError(f"chat template failed: {e}") from e
