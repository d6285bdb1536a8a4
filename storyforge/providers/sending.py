"""The provider loop: planned requests -> workers on one pooled session -> answers journaled.

Takes: the requests left to send (:class:`~storyforge.providers.plan.WorkItem`), the journals
they go to, the provider and the way it sends (cache, endpoints: see
:mod:`storyforge.providers.endpoints`). Gives: :func:`send_all`, which sends every request
through ``provider.concurrency`` workers and appends each answer to its journal as it comes;
:class:`RunStats` and :class:`Lane` (a journal's counts and stage); :class:`FailFast`; and the
pass's progress bar (:func:`pass_bar`, :func:`bar_label`).

Each line of a journal is ``{"id", "split", "sample", "request_hash", "output",
"finish_reason", "usage": {"prompt_tokens", "completion_tokens"}, "latency_s", "attempts",
"error"}``, in completion order, appended whole, with one write and fsync for all the answers
of each :data:`FSYNC_WINDOW_S` (:class:`_BatchWriter`): that cut the run's system CPU from
~0.12 to ~0.05 ms per request (``bench/provider_bench.py``, 2,000 requests: 120-250 fsyncs
down to about 36). The workers share one pooled session (:mod:`storyforge.providers.transport`)
and pull from one work list, which keeps memory flat however many prompts there are.

Stopping: a non-retryable answer (400, 401, 404, ...) cancels the other requests, writes what
finished, and raises :class:`~storyforge.errors.ProviderError`. Ctrl-C does the same and
re-raises ``KeyboardInterrupt``. Reaching ``provider.max_cost_usd`` sends nothing more but lets
the requests in flight finish (they are paid for either way), journals their answers, and then
raises :class:`~storyforge.errors.BudgetExceeded` with what the journals hold as spent. After
``kill -9`` the next run cuts the torn tail and goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storyforge.extras import require

require("aiohttp", extra="generate", for_what="calling a model server")

import aiohttp
from tqdm import tqdm

from storyforge.config.provider import ProviderConf
from storyforge.errors import BudgetExceeded, ProviderError, StoryforgeError
from storyforge.progress import progress_bar
from storyforge.providers.base import ChatRequest, Provider, cut, public_url, same_model
from storyforge.providers.cache import ResponseCache
from storyforge.providers.choices import split_outcome
from storyforge.providers.error_budget import ErrorBudget
from storyforge.providers.identity import ServerIdentity
from storyforge.providers.journal import Appender, encode_record
from storyforge.providers.plan import WorkItem
from storyforge.providers.retry import Outcome, RetryPolicy
from storyforge.providers.transport import open_session

__all__ = [
    "FSYNC_WINDOW_S",
    "FailFast",
    "Follow",
    "Lane",
    "RunStats",
    "Sending",
    "bar_label",
    "pass_bar",
    "send_all",
]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RunStats:
    """Counters for the manifest; mutated only on the event loop thread."""

    requests: int = 0
    retries: int = 0
    errors: int = 0
    cached: int = 0
    timeouts: int = 0
    # Retried tries by why (timed out, connection failed, HTTP 503...): one log line each.
    retried: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_errors: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.requests += 1
        if outcome.cached:
            self.cached += 1
        if outcome.completion is None:
            self.errors += 1
            if len(self.last_errors) < 5 and outcome.error:
                self.last_errors.append(outcome.error)
        else:
            self.prompt_tokens += outcome.completion.prompt_tokens or 0
            self.completion_tokens += outcome.completion.completion_tokens or 0

    def retry(self, reason: str) -> None:
        """Count a try that failed and is tried again, by its kind."""
        self.retries += 1
        kind = _retry_kind(reason)
        if kind == _TIMED_OUT:
            self.timeouts += 1
        self.retried[kind] = self.retried.get(kind, 0) + 1

    def log_retries(self, conf: ProviderConf) -> None:
        """One line per kind of retried try (terminal and run.log)."""
        for kind, count in sorted(self.retried.items(), key=lambda item: (-item[1], item[0])):
            if kind == _TIMED_OUT:
                log.warning(
                    "%d request(s) timed out and were retried (no complete answer within "
                    "provider.timeout_s=%g, which counts the wait in the server's queue)",
                    count,
                    conf.timeout_s,
                )
            else:
                log.warning("%d request(s) failed with %s and were retried", count, kind)


_TIMED_OUT = "timeout"


def _retry_kind(reason: str) -> str:
    """``timeout``, ``a failed connection (ClientConnectorError)``, ``HTTP 503``, ``a malformed answer``..."""
    if reason.startswith("no complete answer within"):
        return _TIMED_OUT
    if reason.startswith("connection failed"):
        head = reason.split(":", 1)[0].removeprefix("connection failed").strip(" ()")
        return f"a failed connection ({head})" if head else "a failed connection"
    if reason.startswith("HTTP "):
        return reason.split(":", 1)[0]
    if reason.startswith("malformed answer"):
        return "a malformed answer"
    return cut(reason, 80)


def bar_label(stage: str, journal_name: str, model: str) -> str:
    """The progress bar's label of one pass: ``generate M``, ``repair attempt 2 M``,
    ``judge attempt 1 retry 1 M`` (the attempt and retry are read off the journal's name)."""
    attempt = re.search(r"\.attempt(\d+)", journal_name)
    retry = re.search(r"\.retry(\d+)", journal_name)
    what = {"generation": "generate", "regeneration": "repair", "judge": "judge"}.get(stage, stage)
    if stage != "generation":
        what += f" attempt {attempt.group(1) if attempt else 1}"
    if retry:
        what += f" retry {retry.group(1)}"
    return f"{what} {model}"


def pass_bar(conf: ProviderConf, *, total: int, initial: int, desc: str) -> tqdm:
    """A pass's progress bar (``provider.progress``): done, errors, retries, timeouts."""
    return progress_bar(
        total=total,
        initial=initial,
        desc=desc,
        unit="req",
        show=conf.progress,
        dynamic_ncols=True,
        mininterval=0.25,
        postfix={"errors": 0, "retries": 0, "timeouts": 0},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Sending:
    """How a pass's requests go out: the provider settings and client (pointed at the server
    ``provider=llama_cpp`` started), the cache (and what the log says of it), the identity its
    answers are filed under, the send function (:func:`~storyforge.providers.endpoints.plan_sending`)
    and the worker count."""

    conf: ProviderConf
    provider: Provider
    cache: ResponseCache | None
    note: str
    identity: ServerIdentity | None
    sender: Any
    workers: int


@dataclass(slots=True, kw_only=True)
class Lane:
    """Where the answers of one journal go: its stage (priced and counted under it) and stats."""

    stage: str
    stats: RunStats
    on_outcome: Callable[[Outcome, ChatRequest | None], None] | None = None


Follow = Callable[[WorkItem, dict[str, Any]], "WorkItem | None"]
"""What a finished request leads to: the next request of its chain (sent at once), or None."""


def send_all(
    sending: Sending,
    items: Iterator[WorkItem],
    remaining: int,
    paths: list[Path],
    lanes: list[Lane],
    bar: tqdm,
    *,
    budget: ErrorBudget | None = None,
    follow: Follow | None = None,
) -> None:
    """Run every item through ``sending.workers`` workers sharing one pooled session, each
    answer journaled in ``paths[item.lane]`` and counted in ``lanes[item.lane]``, then close
    the ``budget``'s pass (it is told of every failed request, and may stop the run). An
    interruption or a stop says how much was written where; the bar and the cache are closed
    whatever happens.

    With ``follow``, the request a finished one leads to (a chain's next attempt) joins the
    queue at once and is sent when a worker is free, after the items already queued, so no
    worker waits for the slowest answers of an attempt while chains are still going."""
    try:
        if remaining:
            asyncio.run(_send_all(sending, items, remaining, paths, lanes, bar, budget, follow))
        if budget is not None:
            budget.finish(lanes[0].stage)
    except (KeyboardInterrupt, StoryforgeError) as exc:
        written = sum(lane.stats.requests for lane in lanes)
        where = ", ".join(str(path) for path in paths if path.exists())
        if isinstance(exc, KeyboardInterrupt):
            log.warning(
                "interrupted: %d completion(s) written to %s; rerun into the same directory to resume",
                written,
                where,
            )
        else:
            log.error("generation stopped early; %d completion(s) written to %s", written, where)
        raise
    finally:
        bar.close()
        if sending.cache is not None:
            sending.cache.close()


async def _send_all(
    sending: Sending,
    items: Iterator[WorkItem],
    remaining: int,
    paths: list[Path],
    lanes: list[Lane],
    bar: tqdm,
    budget: ErrorBudget | None,
    follow: Follow | None,
) -> None:
    conf, provider, sender = sending.conf, sending.provider, sending.sender
    policy = RetryPolicy(
        max_retries=conf.max_retries,
        timeout_s=conf.timeout_s,
        backoff_base_s=conf.backoff_base_s,
        backoff_max_s=conf.backoff_max_s,
        max_retry_after_s=conf.max_retry_after_s,
        max_response_bytes=conf.max_response_bytes,
        on_model_mismatch=conf.on_model_mismatch,
    )
    concurrency = min(sending.workers, remaining)
    rng = random.Random()
    writer = _BatchWriter(paths)
    breaker = FailFast(
        provider=provider, window_s=conf.fail_fast_s, answered=budget.answered if budget is not None else None
    )
    ready: collections.deque[WorkItem] = collections.deque()
    wake = asyncio.Event()
    busy = 0
    # The limit's last word once provider.max_cost_usd is reached: nothing more is sent, and each
    # answer still arriving is journaled and counted, so the last one says the whole spent.
    budget_stop: BudgetExceeded | None = None

    def show(stats: RunStats) -> None:
        bar.set_postfix(errors=stats.errors, retries=stats.retries, timeouts=stats.timeouts, refresh=False)

    def retrying(stats: RunStats) -> Callable[[str], None]:
        def on_retry(reason: str) -> None:
            stats.retry(reason)
            show(stats)
            breaker.failed(reason)

        return on_retry

    on_retries = [retrying(lane.stats) for lane in lanes]

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal busy
        while True:
            if budget_stop is not None:
                return
            # A chain's next attempt queues behind the requests not yet started (as on a
            # first-come semaphore): no request waits long, and no worker idles while any waits.
            item = next(items, None)
            if item is None and ready:
                item = ready.popleft()
            if item is None:
                if follow is None or busy == 0:
                    return
                wake.clear()  # a chain in flight may still lead to a request
                await wake.wait()
                continue
            busy += 1
            try:
                await handle(session, item)
            finally:
                busy -= 1
                wake.set()

    async def handle(session: aiohttp.ClientSession, item: WorkItem) -> None:
        nonlocal budget_stop
        lane = lanes[item.lane]
        stats = lane.stats
        outcome = await sender(
            session, provider, item.request, item.content, policy, rng=rng, on_retry=on_retries[item.lane]
        )
        if item.samples:
            for request, part in split_outcome(item.request, item.samples, outcome, conf.samples):
                one = WorkItem(request=request, content=item.content, request_hash=item.request_hash)
                writer.add(encode_record(_record(one, part, provider.model)), item.lane)
            record = None
        else:
            record = _record(item, outcome, provider.model)
            writer.add(encode_record(record), item.lane)
        stats.add(outcome)
        bar.update(len(item.samples) or 1)
        if lane.on_outcome is not None:
            try:
                lane.on_outcome(outcome, item.request)
            except BudgetExceeded as exc:  # provider.max_cost_usd: raised once the others are in
                budget_stop = exc
        if outcome.completion is None:
            show(stats)
            breaker.failed(outcome.error or "")
            if budget is not None:
                try:
                    # may stop the run (provider.max_error_rate); n= fails every sample
                    budget.failed(lane.stage, len(item.samples) or 1)
                except ProviderError:
                    # Nothing ever answered: say so (a dead URL), not just "too many errors".
                    dead = breaker.verdict()
                    if dead is not None:
                        raise dead from None
                    raise
        else:
            breaker.succeeded()
        if follow is not None and record is not None and budget_stop is None:
            after = follow(item, record)
            if after is not None:
                ready.append(after)
                bar.total += 1

    try:
        async with open_session(concurrency, provider.url, trust_env=conf.trust_env) as session:
            workers = [asyncio.create_task(worker(session)) for _ in range(concurrency)]
            everyone = asyncio.gather(*workers)
            watched: set[asyncio.Future[Any]] = {everyone, writer.task}
            try:
                await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
                if writer.task.done():
                    writer.task.result()  # the writer only ends early by failing
                everyone.result()
            finally:
                for task in workers:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                if everyone.done() and not everyone.cancelled():
                    everyone.exception()  # retrieved, so asyncio does not log it again
    finally:
        await writer.close()
    if budget_stop is not None:
        raise budget_stop
    verdict = breaker.verdict()
    if verdict is not None:  # every request gave up before the window ran out
        raise verdict


class FailFast:
    """Stops a run that never got an answer once every try has failed the same way for a while.

    A dead or mistyped URL (connection refused, unknown host) or a server that answers every
    request with the same error would otherwise be retried request after request for minutes
    and end as a file of error records. Once any answer has arrived this never trips: errors
    after that are the error-rate check's business (:mod:`storyforge.providers.error_budget`). Timeouts do
    not count (a slow server is not a dead one). ``answered``, the URLs that answered earlier
    passes of the run, carries that knowledge from pass to pass.
    """

    def __init__(self, *, provider: Provider, window_s: float, answered: set[str] | None = None) -> None:
        self._provider = provider
        self._window_s = window_s
        self._seen = answered if answered is not None else set()
        self._answered = provider.url in self._seen
        self._first: float | None = None
        self._kinds: set[str] = set()
        self._tries = 0
        self._last = ""

    def succeeded(self) -> None:
        self._answered = True
        self._seen.add(self._provider.url)

    def failed(self, reason: str) -> None:
        if self._answered or self._window_s <= 0:
            return
        kind = _failure_kind(reason)
        if kind is None:
            self._kinds.add("other")  # a mixed picture: leave it to the error-rate check
            return
        now = time.monotonic()
        if self._first is None:
            self._first = now
        self._kinds.add(kind)
        self._tries += 1
        self._last = reason
        if now - self._first >= self._window_s:
            verdict = self.verdict()
            if verdict is not None:
                raise verdict

    def verdict(self) -> ProviderError | None:
        """The error to stop with: nothing answered and every try failed the same way."""
        if self._answered or self._window_s <= 0 or len(self._kinds) != 1 or "other" in self._kinds:
            return None
        assert self._first is not None
        return ProviderError(
            f"no answer from {public_url(self._provider.url)} in {time.monotonic() - self._first:.0f}s: "
            f"{self._tries} tries, all failed with {cut(_GAVE_UP.sub('', self._last), 300)}. "
            "Check that the server is running and that provider.base_url (provider.host for Ollama) "
            "is right"
        )


_GAVE_UP = re.compile(r"^gave up after \d+ attempts?: ")


def _failure_kind(reason: str) -> str | None:
    """``connection`` for connection-level failures, the status and text for server errors."""
    text = _GAVE_UP.sub("", reason)
    if text.startswith("connection failed"):
        return "connection"
    if text.startswith("HTTP ") or "provider.max_response_bytes" in text:
        return text
    return None


FSYNC_WINDOW_S = 0.05
"""At most one journal fsync starts per window (seconds); see :class:`_BatchWriter`."""


class _BatchWriter:
    """Collects finished lines and appends them in batches on a worker thread.

    Appending and fsyncing off the event loop keeps requests flowing while the disk works.
    A batch is written and fsynced at most every ``window`` seconds: whatever finished since
    the last one goes out together, so a run of thousands of fast answers pays for tens of
    fsyncs, not thousands. Crash safety is unchanged: a line is only ever appended whole, a
    crash loses at most the answers of the last window (they are not in the file, so a rerun
    asks for them again, still exactly once), and ``close`` writes everything still pending
    at once, also after a cancellation or Ctrl-C.
    """

    def __init__(
        self, paths: Sequence[Path], *, window: float = FSYNC_WINDOW_S, opener: type[Appender] = Appender
    ) -> None:
        # Journal k (``paths[k]``) is opened at its first line, so a journal no answer went
        # to is not created.
        self._paths = list(paths)
        self._opener = opener
        self._appenders: dict[int, Appender] = {}
        self._window = window
        self._pending: list[tuple[int, bytes]] = []
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self.task = asyncio.create_task(self._loop())

    def add(self, line: bytes, journal: int = 0) -> None:
        self._pending.append((journal, line))
        self._wake.set()

    def _write(self, batch: list[tuple[int, bytes]]) -> None:
        """Append ``batch``, journal by journal in journal order: a chain's attempt ``k`` is
        added before its attempt ``k+1`` is even sent, so a journal never holds an attempt
        whose previous one is missing from the journal before it, even after ``kill -9``."""
        lines: dict[int, list[bytes]] = {}
        for journal, line in batch:
            lines.setdefault(journal, []).append(line)
        for journal in sorted(lines):
            appender = self._appenders.get(journal)
            if appender is None:
                appender = self._appenders[journal] = self._opener(self._paths[journal])
            appender.write(lines[journal])

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        last = -self._window
        while True:
            await self._wake.wait()
            pause = last + self._window - loop.time()
            if pause > 0 and not self._closing.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self._closing.wait()  # closing writes at once
            self._wake.clear()
            batch, self._pending = self._pending, []
            if batch:
                last = loop.time()
                await asyncio.to_thread(self._write, batch)
            if self._closing.is_set() and not self._pending:
                return

    async def close(self) -> None:
        """Write what is pending, then close the journals."""
        self._closing.set()
        self._wake.set()
        try:
            if not self.task.done():
                # shield: a second Ctrl-C must not cut a batch that is being written
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(self.task)
            batch, self._pending = self._pending, []
            if batch:
                self._write(batch)
            if self.task.done() and not self.task.cancelled() and self.task.exception() is not None:
                raise self.task.exception()  # type: ignore[misc]
        finally:
            for appender in self._appenders.values():
                appender.close()


def _record(item: WorkItem, outcome: Outcome, model: str) -> dict[str, Any]:
    completion = outcome.completion
    record = {
        "id": item.request.id,
        "split": item.request.split,
        "sample": item.request.sample,
        "request_hash": item.request_hash,
        "output": completion.output if completion else None,
        "finish_reason": completion.finish_reason if completion else None,
        "usage": completion.usage() if completion else None,
        "latency_s": round(outcome.latency_s, 4),
        "attempts": outcome.attempts,
        "error": outcome.error,
    }
    # Keys a record carries only when they say something: an echoed prefill, another model.
    if completion is not None and completion.prefill_echo_stripped:
        record["prefill_echo_stripped"] = True
    if completion is not None and not same_model(model, completion.served_model):
        record["served_model"] = completion.served_model
    return record
