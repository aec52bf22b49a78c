"""Chat templates rendered with jinja2 in a sandbox (templates come from model files, not from us).

A template is foreign code: besides the sandbox's attribute rules, a render is bounded by a loop
budget (every `for` of the template draws from it), a wall-clock deadline checked at each loop step
and call, and a size limit on `*` and `**`, so that no template can hold a thread for good.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used when a model carries no template: ChatML, which most small instruction models follow.
DEFAULT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MAX_LOOP_STEPS = 1_000_000  # per render: real templates take a few per message
RENDER_SECONDS = 10.0
MAX_REPEAT_CHARS = 1 << 24  # what `"x" * n` or `list * n` may build
MAX_POWER_EXPONENT = 1024
_BUDGET_NAME = "__lockstep_loop"


class ChatTemplateError(ValueError):
    pass


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


class _Budget:
    """One render's allowance; lives in a thread-local so that concurrent renders do not share it."""

    def __init__(self, origin: str):
        self.origin = origin
        self.steps = MAX_LOOP_STEPS
        self.deadline = time.monotonic() + RENDER_SECONDS

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"{self.origin} took longer than {RENDER_SECONDS:g} s to render")

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise ChatTemplateError(f"{self.origin} ran more than {MAX_LOOP_STEPS} loop steps")
        if self.steps & 1023 == 0:
            self.check()


_current = threading.local()


def _origin() -> str:
    budget = getattr(_current, "budget", None)
    return budget.origin if budget is not None else "the chat template"


def _budgeted(iterable):
    budget: _Budget | None = getattr(_current, "budget", None)
    for item in iterable:
        if budget is not None:
            budget.step()
        yield item


class _GenerationBlock(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks assistant text for training masks):
    rendered as its body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**"])

    def _parse(self, source, name, filename):
        # every loop's iterable goes through the budget (templates have no other unbounded construct)
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.Name(_BUDGET_NAME, "load"), [loop.iter], [], None, None)
        return tree

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int) and len(seq) * n > MAX_REPEAT_CHARS:
                    raise ChatTemplateError(f"{_origin()} repeats a sequence to more than {MAX_REPEAT_CHARS} items")
        elif operator == "**" and isinstance(right, int | float) and abs(right) > MAX_POWER_EXPONENT:
            raise ChatTemplateError(f"{_origin()} raises to a power above {MAX_POWER_EXPONENT}")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        budget: _Budget | None = getattr(_current, "budget", None)
        if budget is not None:
            budget.check()
        return super().call(__context, __obj, *args, **kwargs)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "",
                 origin: str = "the model's chat template"):
        self.source = source or DEFAULT_TEMPLATE
        self.bos_token, self.eos_token = bos_token, eos_token
        self.origin = origin if source else "the default chat template (ChatML)"
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.globals[_BUDGET_NAME] = _budgeted
        try:
            self._template = env.from_string(self.source)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template does not parse: {e}") from e

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        _current.budget = _Budget(self.origin)
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token, **extra,
            )
        except ChatTemplateError:
            raise
        except RecursionError:
            raise ChatTemplateError(f"{self.origin} recursed too deeply") from None
        except Exception as e:  # a template is foreign code: any failure is the template's
            raise ChatTemplateError(f"{self.origin} failed: {e}") from e
        finally:
            _current.budget = None
