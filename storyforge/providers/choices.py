"""Several samples from one request: ``n=N`` in the body, one choice per sample in the answer.

Takes: the provider settings (``samples``, ``n_per_request``: ``auto``, ``true`` or ``false``)
and the provider. Gives: :func:`use_n` (whether this run asks for ``n``), :class:`NChoices`
(the provider asking for ``n`` choices and parsing all of them into a :class:`MultiCompletion`)
and :func:`split_outcome` (one outcome per sample, for the journal).

Why: with ``provider.samples=N`` every sample of a prompt is otherwise a request of its own,
and the server reads the same prompt N times. With ``n=N`` it reads it once. ``auto`` asks for
``n`` when ``samples > 1`` on the OpenAI-compatible API (vLLM, SGLang, TGI and OpenAI accept
it) and never on Ollama's ``/api/chat``, which has no ``n``; ``true`` on Ollama is an error.
A server that ignores ``n`` answers fewer choices; the samples it left out are recorded as
errors saying so (set ``provider.n_per_request=false`` for such a server).

What changes in ``generations.jsonl``: every sample of a prompt carries the same
``request_hash`` (one body with ``n``; with ``provider.seed`` the body holds ``seed``, not
``seed + k``), and the request's ``usage`` is recorded on the first sample written from it;
the others record ``0`` tokens, so the file's token sums stay exact. Not with a prefill to
continue: continuing a prefill asks for one continuation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from storyforge.config.provider import OllamaProviderConf, ProviderConf
from storyforge.errors import ConfigError
from storyforge.providers.base import ChatRequest, Completion, MalformedResponse, Provider, Wrapper
from storyforge.providers.retry import Outcome

__all__ = ["MultiCompletion", "NChoices", "split_outcome", "use_n", "with_n"]

N_PER_REQUEST = ("auto", "true", "false")


def use_n(conf: ProviderConf) -> bool:
    """True when this run sends one request with ``n=samples`` per prompt."""
    mode = str(conf.n_per_request).lower()
    if mode not in N_PER_REQUEST:
        raise ConfigError(
            f"provider.n_per_request must be one of auto, true, false; got {conf.n_per_request!r}"
        )
    if mode == "false" or conf.samples == 1:
        return False
    ollama = isinstance(conf, OllamaProviderConf)
    prefill = getattr(conf, "prefix_continuation", "unsupported") != "unsupported"
    if mode == "true":
        if ollama:
            raise ConfigError("provider.n_per_request=true: Ollama's /api/chat has no n; use false or auto")
        if prefill:
            raise ConfigError(
                "provider.n_per_request=true cannot be combined with provider.prefix_continuation; use false"
            )
        return True
    return not ollama and not prefill


def with_n(provider: Provider, conf: ProviderConf) -> Provider:
    """``provider`` asking for ``n=samples`` choices when :func:`use_n` says so, else itself."""
    return NChoices(provider, conf.samples) if use_n(conf) else provider


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MultiCompletion(Completion):
    """An answer with several choices; the fields of :class:`Completion` are those of choice 0."""

    choices: tuple[Completion, ...] = ()


class NChoices(Wrapper):
    """``provider`` asking for ``n`` choices per request (same name, URL and description)."""

    def __init__(self, provider: Provider, n: int) -> None:
        super().__init__(provider)
        self.n = n

    def body(self, request: ChatRequest) -> dict[str, Any]:
        return {**self.inner.body(request), "n": self.n}

    def parse(self, payload: Any) -> Completion:
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not isinstance(choices, list) or not choices:
            raise MalformedResponse("no choices in the answer")
        parsed = [self.inner.parse({**payload, "choices": [choice]}) for choice in choices]
        first = {f.name: getattr(parsed[0], f.name) for f in dataclasses.fields(Completion)}
        return MultiCompletion(**first, choices=tuple(parsed))


def split_outcome(
    request: ChatRequest, samples: Sequence[int], outcome: Outcome, n: int
) -> list[tuple[ChatRequest, Outcome]]:
    """One (request, outcome) per sample of ``samples`` from an answer with several choices."""
    completion = outcome.completion
    if completion is None:
        return [(dataclasses.replace(request, sample=k), outcome) for k in samples]
    choices = completion.choices if isinstance(completion, MultiCompletion) else (completion,)
    parts: list[tuple[ChatRequest, Outcome]] = []
    for k in samples:
        sample_request = dataclasses.replace(request, sample=k)
        if k >= len(choices):
            error = (
                f"the server answered {len(choices)} of the {n} choices asked for with n={n}; it ignores n: "
                "set provider.n_per_request=false"
            )
            parts.append((sample_request, dataclasses.replace(outcome, completion=None, error=error)))
            continue
        first = not any(part.completion is not None for _, part in parts)  # carries the usage
        choice = dataclasses.replace(
            choices[k],
            prompt_tokens=completion.prompt_tokens if first else 0,
            completion_tokens=completion.completion_tokens if first else 0,
        )
        parts.append((sample_request, dataclasses.replace(outcome, completion=choice)))
    return parts
