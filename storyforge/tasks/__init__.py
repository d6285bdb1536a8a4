"""The task kinds: one module or package per kind, each registering a :class:`TaskKind`.

Takes: nothing. Gives: :func:`lazy_exports`, the module ``__getattr__`` the task-kind packages
(``tinystories``, ``research_qa``) use to import each public name from its submodule on first
use. Why: importing a package to register its task kind must stay cheap (no engine, no
jsonschema, no matplotlib); the heavier parts load only when a caller asks for them.
The contract itself lives in :mod:`storyforge.tasks.base`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) giving ``exports[name]``'s attribute ``name``, imported on use."""

    def __getattr__(name: str) -> Any:
        try:
            module = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        return getattr(importlib.import_module(module), name)

    return __getattr__
