"""The ``tinystories`` task kind: prompt seeds, the canonical instruction, output checks.

Public names (imported lazily so each part loads only what it needs)::

    TASK, SeedRecord, THEME_SET                     # the task kind, its context, the themes
    render_instruction(seed) -> str                 # the canonical instruction, via the engine
    validate_output(seed, text) -> ValidationResult # the seed spec's output checks
"""

from __future__ import annotations

from storyforge.tasks import lazy_exports

_EXPORTS = {
    "render_instruction": "storyforge.tasks.tinystories.instruction",
    "TASK": "storyforge.tasks.tinystories.kind",
    "SeedRecord": "storyforge.tasks.tinystories.kind",
    "THEME_SET": "storyforge.tasks.tinystories.spec",
    "validate_output": "storyforge.tasks.tinystories.validate",
    "ValidationResult": "storyforge.tasks.tinystories.validate",
}

__all__ = ["TASK", "THEME_SET", "SeedRecord", "ValidationResult", "render_instruction", "validate_output"]
assert sorted(__all__) == sorted(_EXPORTS)

# Registers the ``tinystories`` task kind; a light module (no engine, no jsonschema).
from storyforge.tasks.tinystories import kind as _kind  # noqa: F401

__getattr__ = lazy_exports(__name__, _EXPORTS)
