"""Generation for a job: prompts.jsonl -> ``samples`` requests per prompt -> generations.jsonl.

Takes: the generation settings (:class:`~storyforge.config.provider.GenerationSettings`: the
checked provider, the response cache, ``strict`` and ``resume``), the run directory and the
job's ``prompts.jsonl`` (one ``{"id", "split", "messages"}`` per line). Gives:
:func:`generate_for_job`, which returns the path of ``generations.jsonl`` and the stats for
the run manifest, in three steps a reader can follow: :func:`~storyforge.providers.plan.plan_pass`
(what to send: :mod:`storyforge.providers.plan`), :func:`send_pass` (the cache, the server
identity and the provider loop of :mod:`storyforge.providers.sending`) and :func:`record_pass`
(the figures); :func:`generate_chains`, the same for chains of attempts (each attempt sent as
soon as the one before it is answered and checked, one journal per attempt); and
:func:`build_provider` for jobs that need to know what will run (:func:`provider_conf` and
:func:`provider_enabled`, which read a config, live in :mod:`storyforge.config.provider` and
are re-exported here).

A journal's lines are in completion order (the TinyStories job sorts the finished file by
prompt, then sample: :func:`storyforge.executors.sort_generations`). ``output`` is only the
generated text (after a prefill, the continuation); on failure after every retry it is
``null`` and ``error`` says why. A rerun into the same directory resumes (``+resume=true``
says so explicitly; the same ``hydra.run.dir`` is enough): see
:mod:`storyforge.providers.journal` for what counts as done. Several endpoints
(``provider.base_url`` as a list: ``provider.concurrency`` workers each), the response cache
(``cache.path``, ``provider.replay``) and ``n=`` per request (``provider.n_per_request``) plug
in through :mod:`~storyforge.providers.endpoints`, :mod:`~storyforge.providers.cache` and
:mod:`~storyforge.providers.choices`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from storyforge.extras import require

require("aiohttp", extra="generate", for_what="calling a model server")


from storyforge.config.provider import (
    GenerationSettings,
    LlamaCppProviderConf,
    ProviderConf,
    check_replay_cache,
    provider_conf,
    provider_enabled,
)
from storyforge.errors import ConfigError, DataError
from storyforge.providers.base import ChatRequest, Provider
from storyforge.providers.cache import ResponseCache, check_replay, replay_identity
from storyforge.providers.choices import use_n
from storyforge.providers.cost import CostMeter
from storyforge.providers.endpoints import endpoint_providers, plan_sending
from storyforge.providers.error_budget import ErrorBudget
from storyforge.providers.identity import ServerIdentity, pinned, probe
from storyforge.providers.journal import Reconciled, read_records, reconcile, record_server, recorded_server
from storyforge.providers.plan import (
    PassPlan,
    RequestSource,
    WorkItem,
    build_provider,
    plan_pass,
    read_prompts,
)
from storyforge.providers.sending import Lane, RunStats, Sending, bar_label, pass_bar, send_all
from storyforge.runfiles import GENERATIONS

__all__ = [
    "GENERATIONS_NAME",
    "ChainRules",
    "RequestSource",
    "RunStats",
    "bar_label",
    "build_provider",
    "generate_chains",
    "generate_for_job",
    "provider_conf",
    "provider_enabled",
    "read_prompts",
    "record_pass",
    "send_pass",
]

log = logging.getLogger(__name__)

GENERATIONS_NAME = GENERATIONS


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
    """Generate ``provider.samples`` completions per prompt into ``out_dir/generations.jsonl``:
    :func:`plan_pass` (what to send), :func:`send_pass` (the provider loop, every answer
    journaled) and :func:`record_pass` (the figures).

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
    work = plan_pass(
        settings,
        Path(out_dir) / journal_name,
        Path(prompts_path),
        source=source,
        wrap=wrap,
        require_done=require_done,
    )
    stats, sending = send_pass(settings, work, stage=stage, meter=meter, budget=budget)
    plan = work.plan
    result = record_pass(
        sending,
        plan.expected,
        work.state,
        stats,
        skipped=len(plan.problems),
        sent=bool(work.remaining),
        started=started,
        meter=meter,
        stage=stage,
    )
    if sending.cache is not None:
        result["cache_hits"] = sending.cache.hits
    return work.path, result


