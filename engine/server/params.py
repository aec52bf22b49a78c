"""Request bodies -> checked values. Every fault is a 400 that names the field and what it expects."""

from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import replace
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from engine.grammar import GrammarError, compile_grammar
from engine.json_schema import JSON_OBJECT, SchemaError, schema_grammar
from engine.sampler import SamplingParams, random_seed
from engine.server.errors import ApiError, bad_request
from engine.server.state import EngineState, state_of

MAX_PREDICT = 1 << 24  # beyond any context; larger is a client bug worth naming
MAX_STOPS = 16
MAX_STOP_CHARS = 1024
MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_SEED = (1 << 64) - 1

_MISSING = object()


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_body(request: web.Request) -> bytes:
    """The body within --timeout and --body-limit (counted after decompression, so no gzip bomb fits)."""
    opts = state_of(request).opts
    try:
        async with asyncio.timeout(opts.timeout):
            return await request.read()
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {opts.timeout} s (--timeout)",
                       close=True) from None
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body is larger than the limit of {opts.body_limit} MiB (--body-limit), "
                            "counted after decompression", close=True) from None
    except (HttpProcessingError, RequestPayloadError) as e:  # e.g. a body that is not what its Content-Encoding says
        raise ApiError(400, f"request body cannot be read: {one_line(getattr(e, 'message', e))}",
                       close=True) from None


def one_line(message: object) -> str:
    return " ".join(str(message).split())


