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
    Capabilities as Capabilities,
)
from storyforge.providers.base import (
    ChatRequest as ChatRequest,
)
from storyforge.providers.base import (
    Completion as Completion,
)
from storyforge.providers.base import (
    MalformedResponse as MalformedResponse,
)
from storyforge.providers.base import (
    Provider as Provider,
)
from storyforge.providers.base import (
    request_hash as request_hash,
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

_FROM_RUNNER = frozenset({"GENERATIONS_NAME", "build_provider", "generate_for_job"})


def __getattr__(name: str) -> Any:
    if name in ("provider_conf", "provider_enabled"):
        value = getattr(importlib.import_module("storyforge.config.provider"), name)
        globals()[name] = value
        return value
    if name in _FROM_RUNNER:
        value = getattr(importlib.import_module("storyforge.providers.runner"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'storyforge.providers' has no attribute {name!r}")
