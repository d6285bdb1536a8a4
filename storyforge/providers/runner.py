"""Generation for a job: prompts.jsonl -> ``samples`` requests per prompt -> generations.jsonl.

Takes: the generation settings (:class:`~storyforge.config.provider.GenerationSettings`: the
checked provider, the response cache, ``strict`` and ``resume``), the run directory and the job's ``prompts.jsonl`` (one ``{"id", "split", "messages"}`` per line).
Gives: :func:`generate_for_job`, which returns the path of ``generations.jsonl`` and the
stats for the run manifest; :func:`generate_chains`, the same for chains of attempts (each
attempt sent as soon as the one before it is answered and checked, one journal per attempt);
and :func:`build_provider` for jobs that need to know what will
run (:func:`provider_conf` and :func:`provider_enabled`, which read a config, live in
:mod:`storyforge.config.provider` and are re-exported here).

Each line of ``generations.jsonl`` is ``{"id", "split", "sample", "request_hash", "output",
"finish_reason", "usage": {"prompt_tokens", "completion_tokens"}, "latency_s", "attempts",
"error"}``, in completion order (the TinyStories job sorts the finished file by prompt,
then sample: :func:`storyforge.executors.sort_generations`). ``output`` is only the
generated text (after a prefill, the continuation); on failure after every retry it is ``null`` and ``error`` says why. Every
finished request is appended as a whole line, with one write and fsync for all the answers of
each :data:`FSYNC_WINDOW_S` (50 ms), and a rerun into the same directory resumes
(``+resume=true`` says so explicitly; the same ``hydra.run.dir`` is enough): see
:mod:`storyforge.providers.journal` for what counts as done.

Per-request cost outside the HTTP client, measured with ``bench/provider_bench.py`` (2,000
requests): the planning pass reads, validates, encodes and hashes every request once and keeps
the encoded bodies for sending (up to :data:`PLAN_KEEP_BYTES`; a bigger run encodes them again
while sending), instead of doing all of it twice; one fsync per 50 ms instead of one per
finished batch cut the run's system CPU from ~0.12 to ~0.05 ms per request (120-250 fsyncs
down to about 36); the record and body encoders are built once instead of per call.

Transport: one ``aiohttp.ClientSession`` for the whole run whose pool keeps at most
``provider.concurrency`` keep-alive connections, and that many workers pulling from one
shared work list (see :mod:`storyforge.providers.transport` for why aiohttp, with figures).
Keep-alive reuse saves a TCP (and TLS) handshake per request; as many connections as
workers means no request waits for a connection and the server never sees more
connections than it was promised. A worker pool, rather than one task per request behind a
semaphore, keeps memory flat however many prompts there are. Several endpoints
(``provider.base_url`` as a list: ``provider.concurrency`` workers each), the response cache
(``cache.path``, ``provider.replay``) and ``n=`` per request (``provider.n_per_request``) plug
in through :mod:`~storyforge.providers.endpoints`, :mod:`~storyforge.providers.cache` and
:mod:`~storyforge.providers.choices`.

Stopping: a non-retryable answer (400, 401, 404, ...) cancels the other requests, writes what
finished, and raises :class:`~storyforge.errors.ProviderError`. Ctrl-C does the same and
re-raises ``KeyboardInterrupt``. Reaching ``provider.max_cost_usd`` sends nothing more but lets
the requests in flight finish (they are paid for either way), journals their answers, and then
raises :class:`~storyforge.errors.BudgetExceeded` with what the journals hold as spent. After ``kill -9`` the next run cuts the torn tail and goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import importlib
import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from storyforge.extras import require

require("aiohttp", extra="generate", for_what="calling a model server")

import aiohttp
from tqdm import tqdm

from storyforge import jsontext
from storyforge.config.provider import (
    GenerationSettings,
    LlamaCppProviderConf,
    OpenAIProviderConf,
    ProviderConf,
    provider_conf,
    provider_enabled,
)
from storyforge.errors import BudgetExceeded, ConfigError, DataError, ProviderError, StoryforgeError
from storyforge.providers.base import (
    ChatRequest,
    Completion,
    Provider,
    content_hash,
    encode_body,
    public_url,
    same_model,
)
from storyforge.providers.cache import ResponseCache, check_replay, open_for_run, replay_identity
from storyforge.providers.choices import NChoices, split_outcome, with_n
from storyforge.providers.cost import CostMeter
from storyforge.providers.endpoints import plan_sending
from storyforge.providers.error_budget import ErrorBudget
from storyforge.providers.identity import ServerIdentity, pinned, probe
from storyforge.providers.journal import (
    Appender,
    Reconciled,
    encode_record,
    read_records,
    reconcile,
    record_server,
    recorded_server,
)
from storyforge.providers.retry import Outcome, RetryPolicy, send
from storyforge.providers.transport import open_session

__all__ = [
    "GENERATIONS_NAME",
    "ChainRules",
    "RequestSource",
    "RunStats",
    "build_provider",
    "generate_chains",
    "generate_for_job",
    "provider_conf",
    "provider_enabled",
    "read_prompts",
]

log = logging.getLogger(__name__)

GENERATIONS_NAME = "generations.jsonl"


def build_provider(conf: ProviderConf) -> Provider:
    """The provider class named by ``conf._target_`` (only ``storyforge.providers.*``)."""
    target = conf._target_
    if target is None:
        raise ConfigError(
            f"provider={conf.name} sends no requests; choose provider=openai, provider=ollama or "
            "provider=llama_cpp to generate"
        )
    if not target.startswith("storyforge.providers."):
        raise ConfigError(f"provider._target_ must name a class inside storyforge.providers, got {target!r}")
    module_name, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"provider._target_ {target!r} cannot be imported: {exc}") from None
    provider = cls(conf)
    if not isinstance(provider, Provider):
        raise ConfigError(f"provider._target_ {target!r} does not implement the Provider protocol")
    return provider


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """One line of prompts.jsonl."""

    id: str
    split: str | None
    messages: tuple[Mapping[str, Any], ...]


def read_prompts(path: Path) -> Iterator[Prompt | str]:
    """Stream prompts from ``path``; a bad line yields a problem naming the line and prompt id.

    Deterministic, so the planning pass and the sending pass skip the same lines without
    holding every prompt in memory.
    """
    seen: set[str] = set()
    with path.open("r", encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path.name}:{number}"
            try:
                record = jsontext.loads(line)
            except ValueError as exc:
                yield f"{where}: not a JSON line ({exc})"
                continue
            rid = record.get("id") if isinstance(record, dict) else None
            if not isinstance(rid, str) or not rid:
                yield f"{where}: a prompt needs a non-empty string id"
                continue
            messages = record.get("messages")
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                yield f"{where}: prompt {rid!r}: messages must be a list of objects"
                continue
            if rid in seen:
                yield f"{where}: prompt id {rid!r} appears twice; the later one is skipped"
                continue
            seen.add(rid)
            split = record.get("split")
            yield Prompt(id=rid, split=split if isinstance(split, str) else None, messages=tuple(messages))


def _requests(
    provider: Provider, path: Path, samples: int
) -> Iterator[tuple[ChatRequest, dict[str, Any]] | str]:
    """Every (prompt, sample) request with its body, or a problem; a prompt is all or nothing."""
    for prompt in read_prompts(path):
        if isinstance(prompt, str):
            yield prompt
            continue
        try:
            batch = []
            # With n= per request (NChoices), one request asks for every sample of the prompt.
            for sample in range(0, samples, samples if isinstance(provider, NChoices) else 1):
                request = ChatRequest(
                    id=prompt.id, split=prompt.split, sample=sample, messages=prompt.messages
                )
                batch.append((request, provider.body(request)))
        except DataError as exc:
            yield str(exc)
            continue
        yield from batch


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkItem:
    """One request to make: the request, its encoded body and that body's hash."""

    request: ChatRequest
    content: bytes
    request_hash: str
    # With n= per request: the samples this request answers (empty: just request.sample).
    samples: tuple[int, ...] = ()
    # The journal (and stage) this request's answer goes to: 0 for attempt 1, k-1 for attempt k.
    lane: int = 0

    def journal_keys(self) -> list[tuple[str, int]]:
        return [(self.request.id, k) for k in self.samples or (self.request.sample,)]


