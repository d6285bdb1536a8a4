"""Model-server providers and the generation runner.

Takes: a composed config whose ``provider`` group names a backend. Gives: the public
provider API (re-exported below). ``base`` defines the contract, ``openai`` and ``ollama``
implement it, ``retry`` sends one request with backoff, ``journal`` keeps generations.jsonl
crash-safe, and ``runner`` ties them together in :func:`generate_for_job`.
"""

from __future__ import annotations

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
from storyforge.providers.runner import (
    GENERATIONS_NAME as GENERATIONS_NAME,
)
from storyforge.providers.runner import (
    build_provider as build_provider,
)
from storyforge.providers.runner import (
    generate_for_job as generate_for_job,
)
from storyforge.providers.runner import (
    provider_conf as provider_conf,
)
from storyforge.providers.runner import (
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
