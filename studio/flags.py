"""The engine's command line: which flags exist, which the studio owns, and checks of extra args.

Engine options are kept as an ordered mapping canonical flag -> value (None for a switch) so the
relaunch ladder can change one of them and render the argv again.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from settings import CACHE_TYPES, EXACT_CACHE_TYPES, TENSOR_SPLIT, LoadDefaults

MAX_EXTRA_ARGS = 64
MAX_ARG_CHARS = 4096

Options = dict[str, str | None]
Check = Callable[[str], str | None]


class ExtraArgsError(ValueError):
    """An extra arg the studio refuses to pass to the engine; the message names it."""


def _int(minimum: int | None = None) -> Check:
    def check(value: str) -> str | None:
        if not re.fullmatch(r"-?\d{1,12}", value):
            return f"expects an integer, got {value!r}"
        if minimum is not None and int(value) < minimum:
            return f"expects an integer >= {minimum}, got {value}"
        return None

    return check


def _choice(*allowed: str) -> Check:
    def check(value: str) -> str | None:
        return None if value in allowed else f"expects one of {', '.join(allowed)}, got {value!r}"

    return check


def _gpu_layers(value: str) -> str | None:
    # The engine takes a layer count, -1, or the words all / auto (every layer on the GPU).
    return None if value in ("all", "auto") else _int(-1)(value)


def _threads(value: str) -> str | None:
    # -1 asks the engine for its default (llama-server's spelling); 0 and below are refused there.
    return None if value == "-1" else _int(1)(value)


def _number(value: str) -> str | None:
    return None if re.fullmatch(r"\d{1,6}(\.\d{1,12})?", value) else f"expects a number >= 0, got {value!r}"


def _split(value: str) -> str | None:
    if re.fullmatch(TENSOR_SPLIT, value) is None or not any(float(p) for p in re.split("[,/]", value)):
        return f"expects proportions per GPU like 1,1 or 3,1, got {value!r}"
    return None


def _nonempty(value: str) -> str | None:
    return None if value else "expects a non-empty value"


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # canonical (long) name first
    takes_value: bool
    check: Check | None = None
    owned_by: str | None = None  # set: the studio sets this flag itself; says what to use instead
    reads_file: bool = False  # its value is a path the engine opens (and may echo back, e.g. in /props)

    @property
    def canonical(self) -> str:
        return self.names[0]


_OWNED = "the studio sets it"
FLAGS: tuple[Flag, ...] = (
    Flag(("--model", "-m"), True, owned_by=f"{_OWNED} from the load request's model"),
    Flag(("--alias",), True, owned_by=f"{_OWNED} to the model id"),
    Flag(("--host",), True, owned_by=f"{_OWNED}; the engine listens on 127.0.0.1 behind the studio"),
    Flag(("--port",), True, owned_by=f"{_OWNED} to a free port"),
    Flag(("--parallel", "-np"), True, owned_by=f"{_OWNED}; use the 'parallel' load setting"),
    Flag(("--api-key",), True, owned_by=f"{_OWNED}; use the studio's api key setting"),
    Flag(("--exact-concurrency",), True, owned_by=f"{_OWNED}; use the 'exact_concurrency' setting"),
    Flag(("--ctx-size", "-c"), True, _int(0)),
    Flag(("--batch-size", "-b"), True, _int(1)),
    Flag(("--ubatch-size", "-ub"), True, _int(1)),
    Flag(("--kv-unified", "-kvu"), False),
    Flag(("--flash-attn", "-fa"), True, _choice("on", "off", "auto")),
    Flag(("--n-gpu-layers", "-ngl"), True, _gpu_layers),
    Flag(("--no-kv-offload", "-nkvo"), False),
    Flag(("--cache-type-k", "-ctk"), True, _choice(*CACHE_TYPES)),
    Flag(("--cache-type-v", "-ctv"), True, _choice(*CACHE_TYPES)),
    Flag(("--context-shift",), False),
    Flag(("--no-context-shift",), False),
    Flag(("--cache-reuse",), True, _int(0)),
    Flag(("--keep",), True, _int(-1)),
    Flag(("--sleep-idle-seconds",), True, _int(-1)),
    Flag(("--spec-type",), True, _choice("none", "ngram", "draft-simple")),
    Flag(("--spec-draft-n-max",), True, _int(0)),
    Flag(("--model-draft", "-md", "--spec-draft-model"), True, _nonempty, reads_file=True),
    Flag(("--gpu-layers-draft", "-ngld", "--n-gpu-layers-draft", "--spec-draft-ngl"), True, _nonempty),
    Flag(("--seed", "-s"), True, _int(-1)),
    Flag(("--metrics",), False),
    Flag(("--jinja",), False),
    Flag(("--chat-template-file",), True, _nonempty, reads_file=True),
    Flag(("--device",), True, _choice("auto", "cuda", "cpu")),
    Flag(("--preempt-ram",), True, _int(0)),
    # llama-server's (engine/cli_compat.py)
    Flag(("--temp",), True, _number),
    Flag(("--n-predict", "-n"), True, _int(-1)),
    Flag(("--threads", "-t"), True, _threads),
    Flag(("--threads-batch", "-tb"), True, _int(-1)),
    Flag(("--cont-batching", "-cb"), False),
    Flag(("--slots",), False),
    Flag(("--no-slots",), False),
    Flag(("--tags",), True, _nonempty),
    Flag(("--no-jinja",), False),
    Flag(("--chat-template",), True, _nonempty),
    Flag(("--reasoning-format",), True, _choice("none", "deepseek", "deepseek-legacy", "auto")),
    Flag(("--reasoning",), True, _choice("on", "off", "auto")),
    Flag(("--no-webui", "--no-ui"), False),
    Flag(("--verbose", "-v", "--log-verbose"), False),
    Flag(("--slot-save-path",), True, _nonempty, reads_file=True),  # the engine writes and reads files there
    Flag(("--cache-ram",), True, _int(-1)),
    Flag(("--swa-full",), False),
    Flag(("--spec-draft-n-min",), True, _int(0)),
    Flag(("--backend-sampling", "--backend_sampling"), False),
    # several GPUs (engine/parallel)
    Flag(("--tp",), True, _int(1)),
    Flag(("--tensor-split", "-ts"), True, _split),
    Flag(("--split-mode", "-sm"), True, _choice("none", "layer", "row")),
    Flag(("--main-gpu", "-mg"), True, _int(0)),
)
BY_NAME: dict[str, Flag] = {name: flag for flag in FLAGS for name in flag.names}
OWNED_FLAGS: tuple[str, ...] = tuple(n for f in FLAGS if f.owned_by for n in f.names)
_EXCLUSIVE = (("--context-shift", "--no-context-shift"), ("--slots", "--no-slots"))
FILE_FLAGS: tuple[str, ...] = tuple(n for f in FLAGS if f.reads_file for n in f.names)


def file_flags(args: list[str]) -> list[str]:
    """The flags in `args` that make the engine read a file (`--flag` and `--flag=value` forms)."""
    return [a.split("=", 1)[0] for a in args if isinstance(a, str) and a.split("=", 1)[0] in FILE_FLAGS]


def _bad_chars(arg: str) -> str | None:
    for ch in arg:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return f"U+{ord(ch):04X}"
    return None


def parse_extra_args(args: list[str]) -> Options:
    """Check a user's extra args and return them as engine options; raise ExtraArgsError naming the fault."""
    if len(args) > MAX_EXTRA_ARGS:
        raise ExtraArgsError(f"too many extra args: {len(args)} (at most {MAX_EXTRA_ARGS})")
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            raise ExtraArgsError(f"extra arg {i + 1} is not a string")
        if len(arg) > MAX_ARG_CHARS:
            raise ExtraArgsError(f"extra arg {i + 1} is {len(arg)} characters long (at most {MAX_ARG_CHARS})")
        bad = _bad_chars(arg)
        if bad:
            raise ExtraArgsError(f"extra arg {i + 1} ({arg[:40]!r}) contains the control character {bad}")
        if arg == "":
            raise ExtraArgsError(f"extra arg {i + 1} is empty")

    options: Options = {}
    i = 0
    while i < len(args):
        token = args[i]
        name, inline = token, None
        if token.startswith("--") and "=" in token:
            name, inline = token.split("=", 1)
        if not name.startswith("-") or _is_number(name):
            raise ExtraArgsError(f"unexpected value {token!r}: not after a flag that takes a value")
        flag = BY_NAME.get(name)
        if flag is None:
            raise ExtraArgsError(f"unknown engine flag {name!r}")
        if flag.owned_by:
            raise ExtraArgsError(f"extra args may not set {name}: {flag.owned_by}")
        if flag.takes_value:
            if inline is not None:
                value = inline
            elif i + 1 < len(args) and (not args[i + 1].startswith("-") or _is_number(args[i + 1])):
                i += 1
                value = args[i]
            else:
                raise ExtraArgsError(f"{name} needs a value")
            problem = flag.check(value) if flag.check else None
            if problem:
                raise ExtraArgsError(f"{name} {problem}")
        else:
            if inline is not None:
                raise ExtraArgsError(f"{name} takes no value (got {inline!r})")
            value = None
        if flag.canonical in options:
            raise ExtraArgsError(f"{name} is given more than once")
        options[flag.canonical] = value
        i += 1

    for a, b in _EXCLUSIVE:
        if a in options and b in options:
            raise ExtraArgsError(f"{a} and {b} contradict each other")
    return options


