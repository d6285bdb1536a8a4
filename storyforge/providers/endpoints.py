"""Many endpoints for one model: spread requests, take a dead endpoint out, bring it back later.

Takes: the provider settings (``provider.base_url`` as a list, ``provider.concurrency`` per
endpoint, ``provider.fail_fast_s``) and the provider built for the first URL. Gives:
:func:`plan_sending`, which returns the send function the runner calls for every request (with
the response cache in front when there is one) and how many workers the run needs; and
:class:`EndpointPool`, the send function for more than one endpoint.

How the pool behaves: each request goes to the endpoint with the fewest requests in flight,
never more than ``concurrency`` at once per endpoint. A try that fails at the connection
level (refused, reset, no route) takes that endpoint out and the request goes to another one
at once; such a failover is not counted against ``max_retries``, since no server answered. An
endpoint that is out is tried again with a single request after a pause (1 s, doubling up to
30 s); when that request succeeds it is back. Other failures (5xx, timeouts, malformed
answers) are retried with backoff as :func:`~storyforge.providers.retry.send` does, each try on
the least busy endpoint. Only when every endpoint has been out for ``fail_fast_s`` seconds does
the run stop, with a :class:`~storyforge.errors.ProviderError` naming each endpoint and why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from storyforge.config.provider import OpenAIProviderConf, ProviderConf
from storyforge.errors import ProviderError
from storyforge.providers.base import ChatRequest, Provider, public_url
from storyforge.providers.cache import CachedSend, ResponseCache
from storyforge.providers.retry import Outcome, RetryPolicy, send

__all__ = ["COOLDOWN_S", "MAX_COOLDOWN_S", "EndpointPool", "endpoint_providers", "plan_sending"]

log = logging.getLogger(__name__)

COOLDOWN_S = 1.0
MAX_COOLDOWN_S = 30.0
_GIVE_UP_DEFAULT_S = 60.0


def plan_sending(
    conf: ProviderConf,
    provider: Provider,
    cache: ResponseCache | None,
    build: Callable[[ProviderConf], Provider],
    *,
    identity: str = "",
) -> tuple[Any, int]:
    """The send function for this run and its worker count (``concurrency`` per endpoint);
    ``identity`` is the digest the cache files this run's answers under."""
    providers = endpoint_providers(conf, provider, build)
    sender: Any = send
    if len(providers) > 1:
        give_up = conf.fail_fast_s if conf.fail_fast_s > 0 else _GIVE_UP_DEFAULT_S
        sender = EndpointPool(providers, concurrency=conf.concurrency, give_up_s=give_up)
    if cache is not None:
        sender = CachedSend(cache, identity=identity, replay_only=conf.replay == "only", inner=sender)
    return sender, conf.concurrency * len(providers)


def endpoint_providers(
    conf: ProviderConf, provider: Provider, build: Callable[[ProviderConf], Provider]
) -> list[Provider]:
    """``provider`` (the first endpoint's) and one provider built for each other endpoint."""
    if not isinstance(conf, OpenAIProviderConf):
        return [provider]
    return [provider, *(build(dataclasses.replace(conf, base_url=url)) for url in conf.base_urls()[1:])]


@dataclasses.dataclass(slots=True)
class _Endpoint:
    provider: Provider
    in_flight: int = 0
    down_until: float = 0.0  # monotonic time of the next probe; 0 while the endpoint is in
    cooldown: float = COOLDOWN_S
    reason: str = ""

    @property
    def name(self) -> str:
        return public_url(self.provider.url)


class EndpointPool:
    """A send function over several endpoints of the same model (see the module docstring)."""

    def __init__(self, providers: Sequence[Provider], *, concurrency: int, give_up_s: float) -> None:
        self._endpoints = [_Endpoint(provider=p) for p in providers]
        self._limit = concurrency
        self._give_up_s = give_up_s
        self._changed = asyncio.Condition()
        self._all_down_since: float | None = None

    async def __call__(
        self,
        session: aiohttp.ClientSession,
        provider: Provider,
        request: ChatRequest,
        content: bytes,
        policy: RetryPolicy,
        *,
        rng: random.Random,
        on_retry: Callable[[str], None] | None = None,
    ) -> Outcome:
        one_try = dataclasses.replace(policy, max_retries=0)
        attempts = tries = 0
        while True:
            endpoint = await self._acquire()
            try:
                outcome = await send(session, endpoint.provider, request, content, one_try, rng=rng)
            finally:
                endpoint.in_flight -= 1
                await self._notify()
            attempts += outcome.attempts
            if outcome.completion is not None:
                await self._up(endpoint)
                return dataclasses.replace(outcome, attempts=attempts)
            error = outcome.error or ""
            if not error.startswith("gave up after"):
                return dataclasses.replace(outcome, attempts=attempts)  # not worth another try
            reason = error.split(": ", 1)[-1]
            if on_retry is not None:
                on_retry(reason)
            if reason.startswith("connection failed"):
                await self._down(endpoint, reason)
                continue
            tries += 1
            if tries > policy.max_retries:
                return dataclasses.replace(
                    outcome, attempts=attempts, error=f"gave up after {attempts} attempts: {reason}"
                )
            await asyncio.sleep(policy.delay(tries - 1, None, rng))

    async def _acquire(self) -> _Endpoint:
        async with self._changed:
            while True:
                now = time.monotonic()
                ready = [
                    e
                    for e in self._endpoints
                    if (
                        e.in_flight < self._limit
                        if not e.down_until
                        else e.in_flight == 0 and now >= e.down_until
                    )
                ]
                if ready:
                    endpoint = min(ready, key=lambda e: (e.down_until != 0, e.in_flight))
                    endpoint.in_flight += 1
                    return endpoint
                wait = 1.0
                if self._all_down_since is not None:
                    waited = now - self._all_down_since
                    if waited >= self._give_up_s:
                        raise ProviderError(
                            f"every endpoint has been down for {waited:.0f}s (provider.fail_fast_s="
                            f"{self._give_up_s:g}): "
                            + "; ".join(f"{e.name}: {e.reason}" for e in self._endpoints)
                            + ". Check the servers and provider.base_url; rerun into the same directory "
                            "to resume"
                        )
                    wait = self._give_up_s - waited
                probes = [e.down_until - now for e in self._endpoints if e.down_until and e.in_flight == 0]
                wait = max(0.005, min([wait, *probes]))
                try:
                    async with asyncio.timeout(wait):
                        await self._changed.wait()
                except TimeoutError:
                    pass

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _down(self, endpoint: _Endpoint, reason: str) -> None:
        async with self._changed:
            now = time.monotonic()
            if not endpoint.down_until:
                log.warning(
                    "endpoint %s is not answering (%s); taken out, tried again in %gs",
                    endpoint.name,
                    reason,
                    endpoint.cooldown,
                )
            else:
                endpoint.cooldown = min(endpoint.cooldown * 2, MAX_COOLDOWN_S)
            endpoint.down_until = now + endpoint.cooldown
            endpoint.reason = reason
            if self._all_down_since is None and all(e.down_until for e in self._endpoints):
                self._all_down_since = now
            self._changed.notify_all()

    async def _up(self, endpoint: _Endpoint) -> None:
        if not endpoint.down_until and self._all_down_since is None:
            return
        async with self._changed:
            if endpoint.down_until:
                log.warning("endpoint %s answers again; back in use", endpoint.name)
            endpoint.down_until = 0.0
            endpoint.cooldown = COOLDOWN_S
            self._all_down_since = None
            self._changed.notify_all()
