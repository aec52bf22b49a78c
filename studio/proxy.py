"""The /v1 proxy to the loaded engine: only the engine's OpenAI-compatible paths, streaming included.

The path sent upstream is rebuilt from an allow-list, never copied from the request: a tail such as
`%2e%2e/props` would otherwise be normalised by the HTTP client into another engine endpoint.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from urllib.parse import quote

import aiohttp
from aiohttp import web
from yarl import URL

# Headers that belong to one hop, not to the request or response being relayed.
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
       "transfer-encoding", "upgrade", "host", "content-length"}
PATHS = ("models", "completions", "chat/completions", "health")
_MODEL_ID = re.compile(r"models/([^/\\%]+)")


def upstream_path(tail: str) -> str | None:
    """'/v1/<tail>' when `tail` (already percent-decoded once) is a known path, else None."""
    if tail in PATHS:
        return "/v1/" + tail
    match = _MODEL_ID.fullmatch(tail)
    if match and match.group(1) not in (".", ".."):
        return "/v1/models/" + quote(match.group(1), safe="")
    return None


async def forward(request: web.Request, path: str, child, session: aiohttp.ClientSession, body: bytes,
                  error: Callable[..., web.Response], tap: Callable[[bytes], None] | None = None
                  ) -> web.StreamResponse:
    """Relay `request` to `path` (from upstream_path) on the engine `child`, with `body`; `tap` sees each
    chunk of the answer as it is relayed."""
    query = request.rel_url.raw_query_string
    url = URL(child.base_url + path + ("?" + query if query else ""), encoded=True)
    # The studio answers for origins (the engine would judge the studio's own clients by its own policy).
    dropped = HOP | {"authorization", "x-api-key", "origin"}
    headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
    headers.update(child.auth_headers)
    # No total timeout: a long generation streams for as long as it streams.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    response: web.StreamResponse | None = None
    try:
        async with session.request(request.method, url, headers=headers, data=body, timeout=timeout) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP:
                    response.headers.add(key, value)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                if tap is not None:
                    tap(chunk)
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        if response is not None and response.prepared:
            await _end_cut_stream(response, exc)
            return response
        return error(502, "engine_unreachable", f"the engine did not answer: {exc}")


async def _end_cut_stream(response: web.StreamResponse, exc: Exception) -> None:
    """The engine went away mid-answer. A cut stream must not read as a complete one: an event stream ends
    with an error event (OpenAI clients raise on it); any other body is left cut short."""
    if not response.content_type.startswith("text/event-stream"):
        return
    event = {"error": {"code": 502, "type": "engine_unreachable",
                       "message": f"the engine stopped mid-answer: {exc}"}}
    with contextlib.suppress(ConnectionError, RuntimeError):  # the client may be gone as well
        await response.write(b"\n\ndata: " + json.dumps(event).encode() + b"\n\n")
        await response.write_eof()