RequestSource = Callable[[Provider], Iterator[tuple[ChatRequest, dict[str, Any]] | str]]
"""Every request of a generation pass with its body, or a problem, in a deterministic order
(called once for planning and maybe again for sending)."""


def _work_items(provider: Provider, path: Path, samples: int) -> Iterator[WorkItem | str]:
    """Every request encoded for sending, with its hash, or a problem (see :func:`_requests`)."""
    return _encoded(provider, _requests(provider, path, samples), samples)


def _encoded(
    provider: Provider, requests: Iterator[tuple[ChatRequest, dict[str, Any]] | str], samples: int
) -> Iterator[WorkItem | str]:
    for item in requests:
        if isinstance(item, str):
            yield item
            continue
        request, body = item
        content = encode_body(body)
        yield WorkItem(
            request=request,
            content=content,
            request_hash=content_hash(content),
            samples=tuple(range(samples)) if isinstance(provider, NChoices) else (),
        )


PLAN_KEEP_BYTES = 64 * 1024 * 1024
"""Encoded requests up to about this much memory are kept from the planning pass and sent as
they are; a bigger run reads and encodes its prompts again while sending, so memory stays flat
however many prompts there are."""

_ITEM_OVERHEAD = 400
"""Rough bytes per kept request besides its body (the request and item objects)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What the planning pass found: each request's hash, the bad records, and maybe the requests."""

    expected: dict[tuple[str, int], str]
    problems: list[str]
    items: list[WorkItem] | None
    longest: int = 0
    """The longest encoded request body, in bytes (a managed server's context is sized from it)."""


