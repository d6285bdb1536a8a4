"""What serves the model: read once per run, it is part of every response-cache key.

Takes: the provider settings and the providers built for each endpoint. Gives:
:func:`probe` (one GET or two per endpoint, before any request is sent), :class:`ServerIdentity`
(the identity, its short digest and the slots the servers report) and :func:`pinned`.

The rule. Two servers that answer to the same ``provider.model`` may run different weights (a
swapped GGUF behind the same alias, a vLLM ``--served-model-name``, a fake server), so a cached
answer is only reused for the server that gave it. Each endpoint is asked, in this order:

- llama.cpp's ``GET /props`` (at the server's root): the model file (``model_path``), with its
  size and parameter count when ``/v1/models`` lists them (``meta``);
- ``GET {base_url}/models`` (OpenAI-compatible): the entry for the model, its ``id``, ``root``
  and ``owned_by``. ``created`` is left out: vLLM and llama.cpp report the time of the request
  there, which would make every run a new server;
- Ollama's ``GET /api/tags``: the model's ``digest``;
- otherwise the base URL itself (without credentials or query string).

The run's identity is the sorted set of what its endpoints report, so replicas that report the
same model file share answers and a list of endpoints with no identity to report does not.
``provider.cache_identity`` pins it instead (no probe): the way to share answers on purpose, or
to replay under a digest a manifest recorded. An endpoint that cannot be reached, or answers
these reads with 429 or 5xx (llama.cpp while it loads the model), is left out; when none can
tell, the run has no identity and does not use the cache (it asks the servers, and a dead URL
fails as it would without a cache).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from storyforge.config.provider import OllamaProviderConf, OpenAIProviderConf, ProviderConf
from storyforge.providers.base import Provider, join_url, public_url, same_model, split_userinfo
from storyforge.providers.retry import read_capped
from storyforge.providers.transport import open_session
from storyforge.redaction import redact

__all__ = ["PROBE_BYTES", "ServerIdentity", "digest_of", "pinned", "probe"]

log = logging.getLogger(__name__)

PROBE_BYTES = 4 * 1024 * 1024
"""A probe answer larger than this is not read (a model list is a few kB)."""

PROBE_TIMEOUT_S = 10.0
"""The longest a probe waits (or ``provider.timeout_s`` when that is shorter)."""

_HEX16 = re.compile(r"[0-9a-f]{16}")


def digest_of(text: str) -> str:
    """The 16 hex digits of an identity that go into the cache keys."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerIdentity:
    """What the run's answers are cached under: ``text`` (what the servers reported), ``digest``
    (its 16 hex digits, in every cache key), ``source`` (``props``, ``models``, ``tags``,
    ``base_url``, ``pinned``, ``journal`` or ``cache``) and the slots each endpoint reports."""

    text: str
    digest: str
    source: str
    slots: dict[str, int] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """What the manifest records (never a secret: URLs are public, fields are the server's)."""
        return {"digest": self.digest, "source": self.source, "reported": redact(self.text)}


def pinned(value: str, *, source: str = "pinned") -> ServerIdentity:
    """``provider.cache_identity``: 16 hex digits are a digest as a manifest records it; any other
    text is a name whose digest is used."""
    text = value.strip()
    digest = text if _HEX16.fullmatch(text) else digest_of(f"pinned:{text}")
    return ServerIdentity(text=text, digest=digest, source=source)


@dataclass(frozen=True, slots=True)
class _Seen:
    fields: dict[str, Any] | None  # None: the endpoint could not be reached
    source: str
    slots: int | None
    why: str = ""


async def _get(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], timeout_s: float
) -> tuple[int, Any]:
    """(status, decoded JSON or None); connection failures and timeouts raise."""
    async with session.get(
        url,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        allow_redirects=False,  # the key must not travel to another address
    ) as response:
        data = await read_capped(response, PROBE_BYTES)
        if data is None or not 200 <= response.status <= 299:
            return response.status, None
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, None


def _server_root(base: str) -> str:
    """``http://h:8080/v1`` -> ``http://h:8080/`` (llama.cpp serves /props beside /v1)."""
    parts = urlsplit(base)
    path = re.sub(r"/v1/?$", "/", parts.path.rstrip("/") + "/")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _model_entry(listing: Any, model: str, key: str, name_key: str) -> Mapping[str, Any] | None:
    entries = listing.get(key) if isinstance(listing, Mapping) else None
    if not isinstance(entries, list):
        return None
    named = [(e[name_key], e) for e in entries if isinstance(e, Mapping) and isinstance(e.get(name_key), str)]
    exact = [e for name, e in named if name == model]
    close = [e for name, e in named if same_model(model, name)]
    found = exact or close
    return found[0] if found else None


def _plain(value: Any) -> Any:
    """A reported field kept only when it is a short scalar (a server's text, never a structure)."""
    if isinstance(value, str):
        return value[:500]
    return value if value is None or isinstance(value, bool | int | float) else None


