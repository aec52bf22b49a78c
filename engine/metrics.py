"""Prometheus text for /metrics, from the scheduler's counters and the server's finished completions.

Names carry llama-server's style ("prefix:name"); the studio matches them by suffix. Ours are `lockstep:*`;
the figures llama-server also reports are repeated under its `llamacpp:*` names.
"""

from __future__ import annotations

PREFIX = "lockstep"
# the scheduler's figures that are levels, not counts (the rest only grow)
GAUGES = frozenset({"pages_total", "pages_free", "pages_cached", "busy_slots", "n_slots", "parked_bytes",
                    "recurrent_states", "queue_len"})


def add_counters(base: dict, stats: dict) -> dict:
    """`stats` with the counts of `base` (an earlier scheduler's last figures) added, so that counters carry
    on across a sleep instead of starting again from zero."""
    out = {**{k: v for k, v in base.items() if k in GAUGES}, **stats}
    for k, v in base.items():
        if k not in GAUGES and isinstance(v, int | float):
            out[k] = out.get(k, 0) + v
    return out


def render(stats: dict, served, window: tuple[int, float, int, float] | None = None) -> str:
    """`window`: (predicted tokens, their ms, prompt tokens, their ms) since the last scrape, for llama-server's
    throughput gauges (theirs cover the time since the previous scrape); None = since the start."""
    pages_total, pages_free = stats["pages_total"], stats["pages_free"]
    pages_cached = stats.get("pages_cached", 0)
    gen_s, prompt_s = served.predicted.ms / 1000, served.prompt.ms / 1000
    rows = [
        ("prompt_tokens_total", "counter", "Prompt tokens submitted.", stats["prompt_tokens_total"]),
        ("tokens_predicted_total", "counter", "Tokens generated.", stats["tokens_predicted_total"]),
        ("requests_total", "counter", "Requests admitted to a slot.", stats["requests_total"]),
        ("requests_processing", "gauge", "Slots busy with a sequence.", stats["busy_slots"]),
        ("requests_deferred", "gauge", "Requests waiting for a slot.", stats["queue_len"]),
        ("n_slots", "gauge", "Slots (--parallel).", stats["n_slots"]),
        ("pages_total", "gauge", "KV pages in the pool.", pages_total),
        ("pages_free", "gauge", "KV pages free.", pages_free),
        ("pages_cached", "gauge", "KV pages holding idle slots' prompt caches (reclaimable).", pages_cached),
        ("pages_used", "gauge", "KV pages held by running sequences.", pages_total - pages_free - pages_cached),
        ("parked_bytes", "gauge", "Host memory holding parked KV pages.", stats.get("parked_bytes", 0)),
        ("recurrent_states", "gauge", "Sequences holding a recurrent state (hybrid models).",
         stats.get("recurrent_states", 0)),
        ("parks_total", "counter", "Sequences parked to host memory.", stats["parks"]),
        ("restores_total", "counter", "Parked sequences restored into the pool.", stats["restores"]),
        ("recomputes_total", "counter", "Preempted sequences dropped for recompute.", stats["recomputes"]),
        ("context_shifts_total", "counter", "Context shifts (--context-shift).", stats.get("context_shifts", 0)),
        ("drafted_total", "counter", "Speculative draft tokens proposed.", stats.get("drafted_total", 0)),
        ("draft_accepted_total", "counter", "Speculative draft tokens accepted.",
         stats.get("draft_accepted_total", 0)),
        ("steps_total", "counter", "Forward steps run.", stats.get("steps_total", 0)),
        ("step_seconds_total", "counter", "Seconds in forward steps, device work and its wait included.",
         stats.get("step_seconds_total", 0.0)),
        ("decode_steps_total", "counter", "Forward steps of one token per sequence.",
         stats.get("decode_steps_total", 0)),
        ("decode_step_seconds_total", "counter", "Seconds in those steps.", stats.get("decode_step_seconds_total", 0.0)),
        ("busy_seconds_total", "counter", "Seconds the compute thread had work: steps plus scheduling.",
         stats.get("busy_seconds_total", 0.0)),
        ("ahead_steps_total", "counter",
         "Decode steps launched before the previous step's tokens reached the host (its scheduling overlapped).",
         stats.get("ahead_steps_total", 0)),
        ("completions_total", "counter", "Completions finished.", served.completions),
        ("predicted_tokens_seconds", "gauge", "Average decode speed per sequence, tokens/s.",
         served.predicted.tokens / gen_s if gen_s > 0 else 0.0),
        ("prompt_tokens_seconds", "gauge", "Average prompt processing speed, tokens/s.",
         served.prompt.tokens / prompt_s if prompt_s > 0 else 0.0),
    ]
    return _lines(PREFIX, rows) + _lines("llamacpp", _llamacpp_rows(stats, served, window))


def _llamacpp_rows(stats: dict, served, window) -> list[tuple]:
    """llama-server's names for the figures that mean the same, so its dashboards read ours."""
    gen_s, prompt_s = served.predicted.ms / 1000, served.prompt.ms / 1000
    n_gen, w_gen_ms, n_prompt, w_prompt_ms = window or served.totals()
    decode_steps = stats.get("decode_steps_total", 0)
    return [
        ("prompt_tokens_total", "counter", "Prompt tokens processed (cached ones apart).", served.prompt.tokens),
        ("prompt_tokens_cached_total", "counter", "Prompt tokens reused from the prompt cache.", served.cached_tokens),
        ("prompt_seconds_total", "counter", "Prompt processing time.", prompt_s),
        ("tokens_predicted_total", "counter", "Tokens generated by finished completions.", served.predicted.tokens),
        ("tokens_predicted_seconds_total", "counter", "Generation time.", gen_s),
        ("n_decode_total", "counter", "Forward steps run.", stats.get("steps_total", 0)),
        ("n_tokens_max", "counter", "Longest sequence finished, in tokens.", served.max_tokens),
        ("spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", stats.get("drafted_total", 0)),
        ("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
         stats.get("draft_accepted_total", 0)),
        ("spec_decode_num_drafts_total", "counter", "Drafts proposed.", stats.get("drafts_total", 0)),
        ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s since the last scrape.",
         n_prompt * 1000 / w_prompt_ms if w_prompt_ms > 0 else 0.0),
        ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s since the last scrape.",
         n_gen * 1000 / w_gen_ms if w_gen_ms > 0 else 0.0),
        ("requests_processing", "gauge", "Requests processing.", stats["busy_slots"]),
        ("requests_deferred", "gauge", "Requests deferred.", stats["queue_len"]),
        ("n_busy_slots_per_decode", "gauge", "Average busy slots per decode step.",
         stats.get("decode_rows_total", 0) / decode_steps if decode_steps else 0.0),
    ]


def _lines(prefix: str, rows: list[tuple]) -> str:
    lines = []
    for name, kind, help_text, value in rows:
        full = f"{prefix}:{name}"
        lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}", f"{full} {_number(value)}"]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"
