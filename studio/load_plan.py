"""A load request turned into a launch plan: the model found in the catalog, settings and precedence
resolved, the engine's options composed; and the refusals known before any child starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from settings import EnvOverrideError, LoadRequest, Settings, resolve_exact, resolve_preempt
from studio.catalog import Catalog, beyond_native
from studio.errors import StudioError
from studio.flags import ExtraArgsError, LoadWarning, Options, exact_contradictions, options_from_settings

# Load warnings that are certain refusals under exact_concurrency on: known before any child starts.
_EXACT_ON_REFUSALS = {"exact_kv_quantized", "exact_flash_attn_off"}


@dataclass
class LaunchPlan:
    model_path: str
    alias: str
    parallel: int
    options: Options
    exact_mode: str  # the resolved request: auto, on or off
    preempt_mode: str
    native_context: int | None = None


def plan_load(request: LoadRequest, settings: Settings, catalog: Catalog, env: Mapping[str, str]
              ) -> tuple[str, LaunchPlan, list[LoadWarning], tuple]:
    """(model id, plan, warnings, key): equal keys are the same load (`already_loaded`)."""
    info = catalog.find(request.model)
    if info is None:
        raise StudioError(404, "model_not_found",
                          f"model {request.model!r} is neither a catalog id nor a model path")
    load = request.with_defaults(settings.load)
    if problem := beyond_native(request.ctx_size, load.parallel, info.native_context):
        raise StudioError(400, "context_beyond_native", problem)
    if request.ctx_size is None and info.native_context and load.ctx_size > info.native_context:
        # an unasked-for default never runs a model past the positions it was trained on
        load = load.model_copy(update={"ctx_size": info.native_context})
    try:
        exact = resolve_exact(request.exact_concurrency, settings.exact_concurrency, env)
        preempt = resolve_preempt(request.preempt_mode, settings.preempt_mode, env)
        options = options_from_settings(load)
    except EnvOverrideError as exc:
        raise StudioError(500, "invalid_environment", str(exc)) from exc
    except ExtraArgsError as exc:
        raise StudioError(400, "invalid_extra_args", str(exc)) from exc
    plan = LaunchPlan(info.path, info.id, load.parallel, options, exact.value, preempt.value,
                      info.native_context)
    warnings = exact_contradictions(options) if exact.value != "off" else []
    key = (info.path, load.parallel, tuple(options.items()), exact.value, preempt.value)
    return info.id, plan, warnings, key


def refuse_before_stopping(plan: LaunchPlan, warnings: list[LoadWarning], running: str) -> None:
    """A load the engine is certain to refuse never stops the model that is running."""
    if plan.exact_mode != "on":
        return
    for warning in warnings:
        if warning.code in _EXACT_ON_REFUSALS:
            raise StudioError(422, "load_refused", f"exact_concurrency is on, and the engine refuses it with "
                              f"{warning.flag}: {warning.message}. Meet that requirement, or set exact_concurrency "
                              f"to auto or off; {running} is still loaded", failure="exact_refusal",
                              flag=warning.flag, still_loaded=running)
