"""Live validation of the Load form: text fields in, a LoadRequest or per-field messages out.

Pure functions over the settings package and the studio's flag checks, so the form shows exactly
the refusals and warnings a load through the API would give.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from settings import EnvOverrideError, LoadDefaults, LoadRequest, Resolved, resolve_exact
from studio.catalog import beyond_native, weights_per_gpu
from studio.flags import ExtraArgsError, exact_contradictions, options_from_settings

INT_FIELDS = ("ctx_size", "parallel", "batch_size", "ubatch_size", "n_gpu_layers", "spec_draft_n_max", "tp")
TEXT_FIELDS = ("tensor_split", "threads")  # threads: auto or a number, read by settings.threads_value
CHOICE_FIELDS = ("flash_attn", "cache_type_k", "cache_type_v", "spec_type")
DEFAULT = "default"  # the exact selector's "take the stored setting" choice

_SOURCE_TEXT = {
    "env": "from LOCKSTEP_EXACT_CONCURRENCY in the studio's environment",
    "request": "chosen here",
    "store": "the default stored in Settings",
    "inherited": "inherited LOCKSTEP_EXACT=1",
    "default": "built-in default",
}


@dataclass
class FormCheck:
    request: LoadRequest | None
    errors: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    exact: Resolved | None = None
    per_gpu: int | None = None  # the weights' bytes on the most loaded GPU (catalog.weights_per_gpu)

    @property
    def ok(self) -> bool:
        return self.request is not None and not self.errors

    def exact_text(self) -> str:
        if self.exact is None:
            return "exact concurrency: ?"
        return f"exact concurrency will be requested as {self.exact.value} ({_SOURCE_TEXT[self.exact.source]})"


def effective_defaults(stored: LoadDefaults, native_context: int | None) -> LoadDefaults:
    """The settings a load from the TUI gets without edits, as exact numbers.

    With no load defaults stored, one chat gets the model's whole native context (four slots sharing it
    left 256 tokens a chat); stored defaults are kept, with the context clamped to the native one as
    /api/load clamps a context nobody asked for.
    """
    if not native_context:
        return stored
    if stored == LoadDefaults():
        return stored.model_copy(update={"parallel": 1, "ctx_size": native_context})
    if stored.ctx_size == 0 or stored.ctx_size > native_context:
        return stored.model_copy(update={"ctx_size": native_context})
    return stored


def form_values(load: LoadDefaults) -> dict[str, str]:
    """The form's text for stored load defaults."""
    values = {name: "" if getattr(load, name) is None else str(getattr(load, name)) for name in INT_FIELDS}
    values.update({name: getattr(load, name) for name in CHOICE_FIELDS})
    values.update({name: str(getattr(load, name) or "") for name in TEXT_FIELDS})
    values["extra_args"] = shlex.join(load.extra_args)
    return values


def check_load_form(values: Mapping[str, str | None], *, defaults: LoadDefaults, stored_exact: str | None,
                    env: Mapping[str, str], native_context: int | None = None, size_bytes: int = 0) -> FormCheck:
    errors: dict[str, str] = {}
    body: dict[str, object] = {}
    model = (values.get("model") or "").strip()
    if not model:
        errors["model"] = "choose a model (none found: see the Models screen)"
    body["model"] = model or "?"
    for name in INT_FIELDS:
        text = (values.get(name) or "").strip()
        if not text:
            continue  # blank takes the stored default
        try:
            body[name] = int(text)
        except ValueError:
            errors[name] = f"a whole number, not {text!r}"
    for name in CHOICE_FIELDS:
        if values.get(name):
            body[name] = values[name]
    for name in TEXT_FIELDS:
        if text := (values.get(name) or "").strip():
            body[name] = text
    try:
        body["extra_args"] = shlex.split(values.get("extra_args") or "")
    except ValueError as exc:
        errors["extra_args"] = f"cannot split into arguments: {exc}"
    exact_choice = values.get("exact") or DEFAULT
    body["exact_concurrency"] = None if exact_choice == DEFAULT else exact_choice

    request = None
    try:
        request = LoadRequest.model_validate(body)
    except ValidationError as exc:
        for err in exc.errors():
            where = str(err["loc"][0]) if err["loc"] else "model"
            errors.setdefault(where, err["msg"])
    check = FormCheck(None, errors)
    if request is None:
        return check

    try:
        options = options_from_settings(request.with_defaults(defaults))
    except ExtraArgsError as exc:
        errors["extra_args"] = str(exc)
        options = None
    try:
        check.exact = resolve_exact(request.exact_concurrency, stored_exact, env)
    except EnvOverrideError as exc:
        errors["exact"] = str(exc)
    if check.exact is not None:
        if check.exact.source == "env" and request.exact_concurrency not in (None, check.exact.value):
            check.warnings.append(f"LOCKSTEP_EXACT_CONCURRENCY={check.exact.value} in the studio's environment "
                                  f"outranks {request.exact_concurrency!r} chosen here")
        if options is not None and check.exact.value != "off":
            check.warnings += [w.message for w in exact_contradictions(options)]
    full = request.with_defaults(defaults)
    if size_bytes:
        check.per_gpu = weights_per_gpu(size_bytes, full.tp, full.tensor_split)
    ctx = full.ctx_size
    if problem := beyond_native(request.ctx_size, full.parallel, native_context):
        errors["ctx_size"] = problem
    elif native_context and ctx > native_context:
        check.warnings.append(f"context {ctx} is beyond the model's native context {native_context}")
    check.request = request if not errors else None
    return check
