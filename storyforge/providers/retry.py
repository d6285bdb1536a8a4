"""One request to a model server, retried until it succeeds, fails for good, or runs out of tries.

Takes: a pooled ``aiohttp.ClientSession``, a :class:`~storyforge.providers.base.Provider`, one
:class:`~storyforge.providers.base.ChatRequest` with its encoded body, and a
:class:`RetryPolicy`. Gives: :func:`send`, which returns an :class:`Outcome` (a
:class:`~storyforge.providers.base.Completion`, or the last error after every try) or raises
:class:`~storyforge.errors.ProviderError` at once for an answer that retrying cannot fix.

What is retried: HTTP 408, 409, 425, 429 and 5xx (except 501 and 505), timeouts (the whole
request has a deadline of ``timeout_s``, not just each socket read, so a server that trickles
bytes cannot hold a worker forever), dropped or refused connections, and 2xx answers that are
not the JSON the API promises. Anything else (400, 401, 403, 404, 422, ...) means the request
or the config is wrong, so it stops the run with the status and the server's own words.

Waiting: a ``Retry-After`` header (delta-seconds or an HTTP date) is obeyed, capped at
``max_retry_after_s``; otherwise full-jitter exponential backoff, a uniform draw from
``[0, min(backoff_max_s, backoff_base_s * 2**retry)]``, which spreads a burst of clients that
failed together instead of having them retry in lockstep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp

from storyforge import jsontext
from storyforge.errors import ProviderError
from storyforge.providers.base import (
    ChatRequest,
    Completion,
    MalformedResponse,
    Provider,
    cut,
    names_a_model_file,
    public_url,
    same_model,
    server_error_text,
    strip_prefill_echo,
)

__all__ = [
    "Outcome",
    "RetryPolicy",
    "is_retryable_status",
    "parse_retry_after",
    "read_capped",
    "send",
]

log = logging.getLogger(__name__)

_RETRYABLE_4XX = frozenset({408, 409, 425, 429})
_FINAL_5XX = frozenset({501, 505})

_HINTS = {
    401: "check the key in the environment variable named by provider.api_key_env",
    403: "check the key in the environment variable named by provider.api_key_env",
    404: "check provider.base_url / provider.host and provider.model",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently one request is tried."""

    max_retries: int
    timeout_s: float
    backoff_base_s: float
    backoff_max_s: float
    max_retry_after_s: float
    max_response_bytes: int = 8 * 1024 * 1024
    # What an answer from another model than provider.model does: "error" stops the run,
    # "warn" keeps the answer and records the model that served it.
    on_model_mismatch: str = "error"

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Full jitter: a uniform draw in ``[0, min(max, base * 2**retry)]`` (``retry`` from 0)."""
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2.0 ** min(retry, 62))
        return rng.uniform(0.0, ceiling)

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        """The wait before the next try: the server's Retry-After (capped) if it sent one."""
        if retry_after is not None:
            if retry_after > self.max_retry_after_s:
                _warn_once(
                    ("retry-after", retry_after),
                    f"the server asked to wait {retry_after:g}s (Retry-After); waiting "
                    f"provider.max_retry_after_s={self.max_retry_after_s:g}s instead",
                )
            return min(retry_after, self.max_retry_after_s)
        return self.backoff(retry, rng)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How one request ended: a completion, or the error that remained after every try.

    ``attempts`` counts every try (1 when the first succeeded); ``latency_s`` is the duration
    of the last try, which is the one that produced the completion.
    """

    completion: Completion | None
    error: str | None
    attempts: int
    latency_s: float
    # Answered from the response cache (nothing was sent, nothing paid).
    cached: bool = False


def is_retryable_status(status: int) -> bool:
    """True for statuses that may succeed when asked again (429, 5xx, ...)."""
    if status in _RETRYABLE_4XX:
        return True
    return 500 <= status <= 599 and status not in _FINAL_5XX


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or HTTP date), else None.

    A date in the past gives 0; anything unparseable gives None (fall back to backoff).
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now if now is not None else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds())


Sleep = Callable[[float], Awaitable[Any]]


async def send(
    session: aiohttp.ClientSession,
    provider: Provider,
    request: ChatRequest,
    content: bytes,
    policy: RetryPolicy,
    *,
    rng: random.Random,
    sleep: Sleep = asyncio.sleep,
    on_retry: Callable[[str], None] | None = None,
) -> Outcome:
    """POST ``content`` to ``provider.url`` until it succeeds or the tries run out.

    Each try has one deadline of ``policy.timeout_s`` for the whole exchange. Raises
    :class:`ProviderError` (status and server text, secrets redacted) for an answer that no
    retry can fix. ``on_retry(reason)`` is called before each wait.
    """
    headers = provider.headers()
    deadline = aiohttp.ClientTimeout(total=policy.timeout_s)
    attempts = 0
    while True:
        attempts += 1
        retry_after: float | None = None
        started = time.perf_counter()
        try:
            # Redirects are never followed: the API key must not travel to another address.
            async with session.post(
                provider.url, data=content, headers=headers, timeout=deadline, allow_redirects=False
            ) as response:
                status = response.status
                data = await read_capped(response, policy.max_response_bytes)
                if data is None:
                    response.close()  # drop the rest of the body with the connection
                    return Outcome(
                        completion=None,
                        error=f"the answer is larger than provider.max_response_bytes="
                        f"{policy.max_response_bytes} (HTTP {status}); it was not kept",
                        attempts=attempts,
                        latency_s=time.perf_counter() - started,
                    )
        except TimeoutError:  # aiohttp's timeouts (total, connect, read) are all TimeoutErrors
            reason = f"no complete answer within timeout_s={policy.timeout_s:g}s"
        except aiohttp.ClientError as exc:
            reason = f"connection failed ({type(exc).__name__}: {provider.redact(str(exc)) or 'no detail'})"
        else:
            latency = time.perf_counter() - started
            if 200 <= status <= 299:
                try:
                    completion = provider.parse(jsontext.loads(data))
                except (ValueError, MalformedResponse) as exc:
                    reason = f"malformed answer (HTTP {status}): {cut(' '.join(provider.redact(str(exc)).split()), 200)}"
                else:
                    completion = redact_completion(provider, completion)
                    check_served_model(provider, completion, policy)
                    completion = strip_prefill_echo(completion, request)
                    return Outcome(completion=completion, error=None, attempts=attempts, latency_s=latency)
            else:
                text = _error_text(data, response.reason, provider.redact)
                if not is_retryable_status(status):
                    hint = _HINTS.get(status) or _redirect_hint(status, response.headers.get("Location"))
                    raise ProviderError(
                        f"{provider.name} server at {public_url(provider.url)} answered HTTP {status} "
                        f"{response.reason or ''} for prompt {request.id!r} sample {request.sample}: "
                        f"{text}" + (f" ({hint})" if hint else ""),
                        status=status,
                        body=text,
                    )
                reason = f"HTTP {status}: {text}"
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
        latency = time.perf_counter() - started
        reason = provider.redact(reason)
        if attempts > policy.max_retries:
            return Outcome(
                completion=None,
                error=f"gave up after {attempts} attempt{'s' if attempts != 1 else ''}: {reason}",
                attempts=attempts,
                latency_s=latency,
            )
        if on_retry is not None:
            on_retry(reason)
        await sleep(policy.delay(attempts - 1, retry_after, rng))


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, or None as soon as it is known to exceed ``limit`` bytes."""
    if response.content_length is not None and response.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _redirect_hint(status: int, location: str | None) -> str | None:
    if not 300 <= status <= 399:
        return None
    return (
        f"it redirects to {location or 'no Location'}; storyforge does not follow redirects, so the "
        "API key never travels to another address: set the provider's URL to the final address"
    )


