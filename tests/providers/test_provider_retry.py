"""Retries: which answers are retried, how long to wait, and what stops at once (real loopback HTTP)."""

from __future__ import annotations

import asyncio
import random
import re
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storyforge.config.provider import OpenAIProviderConf
from storyforge.errors import ProviderError
from storyforge.providers.base import ChatRequest, canonical_json
from storyforge.providers.openai import OpenAIProvider
from storyforge.providers.retry import Outcome, RetryPolicy, is_retryable_status, parse_retry_after, send
from storyforge.providers.transport import open_session
from tests.support.fake_server import FakeServer, Fault

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5", 5.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("-3", 0.0),
        (format_datetime(NOW + timedelta(seconds=10), usegmt=True), 10.0),
        (format_datetime(NOW - timedelta(seconds=10), usegmt=True), 0.0),
        ("Wed, 01 May 2024 12:00:30 GMT", 30.0),
        ("soon", None),
        ("", None),
        (None, None),
        ("nan", None),
        ("inf", None),
    ],
)
def test_parse_retry_after(value, expected):
    """Retry-After is read as delta-seconds or an HTTP date; past dates give 0, junk gives None."""
    assert parse_retry_after(value, now=NOW) == expected


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (429, True),
        (408, True),
        (409, True),
        (425, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (501, False),
        (505, False),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (422, False),
    ],
)
def test_retryable_statuses(status, retryable):
    """429 and most 5xx are retried; client errors and 501/505 are final."""
    assert is_retryable_status(status) is retryable


@given(
    retry=st.integers(min_value=0, max_value=200),
    base=st.floats(min_value=0.001, max_value=10),
    cap=st.floats(min_value=0.001, max_value=100),
    seed=st.integers(),
)
def test_full_jitter_stays_within_the_exponential_ceiling(retry, base, cap, seed):
    """A backoff draw is in [0, min(cap, base * 2**retry)] for every retry number."""
    policy = RetryPolicy(
        max_retries=3, timeout_s=1, backoff_base_s=base, backoff_max_s=cap, max_retry_after_s=5
    )
    delay = policy.backoff(retry, random.Random(seed))
    assert 0.0 <= delay <= min(cap, base * 2.0 ** min(retry, 62))


def test_retry_after_wins_over_backoff_but_is_capped():
    """A server's Retry-After is obeyed as given, up to max_retry_after_s."""
    policy = RetryPolicy(
        max_retries=3, timeout_s=1, backoff_base_s=100, backoff_max_s=100, max_retry_after_s=5
    )
    rng = random.Random(0)
    assert policy.delay(0, 2.0, rng) == 2.0
    assert policy.delay(0, 60.0, rng) == 5.0


def _send(
    server: FakeServer, *, max_retries: int = 3, timeout_s: float = 2.0, key: str | None = None
) -> tuple[Outcome, list[float], list[str]]:
    env = {"SF_KEY": key} if key else {}
    provider = OpenAIProvider(
        OpenAIProviderConf(base_url=server.base_url, model="m", api_key_env="SF_KEY" if key else None),
        environ=env,
    )
    request = ChatRequest(id="p7", split=None, sample=1, messages=({"role": "user", "content": "hi"},))
    content = canonical_json(provider.body(request)).encode()
    policy = RetryPolicy(
        max_retries=max_retries,
        timeout_s=timeout_s,
        backoff_base_s=0.5,
        backoff_max_s=4,
        max_retry_after_s=30,
    )
    sleeps: list[float] = []
    reasons: list[str] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def go() -> Outcome:
        async with open_session(1, provider.url, trust_env=True) as session:
            return await send(
                session,
                provider,
                request,
                content,
                policy,
                rng=random.Random(1),
                sleep=fake_sleep,
                on_retry=reasons.append,
            )

    return asyncio.run(go()), sleeps, reasons


