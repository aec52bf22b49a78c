"""Whether the Hub (or the proxy in front of it) takes a TCP connection, asked before huggingface_hub lists a
repo: its HTTP calls retry a refused or failed connection five times with backoff (1+2+4+8+8 s), so without
this an offline pull takes ~23 s to say so."""

from __future__ import annotations

import socket
import threading
import urllib.parse
import urllib.request

# Only the TCP connect (name lookup included) is bounded here: one round trip, well under a second even on a
# slow link (a satellite hop is ~0.6 s), with room for one lost SYN (Linux resends after 1 s). Listing and
# transfers keep huggingface_hub's and fetch()'s own timeouts and retries, so a slow working network still pulls.
CONNECT_S = 3.0


def _address(endpoint: str) -> tuple[str, int] | None:
    """The host and port a request to `endpoint` connects to first: the proxy's when one applies."""
    url = urllib.parse.urlsplit(endpoint)
    if not url.hostname:
        return None
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(url.hostname):
        url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if not url.hostname:
            return None
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def unreachable(endpoint: str, timeout: float = CONNECT_S) -> str | None:
    """Why no connection to `endpoint` opened within `timeout`; None when one did (or it cannot be asked)."""
    address = _address(endpoint)
    if address is None:
        return None  # an endpoint we cannot parse: huggingface_hub will say what is wrong with it
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{exc.strerror or exc} ({address[0]}:{address[1]})")

    # A thread, because a hung name lookup ignores the socket timeout.
    probe = threading.Thread(target=connect, daemon=True, name="hub-probe")
    probe.start()
    probe.join(timeout)
    return outcome[0] if outcome else f"no connection to {address[0]}:{address[1]} within {timeout:.0f} s"
