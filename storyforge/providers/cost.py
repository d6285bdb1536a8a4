"""What a run costs: the estimate before the first request, the meter while it runs, the limit.

Takes: the model's :class:`~storyforge.config.pricing.Price`, ``provider.max_cost_usd`` and, per
finished request, its :class:`~storyforge.providers.retry.Outcome`. Gives:
:func:`estimate_cost` (bounds before anything is sent), :class:`CostMeter` (tokens and USD per
stage: ``generation``, ``regeneration``, ``judge``; a limit check after every answer) and
:func:`check_estimate`, which refuses a run whose lower bound is already above the limit.

What counts: every answer a server sent (its ``usage``; cached-input tokens, when the server
reports ``prompt_tokens_details.cached_tokens``, at the cached-input price). A count the server
left out, or gave as anything but an integer from 0 to
:data:`~storyforge.providers.base.MAX_TOKEN_COUNT`, is estimated with the run's token
estimator (``pricing.tokenizer``) from the prompt and the answer, counted under
``estimated_requests`` and said once in the log. An answer from the
response cache costs nothing and is counted as a cache hit. A rerun counts the answers already
in its journals as spent (the journal does not say which of them came from the cache, so a
rerun's figure can only be higher than what was paid, never lower), so a stopped run resumed
with the same limit stops again at once, and one resumed with a higher limit goes on from
where it stopped without sending anything twice.

Two figures: :meth:`CostMeter.summary` is what the data cost (every answer in the journals,
priced; the same for a run and its replay), written to the report; :meth:`CostMeter.run_summary`
is what this run spent (requests sent, cache hits at no cost), written to the manifest.

Stopping: once the spent total reaches the limit, :meth:`CostMeter.check` raises
:class:`~storyforge.errors.BudgetExceeded` (exit status 5). The runner then sends nothing more,
lets the requests still in flight (at most ``provider.concurrency``, paid for either way) finish,
journals and counts them, and stops with the last check's error, whose spent figure is what the
journals hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storyforge import jsontext
from storyforge.config.pricing import Price
from storyforge.engine.budget import default_estimator
from storyforge.errors import BudgetExceeded
from storyforge.providers.base import ChatRequest, int_or_none

if TYPE_CHECKING:  # aiohttp (under retry) is loaded only by a run that sends requests
    from storyforge.providers.retry import Outcome

__all__ = ["STAGES", "CostEstimate", "CostMeter", "StageCost", "check_estimate", "estimate_cost"]

log = logging.getLogger(__name__)

STAGES = ("generation", "regeneration", "judge")

REPAIR_TURN_TOKENS = 150
"""What the estimate allows for a repair turn (the packaged template's text is about 60 tokens
plus the phrases it names)."""


@dataclass(slots=True)
class StageCost:
    """One stage's figures (a mutable tally; only the event loop thread changes it)."""

    requests: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    # Requests whose server gave no valid token count: their counts were estimated.
    estimated_requests: int = 0
    # Answers kept from an earlier run into the same directory, counted as spent.
    resumed_prompt_tokens: int = 0
    resumed_completion_tokens: int = 0
    resumed_cost_usd: float = 0.0

    def as_record(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "tokens": {
                "prompt": self.prompt_tokens + self.resumed_prompt_tokens,
                "cached_prompt": self.cached_prompt_tokens,
                "completion": self.completion_tokens + self.resumed_completion_tokens,
            },
            "cost_usd": round(self.cost_usd + self.resumed_cost_usd, 6),
            "estimated_requests": self.estimated_requests,
        }


