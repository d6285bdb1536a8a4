"""The HTTP client for a generation run: one ``aiohttp.ClientSession``, one keep-alive connection per worker.

Takes: the worker count, the endpoint and the proxy policy. Gives: :func:`open_session`, an
``aiohttp.ClientSession`` whose ``TCPConnector(limit=workers)`` pool keeps at most ``workers``
connections to the server and reuses them for the whole run, and :func:`environment_proxy`,
the proxy the environment asks for (never one for a loopback endpoint).

Why aiohttp: a run sends thousands of requests to a loopback server on a small machine, so
the client's CPU per request sets the pace. aiohttp parses HTTP in C and its pool hands back
an idle keep-alive connection in O(1); httpx, which the official OpenAI client is built on,
spent about 3.5x the CPU per request in ``bench/provider_bench.py`` (and that client cannot
speak Ollama's native API).

Connections: each worker sends one request at a time and the pool holds as many
connections as there are workers, so no request waits for a connection, every connection
is reused (no handshake per request) and the server never sees more connections than it
was promised. Timeouts: the session has none of its own; :func:`~storyforge.providers.retry.send`
gives every try one ``aiohttp.ClientTimeout(total=timeout_s)``, a deadline for the whole
exchange (connect, send, headers and body), so a server that trickles bytes cannot hold a
worker forever. Cookies are not kept (a model API is stateless, and a jar costs time on
every request).

Proxies: with ``trust_env`` the endpoint's proxy comes from ``HTTP(S)_PROXY`` /
``ALL_PROXY`` and ``NO_PROXY`` as usual, decided once per run by :func:`environment_proxy`,
except that a loopback endpoint is never proxied (a proxy cannot reach this machine's
127.0.0.1). The session itself runs with aiohttp's ``trust_env`` off on purpose: that flag
looks the proxy (and ``~/.netrc``) up again in a thread on every request, ignores
``ALL_PROXY``, would proxy loopback, and with a ``~/.netrc`` entry for the host makes every
request that carries an API key fail (aiohttp will not send both ``Authorization``
headers). Credentials in the proxy URL (``http://user:pass@proxy:3128``) are sent as
``Proxy-Authorization``.
"""

from __future__ import annotations

import ipaddress
import urllib.request
from urllib.parse import urlsplit

import aiohttp

__all__ = ["environment_proxy", "open_session"]


def open_session(workers: int, url: str, *, trust_env: bool) -> aiohttp.ClientSession:
    """One session for a run against ``url``: at most ``workers`` kept-alive connections.

    Call inside the event loop that will use it; close it with ``async with`` or ``close()``.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=workers, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=None),
        proxy=environment_proxy(url) if trust_env else None,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        raise_for_status=False,
    )


def environment_proxy(url: str) -> str | None:
    """The proxy the environment asks for when calling ``url``, or None (always None for loopback)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if _is_loopback(host):
        return None
    proxies = urllib.request.getproxies()
    if not proxies or urllib.request.proxy_bypass(host):
        return None
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy:
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
