"""Model-server providers and the generation runner.

Takes: the checked provider settings (:mod:`storyforge.config.provider`). Gives: the public
provider API (re-exported below). ``base`` defines the contract, ``openai`` and ``ollama``
implement it, ``retry`` sends one request with backoff, ``journal`` keeps generations.jsonl
crash-safe, and ``runner`` ties them together in :func:`generate_for_job`.

The runner's names are imported on first use: it brings the HTTP client library, which a job
that makes no requests (``provider=none``) should not pay for at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

from storyforge.providers.base import (
    Capabilities,
    ChatRequest,
    Completion,
    MalformedResponse,
    Provider,
    request_hash,
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

_LAZY = {
    "provider_conf": "storyforge.config.provider",
    "provider_enabled": "storyforge.config.provider",
    "GENERATIONS_NAME": "storyforge.providers.runner",
    "build_provider": "storyforge.providers.runner",
    "generate_for_job": "storyforge.providers.runner",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'storyforge.providers' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