def _plan(
    provider: Provider,
    path: Path,
    samples: int,
    *,
    keep_bytes: int | None = None,
    source: RequestSource | None = None,
) -> Plan:
    """The planning pass, before anything is sent: each request's hash (what "done" means) and
    every bad record, plus the encoded requests themselves while they fit in ``keep_bytes``
    (default :data:`PLAN_KEEP_BYTES`; ``items`` is None when they did not). A prefill the
    provider cannot continue fails here as a ConfigError."""
    limit = PLAN_KEEP_BYTES if keep_bytes is None else keep_bytes
    expected: dict[tuple[str, int], str] = {}
    problems: list[str] = []
    kept: list[WorkItem] | None = []
    size = longest = 0
    items = (
        _work_items(provider, path, samples) if source is None else _encoded(provider, source(provider), 1)
    )
    for item in items:
        if isinstance(item, str):
            problems.append(item)
            continue
        for key in item.journal_keys():
            expected[key] = item.request_hash
        longest = max(longest, len(item.content))
        if kept is not None:
            size += len(item.content) + _ITEM_OVERHEAD
            if size > limit:
                kept = None
            else:
                kept.append(item)
    return Plan(expected=expected, problems=problems, items=kept, longest=longest)


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
    return _cut(reason, 80)


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


