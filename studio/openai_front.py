"""What the studio's /v1 front adds to the proxy: the model list without an engine, model names checked
against the loaded model, and a length limit for requests that give none.

Clients send a model name with every request (the `openai` client requires one); serving whatever is
loaded under any name would hide a mistake, so a name that is neither the loaded model's id, alias nor
path is a 404 that names the loaded model, as Ollama answers for a model it does not have. With the
`auto_load` setting on, a name that is a catalog id is loaded instead (stored load defaults), as Ollama
loads a model on its first request.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from settings import LoadRequest
from studio.catalog import ModelInfo
from studio.errors import StudioError
from studio.manager import LoadManager

# Bodies that generate: where a model name and a length limit matter.
GENERATING = ("/v1/chat/completions", "/v1/completions")
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")
# A request without a limit would otherwise run to the end of its context, minutes on a CPU.
DEFAULT_MAX_TOKENS = 1024


def model_list(manager: LoadManager, models: list[ModelInfo]) -> dict[str, Any]:
    """OpenAI's model list from the catalog's `models`, loaded or not, with the loaded one marked (and first)."""
    loaded = manager.loaded if manager.state in ("ready", "loading") else None
    rows = []
    for info in models:
        is_loaded = loaded is not None and loaded.plan.model_path == info.path
        rows.append({"id": info.id, "object": "model", "created": 0, "owned_by": "lockstep",
                     "loaded": is_loaded, "state": manager.state if is_loaded else "not_loaded",
                     "path": info.path, "format": info.format, "context_length": info.native_context})
    rows.sort(key=lambda r: not r["loaded"])
    return {"object": "list", "data": rows, "loaded": loaded.model_id if loaded else None}


def default_max_tokens(props: dict[str, Any]) -> int:
    """The studio's limit for the loaded model: DEFAULT_MAX_TOKENS, or a slot's whole context when smaller."""
    slot_ctx = props.get("n_ctx_seq") or 0
    return min(DEFAULT_MAX_TOKENS, slot_ctx) if slot_ctx > 0 else DEFAULT_MAX_TOKENS


def _names(manager: LoadManager) -> set[str]:
    loaded = manager.loaded
    if loaded is None:
        return set()
    return {loaded.model_id, loaded.plan.alias, loaded.plan.model_path}


def requested_model(path: str, raw: bytes) -> str | None:
    """The model a generating request names, or None."""
    if path not in GENERATING or not raw:
        return None
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    name = body.get("model") if isinstance(body, dict) else None
    return name if isinstance(name, str) and name else None


async def load_on_demand(manager: LoadManager, path: str, raw: bytes) -> None:
    """Under `auto_load`, loads the catalog model a request names when another one, or none, is loaded. Only
    catalog ids: a request body is no way to read an arbitrary file. A failed load answers as /api/load's."""
    name = requested_model(path, raw)
    if name is None or not manager.store.settings.auto_load:
        return
    if name in _names(manager):
        return  # a crashed engine of this model respawns in manager.engine()
    # the catalog reads model headers from disk: off the event loop
    models = await asyncio.to_thread(manager.catalog.scan)
    if not any(m.id == name for m in models):
        return
    manager.log.info("auto_load: loading %s for a request that names it", name)
    # Shielded, as /api/load: a client that stops waiting does not abandon a load half way.
    await asyncio.shield(manager.load(LoadRequest(model=name)))


def prepare_body(manager: LoadManager, path: str, raw: bytes) -> bytes:
    """The body to forward: checked model name, and the default limit when the request sets none."""
    if path not in GENERATING or not raw:
        return raw
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw  # the engine answers a malformed body in its own words
    if not isinstance(body, dict):
        return raw
    name = body.get("model")
    loaded = manager.loaded
    if isinstance(name, str) and name and loaded is not None and name not in _names(manager):
        raise StudioError(404, "model_not_found",
                          f"model {name!r} is not loaded; the loaded model is {loaded.model_id!r} "
                          "(load another with POST /api/load, send its name, or turn the auto_load setting on to load "
                          "catalog models by name)", loaded=loaded.model_id)
    if any(body.get(k) is not None for k in LIMIT_FIELDS):
        return raw
    child = loaded.child if loaded is not None else None
    body["max_tokens"] = default_max_tokens(child.props if child is not None else {})
    return json.dumps(body).encode()


_ID = re.compile(rb'"id"\s*:\s*"([^"]{1,80})"')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class RequestRecord:
    """What the studio log says of one proxied request: its id, tokens, time and status."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.start = time.monotonic()
        self.id: str | None = None
        self.events = 0  # streamed token events, when the engine reports no usage
        self.tail = b""

    def feed(self, chunk: bytes) -> None:
        if self.id is None and (m := _ID.search(chunk)):
            self.id = m.group(1).decode(errors="replace")
        self.events += chunk.count(b'"delta"') + chunk.count(b'"text"')
        self.tail = (self.tail + chunk)[-4096:]

    def line(self, status: int | str) -> str:
        usage = _COMPLETION_TOKENS.findall(self.tail)
        tokens = f"tokens {int(usage[-1])}" if usage else f"events {self.events}"
        ms = (time.monotonic() - self.start) * 1000
        return f"request {self.id or '-'} {self.path}: {tokens}, {ms:.0f} ms, status {status}"
