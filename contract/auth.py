"""Bearer keys, compared the same way by the engine and the studio."""

from __future__ import annotations

import hmac


def same_key(given: str, expected: str) -> bool:
    """Constant time in the key's content, so a timing probe learns nothing of it."""
    return hmac.compare_digest(given.encode(), expected.encode())


def presented_key(headers) -> str:
    """The key a request presents: `Authorization: Bearer <key>`, else `X-Api-Key`."""
    auth = headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("X-Api-Key", "")
