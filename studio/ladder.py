"""The relaunch ladder: after a failed attempt, the changed command line worth another attempt (exact
dropped under auto, a halved context after out of memory, the CPU backend without CUDA), or the
message that ends the load.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract import PAGE_SIZE
from studio.failures import Failure
from studio.flags import Options
from studio.load_plan import LaunchPlan


@dataclass
class _Step:
    options: Options
    exact: bool
    change: str
    drops_exact: bool = False


def next_step(plan: LaunchPlan, options: Options, exact: bool, failure: Failure) -> _Step | str:
    """The ladder: the changed launch to try after `failure`, or the final message when there is none."""
    if failure.kind == "exact_refusal":
        if exact and plan.exact_mode == "auto":
            return _Step(options, False, f"relaunch without exact concurrency (auto): {failure.detail}",
                         drops_exact=True)
        if exact and plan.exact_mode == "on":
            return (f"exact_concurrency is on, and the engine refused it: {failure.detail}. "
                    "Meet that requirement, or set exact_concurrency to auto or off")
        return f"the engine refused to start: {failure.detail}"
    if failure.kind == "out_of_memory":
        current = int(options.get("--ctx-size") or 0) or (plan.native_context or 0)
        smaller = (current // 2) // PAGE_SIZE * PAGE_SIZE
        if smaller < PAGE_SIZE:
            return f"out of memory: {failure.detail} (context {current or 'unknown'} cannot shrink further)"
        return _Step({**options, "--ctx-size": str(smaller)}, exact,
                     f"relaunch with --ctx-size {smaller} (was {current}): out of memory: {failure.detail}")
    if failure.kind == "no_cuda":
        if options.get("--device") == "cpu":
            return f"no usable CUDA device, and the CPU backend failed too: {failure.detail}"
        return _Step({**options, "--device": "cpu"}, exact,
                     f"relaunch with --device cpu: no usable CUDA device: {failure.detail}")
    return terminal_message(failure)


def terminal_message(failure: Failure) -> str:
    return {
        "bad_model": f"the engine could not load the model: {failure.detail}",
        "bad_flags": f"the engine refused its command line: {failure.detail}",
        "port_in_use": f"the engine could not bind its port: {failure.detail}",
        "timeout": failure.detail,
    }.get(failure.kind, f"the engine failed: {failure.detail}")