def test_every_transient_fault_is_retried_until_success(server):
    """500, 429, malformed JSON, a cut body, a dropped connection and a stall are all retried."""
    server.queue_faults(
        Fault.http(500),
        Fault.rate_limited("0"),
        Fault.malformed(),
        Fault.cut(),
        Fault.drop(),
        Fault.stall(2.0),
    )
    outcome, sleeps, reasons = _send(server, max_retries=6, timeout_s=0.5)
    assert outcome.completion is not None and outcome.completion.output == "reply to: hi"
    assert outcome.attempts == 7 and outcome.error is None
    assert [r.split(" ")[0] for r in reasons] == [
        "HTTP",
        "HTTP",
        "malformed",
        "connection",
        "connection",
        "no",
    ]
    assert reasons[-1] == "no complete answer within timeout_s=0.5s"
    assert sleeps[1] == 0.0  # Retry-After: 0 is obeyed, not replaced by backoff


def test_deadline_covers_the_whole_answer_not_each_read(server):
    """An answer trickled over 2 s, each piece well within timeout_s=0.5, still times out and is retried."""
    server.queue_faults(Fault.trickle(2.0))
    outcome, sleeps, reasons = _send(server, timeout_s=0.5)
    assert outcome.completion is not None and outcome.attempts == 2
    assert reasons == ["no complete answer within timeout_s=0.5s"] and len(sleeps) == 1


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [("3", 3.0), (None, None)],
)
def test_429_waits_for_retry_after(server, retry_after, expected):
    """After a 429 the wait is the server's Retry-After, else a jittered backoff below base."""
    server.queue_faults(Fault.rate_limited(retry_after) if retry_after else Fault.http(429))
    outcome, sleeps, _ = _send(server)
    assert outcome.completion is not None
    assert len(sleeps) == 1
    if expected is None:
        assert 0.0 <= sleeps[0] <= 0.5
    else:
        assert sleeps[0] == expected


def test_retry_after_as_http_date(server):
    """An HTTP-date Retry-After some seconds ahead becomes a wait of about that long."""
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    server.queue_faults(Fault.rate_limited(when))
    outcome, sleeps, _ = _send(server)
    assert outcome.completion is not None
    assert 15.0 < sleeps[0] <= 20.0


def test_giving_up_returns_the_last_error(server):
    """When every try fails the outcome carries the count and the server's last words, no exception."""
    server.rule = lambda received: Fault.http(503, "overloaded, try later")
    outcome, sleeps, _ = _send(server, max_retries=2)
    assert outcome.completion is None
    assert outcome.error == "gave up after 3 attempts: HTTP 503: overloaded, try later"
    assert len(sleeps) == 2


@pytest.mark.parametrize(
    ("fault", "status", "text"),
    [
        (Fault.http(400, "max_tokens is too large"), 400, "max_tokens is too large"),
        (Fault.http(404, "The model `m` does not exist."), 404, "The model `m` does not exist."),
    ],
)
def test_final_statuses_raise_at_once(server, fault, status, text):
    """400 and 404 are not retried: ProviderError names status, prompt, sample and the server's text."""
    server.queue_faults(fault)
    with pytest.raises(ProviderError) as err:
        _send(server)
    assert err.value.status == status and err.value.body == text
    assert re.search(
        rf"answered HTTP {status} .* for prompt 'p7' sample 1: {re.escape(text)}", str(err.value)
    )
    assert server.request_count == 1


def test_401_is_final_and_never_shows_the_key(server):
    """A 401 stops with a hint about api_key_env, and a key echoed by the server is redacted."""
    key = "sk-test-0123456789abcdef"
    server.queue_faults(Fault.http(401, f"Incorrect API key provided: {key}"))
    with pytest.raises(ProviderError) as err:
        _send(server, key=key)
    assert key not in str(err.value) and key not in (err.value.body or "")
    assert "Incorrect API key provided: ***" in str(err.value)
    assert "check the key in the environment variable named by provider.api_key_env" in str(err.value)
    assert server.received[0].headers["authorization"] == f"Bearer {key}"