def _cached_tokens(outcome: Outcome, prompt: int) -> int:
    """The cached part of the prompt the server reports (at most the prompt itself)."""
    completion = outcome.completion
    usage = completion.raw_usage if completion is not None else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    cached = int_or_none(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    return min(cached or 0, prompt)


@dataclass(slots=True)
class CostMeter:
    """Tokens and USD per stage, and the run's limit (``None``: no limit)."""

    price: Price
    model: str
    limit: float | None = None
    # The model has a price in the pricing group (an unpriced model counts tokens at $0 and the
    # run's files carry no cost section).
    priced: bool = True
    stages: dict[str, StageCost] = field(default_factory=lambda: {stage: StageCost() for stage in STAGES})
    # What the journals hold per stage once each pass is done: (prompt, completion) tokens.
    journaled: dict[str, list[int]] = field(default_factory=lambda: {stage: [0, 0] for stage in STAGES})
    # Counts a token count the server did not give validly (see the module), and its name.
    estimator: Callable[[str], int] = default_estimator
    estimator_name: str = "ceil(chars / 4)"
    _warned: bool = False

    @property
    def spent(self) -> float:
        return sum(s.cost_usd + s.resumed_cost_usd for s in self.stages.values())

    def resumed(self, stage: str, *, prompt_tokens: int, completion_tokens: int) -> None:
        """Count the answers a journal already holds (from an earlier run) as spent."""
        entry = self.stages[stage]
        entry.resumed_prompt_tokens += prompt_tokens
        entry.resumed_completion_tokens += completion_tokens
        entry.resumed_cost_usd += self.price.cost(
            prompt=prompt_tokens, cached=0, completion=completion_tokens
        )

    def charge(self, stage: str, outcome: Outcome, request: ChatRequest | None = None) -> None:
        """Count one finished request of ``request`` (a cache hit costs nothing)."""
        entry = self.stages[stage]
        if outcome.cached:
            entry.cache_hits += 1
            return
        entry.requests += 1
        completion = outcome.completion
        if completion is None:
            return  # an error after every retry: no usage reported
        prompt, done = int_or_none(completion.prompt_tokens), int_or_none(completion.completion_tokens)
        if prompt is None or done is None:
            entry.estimated_requests += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "the server gave no valid token count for a %s request; such counts are "
                    "estimated with %s (estimated_requests in the manifest's cost)",
                    stage,
                    self.estimator_name,
                )
            if prompt is None:
                messages = request.messages if request is not None else ()
                prompt = sum(self.estimator(str(m.get("content", ""))) for m in messages)
            if done is None:
                done = self.estimator(completion.output)
        cached = _cached_tokens(outcome, prompt)
        entry.prompt_tokens += prompt
        entry.cached_prompt_tokens += cached
        entry.completion_tokens += done
        entry.cost_usd += self.price.cost(prompt=prompt, cached=cached, completion=done)

    def check(self) -> None:
        """Raise :class:`BudgetExceeded` once the spent total has reached the limit."""
        if self.limit is not None and self.spent >= self.limit:
            raise BudgetExceeded(
                f"provider.max_cost_usd={self.limit:g} reached: ${self.spent:.4f} spent on {self.model}; "
                "the answers so far are kept; rerun into the same directory with a higher "
                "provider.max_cost_usd to go on"
            )

    def journal(self, stage: str, *, prompt_tokens: int, completion_tokens: int) -> None:
        """Add what one finished pass's journal holds (every answer of the data, resumed ones too)."""
        self.journaled[stage][0] += prompt_tokens
        self.journaled[stage][1] += completion_tokens

    def hook(self, stage: str) -> Callable[[Outcome, ChatRequest | None], None]:
        """What the runner calls after each finished request of ``stage``."""

        def on_outcome(outcome: Outcome, request: ChatRequest | None = None) -> None:
            self.charge(stage, outcome, request)
            self.check()

        return on_outcome

    def summary(self, *, passed: int | None = None) -> dict[str, Any]:
        """The report's ``cost`` section: what the data cost, from the tokens its journals hold
        (so a replay, which pays nothing, reports the same figures as the run it replays)."""
        stages: dict[str, Any] = {}
        total = 0.0
        for stage, (prompt, completion) in self.journaled.items():
            usd = self.price.cost(prompt=prompt, cached=0, completion=completion)
            total += usd
            stages[stage] = {
                "tokens": {"prompt": prompt, "completion": completion},
                "cost_usd": round(usd, 6),
            }
        return {
            "model": self.model,
            "price_per_million": {
                "input": self.price.input,
                "cached_input": self.price.cached_input,
                "output": self.price.output,
            },
            "stages": stages,
            "total_usd": round(total, 6),
            "passed": passed,
            "per_passing_sample_usd": round(total / passed, 6) if passed else None,
        }

    def share(self, limit: float | None) -> CostMeter:
        """A fresh meter for the same model and price with its own ``limit`` (a shard's share)."""
        return CostMeter(
            price=self.price,
            model=self.model,
            limit=limit,
            priced=self.priced,
            estimator=self.estimator,
            estimator_name=self.estimator_name,
        )

    @classmethod
    def combine(cls, meters: Sequence[CostMeter], *, limit: float | None) -> CostMeter:
        """One meter adding up ``meters`` (the shards' of one run, same model and price)."""
        first = meters[0]
        total = first.share(limit)
        for meter in meters:
            for stage, entry in meter.stages.items():
                into = total.stages[stage]
                for name in (f.name for f in fields(StageCost)):
                    setattr(into, name, getattr(into, name) + getattr(entry, name))
            for stage, (prompt, completion) in meter.journaled.items():
                total.journaled[stage][0] += prompt
                total.journaled[stage][1] += completion
        return total

    def run_summary(self) -> dict[str, Any]:
        """The manifest's record of this run's spending: requests sent, cache hits, USD."""
        return {
            "max_cost_usd": self.limit,
            "spent_usd": round(self.spent, 6),
            "stages": {stage: entry.as_record() for stage, entry in self.stages.items()},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class CostEstimate:
    """Bounds on a run's cost before it starts (``high`` is None without a completion cap)."""

    prompts: int
    prompt_tokens: int
    requests: int
    low: float
    high: float | None

    def describe(self, *, priced: bool = True) -> str:
        counts = f"{self.requests} first-attempt request(s) ({self.prompts} prompt(s), {self.prompt_tokens} prompt tokens)"
        if not priced:
            return f"cost estimate: not priced (no price for this model in pricing.models) for {counts}"
        high = "unbounded (no max_tokens)" if self.high is None else f"${self.high:.4f}"
        return f"cost estimate: ${self.low:.4f} to {high} for {counts}"


def _prompt_tokens(prompts_path: Path, count: Callable[[str], int]) -> Iterable[int]:
    for _, record in jsontext.read_jsonl(prompts_path):  # a bad line is reported by read_prompts
        messages = record.get("messages") if isinstance(record, dict) else None
        if isinstance(messages, list):
            yield sum(count(str(m.get("content", ""))) for m in messages if isinstance(m, dict))


def estimate_cost(
    prompts_path: Path,
    count: Callable[[str], int],
    price: Price,
    *,
    samples: int,
    max_tokens: int | None,
    attempts: int = 1,
    judged: bool = False,
) -> CostEstimate:
    """Bounds: the lower one is every first-attempt prompt read once per sample with nothing
    generated; the upper one has every answer at ``max_tokens`` and every later attempt sent
    (a repair turn carrying the failed answer and :data:`REPAIR_TURN_TOKENS`), and, when
    ``judged``, a judge request per answer (the answer plus the prompt again)."""
    per_prompt = list(_prompt_tokens(prompts_path, count))
    tokens = sum(per_prompt)
    low = price.cost(prompt=tokens * samples, cached=0, completion=0)
    high: float | None = None
    if max_tokens is not None:
        first = price.cost(
            prompt=tokens * samples, cached=0, completion=max_tokens * samples * len(per_prompt)
        )
        later_prompt = (tokens + len(per_prompt) * (max_tokens + REPAIR_TURN_TOKENS)) * samples
        later = price.cost(prompt=later_prompt, cached=0, completion=max_tokens * samples * len(per_prompt))
        high = first + (attempts - 1) * later
        if judged:
            judge_prompt = (tokens + len(per_prompt) * max_tokens) * samples * attempts
            high += price.cost(
                prompt=judge_prompt, cached=0, completion=max_tokens * samples * attempts * len(per_prompt)
            )
    return CostEstimate(
        prompts=len(per_prompt), prompt_tokens=tokens, requests=len(per_prompt) * samples, low=low, high=high
    )


def check_estimate(estimate: CostEstimate, limit: float | None, *, priced: bool = True) -> None:
    """Log the estimate; raise :class:`BudgetExceeded` when even its lower bound is above ``limit``."""
    log.info("%s", estimate.describe(priced=priced))
    if limit is not None and estimate.low > limit:
        raise BudgetExceeded(
            f"provider.max_cost_usd={limit:g} is below the lower bound of this run's cost "
            f"(${estimate.low:.4f}: {estimate.prompt_tokens} prompt tokens read once per sample); "
            "nothing was sent. Raise the limit or run fewer seeds or samples"
        )