def _resume_meter(meter: CostMeter | None, stages: Sequence[tuple[str, Reconciled]], remaining: int) -> None:
    """The answers the journals hold count as spent; a run stopped at its limit does not send
    more under the same limit."""
    if meter is None:
        return
    for stage, state in stages:
        meter.resumed(stage, prompt_tokens=state.prompt_tokens, completion_tokens=state.completion_tokens)
    if remaining:
        meter.check()


def send_pass(
    settings: GenerationSettings,
    work: PassPlan,
    *,
    stage: str,
    meter: CostMeter | None = None,
    budget: ErrorBudget | None = None,
) -> tuple[RunStats, Sending]:
    """Send what ``work`` has left (the cache, the server identity and the workers opened
    first), every answer appended to its journal as it comes; returns the pass's counts."""
    state, remaining = work.state, work.remaining
    _resume_meter(meter, [(stage, state)], remaining)
    sending = _open_sending(settings, work, remaining)
    lanes = _lanes([stage], meter)
    if budget is not None:
        budget.start(stage, work.total, state.kept_errors)
    desc = bar_label(stage, work.path.name, sending.provider.model)
    bar = pass_bar(sending.conf, total=work.total, initial=state.kept, desc=desc)
    send_all(sending, work.items(), remaining, [work.path], lanes, bar, budget=budget)
    return lanes[0].stats, sending


def _lanes(stages: Sequence[str], meter: CostMeter | None) -> list[Lane]:
    """A lane per journal, each answer priced under its stage in ``meter``."""
    return [
        Lane(stage=stage, stats=RunStats(), on_outcome=meter.hook(stage) if meter is not None else None)
        for stage in stages
    ]


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
    if attempts > 1 and (isinstance(conf, LlamaCppProviderConf) or use_n(conf)):
        raise ConfigError(
            f"provider={conf.name}: chains of attempts are sent pass by pass (generate_for_job)"
        )
    out_dir = Path(out_dir)
    work = plan_pass(settings, out_dir / rules.journal(1), Path(prompts_path))
    provider, plan = work.provider, work.plan
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
        item = WorkItem.of(*made, lane=attempt)
        expected[attempt][(item.request.id, item.request.sample)] = item.request_hash
        return item

    # Each attempt's journal reconciled in turn: the answers of attempt k (what is done of it)
    # give the requests of attempt k+1.
    states = [work.state, *(Reconciled() for _ in range(attempts - 1))]
    left: list[list[WorkItem]] = [[] for _ in range(attempts)]
    unused = 0
    for lane in range(attempts):
        path = paths[lane]
        if lane and not expected[lane] and not path.exists():
            continue
        if lane:
            state = states[lane] = reconcile(
                path, expected[lane], on_stale=conf.on_stale, retry_errors=conf.retry_errors
            )
            if state.kept:
                log.info(
                    "resuming: %d of %d completions already in %s", state.kept, len(expected[lane]), path
                )
        if lane + 1 < attempts:
            for record in read_records(path):  # after reconcile: the records that are done
                nxt = next_item(record, lane + 1)
                if nxt is not None:
                    left[lane + 1].append(nxt)
                else:
                    unused += attempts - 1 - lane  # the chain ended here
    remaining = work.remaining
    for lane in range(1, attempts):
        left[lane] = [i for i in left[lane] if (i.request.id, i.request.sample) not in states[lane].done]
        remaining += len(left[lane])

    def todo() -> Iterator[WorkItem]:
        """Later attempts left from an earlier run first, then attempt 1's requests not done."""
        for lane in range(attempts - 1, 0, -1):
            yield from left[lane]
        yield from work.items()

    sending = _open_sending(settings, work, remaining)  # later attempts count as requests left
    _resume_meter(meter, list(zip(stages, states, strict=True)), remaining)
    lanes = _lanes(stages, meter)
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

    kept = sum(state.kept for state in states)
    desc = f"generate and repair (up to {attempts} attempts) {provider.model}"
    bar = pass_bar(sending.conf, total=remaining + kept, initial=kept, desc=desc)
    send_all(sending, todo(), remaining, paths, lanes, bar, budget=budget, follow=follow)
    if budget is not None:
        budget.attempt = attempts
    results = []
    for lane in range(attempts):
        if lane and not expected[lane]:
            continue  # no chain reached this attempt
        result = record_pass(
            sending,
            expected[lane],
            states[lane],
            lanes[lane].stats,
            skipped=skipped[lane],
            sent=bool(remaining),
            started=started,
            meter=meter,
            stage=stages[lane],
        )
        results.append((paths[lane], result))
    return results


