"""FrozenDict: the read-only, hashable ``dict`` a compiled template's values are made of.

Takes: nothing (a leaf module). Gives: :class:`FrozenDict`, used by
:mod:`storyforge.engine.nodes` (``freeze``) and :mod:`storyforge.engine.sources` (handlers
remember the frozen args that passed their check).

Why a module of its own: both of those need the class, and the engine's imports point one way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FrozenDict"]


class FrozenDict(dict[str, Any]):
    """A read-only, hashable ``dict`` for frozen condition values and DataRef args.

    It stays a ``dict`` (handlers that check ``isinstance(args, dict)`` or ``json.dumps`` it
    keep working), but every mutating method raises ``TypeError``.
    """

    # The hash, once worked out. Left unset until then, so that making one is dict's own C
    # constructor (a Python __init__ setting it to None made each FrozenDict three times dearer,
    # and compiling makes one per DataRef args and condition value).
    __slots__ = ("_hash",)

    def _readonly(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a compiled template's values are read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly
    __ior__ = _readonly

    _hash: int

    def __hash__(self) -> int:  # type: ignore[override]
        try:
            return self._hash
        except AttributeError:
            value = self._hash = hash(frozenset(self.items()))
            return value

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"