async def read_json(request: web.Request) -> dict[str, Any]:
    raw = await read_body(request)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8 (bad byte at offset {e.start})") from None
    if not text.strip():
        raise bad_request("request body is empty; expected a JSON object")
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise bad_request("request body is nested too deeply") from None
    except ValueError as e:
        raise bad_request(f"request body: {e}") from None
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object, not {kind_of(body)}")
    if _SURROGATE_ESCAPE.search(text) and (where := lone_surrogate(body)) is not None:
        raise bad_request(f"{where} holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair); "
                          "text must be valid Unicode")
    return body


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def lone_surrogate(value: Any) -> str | None:
    """Where the first string that cannot be UTF-8 sits ("'messages[0].content'"), walked without recursion."""
    stack = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if not _encodable(v):
                return f"'{path}'" if path else "a string"
        elif isinstance(v, dict):
            for k, x in v.items():
                if not _encodable(k):
                    return f"a key of '{path}'" if path else "a key"
                stack.append((f"{path}.{k}" if path else k, x))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))
    return None


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class Fields:
    """Typed access to a JSON object's fields; null counts as absent."""

    def __init__(self, body: dict[str, Any]):
        self.body = body

    def raw(self, name: str, default: Any = None) -> Any:
        value = self.body.get(name, _MISSING)
        return default if value is _MISSING or value is None else value

    def has(self, name: str) -> bool:
        return self.body.get(name) is not None

    def int(self, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        value = self.raw(name, _MISSING)
        if value is _MISSING:
            return default
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_request(f"'{name}' must be an integer, not {kind_of(value)}")
        _check_range(name, value, lo, hi)
        return value

    def num(self, name: str, default: float, lo: float | None = None, hi: float | None = None) -> float:
        value = self.raw(name, _MISSING)
        if value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad_request(f"'{name}' must be a number, not {kind_of(value)}")
        value = float(value)
        if not math.isfinite(value):
            raise bad_request(f"'{name}' must be a finite number")
        _check_range(name, value, lo, hi)
        return value

    def bool(self, name: str, default: bool) -> bool:
        return self._typed(name, default, bool, "true or false")

    def str(self, name: str, default: str | None = None) -> str | None:
        return self._typed(name, default, str, "a string")

    def _typed(self, name: str, default, kind: type, words: str):
        value = self.raw(name, _MISSING)
        if value is _MISSING:
            return default
        if not isinstance(value, kind):
            raise bad_request(f"'{name}' must be {words}, not {kind_of(value)}")
        return value

    def obj(self, name: str) -> Fields:
        value = self.raw(name, {})
        if not isinstance(value, dict):
            raise bad_request(f"'{name}' must be an object, not {kind_of(value)}")
        return Fields(value)


def _check_range(name: str, value: float, lo: float | None, hi: float | None) -> None:
    if lo is not None and value < lo:
        raise bad_request(f"'{name}' must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise bad_request(f"'{name}' must be <= {hi}, got {value}")


def sampling(f: Fields, defaults: SamplingParams, server_seed: int, tokenizer=None) -> SamplingParams:
    """Sampling parameters with the seed resolved: the request's, else the server's --seed, else random.
    With the tokenizer, also logit_bias (text keys are tokenized) and ignore_eos."""
    p = replace(
        defaults,
        temperature=f.num("temperature", defaults.temperature, 0.0, 100.0),
        top_k=f.int("top_k", defaults.top_k, -1),
        top_p=f.num("top_p", defaults.top_p, 0.0, 1.0),
        min_p=f.num("min_p", defaults.min_p, 0.0, 1.0),
        repeat_penalty=f.num("repeat_penalty", defaults.repeat_penalty, 0.0, 100.0),
        repeat_last_n=f.int("repeat_last_n", defaults.repeat_last_n, -1),
        presence_penalty=f.num("presence_penalty", defaults.presence_penalty, -2.0, 2.0),
        frequency_penalty=f.num("frequency_penalty", defaults.frequency_penalty, -2.0, 2.0),
    )
    if p.repeat_penalty == 0.0:
        raise bad_request("'repeat_penalty' must be > 0 (1.0 turns it off)")
    if p.top_k < 0:
        p = replace(p, top_k=0)  # -1 is the vLLM spelling of "no top-k"; the sampler reads 0 so
    if p.repeat_last_n == 0:  # llama.cpp: a zero window turns every penalty off
        p = replace(p, repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    elif p.repeat_last_n == -1:
        p = replace(p, repeat_last_n=0)  # the whole history, which the context bounds
    seed = f.int("seed", -1, -1, MAX_SEED)
    if seed == -1:
        seed = server_seed if server_seed >= 0 else random_seed()
    p = replace(p, seed=seed, post_sampling_probs=f.bool("post_sampling_probs", False), grammar=grammar_of(f))
    if tokenizer is not None:
        bias = logit_bias(f.raw("logit_bias", []), tokenizer)
        if f.bool("ignore_eos", False):  # llama-server turns it into a ban on every end-of-generation token
            bias += [(t, float("-inf")) for t in sorted(tokenizer.eos_ids | tokenizer.extra_stop_ids)]
        p = replace(p, logit_bias=tuple(bias))
    return p


def _bias_value(value: Any, where: str) -> float:
    if value is False:
        return float("-inf")  # llama-server's spelling of a ban
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_request(f"'{where}' must be a finite number, or false to ban the token")
    return float(value)


def logit_bias(value: Any, tokenizer) -> list[tuple[int, float]]:
    """OpenAI's {"id": bias} and llama-server's [[id or text, bias], ...]; a text key biases each of its tokens."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = []
        for i, pair in enumerate(value):
            if not isinstance(pair, list) or len(pair) != 2:
                raise bad_request(f"'logit_bias[{i}]' must be a [token or text, bias] pair")
            items.append((pair[0], pair[1]))
    else:
        raise bad_request(f"'logit_bias' must be an object or an array, not {kind_of(value)}")
    out = []
    for key, bias in items:
        where = f"logit_bias[{json.dumps(key)}]"
        b = _bias_value(bias, where)
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key)
        if isinstance(key, bool):
            raise bad_request(f"'{where}': a key must be a token id or a text")
        if isinstance(key, int):
            if not 0 <= key < tokenizer.vocab_size:
                raise bad_request(f"'{where}': unknown token id {key} (the vocabulary has {tokenizer.vocab_size})")
            out.append((key, b))
        elif isinstance(key, str):
            out += [(t, b) for t in tokenizer.encode(key, add_special=False)]
        else:
            raise bad_request(f"'{where}': a key must be a token id or a text")
    return out


# Sampling features clients know from llama-server or OpenAI that the engine does not have. A request
# that sets one to anything but its neutral value is refused, so its output never silently differs.
_NEUTRAL = {
    "mirostat": (0,),
    "typical_p": (1, 1.0),
    "dynatemp_range": (0, 0.0),
    "xtc_probability": (0, 0.0),
    "dry_multiplier": (0, 0.0),
    "top_n_sigma": (-1, -1.0),
}


def shift_fields(f: Fields, default_keep: int) -> dict:
    """llama-server's n_keep (-1: the whole prompt) and n_discard (0: half of what follows n_keep), read by a
    --context-shift."""
    return {"n_keep": f.int("n_keep", default_keep, -1), "n_discard": f.int("n_discard", 0, 0)}


def reject_unsupported(f: Fields) -> None:
    for name, neutral in _NEUTRAL.items():
        value = f.raw(name, neutral[0])
        if value not in neutral:
            raise bad_request(f"'{name}' is not supported yet")


def stop_strings(f: Fields, name: str = "stop") -> list[str]:
    value = f.raw(name, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise bad_request(f"'{name}' must be a string or an array of strings, not {kind_of(value)}")
    if len(value) > MAX_STOPS:
        raise bad_request(f"'{name}' has {len(value)} strings; at most {MAX_STOPS}")
    for i, s in enumerate(value):
        if not isinstance(s, str):
            raise bad_request(f"'{name}[{i}]' must be a string, not {kind_of(s)}")
        if not s:
            raise bad_request(f"'{name}[{i}]' is empty")
        if len(s) > MAX_STOP_CHARS:
            raise bad_request(f"'{name}[{i}]' is longer than {MAX_STOP_CHARS} characters")
    return list(value)


def max_tokens(f: Fields, *names: str) -> int:
    """The first of `names` given; -1 (until the context is full) when none is."""
    for name in names:
        if f.has(name):
            return f.int(name, -1, -1, MAX_PREDICT)
    return -1


def token_ids(value: list, vocab_size: int, name: str) -> list[int]:
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            raise bad_request(f"'{name}[{i}]' must be a token id (an integer), not {kind_of(t)}")
        if not 0 <= t < vocab_size:
            raise bad_request(f"'{name}[{i}]': unknown token id {t} (the vocabulary has {vocab_size})")
    return list(value)


def nonempty(ids: list[int], name: str) -> list[int]:
    if not ids:
        raise bad_request(f"'{name}' is empty")
    return ids


def check_fits(state: EngineState, text: str, what: str = "prompt") -> None:
    """Refuses text that cannot fit the context before tokenizing it: a token covers at most
    max_token_bytes bytes (halved for normalizers), and a character is at least one byte."""
    least = len(text) // (2 * state.max_token_bytes)
    if least >= state.scheduler.n_ctx_seq:
        raise ApiError(400, f"the {what} has at least {least} tokens ({len(text)} characters); the context holds "
                            f"{state.scheduler.n_ctx_seq} per sequence (raise --ctx-size)", "exceed_context_size_error",
                       extra={"n_prompt_tokens": least, "n_ctx": state.scheduler.n_ctx_seq})


async def prompt_tokens(value: Any, state: EngineState, name: str = "prompt") -> list[int]:
    """A prompt as text (tokenized with BOS, on a worker thread), as token ids, or as an array holding exactly
    one of these."""
    tokenizer = state.tokenizer
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise bad_request(f"'{name}' is empty")
        check_fits(state, value)
        ids = await state.workers.run(tokenizer.encode, value, True, size=len(value))
    elif isinstance(value, list):
        if value and all(isinstance(v, str | list) for v in value):
            raise bad_request(f"'{name}' holds {len(value)} prompts; send one prompt per request")
        ids = token_ids(value, tokenizer.vocab_size, name)
    elif value is None:
        raise bad_request(f"'{name}' is required")
    else:
        raise bad_request(f"'{name}' must be a string or an array of token ids, not {kind_of(value)}")
    return nonempty(ids, name)


def grammar_of(f: Fields) -> str:
    """The GBNF a request's answer must follow: `grammar`, `json_schema` (llama-server) or `response_format`
    json_object / json_schema (OpenAI); checked here, so a bad one is a 400 naming it."""
    fmt = f.obj("response_format")
    kind = fmt.raw("type", "text")
    if kind not in ("text", "json_object", "json_schema"):
        raise bad_request(f"'response_format' type {kind!r} is not supported (text, json_object or json_schema)")
    try:
        if f.str("grammar"):
            source = f.str("grammar")
        elif f.has("json_schema"):
            source = schema_grammar(f.raw("json_schema"))
        elif kind == "json_schema":
            spec = fmt.obj("json_schema")
            source = schema_grammar(spec.raw("schema", {}))
        elif kind == "json_object":
            source = schema_grammar(fmt.raw("schema")) if fmt.has("schema") else JSON_OBJECT
        else:
            return ""
        compile_grammar(source)
    except (GrammarError, SchemaError) as e:
        raise bad_request(f"the request's grammar or JSON schema: {e}") from None
    return source