def record_pass(
    sending: Sending,
    expected: Mapping[tuple[str, int], str],
    state: Reconciled,
    stats: RunStats,
    *,
    skipped: int,
    sent: bool,
    started: float,
    meter: CostMeter | None,
    stage: str,
) -> dict[str, Any]:
    """One journal's figures for the manifest (see :func:`generate_for_job`); its tokens
    journaled in ``meter`` under ``stage``; the cache answers, retries and errors logged."""
    result = {
        **sending.provider.describe(),
        "samples": sending.conf.samples,
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
    if sent:
        log.info("%d of %d answers from the response cache (%s)", stats.cached, stats.requests, sending.note)
    stats.log_retries(sending.conf)
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
            sending.conf.max_retries,
            stats.last_errors[0],
        )
    return result


def _open_sending(settings: GenerationSettings, work: PassPlan, remaining: int) -> Sending:
    """The cache, the server identity and the sender for the pass ``work`` plans, with
    ``remaining`` requests to send; with ``provider=llama_cpp`` and requests to send, its
    server started first, its context sized for the longest request body (its log beside the
    journal)."""
    provider, path, conf = work.provider, work.path, settings.provider
    unanswered = f"{remaining} of {work.total} request(s) have no answer in {path}" if remaining else None
    check_replay_cache(conf.replay, settings.cache, unanswered=unanswered)
    # With every answer in the journal, a run directory replays on its own (no cache, no server).
    cache_path = settings.cache.path
    cache = (
        None if cache_path is None or (not remaining and conf.replay == "only") else ResponseCache(cache_path)
    )
    if remaining and conf.replay != "only" and isinstance(conf, LlamaCppProviderConf):
        from storyforge.providers.llama_cpp import serve

        conf = serve(conf, longest_body_bytes=work.plan.longest, log_dir=path.parent)
        provider = work.built(conf)  # the same request bodies, sent to the server just started
    identity = _server_identity(conf, provider, work, cache) if remaining else None
    note = "off: cache.path=null" if cache is None else str(cache.path)
    if cache is not None and identity is None and remaining:
        # No identity to file answers under: the cache is neither read nor written this run.
        note = "not read: what serves the model could not be read"
        cache.close()
        cache = None
    if cache is not None and identity is not None:
        if conf.replay == "only":
            check_replay(cache, provider.name, identity.digest, work.plan.expected, work.state.done)
        cache.remember(identity)
    if identity is not None and identity.source != "journal":
        record_server(path, identity.describe())
    digest = identity.digest if identity else ""
    sender, workers = plan_sending(conf, provider, cache, work.built, identity=digest)
    return Sending(
        conf=conf,
        provider=provider,
        cache=cache,
        note=note,
        identity=identity,
        sender=sender,
        workers=workers,
    )


def _server_identity(
    conf: ProviderConf, provider: Provider, work: PassPlan, cache: ResponseCache | None
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
        recorded = recorded_server(work.path)
        if recorded is not None:
            digest = recorded["digest"]
            return ServerIdentity(
                text=str(recorded.get("reported") or digest), digest=digest, source="journal"
            )
        if cache is None:
            return None
        return replay_identity(cache, provider.name, work.plan.expected, work.state.done)
    return probe(conf, endpoint_providers(conf, provider, work.built))