async def _one(
    session: aiohttp.ClientSession, conf: ProviderConf, provider: Provider, base: str, timeout_s: float
) -> _Seen:
    headers = {k: v for k, v in provider.headers().items() if k.lower() != "content-type"}
    try:
        if isinstance(conf, OllamaProviderConf):
            status, tags = await _get(session, join_url(base, "api/tags"), headers, timeout_s)
            if _busy(status):
                return _Seen(None, "", None, f"HTTP {status} from /api/tags")
            entry = _model_entry(tags, provider.model, "models", "name")
            if entry is not None and isinstance(entry.get("digest"), str):
                return _Seen({"digest": entry["digest"]}, "tags", None)
            return _Seen({"base_url": public_url(base)}, "base_url", None)
        status, props = await _get(session, join_url(_server_root(base), "props"), headers, timeout_s)
        if _busy(status):  # llama.cpp answers 503 while it loads the model: not yet known
            return _Seen(None, "", None, f"HTTP {status} from /props")
        status, listing = await _get(session, join_url(base, "models"), headers, timeout_s)
        if _busy(status):
            return _Seen(None, "", None, f"HTTP {status} from /models")
    except (TimeoutError, aiohttp.ClientError) as exc:
        why = "no answer in time" if isinstance(exc, TimeoutError) else type(exc).__name__
        return _Seen(None, "", None, provider.redact(f"{why}: {exc}".rstrip(": ")))
    entry = _model_entry(listing, provider.model, "data", "id")
    slots = props.get("total_slots") if isinstance(props, Mapping) else None
    slots = slots if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0 else None
    if isinstance(props, Mapping) and isinstance(props.get("model_path"), str) and props["model_path"]:
        fields: dict[str, Any] = {"model_path": props["model_path"]}
        # llama.cpp serves one model, listed under its alias whatever name the run asks for.
        data = listing.get("data") if isinstance(listing, Mapping) else None
        only = data[0] if isinstance(data, list) and len(data) == 1 and isinstance(data[0], Mapping) else None
        meta = (entry or only or {}).get("meta")
        if isinstance(meta, Mapping):
            fields |= {k: _plain(meta[k]) for k in ("size", "n_params") if k in meta}
        return _Seen(fields, "props", slots)
    if entry is not None:
        return _Seen({k: _plain(entry.get(k)) for k in ("id", "root", "owned_by")}, "models", slots)
    return _Seen({"base_url": public_url(base)}, "base_url", slots)


def _busy(status: int) -> bool:
    """A status that says the server cannot tell now (overloaded, loading, failing)."""
    return status == 429 or status >= 500


def _bases(conf: ProviderConf, providers: Sequence[Provider]) -> list[str]:
    if isinstance(conf, OpenAIProviderConf):
        return conf.base_urls()
    if isinstance(conf, OllamaProviderConf):
        return [conf.host]
    return [p.url for p in providers]


async def _probe_all(conf: ProviderConf, providers: Sequence[Provider]) -> list[tuple[str, _Seen]]:
    # Credentials in a URL go in the provider's Authorization header, never in the URL asked.
    bases = [split_userinfo(base)[0] for base in _bases(conf, providers)]
    pairs = list(zip(bases, providers, strict=False))
    timeout_s = min(conf.timeout_s, PROBE_TIMEOUT_S)
    async with open_session(max(1, len(pairs)), providers[0].url, trust_env=conf.trust_env) as session:
        seen = await asyncio.gather(*(_one(session, conf, p, b, timeout_s) for b, p in pairs))
    return [(public_url(b), s) for (b, _), s in zip(pairs, seen, strict=True)]


def probe(conf: ProviderConf, providers: Sequence[Provider]) -> ServerIdentity | None:
    """The identity the endpoints report (see the module docstring), or None when none answered.

    Also warns, with the numbers, when ``provider.concurrency`` is above the slots an endpoint
    reports (``/props`` ``total_slots``): the requests beyond them wait in the server's queue.
    """
    results = asyncio.run(_probe_all(conf, providers))
    reached = [(url, seen) for url, seen in results if seen.fields is not None]
    for url, seen in results:
        if seen.fields is None and reached:
            log.warning(
                "could not read what serves %s (%s); it is left out of the run's identity", url, seen.why
            )
    if not reached:
        log.warning(
            "could not read what serves %s (%s): the response cache is not read in this run, every "
            "request is sent (provider.replay=only answers from the cache without a server; "
            "provider.cache_identity pins the identity)",
            ", ".join(url for url, _ in results),
            results[0][1].why if results else "no endpoint",
        )
        return None
    slots = {url: seen.slots for url, seen in reached if seen.slots is not None}
    for url, n in slots.items():
        if conf.concurrency > n:
            log.warning(
                "provider.concurrency=%d is above the %d slot(s) %s reports (/props total_slots): "
                "%d request(s) at a time wait in the server's queue, and that wait counts against "
                "provider.timeout_s=%g",
                conf.concurrency,
                n,
                url,
                conf.concurrency - n,
                conf.timeout_s,
            )
    kinds = sorted({seen.source for _, seen in reached})
    reported = sorted({json.dumps(seen.fields, sort_keys=True, ensure_ascii=False) for _, seen in reached})
    text = reported[0] if len(reported) == 1 else "[" + ",".join(reported) + "]"
    return ServerIdentity(text=text, digest=digest_of(text), source="+".join(kinds), slots=slots)
