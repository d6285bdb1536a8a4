"""The ``tinystories`` task kind: prompt seeds, the canonical instruction, output checks.

Public names (imported lazily so each part loads only what it needs)::

    render_instruction(seed) -> str                 # the canonical instruction, via the engine
    validate_output(seed, text) -> ValidationResult # the seed spec's output checks
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "render_instruction": "storyforge.tasks.tinystories.instruction",
    "TASK": "storyforge.tasks.tinystories.instruction",
    "validate_output": "storyforge.tasks.tinystories.validate",
    "ValidationResult": "storyforge.tasks.tinystories.validate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