_warned: set[object] = set()


def _warn_once(key: object, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", message)


def check_served_model(
    provider: Provider, completion: Completion, policy: RetryPolicy, *, cached: str | None = None
) -> None:
    """Apply ``provider.on_model_mismatch`` to an answer (live, or ``cached`` in that cache file).

    Raises :class:`ProviderError` under ``error``; warns once per model under ``warn``.
    """
    if same_model(provider.model, completion.served_model):
        return
    where = public_url(provider.url)
    if completion.served_model is not None and names_a_model_file(completion.served_model):
        # llama.cpp's server started without --alias answers with the path it loaded: a file,
        # not another model's name. The record keeps it; the run goes on.
        _warn_once(
            ("file", where, completion.served_model),
            f"{provider.name} server at {where} names its model by the file it loaded "
            f"({completion.served_model!r}), not provider.model {provider.model!r}: the records keep "
            "that path. Start llama-server with --alias NAME (or use provider=llama_cpp) to name it",
        )
        return
    origin = (
        f"the response cache {cached} holds an answer from"
        if cached
        else (f"{provider.name} server at {where} answered with")
    )
    if policy.on_model_mismatch == "error":
        raise ProviderError(
            f"{origin} model {completion.served_model!r}, but provider.model is {provider.model!r}"
            + (
                ": it was kept under provider.on_model_mismatch=warn. Set provider.replay=off (and "
                "provider.on_model_mismatch=error) to ask the server again, or "
                "provider.on_model_mismatch=warn to keep it"
                if cached
                else ": the server serves another model than the one asked for (a single-model server "
                "ignores the name). Point provider.base_url at the right server or fix provider.model; "
                "provider.on_model_mismatch=warn keeps such answers"
            )
        )
    _warn_once(
        ("model", where, provider.model, completion.served_model, bool(cached)),
        f"{origin.replace(' answered with', ' answers with')} model {completion.served_model!r}, "
        f"not provider.model {provider.model!r}; the "
        "records keep the served model (provider.on_model_mismatch=warn)",
    )


def _error_text(data: bytes, reason: str | None, redact: Callable[[str], str]) -> str:
    """The server's words, redacted before they are cut (a key across the cut is still found)."""
    fallback = data.decode("utf-8", "replace") or reason or "no error text"
    try:
        payload = json.loads(data)
    except ValueError:
        payload = None
    return server_error_text(payload, fallback, redact=redact)


def redact_completion(provider: Provider, completion: Completion) -> Completion:
    """``completion`` with the provider's secrets removed from its texts (a server may echo a key)."""
    changes: dict[str, Any] = {}
    for name in ("output", "served_model", "finish_reason"):
        value = getattr(completion, name)
        if isinstance(value, str) and (clean := provider.redact(value)) != value:
            changes[name] = clean
    choices = getattr(completion, "choices", None)
    if choices:
        changes["choices"] = tuple(redact_completion(provider, choice) for choice in choices)
    return dataclasses.replace(completion, **changes) if changes else completion