def _is_number(token: str) -> bool:
    return re.fullmatch(r"-\d+(\.\d+)?", token) is not None


def options_from_settings(load: LoadDefaults) -> Options:
    """Engine options from the load fields, then the extra args (which may replace a field's flag)."""
    options: Options = {
        "--ctx-size": str(load.ctx_size),
        "--batch-size": str(load.batch_size),
        "--ubatch-size": str(load.ubatch_size),
        "--flash-attn": load.flash_attn,
        "--cache-type-k": load.cache_type_k,
        "--cache-type-v": load.cache_type_v,
        "--spec-type": load.spec_type,
    }
    if load.spec_type != "none":
        options["--spec-draft-n-max"] = str(load.spec_draft_n_max)
    if load.n_gpu_layers is not None:
        options["--n-gpu-layers"] = str(load.n_gpu_layers)
    for flag, value in (("--tp", load.tp), ("--tensor-split", load.tensor_split), ("--split-mode", load.split_mode)):
        if value is not None:
            options[flag] = str(value)
    if load.threads != "auto":
        options["--threads"] = str(load.threads)
    options.update(parse_extra_args(load.extra_args))
    return options


@dataclass(frozen=True)
class LoadWarning:
    code: str
    flag: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "flag": self.flag, "message": self.message}


