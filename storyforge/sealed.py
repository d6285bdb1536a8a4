"""Schema dataclasses that refuse changes once checked: :class:`Sealed`, and :data:`MISSING`.

Takes: nothing. Gives: :class:`Sealed` (a mixin for the structured-config dataclasses that the
code below the config layer uses as they are) and :data:`MISSING` (OmegaConf's marker of a
value the config must set). Why here, among the base modules: a task defines the schema of
its own config group (the one type its code reads), and a task may not import the config
layer or ``omegaconf``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final, Self

__all__ = ["MISSING", "Sealed"]

MISSING: Final = "???"
"""A required value (``omegaconf.MISSING``): composing a config that leaves it unset fails."""


class Sealed:
    """A schema dataclass that, once checked and :meth:`seal`-ed, refuses every change.

    Hydra needs its schemas mutable (a frozen dataclass becomes a read-only node that
    overrides cannot merge into), so the objects built from them are sealed instead: setting
    an attribute of a sealed object raises :class:`dataclasses.FrozenInstanceError`.
    ``dataclasses.replace`` still works (it builds a new, unsealed object).
    """

    def seal(self) -> Self:
        """Refuse every later change, here and in every sealable part; returns ``self``."""
        for part in self.__dict__.values():
            if isinstance(part, Sealed):
                part.seal()
        object.__setattr__(self, "_sealed", True)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_sealed", False):
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r} of checked settings")
        object.__setattr__(self, name, value)