def generate_for_job(
    settings: GenerationSettings,
    out_dir: Path,
    prompts_path: Path,
    *,
    source: RequestSource | None = None,
    journal_name: str = GENERATIONS_NAME,
    meter: CostMeter | None = None,
    stage: str = "generation",
    wrap: Callable[[Provider], Provider] | None = None,
    require_done: str | None = None,
    budget: ErrorBudget | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Generate ``provider.samples`` completions per prompt into ``out_dir/generations.jsonl``.

    Returns the file's path and the stats for the manifest: ``requests`` (made by this run),
    ``retries``, ``errors``, ``tokens`` (``prompt``/``completion``, whole file), ``wall_time_s``,
    plus ``total``, ``resumed`` (already done before this run) and the provider's description.

    With ``source``, the requests are the ones it gives (one sample each, never ``n=``) instead
    of ``samples`` per line of ``prompts_path``, journaled in ``out_dir/journal_name``: how a
    regeneration attempt is sent (:mod:`storyforge.jobs.regenerate`).

    With ``meter``, every answer is priced under ``stage`` and the run stops with
    :class:`~storyforge.errors.BudgetExceeded` once the meter's limit is reached (the answers
    the journal already holds count as spent; see :mod:`storyforge.providers.cost`).

    ``wrap`` wraps each built provider (the judge's structured output); with ``require_done``
    (the reason, e.g. ``stage=judge``) nothing may be left to send: a missing answer is a
    :class:`ConfigError` naming it.

    With ``budget`` (the run's :class:`~storyforge.providers.error_budget.ErrorBudget`) the
    pass's failed requests count toward the whole run's error rate, which stops it as soon as
    the limit is certain to be passed, and the no-answer check knows what answered before.
    """
    started = time.perf_counter()
    conf = settings.provider

    def built(c: ProviderConf) -> Provider:
        made = with_n(build_provider(c), c) if source is None else build_provider(c)
        return wrap(made) if wrap is not None else made

    provider = built(conf)
    strict = settings.strict
    prompts_path = Path(prompts_path)
    plan = _plan(provider, prompts_path, conf.samples, source=source)
    expected, problems = plan.expected, plan.problems
    if problems and strict:
        raise DataError(
            f"{len(problems)} bad prompt record(s) in {prompts_path} (strict=true):\n  "
            + "\n  ".join(problems)
        )
    for problem in problems:
        log.warning("skipped %s", problem)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / journal_name
    if settings.resume and not path.exists():
        log.info("resume requested, but %s does not exist yet; starting fresh", path)
    state = reconcile(path, expected, on_stale=conf.on_stale, retry_errors=conf.retry_errors)
    path.touch()  # exists even when there is nothing to generate
    total, remaining = len(expected), len(expected) - state.kept
    if state.kept:
        log.info("resuming: %d of %d completions already in %s", state.kept, total, path)
    if require_done is not None and remaining:
        raise ConfigError(
            f"{require_done}: {remaining} of {total} request(s) have no answer in {path}; "
            "finish the run first (the same command without stage=...)"
        )
    if meter is not None:
        meter.resumed(stage, prompt_tokens=state.prompt_tokens, completion_tokens=state.completion_tokens)
        if remaining:
            meter.check()  # a run stopped at its limit does not send more under the same limit

    def todo() -> Iterator[WorkItem]:
        """What is left to send: the kept requests, or (for a big run) the prompts read again."""
        items: Iterable[WorkItem | str]
        if plan.items is not None:
            items = plan.items
        elif source is None:
            items = _work_items(provider, prompts_path, conf.samples)
        else:
            items = _encoded(provider, source(provider), 1)
        for item in items:
            if not isinstance(item, WorkItem):
                continue
            if item.samples:
                missing = tuple(k for k in item.samples if (item.request.id, k) not in state.done)
                if missing:
                    yield WorkItem(
                        request=item.request,
                        content=item.content,
                        request_hash=item.request_hash,
                        samples=missing,
                    )
            elif (item.request.id, item.request.sample) not in state.done:
                yield item

    sending = _open_sending(
        settings,
        provider,
        built,
        path,
        expected,
        state.done,
        remaining,
        total,
        longest=plan.longest,
        out_dir=out_dir,
    )
    cache, conf, provider = sending.cache, sending.conf, sending.provider
    stats = RunStats()
    if budget is not None:
        budget.start(stage, total, state.kept_errors)
    policy = _policy(conf)
    bar = tqdm(
        total=total,
        initial=state.kept,
        desc=bar_label(stage, journal_name, provider.model),
        unit="req",
        disable=not conf.progress,
        dynamic_ncols=True,
        mininterval=0.25,
        postfix={"errors": 0, "retries": 0, "timeouts": 0},
    )
    try:
        if remaining:
            on_outcome = meter.hook(stage) if meter is not None else None
            asyncio.run(
                _run(
                    provider,
                    todo(),
                    remaining,
                    [path],
                    policy,
                    conf,
                    [_Lane(stage=stage, stats=stats, on_outcome=on_outcome)],
                    bar,
                    sending.sender,
                    sending.workers,
                    budget=budget,
                )
            )
        if budget is not None:
            budget.finish(stage)
    except KeyboardInterrupt:
        log.warning(
            "interrupted: %d completion(s) written to %s; rerun into the same directory to resume",
            stats.requests,
            path,
        )
        raise
    except StoryforgeError:
        log.error("generation stopped early; %d completion(s) written to %s", stats.requests, path)
        raise
    finally:
        bar.close()
        if cache is not None:
            cache.close()

    result = _pass_result(
        provider, conf, expected, len(problems), state, stats, sending, remaining, started, meter, stage
    )
    if cache is not None:
        result["cache_hits"] = cache.hits
    return path, result


class ChainRules(Protocol):
    """What makes a request the next attempt of a chain (:func:`generate_chains`)."""

    @property
    def attempts(self) -> int:
        """The most attempts a chain has (attempt 1 is the prompt's request)."""

    def journal(self, attempt: int) -> str:
        """The journal file name of ``attempt``."""

    def next_request(
        self, provider: Provider, record: dict[str, Any], attempt: int
    ) -> tuple[ChatRequest, dict[str, Any]] | str | None:
        """The request (with its body) that follows ``record``, the answer of ``attempt``;
        None when the chain ends there; a problem (a skipped request) as a string."""


def generate_chains(
    settings: GenerationSettings,
    out_dir: Path,
    prompts_path: Path,
    rules: ChainRules,
    *,
    meter: CostMeter | None = None,
    budget: ErrorBudget | None = None,
) -> list[tuple[Path, dict[str, Any]]]:
    """Generate every prompt's ``provider.samples`` chains, each attempt sent as soon as the one
    before it is answered and checked (``rules``), all within ``provider.concurrency``.

    Each attempt has its own journal (``rules.journal(k)``) with the journal rules of
    :func:`generate_for_job`: a rerun keeps what is done and sends only the rest, the answers
    already journaled count as spent, ``provider.replay`` and the response cache apply to every
    attempt. A rerun rebuilds each chain from its journaled attempts (the rules are
    deterministic), and the journals are written in attempt order, so a journal never holds an
    attempt whose previous one is missing. Lines are in completion order (sort them after).

    Returns each attempt's journal and figures (those of :func:`generate_for_job`), for attempt
    1 and every later attempt some chain reached. Priced under ``generation`` for attempt 1 and
    ``regeneration`` after; with ``budget``, every attempt counts toward the run's error rate.
    Requests ``n=`` per request are not for chains: the caller sends those pass by pass, and so
    are ``provider=llama_cpp``'s (its server's context is sized from a pass's longest request,
    and a repair conversation's length is known only once the answer it repairs is in)."""
    started = time.perf_counter()
    conf = settings.provider
    attempts = rules.attempts
    if attempts > 1 and isinstance(conf, LlamaCppProviderConf):
        raise ConfigError("provider=llama_cpp: chains of attempts are sent pass by pass (generate_for_job)")
    provider = build_provider(conf)
    prompts_path = Path(prompts_path)
    plan = _plan(provider, prompts_path, conf.samples)
    if plan.problems and settings.strict:
        raise DataError(
            f"{len(plan.problems)} bad prompt record(s) in {prompts_path} (strict=true):\n  "
            + "\n  ".join(plan.problems)
        )
    for problem in plan.problems:
        log.warning("skipped %s", problem)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / rules.journal(k) for k in range(1, attempts + 1)]
    stages = ["generation", *(["regeneration"] * (attempts - 1))]
    expected: list[dict[tuple[str, int], str]] = [plan.expected, *({} for _ in range(attempts - 1))]
    skipped = [len(plan.problems), *([0] * (attempts - 1))]

    def next_item(record: dict[str, Any], attempt: int) -> WorkItem | None:
        """The request after ``record`` (an answer of ``attempt``), noted as expected."""
        made = rules.next_request(provider, record, attempt)
        if made is None:
            return None
        if isinstance(made, str):
            if settings.strict:
                raise DataError(f"{made} (strict=true)")
            log.warning("skipped %s", made)
            skipped[attempt] += 1
            return None
        request, body = made
        content = encode_body(body)
        item = WorkItem(request=request, content=content, request_hash=content_hash(content), lane=attempt)
        expected[attempt][(request.id, request.sample)] = item.request_hash
        return item

    if settings.resume and not paths[0].exists():
        log.info("resume requested, but %s does not exist yet; starting fresh", paths[0])
    empty = Reconciled(
        done=frozenset(),
        kept=0,
        kept_errors=0,
        stale=0,
        retried_errors=0,
        duplicates=0,
        prompt_tokens=0,
        completion_tokens=0,
    )
    states = [empty] * attempts
    left: list[list[WorkItem]] = [[] for _ in range(attempts)]
    unused = 0
    for lane in range(attempts):
        path = paths[lane]
        if lane and not expected[lane] and not path.exists():
            continue
        state = states[lane] = reconcile(
            path, expected[lane], on_stale=conf.on_stale, retry_errors=conf.retry_errors
        )
        if state.kept:
            log.info("resuming: %d of %d completions already in %s", state.kept, len(expected[lane]), path)
        if lane + 1 < attempts:
            for record in read_records(path):  # after reconcile: the records that are done
                nxt = next_item(record, lane + 1)
                if nxt is not None:
                    left[lane + 1].append(nxt)
                else:
                    unused += attempts - 1 - lane  # the chain ended here
    paths[0].touch()  # exists even when there is nothing to generate
    remaining = len(expected[0]) - states[0].kept
    for lane in range(1, attempts):
        left[lane] = [i for i in left[lane] if (i.request.id, i.request.sample) not in states[lane].done]
        remaining += len(left[lane])

    def todo() -> Iterator[WorkItem]:
        """Later attempts left from an earlier run first, then attempt 1's requests not done."""
        for lane in range(attempts - 1, 0, -1):
            yield from left[lane]
        items: Iterable[WorkItem | str] = (
            plan.items if plan.items is not None else _work_items(provider, prompts_path, conf.samples)
        )
        for item in items:
            if isinstance(item, WorkItem) and (item.request.id, item.request.sample) not in states[0].done:
                yield item

    sending = _open_sending(
        settings,
        provider,
        build_provider,
        paths[0],
        expected[0],
        states[0].done,
        remaining,
        len(expected[0]),
        longest=plan.longest,
        out_dir=out_dir,
    )
    conf, provider = sending.conf, sending.provider
    lanes = [_Lane(stage=stage, stats=RunStats()) for stage in stages]
    for lane, (stage, state) in enumerate(zip(stages, states, strict=True)):
        if meter is not None:
            meter.resumed(stage, prompt_tokens=state.prompt_tokens, completion_tokens=state.completion_tokens)
            lanes[lane].on_outcome = meter.hook(stage)
    if meter is not None and remaining:
        meter.check()  # a run stopped at its limit does not send more under the same limit
    recorded = {0}

    def note_server(lane: int) -> None:
        """The server identity beside each journal answers go to (read again by a replay)."""
        identity = sending.identity
        if lane not in recorded and identity is not None and identity.source != "journal":
            recorded.add(lane)
            record_server(paths[lane], identity.describe())

    for lane in range(1, attempts):
        if left[lane]:
            note_server(lane)
    if budget is not None:
        budget.attempt = 1
        # One pass for every attempt: attempt 1's requests bound the chains; each later
        # attempt joins the pass as it is sent (within that bound).
        budget.start("generation", len(expected[0]), sum(state.kept_errors for state in states))
        budget.grow(sum(len(known) for known in expected[1:]))
        budget.ended(unused)

    def follow(item: WorkItem, record: dict[str, Any]) -> WorkItem | None:
        nxt = next_item(record, item.lane + 1) if item.lane + 1 < attempts else None
        if nxt is not None:
            note_server(nxt.lane)
        if budget is not None:
            if nxt is not None:
                budget.grow(1)
            else:
                budget.ended(attempts - 1 - item.lane)
        return nxt

    policy = _policy(conf)
    bar = tqdm(
        total=remaining + sum(state.kept for state in states),
        initial=sum(state.kept for state in states),
        desc=f"generate and repair (up to {attempts} attempts) {provider.model}",
        unit="req",
        disable=not conf.progress,
        dynamic_ncols=True,
        mininterval=0.25,
        postfix={"errors": 0, "retries": 0, "timeouts": 0},
    )
    try:
        if remaining:
            asyncio.run(
                _run(
                    provider,
                    todo(),
                    remaining,
                    paths,
                    policy,
                    conf,
                    lanes,
                    bar,
                    sending.sender,
                    sending.workers,
                    budget=budget,
                    follow=follow,
                )
            )
        if budget is not None:
            budget.finish("generation")
            budget.attempt = attempts
    except KeyboardInterrupt:
        log.warning(
            "interrupted: %d completion(s) written to %s; rerun into the same directory to resume",
            sum(lane.stats.requests for lane in lanes),
            ", ".join(str(path) for path in paths if path.exists()),
        )
        raise
    except StoryforgeError:
        log.error(
            "generation stopped early; %d completion(s) written to %s",
            sum(lane.stats.requests for lane in lanes),
            ", ".join(str(path) for path in paths if path.exists()),
        )
        raise
    finally:
        bar.close()
        if sending.cache is not None:
            sending.cache.close()
    results = []
    for lane in range(attempts):
        if lane and not expected[lane]:
            continue  # no chain reached this attempt
        result = _pass_result(
            provider,
            conf,
            expected[lane],
            skipped[lane],
            states[lane],
            lanes[lane].stats,
            sending,
            remaining,
            started,
            meter,
            stages[lane],
        )
        results.append((paths[lane], result))
    return results


def _policy(conf: ProviderConf) -> RetryPolicy:
    return RetryPolicy(
        max_retries=conf.max_retries,
        timeout_s=conf.timeout_s,
        backoff_base_s=conf.backoff_base_s,
        backoff_max_s=conf.backoff_max_s,
        max_retry_after_s=conf.max_retry_after_s,
        max_response_bytes=conf.max_response_bytes,
        on_model_mismatch=conf.on_model_mismatch,
    )


def _pass_result(
    provider: Provider,
    conf: ProviderConf,
    expected: Mapping[tuple[str, int], str],
    skipped: int,
    state: Reconciled,
    stats: RunStats,
    sending: _Sending,
    remaining: int,
    started: float,
    meter: CostMeter | None,
    stage: str,
) -> dict[str, Any]:
    """One journal's figures for the manifest (see :func:`generate_for_job`); its tokens
    journaled in ``meter`` under ``stage``; the cache answers, retries and errors logged."""
    result = {
        **provider.describe(),
        "samples": conf.samples,
        "prompts": len({key[0] for key in expected}),
        "skipped_prompts": skipped,
        "total": len(expected),
        "resumed": state.kept,
        "requests": stats.requests,
        "retries": stats.retries,
        "errors": stats.errors,
        # error records in the whole file: this run's plus those kept from an earlier run
        "errors_in_file": state.kept_errors + stats.errors,
        "tokens": {
            "prompt": state.prompt_tokens + stats.prompt_tokens,
            "completion": state.completion_tokens + stats.completion_tokens,
        },
        "wall_time_s": round(time.perf_counter() - started, 3),
    }
    if remaining:
        log.info("%d of %d answers from the response cache (%s)", stats.cached, stats.requests, sending.note)
    stats.log_retries(conf)
    result["timeouts"] = stats.timeouts
    if sending.cache is not None:
        result["cache_hits"] = stats.cached  # the caller may know better (the cache's own count)
    result["cache"] = {
        "path": sending.note,
        "answers_from_cache": stats.cached,
        "answers_from_server": stats.requests - stats.cached,
        "identity": sending.identity.describe() if sending.identity is not None else None,
    }
    if meter is not None:
        meter.journal(
            stage,
            prompt_tokens=state.prompt_tokens + stats.prompt_tokens,
            completion_tokens=state.completion_tokens + stats.completion_tokens,
        )
    if stats.errors:
        log.warning(
            "%d request(s) failed after %d retries and were recorded as errors, e.g. %s",
            stats.errors,
            conf.max_retries,
            stats.last_errors[0],
        )
    return result


@dataclass(frozen=True, slots=True, kw_only=True)
class _Sending:
    """How a run's requests go out: the provider settings and client (pointed at the server
    ``provider=llama_cpp`` started), the cache (and what the log says of it), the identity its
    answers are filed under, the send function and the worker count."""

    conf: ProviderConf
    provider: Provider
    cache: ResponseCache | None
    note: str
    identity: ServerIdentity | None
    sender: Any
    workers: int


def _open_sending(
    settings: GenerationSettings,
    provider: Provider,
    built: Callable[[ProviderConf], Provider],
    path: Path,
    expected: dict[tuple[str, int], str],
    done: frozenset[tuple[str, int]],
    remaining: int,
    total: int,
    *,
    longest: int,
    out_dir: Path,
) -> _Sending:
    """The cache, the server identity and the sender for a run whose journal is ``path``;
    with ``provider=llama_cpp`` and requests to send, its server started first, its context
    sized for the ``longest`` request body (its log in ``out_dir``)."""
    conf = settings.provider
    if settings.cache.path is None and conf.replay == "only" and remaining:
        raise ConfigError(
            f"provider.replay=only: {remaining} of {total} request(s) have no answer in {path} and no "
            "cache is set to answer them (cache.path=null); set cache.path=FILE (the response cache of "
            "the run) or leave the default, cache.path=user"
        )
    # With every answer in the journal, a run directory replays on its own (no cache, no server).
    cache = (
        None
        if not remaining and conf.replay == "only"
        else open_for_run(settings.cache.path, replay=conf.replay)
    )
    if remaining and conf.replay != "only" and isinstance(conf, LlamaCppProviderConf):
        from storyforge.providers.llama_cpp import serve

        conf = serve(conf, longest_body_bytes=longest, log_dir=out_dir)
        provider = built(conf)  # the same request bodies, sent to the server just started
    identity = _server_identity(conf, provider, built, cache, path, expected, done) if remaining else None
    if cache is not None and identity is None and remaining:
        # No identity to file answers under: the cache is neither read nor written this run.
        cache_note = "not read: what serves the model could not be read"
        cache.close()
        cache = None
    else:
        cache_note = "off: cache.path=null" if cache is None else str(cache.path)
    if cache is not None and identity is not None and conf.replay == "only":
        check_replay(cache, provider.name, identity.digest, expected, done)
    if cache is not None and identity is not None:
        cache.remember(identity)
    if identity is not None and identity.source != "journal":
        record_server(path, identity.describe())
    sender, n_workers = plan_sending(
        conf, provider, cache, built, identity=identity.digest if identity else ""
    )
    return _Sending(
        conf=conf,
        provider=provider,
        cache=cache,
        note=cache_note,
        identity=identity,
        sender=sender,
        workers=n_workers,
    )


def _server_identity(
    conf: ProviderConf,
    provider: Provider,
    built: Callable[[ProviderConf], Provider],
    cache: ResponseCache | None,
    path: Path,
    expected: dict[tuple[str, int], str],
    done: frozenset[tuple[str, int]],
) -> ServerIdentity | None:
    """What this run's answers are cached under (see :mod:`storyforge.providers.identity`).

    ``provider.cache_identity`` when set; under ``replay=only`` (no server is asked) the
    identity kept beside the journal, else the only server whose answers the cache holds for
    every request left; otherwise what the endpoints report, read now, once for the run
    (None when no endpoint answered: then the cache is not used).
    """
    if conf.cache_identity is not None:
        return pinned(str(conf.cache_identity))
    if conf.replay == "only":
        recorded = recorded_server(path)
        if recorded is not None:
            digest = recorded["digest"]
            return ServerIdentity(
                text=str(recorded.get("reported") or digest), digest=digest, source="journal"
            )
        if cache is None:
            return None
        return replay_identity(cache, provider.name, expected, done)
    providers = [provider]
    if isinstance(conf, OpenAIProviderConf):
        providers += [built(dataclasses.replace(conf, base_url=url)) for url in conf.base_urls()[1:]]
    return probe(conf, providers)


@dataclass(slots=True, kw_only=True)
class _Lane:
    """Where the answers of one journal go: its stage (priced and counted under it) and stats."""

    stage: str
    stats: RunStats
    on_outcome: Callable[[Outcome, ChatRequest | None], None] | None = None


Follow = Callable[[WorkItem, dict[str, Any]], "WorkItem | None"]
"""What a finished request leads to: the next request of its chain (sent at once), or None."""


async def _run(
    provider: Provider,
    items: Iterator[WorkItem],
    remaining: int,
    paths: list[Path],
    policy: RetryPolicy,
    conf: ProviderConf,
    lanes: list[_Lane],
    bar: tqdm,
    sender: Any = send,
    n_workers: int | None = None,
    *,
    budget: ErrorBudget | None = None,
    follow: Follow | None = None,
) -> None:
    """Run every item through ``conf.concurrency`` workers sharing one pooled session, each
    answer journaled in ``paths[item.lane]`` and counted in ``lanes[item.lane]``; a ``budget``
    is told of every failed request (and may stop the run).

    With ``follow``, the request a finished one leads to (a chain's next attempt) joins the
    queue at once and is sent when a worker is free, after the items already queued, so no
    worker waits for the slowest answers of an attempt while chains are still going."""
    concurrency = min(n_workers or conf.concurrency, remaining)
    rng = random.Random()
    appender = Appender(paths[0])
    writer = _BatchWriter(appender, more=paths[1:])
    breaker = FailFast(
        provider=provider, window_s=conf.fail_fast_s, answered=budget.answered if budget is not None else None
    )
    ready: collections.deque[WorkItem] = collections.deque()
    wake = asyncio.Event()
    busy = 0
    # The limit's last word once provider.max_cost_usd is reached: nothing more is sent, and each
    # answer still arriving is journaled and counted, so the last one says the whole spent.
    budget_stop: BudgetExceeded | None = None

    def retrying(stats: RunStats) -> Callable[[str], None]:
        def on_retry(reason: str) -> None:
            stats.retry(reason)
            bar.set_postfix(
                errors=stats.errors, retries=stats.retries, timeouts=stats.timeouts, refresh=False
            )
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
            bar.set_postfix(
                errors=stats.errors, retries=stats.retries, timeouts=stats.timeouts, refresh=False
            )
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
        try:
            await writer.close()
        finally:
            writer.close_files()
            appender.close()
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
            f"{self._tries} tries, all failed with {_cut(_GAVE_UP.sub('', self._last))}. "
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


def _cut(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
        self, appender: Appender, *, window: float = FSYNC_WINDOW_S, more: Sequence[Path] = ()
    ) -> None:
        self._more = list(more)
        # Journal 0 is ``appender``; journal k (``more[k-1]``) is opened at its first line,
        # so a journal no answer went to is not created.
        self._appenders: dict[int, Appender] = {0: appender}
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
                appender = self._appenders[journal] = Appender(self._more[journal - 1])
            appender.write(lines[journal])

    def close_files(self) -> None:
        """Close the journals this writer opened (journal 0 is its caller's)."""
        for journal, appender in self._appenders.items():
            if journal:
                appender.close()

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
        self._closing.set()
        self._wake.set()
        if not self.task.done():
            # shield: a second Ctrl-C must not cut a batch that is being written
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self.task)
        batch, self._pending = self._pending, []
        if batch:
            self._write(batch)
        if self.task.done() and not self.task.cancelled() and self.task.exception() is not None:
            raise self.task.exception()  # type: ignore[misc]


def _record(item: WorkItem, outcome: Outcome, model: str) -> dict[str, Any]:
    completion = outcome.completion
    return {
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
    } | _answer_notes(completion, model)


def _answer_notes(completion: Completion | None, model: str) -> dict[str, Any]:
    """Keys a record carries only when they say something: an echoed prefill, another model."""
    if completion is None:
        return {}
    notes: dict[str, Any] = {}
    if completion.prefill_echo_stripped:
        notes["prefill_echo_stripped"] = True
    if completion.served_model is not None and not same_model(model, completion.served_model):
        notes["served_model"] = completion.served_model
    return notes
