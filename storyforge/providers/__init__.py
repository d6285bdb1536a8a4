"""Model-server providers and the generation runner.

Takes: a composed config whose ``provider`` group names a backend. Gives: the public
provider API (re-exported below). ``base`` defines the contract, ``openai`` and ``ollama``
implement it, ``retry`` sends one request with backoff, ``journal`` keeps generations.jsonl
crash-safe, and ``runner`` ties them together in :func:`generate_for_job`.
"""

from __future__ import annotations

from storyforge.providers.base import (
    Capabilities as Capabilities,
    ChatRequest as ChatRequest,
    Completion as Completion,
    MalformedResponse as MalformedResponse,
    Provider as Provider,
    request_hash as request_hash,
)
from storyforge.providers.runner import (
    GENERATIONS_NAME as GENERATIONS_NAME,
    build_provider as build_provider,
    generate_for_job as generate_for_job,
    provider_conf as provider_conf,
    provider_enabled as provider_enabled,
)

__all__ = [
    "GENERATIONS_NAME",
    "Capabilities",
    "ChatRequest",
    "Completion",
    "MalformedResponse",
    "Provider",
    "build_provider",
    "generate_for_job",
    "provider_conf",
    "provider_enabled",
    "request_hash",
]