def exact_contradictions(options: Options) -> list[LoadWarning]:
    """Options that do not go with exact concurrency; only meaningful when exact is requested."""
    warnings: list[LoadWarning] = []
    if "--context-shift" in options:
        warnings.append(LoadWarning("exact_context_shift", "--context-shift",
                                    "a context shift cuts a sequence where its context ends, so its answer "
                                    "would depend on --ctx-size; the engine disables it in exact mode"))
    reuse = options.get("--cache-reuse")
    if reuse is not None and int(reuse) > 0:
        warnings.append(LoadWarning("exact_cache_reuse", "--cache-reuse",
                                    f"--cache-reuse {reuse} shifts KV to new positions; the engine disables it "
                                    "in exact mode"))
    if "--no-kv-offload" in options:
        warnings.append(LoadWarning("exact_no_kv_offload", "--no-kv-offload",
                                    "a KV cache kept off the GPU is refused by exact mode on CUDA"))
    for flag in ("--cache-type-k", "--cache-type-v"):
        kind = options.get(flag)
        if kind is not None and kind not in EXACT_CACHE_TYPES:
            warnings.append(LoadWarning("exact_kv_quantized", flag,
                                        f"{flag} {kind} is a quantized KV cache; exact mode needs "
                                        f"{', '.join(EXACT_CACHE_TYPES)}"))
    if options.get("--flash-attn") == "off":
        warnings.append(LoadWarning("exact_flash_attn_off", "--flash-attn",
                                    "exact mode runs on the paged flash attention kernel; --flash-attn off "
                                    "is refused with it"))
    return warnings


@dataclass(frozen=True)
class Owned:
    """The values of the flags the studio owns, for one attempt (its api key travels in the environment)."""

    model_path: str
    alias: str
    host: str
    port: int
    parallel: int


def compose_argv(owned: Owned, options: Options, exact: bool) -> list[str]:
    argv = ["--model", owned.model_path, "--alias", owned.alias, "--host", owned.host,
            "--port", str(owned.port), "--parallel", str(owned.parallel)]
    for flag, value in options.items():
        if exact and flag == "--kv-unified":
            continue  # added below with the mode, once
        argv += [flag] if value is None else [flag, value]
    if "--metrics" not in options:
        argv.append("--metrics")  # /api/status reads page use, parks and speed from it
    argv += ["--kv-unified", "--exact-concurrency", "on"] if exact else ["--exact-concurrency", "off"]
    return argv


def redact_argv(argv: list[str]) -> list[str]:
    """The argv as shown to users and logs: the child's api key is a secret."""
    out = list(argv)
    for i, token in enumerate(out[:-1]):
        if token == "--api-key":
            out[i + 1] = "***"
    return out
