"""Live figures of a running engine for /api/status: its /slots and its Prometheus /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import Any

import aiohttp

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")

# Status field -> metric name suffixes accepted for it, so llama-server style prefixes
# ("llamacpp:") and "_total" counters both match.
_WANTED = {
    "pages_used": ("pages_used",),
    "pages_free": ("pages_free",),
    "parks": ("parks_total", "parks"),
    "restores": ("restores_total", "restores"),
    "recomputes": ("recomputes_total", "recomputes"),
    "tokens_per_second": ("predicted_tokens_seconds", "tokens_per_second"),
}


def parse_metrics(text: str) -> dict[str, float]:
    """Unlabelled sum per metric name; comments and unparsable samples are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        with contextlib.suppress(ValueError):
            out[m["name"]] = out.get(m["name"], 0.0) + float(m["value"])
    return out


def pick(metrics: dict[str, float]) -> dict[str, float | None]:
    picked: dict[str, float | None] = {}
    for field, suffixes in _WANTED.items():
        picked[field] = None
        for suffix in suffixes:
            hits = [v for name, v in metrics.items() if name.split(":")[-1].endswith(suffix)]
            if hits:
                picked[field] = hits[0]
                break
    return picked


async def _get(session: aiohttp.ClientSession, url: str) -> bytes | None:
    try:
        async with session.get(url) as resp:
            return await resp.read() if resp.status == 200 else None
    except (TimeoutError, aiohttp.ClientError):
        return None


async def engine_stats(child, timeout_s: float = 2.0) -> dict[str, Any]:
    """Slots and metric figures; a field the engine does not give is None."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(headers=child.auth_headers, timeout=timeout) as session:
        slots_raw, metrics_raw = await asyncio.gather(
            _get(session, child.base_url + "/slots"), _get(session, child.base_url + "/metrics")
        )
    slots = None
    if slots_raw is not None:
        with contextlib.suppress(ValueError):
            slots = json.loads(slots_raw)
    text = metrics_raw.decode("utf-8", errors="replace") if metrics_raw is not None else ""
    return {"slots": slots, **pick(parse_metrics(text))}
