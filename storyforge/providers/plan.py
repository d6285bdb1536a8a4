"""The requests of a pass, planned before anything is sent: prompts.jsonl -> encoded, hashed requests.

Takes: the generation settings, the pass's journal and the job's ``prompts.jsonl`` (one
``{"id", "split", "messages"}`` per line), or a :data:`RequestSource` (a regeneration
attempt's requests). Gives: :func:`plan_pass`, the pass's :class:`PassPlan` (its provider,
the journal reconciled with the requests, and what is left to send); :func:`plan_requests`,
each request's hash (what "done" means) and every bad record; :func:`read_prompts`; and
:func:`build_provider`. :mod:`storyforge.providers.sending` sends what is planned here and
:mod:`storyforge.providers.runner` ties the two together.

Per-request cost: the planning pass reads, validates, encodes and hashes every request once
and keeps the encoded bodies for sending (up to :data:`PLAN_KEEP_BYTES`; a bigger run encodes
them again while sending), instead of doing all of it twice. Sending takes each kept request
out of the plan as it goes, so a request is let go once it is answered and the memory held
while sending is bounded by ``provider.concurrency``, not by the number of requests.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storyforge import jsontext
from storyforge.config.provider import GenerationSettings, ProviderConf
from storyforge.errors import ConfigError, DataError
from storyforge.providers.base import ChatRequest, Provider, content_hash, encode_body
from storyforge.providers.choices import NChoices, with_n
from storyforge.providers.journal import Reconciled, reconcile

__all__ = [
    "PLAN_KEEP_BYTES",
    "PassPlan",
    "Plan",
    "Prompt",
    "RequestSource",
    "WorkItem",
    "build_provider",
    "plan_pass",
    "plan_requests",
    "read_prompts",
    "work_items",
]

log = logging.getLogger(__name__)


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
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path.name}:{number}"
            record = jsontext.parse_line(line, number)
            if isinstance(record, jsontext.BadLine):
                yield record.at(path.name)
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

    @classmethod
    def of(
        cls, request: ChatRequest, body: Mapping[str, Any], *, samples: int = 0, lane: int = 0
    ) -> WorkItem:
        """``request`` with its body encoded and hashed (``samples``: how many it asks for with n=)."""
        content = encode_body(body)
        return cls(
            request=request,
            content=content,
            request_hash=content_hash(content),
            samples=tuple(range(samples)),
            lane=lane,
        )

    def journal_keys(self) -> list[tuple[str, int]]:
        return [(self.request.id, k) for k in self.samples or (self.request.sample,)]


RequestSource = Callable[[Provider], Iterator[tuple[ChatRequest, dict[str, Any]] | str]]
"""Every request of a generation pass with its body, or a problem, in a deterministic order
(called once for planning and maybe again for sending)."""


def work_items(
    provider: Provider, path: Path, samples: int, source: RequestSource | None = None
) -> Iterator[WorkItem | str]:
    """Every request encoded for sending, with its hash, or a problem: ``source``'s requests,
    else each prompt's ``samples`` (one request for them all with n= per request:
    :class:`~storyforge.providers.choices.NChoices`), a prompt all or nothing."""
    per_request = isinstance(provider, NChoices)
    for item in _requests(provider, path, samples, per_request) if source is None else source(provider):
        if isinstance(item, str):
            yield item
            continue
        yield WorkItem.of(*item, samples=samples if per_request else 0)


def _requests(
    provider: Provider, path: Path, samples: int, per_request: bool
) -> Iterator[tuple[ChatRequest, dict[str, Any]] | str]:
    for prompt in read_prompts(path):
        if isinstance(prompt, str):
            yield prompt
            continue
        try:
            batch = []
            for sample in range(0, samples, samples if per_request else 1):
                request = ChatRequest(
                    id=prompt.id, split=prompt.split, sample=sample, messages=prompt.messages
                )
                batch.append((request, provider.body(request)))
        except DataError as exc:
            yield str(exc)
            continue
        yield from batch


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
    """The encoded requests in order (None: too many to keep); sending takes them out
    (:attr:`PassPlan.items`)."""
    longest: int = 0
    """The longest encoded request body, in bytes (a managed server's context is sized from it)."""


def plan_requests(
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
    for item in work_items(provider, path, samples, source):
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


@dataclass(frozen=True, slots=True, kw_only=True)
class PassPlan:
    """What one pass is to send (:func:`plan_pass`): its provider, its journal and what the
    journal already holds, and the requests left."""

    provider: Provider
    built: Callable[[ProviderConf], Provider]
    """Builds the provider for other settings (another endpoint, a started server)."""
    path: Path
    plan: Plan
    state: Reconciled
    items: Callable[[], Iterator[WorkItem]]
    """The requests left to send, in order (read again from the prompts for a big run); the
    kept ones are handed over once, each dropped from the plan as it is given out."""

    @property
    def total(self) -> int:
        return len(self.plan.expected)

    @property
    def remaining(self) -> int:
        return len(self.plan.expected) - self.state.kept


def plan_pass(
    settings: GenerationSettings,
    path: Path,
    prompts_path: Path,
    *,
    source: RequestSource | None = None,
    wrap: Callable[[Provider], Provider] | None = None,
    require_done: str | None = None,
) -> PassPlan:
    """Read every request of the pass (bad prompt records refused under ``strict``, else
    skipped and logged) and reconcile the journal ``path`` with them: what is left to send."""
    conf = settings.provider

    def built(c: ProviderConf) -> Provider:
        made = with_n(build_provider(c), c) if source is None else build_provider(c)
        return wrap(made) if wrap is not None else made

    provider = built(conf)
    plan = plan_requests(provider, prompts_path, conf.samples, source=source)
    if plan.problems and settings.strict:
        raise DataError(
            f"{len(plan.problems)} bad prompt record(s) in {prompts_path} (strict=true):\n  "
            + "\n  ".join(plan.problems)
        )
    for problem in plan.problems:
        log.warning("skipped %s", problem)
    path.parent.mkdir(parents=True, exist_ok=True)
    if settings.resume and not path.exists():
        log.info("resume requested, but %s does not exist yet; starting fresh", path)
    state = reconcile(path, plan.expected, on_stale=conf.on_stale, retry_errors=conf.retry_errors)
    path.touch()  # exists even when there is nothing to generate
    total, remaining = len(plan.expected), len(plan.expected) - state.kept
    if state.kept:
        log.info("resuming: %d of %d completions already in %s", state.kept, total, path)
    if require_done is not None and remaining:
        raise ConfigError(
            f"{require_done}: {remaining} of {total} request(s) have no answer in {path}; "
            "finish the run first (the same command without stage=...)"
        )

    def todo() -> Iterator[WorkItem]:
        """What is left to send: the kept requests, or (for a big run) the prompts read again."""
        done = state.done
        items = (
            _handed_over(plan.items)
            if plan.items is not None
            else work_items(provider, prompts_path, conf.samples, source)
        )
        for item in items:
            if isinstance(item, str):
                continue
            missing = tuple(k for k in item.samples if (item.request.id, k) not in done)
            if missing:
                yield dataclasses.replace(item, samples=missing)
            elif not item.samples and (item.request.id, item.request.sample) not in done:
                yield item

    return PassPlan(provider=provider, built=built, path=path, plan=plan, state=state, items=todo)


def _handed_over(kept: list[WorkItem]) -> Iterator[WorkItem]:
    """``kept`` in order, each item taken out of the list as it is given: once a request is
    answered nothing holds it, so the requests a pass keeps shrink as they are sent."""
    kept.reverse()
    while kept:
        yield kept.pop()
