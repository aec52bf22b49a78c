"""Host-header names both HTTP servers (engine and studio) read the same way, for their DNS-rebinding
defence."""

from __future__ import annotations

import ipaddress

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD = frozenset({"0.0.0.0", "::", ""})  # a listen address meaning every interface


def host_name(header: str) -> str:
    """The name in a Host header without its port: 'localhost:8765' -> 'localhost', '[::1]:80' -> '::1'."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        return h[1:end] if end > 0 else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
