"""What the exactness check runs on: the loaded model's path, vocabulary size and backend."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp


class NoTarget(Exception):
    """No model is ready to check; the message says what to do."""


@dataclass(frozen=True)
class EvidenceTarget:
    model_id: str
    model_path: str
    vocab: int
    device: str


async def evidence_target(manager) -> EvidenceTarget:
    loaded = manager.loaded
    child = loaded.child if loaded is not None else None
    if manager.state != "ready" or child is None or not child.alive:
        raise NoTarget("load a model first (F1 Models, Enter): the check runs on the loaded model")
    timeout = aiohttp.ClientTimeout(total=10)
    try:
        async with aiohttp.ClientSession(headers=child.auth_headers, timeout=timeout) as session:
            async with session.get(child.base_url + "/v1/models") as resp:
                data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise NoTarget(f"the loaded engine did not describe its model: {exc}") from exc
    try:
        vocab = int(data["data"][0]["meta"]["n_vocab"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise NoTarget("the loaded engine's /v1/models gives no meta.n_vocab") from exc
    # The check must compare like with like: the backend the loaded engine really runs on.
    backend = (child.props.get("exact_concurrency") or {}).get("backend")
    device = backend if backend in ("cpu", "cuda") else (loaded.plan.options.get("--device") or "auto")
    return EvidenceTarget(loaded.model_id, loaded.plan.model_path, vocab, device)
